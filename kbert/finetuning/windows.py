"""Documents longer than the window (`kbert finetune --long-text windows`): which window holds
what, and one answer per document from the answers of its windows.

The windows themselves are made in the graph, with the rest of the packing
(`kbert.text.graph_packer.window_starts`, `pack_token_windows`, `pack_word_windows`); this
module works on what they return, in numpy, with the rules of `kbert.text.windows`:

    Windows               each window's document, first token and length
    containing_windows    every (token, window that holds it) pair
    max_context_windows   for each token, the window where it has the most context: run_squad.py's
                          `_check_is_max_context`, the window a word's tag is read from
    document_mean         the mean over each document's windows: classify's logits, regress' values

Example: a document of 10 tokens in windows of 6, stride 3 (tokens 0-5, 3-8, 6-9), and one of 2.
>>> windows = Windows.from_starts([[0, 3, 6], [0]], num_tokens=[10, 2], room=6)
>>> windows.document.tolist(), windows.length.tolist(), windows.first_window.tolist()
([0, 0, 0, 1], [6, 6, 4, 2], [0, 3])
>>> window, position = max_context_windows(windows, document=[0, 0, 0, 1], token=[0, 5, 8, 1])
>>> window.tolist(), position.tolist()
([0, 1, 2, 3], [1, 3, 3, 2])
>>> document_mean(np.array([[1.0], [2.0], [6.0], [5.0]], np.float32), windows).tolist()
[[3.0], [5.0]]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kbert.text import windows as text_windows


@dataclasses.dataclass
class Windows:
    """The windows of a file's documents, one entry per model input row, the windows of each
    document together and in order (as the packers return them).

    Args:
        document: np.ndarray. int32 [windows]: the document (index in the file) of each window.
        start: np.ndarray. int32 [windows]: the index of the window's first token in its document.
        length: np.ndarray. int32 [windows]: its number of tokens (at most sequence_length - 2).
        num_tokens: np.ndarray. int32 [documents]: each document's length in tokens.
    """

    document: np.ndarray
    start: np.ndarray
    length: np.ndarray
    num_tokens: np.ndarray

    @classmethod
    def from_starts(cls, starts, num_tokens, room: int) -> Windows:
        """From the starts of each document's windows (a list of lists, or a RaggedTensor's
        `to_list()`), the documents' lengths and the window's room (sequence_length - 2)."""
        num_tokens = np.asarray(num_tokens, np.int32).reshape(-1)
        counts = np.asarray([len(row) for row in starts], np.int64)
        document = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        start = np.asarray([s for row in starts for s in row], np.int32).reshape(-1)
        length = np.minimum(room, num_tokens[document] - start).astype(np.int32)
        return cls(document, start, length, num_tokens)

    @property
    def num_documents(self) -> int:
        return len(self.num_tokens)

    @property
    def first_window(self) -> np.ndarray:
        """int64 [documents]: each document's first window (every document has at least one)."""
        return np.searchsorted(self.document, np.arange(self.num_documents))

    @property
    def counts(self) -> np.ndarray:
        """int64 [documents]: each document's number of windows."""
        return np.bincount(self.document, minlength=self.num_documents)


def containing_windows(windows: Windows, document, token) -> tuple[np.ndarray, np.ndarray]:
    """Every window that holds each token (`kbert.text.windows.holding_windows`).

    Args:
        windows: Windows.
        document: int array [tokens]. Each token's document.
        token: int array [tokens]. Each token's index in its document (< its length).

    Returns:
        (which, window): int64 arrays of the same length, one entry per (token, window holding
        it) pair: the token's index in the arguments, and the window, tokens in order and each
        token's windows in order.

    Example (windows 0-5, 3-8, 6-9 of one document: token 4 is in the first two):
    >>> windows = Windows.from_starts([[0, 3, 6]], num_tokens=[10], room=6)
    >>> [a.tolist() for a in containing_windows(windows, [0, 0, 0], [0, 4, 9])]
    [[0, 1, 1, 2], [0, 0, 1, 2]]
    """
    return text_windows.holding_windows(windows, (np.asarray(document).reshape(-1), np.asarray(token).reshape(-1)))


def max_context_windows(windows: Windows, document, token) -> tuple[np.ndarray, np.ndarray]:
    """For each token, the window where it has the most context, and its position there.

    run_squad.py's `_check_is_max_context` (`kbert.text.windows.max_context_windows`): a
    token's score in a window is the smaller of its left and right context (tokens of the window
    before and after it) plus 0.01 x the window's length; the best score wins, the earlier window
    an exact tie. Every token gets exactly one window, which is how `kbert predict` tags each
    word of a long document once.

    Args:
        windows: Windows.
        document: int array [tokens]. Each token's document.
        token: int array [tokens]. Each token's index in its document.

    Returns:
        (window, position): int64 arrays [tokens]: the window, and the token's position in that
        window's model input ([CLS] is position 0, so the window's first token is 1).

    Example (windows 0-5, 3-8, 6-9: token 4 has 1 token of context on its right in the first
    window and 1 on its left in the second, a tie the first window wins; token 5 has at least
    2 on each side in the second and none on its right in the first):
    >>> windows = Windows.from_starts([[0, 3, 6]], num_tokens=[10], room=6)
    >>> [a.tolist() for a in max_context_windows(windows, [0, 0, 0], [4, 5, 9])]
    [[0, 1, 2], [5, 3, 4]]
    """
    window, index = text_windows.max_context_windows(
        windows, (np.asarray(document).reshape(-1), np.asarray(token).reshape(-1))
    )
    return window, index + 1


def document_mean(values: np.ndarray, windows: Windows) -> np.ndarray:
    """The mean of each document's windows' rows: `values` [windows, ...] -> [documents, ...].

    Summed in float64 and returned in `values`' dtype, so a document of one window gets its
    window's row exactly, bit for bit.

    >>> windows = Windows.from_starts([[0, 2], [0]], num_tokens=[5, 1], room=3)
    >>> document_mean(np.array([[1.0, -1.0], [2.0, 0.0], [0.5, 0.5]], np.float32), windows).tolist()
    [[1.5, -0.5], [0.5, 0.5]]
    """
    values = np.asarray(values)
    if not len(values):
        return values[:0]
    sums = np.add.reduceat(values.astype(np.float64), windows.first_window, axis=0)
    return (sums / windows.counts.reshape((-1,) + (1,) * (values.ndim - 1))).astype(values.dtype)
