"""Overlapping windows over long token sequences: run_squad.py's doc spans and its max-context rule.

google-research/bert's run_squad.py reads a document longer than the model's input in windows
of `room` tokens, each starting `doc_stride` tokens after the last, and reads each token in the
window where it has the most context (`_check_is_max_context`). kbert uses the same windows for
SQuAD (`kbert.finetuning.squad`, in numpy) and for `--long-text windows` (packed in the graph by
`kbert.text.graph_packer`, placed in numpy by `kbert.finetuning.windows`, served by
`kbert.serving.heads`). The arithmetic is written once, here, over the numpy or the TensorFlow
ops that fit its inputs: numpy arrays or Python ints run in numpy without importing TensorFlow;
tensors run as TensorFlow ops, eagerly or inside a tf.function.

    sliding_windows       documents' lengths -> their windows, and which window owns each token
    max_context_windows   for windows already made: each token's owner and its index there
    holding_windows       every (token, window that holds it) pair
"""

from __future__ import annotations

import sys
import types
from typing import NamedTuple

import numpy as np


class SlidingWindows(NamedTuple):
    """The windows of a batch of documents, each document's together and in order.

    Args:
        count: int [documents]. Each document's number of windows.
        document: int [windows]. Each window's document.
        start: int [windows]. The index of the window's first token in its document.
        length: int [windows]. Its number of tokens: `room`, but the last of its document's.
        owner: int [tokens] or None. For each token asked about, the window (a row of the
            arrays above) where it has the most context.
        position: int [tokens] or None. The token's index in that window (0: its first token).
    """

    count: object
    document: object
    start: object
    length: object
    owner: object = None
    position: object = None


def sliding_windows(num_tokens, room, stride, tokens=None, *, empty_window=False) -> SlidingWindows:
    """Documents' lengths -> run_squad.py's windows over them and, for the tokens asked about,
    the window that owns each one.

    A document of n tokens gets windows of `room` tokens starting at 0, step, 2 x step, ... up
    to the first that reaches its end, which is the last and may be shorter, where step is
    min(stride, room): run_squad.py's doc-span loop, which moves on by min(length, doc_stride).
    A token belongs to the window where the smaller of its left and right context (tokens of the
    window before and after it) plus 0.01 x the window's length is largest, the earlier window
    on a tie: `_check_is_max_context`, its sums in float64 as Python's. Every token is in at
    least one window and has exactly one owner.

    Args:
        num_tokens: int array or tensor [documents]. Each document's length in tokens.
        room: int or int scalar tensor, at least 1. Tokens a window holds.
        stride: int or int scalar tensor, at least 1. Tokens between two windows' starts.
        tokens: (document, index) int arrays or tensors [tokens], or None. The tokens to place:
            each one's document and index in it (less than that document's length).
        empty_window: bool. An empty document gets one empty window, as a truncating packer
            packs it, rather than none, as run_squad.py's loop gives it.

    Returns:
        SlidingWindows: numpy int64 arrays for numpy inputs, int32 tensors for tensors.

    Example (10 tokens in windows of 6, stride 3: tokens 0-5, 3-8 and 6-9; token 4 has 1 token
    on its right in the first window and 1 on its left in the second, a tie the first wins;
    token 5 has 2 on each side in the second):
    >>> w = sliding_windows([10, 2], room=6, stride=3, tokens=([0, 0, 0, 1], [4, 5, 9, 1]))
    >>> w.count.tolist(), w.start.tolist(), w.length.tolist(), w.document.tolist()
    ([3, 1], [0, 3, 6, 0], [6, 6, 4, 2], [0, 0, 0, 1])
    >>> w.owner.tolist(), w.position.tolist()
    ([0, 1, 2, 3], [4, 2, 3, 1])

    The same ops in the graph:
    >>> import tensorflow as tf
    >>> w = tf.function(lambda n: sliding_windows(n, 6, 3, empty_window=True))(tf.constant([10, 0]))
    >>> w.start.numpy().tolist(), w.length.numpy().tolist(), w.count.numpy().tolist()
    ([0, 3, 6, 0], [6, 6, 4, 0], [3, 1])
    """
    xp = _ops(num_tokens, room, stride)
    if isinstance(room, (int, np.integer)) and isinstance(stride, (int, np.integer)) and min(room, stride) < 1:
        raise ValueError(f"room ({room}) and stride ({stride}) must both be at least 1")
    n, room = xp.ints(num_tokens), xp.ints(room)
    # run_squad.py steps by min(length, doc_stride), and every window it steps from holds `room`
    # tokens (only a document's last is shorter): one step throughout, so a closed form.
    step = xp.minimum(xp.ints(stride), room)
    count = 1 + xp.maximum(n - room + step - 1, 0) // step
    if not empty_window:
        count = xp.where(n > 0, count, 0)
    k, document = xp.ragged_range(count * 0, count)
    start = k * step
    windows = SlidingWindows(count, document, start, xp.minimum(room, xp.take(n, document) - start))
    if tokens is None:
        return windows
    owner, position = max_context_windows(windows, tokens)
    return windows._replace(owner=owner, position=position)


def max_context_windows(windows, tokens):
    """For each token, the window where it has the most context, and its index there.

    The rule of `sliding_windows`, for windows already made (`SlidingWindows`, or any object
    whose `document`, `start` and `length` describe windows as `sliding_windows` orders them).

    Args:
        windows: the windows' `document`, `start` and `length` arrays [windows].
        tokens: (document, index) int arrays [tokens]. Each token's document and index in it.

    Returns:
        (owner, position): int [tokens]: the owning window's row, and the token's index in it.

    Example (windows 0-5, 3-8, 6-9 of one document):
    >>> windows = sliding_windows([10], room=6, stride=3)
    >>> [a.tolist() for a in max_context_windows(windows, ([0, 0, 0], [4, 5, 9]))]
    [[0, 1, 2], [4, 2, 3]]
    """
    xp = _ops(windows.start, *tokens)
    which, window = holding_windows(windows, tokens)
    token, start, length = xp.ints(tokens[1]), xp.ints(windows.start), xp.ints(windows.length)
    t, s, size = xp.take(token, which), xp.take(start, window), xp.take(length, window)
    score = xp.float64(xp.minimum(t - s, s + size - 1 - t)) + 0.01 * xp.float64(size)
    n = xp.size(token)
    best = xp.segment_max(score, which, n)
    # The earliest of the windows with the best score: run_squad.py only moves on to a strictly better one.
    owner = xp.segment_min(xp.where(score == xp.take(best, which), window, xp.int_max), which, n)
    return owner, token - xp.take(start, owner)


def holding_windows(windows, tokens):
    """Every window that holds each token: (which, window) int arrays, one entry per pair, the
    token's index in `tokens` and the window's row, tokens in order and each one's windows in order.

    A document's windows start later and end later one after the other, so the windows that hold
    token t are a run, from the first that ends after t to the last that starts at or before it:
    two binary searches over all the windows at once, documents told apart by one key space.

    Example (windows 0-5, 3-8, 6-9: token 4 is in the first two):
    >>> windows = sliding_windows([10], room=6, stride=3)
    >>> [a.tolist() for a in holding_windows(windows, ([0, 0, 0], [0, 4, 9]))]
    [[0, 1, 1, 2], [0, 0, 1, 2]]
    """
    xp = _ops(windows.start, *tokens)
    start, end = xp.wide(windows.start), xp.wide(windows.start) + xp.wide(windows.length)
    token = xp.wide(tokens[1])
    span = 1 + xp.maximum(xp.max_or_zero(end), xp.max_or_zero(token))  # document x span + index
    window_key = xp.wide(windows.document) * span
    key = xp.wide(tokens[0]) * span + token
    last = xp.searchsorted(window_key + start, key) - 1
    first = xp.searchsorted(window_key + end, key)
    window, which = xp.ragged_range(first, last + 1)
    return which, window


# === The array namespaces the arithmetic above runs on ===


def _ops(*values):
    """TensorFlow's ops (`kbert.text.graph_window_ops`) if any of `values` is a tensor, else numpy's.

    TensorFlow is looked for among the loaded modules, not imported: a caller with a tensor has
    loaded it already, and one with numpy arrays runs without it."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and any(tf.is_tensor(v) for v in values):
        from kbert.text.graph_window_ops import GRAPH_OPS

        return GRAPH_OPS
    return _NUMPY


def _numpy_ragged_range(low, high):
    """(values, rows): the ranges low[i]..high[i] - 1 one after the other, and each value's i."""
    counts = np.maximum(high - low, 0)
    rows = np.repeat(np.arange(len(counts)), counts)
    return np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts - low, counts), rows


def _numpy_segment(reduce, initial):
    def segment(values, ids, n):
        out = np.full(n, initial, values.dtype)
        reduce.at(out, ids, values)
        return out

    return segment


_NUMPY = types.SimpleNamespace(
    ints=lambda x: np.asarray(x, np.int64),
    wide=lambda x: np.asarray(x, np.int64),
    float64=lambda x: np.asarray(x, np.float64),
    minimum=np.minimum,
    maximum=np.maximum,
    where=np.where,
    take=lambda a, i: a[i],
    size=len,
    max_or_zero=lambda x: x.max(initial=0),
    searchsorted=lambda a, v: np.searchsorted(a, v, side="right"),
    ragged_range=_numpy_ragged_range,
    segment_max=_numpy_segment(np.maximum, -np.inf),
    segment_min=_numpy_segment(np.minimum, np.iinfo(np.int64).max),
    int_max=np.iinfo(np.int64).max,
)
