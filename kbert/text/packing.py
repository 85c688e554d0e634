"""Texts -> the encoder's three inputs as numpy arrays, in Python: run_classifier.py's packing.

`pack_texts` packs as google-research/bert's `convert_single_example` does: `[CLS] a [SEP]`, or
`[CLS] a [SEP] b [SEP]` with segment id 1 on b and its `[SEP]`; a pair too long loses tokens from
the end of its longer text, one at a time (`_truncate_seq_pair`), a single text its last tokens;
then zeros up to the sequence length. It needs no TensorFlow, so its arrays feed `model.fit` and
`predict` on every Keras backend.

`PythonPreprocessor` is the same packing behind the methods of `kbert.BertPreprocessor`, which
packs in the graph for tf.data pipelines and exports; it adds words to tag and long documents in
windows. Fine-tuning reads its files with either (`kbert.finetuning.encoding`), and both give the
same ids: `Packer` is what the two share.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from kbert.config import DEFAULT_MAX_SEQ_LENGTH, ENCODER_INPUTS
from kbert.runtime.errors import KbertError
from kbert.text.tokenizer import UNK, Tokenizer
from kbert.text.windows import sliding_windows


class Rows(NamedTuple):
    """Rows of different lengths in numpy: each row's length, and all rows' values one after another.

    Example:
    >>> rows = Rows.from_lists([[1, 2], [], [3]])
    >>> rows.lengths.tolist(), rows.values.tolist(), rows.to_list()
    ([2, 0, 1], [1, 2, 3], [[1, 2], [], [3]])
    """

    lengths: np.ndarray
    values: np.ndarray

    @classmethod
    def from_lists(cls, rows) -> Rows:
        """Lists of ints -> int64 `Rows`."""
        return cls(
            np.asarray([len(row) for row in rows], np.int64), np.asarray([v for row in rows for v in row], np.int64)
        )

    def to_list(self) -> list:
        """The rows as lists of Python ints."""
        values, ends = self.values.tolist(), np.cumsum(self.lengths).tolist()
        return [values[start:end] for start, end in zip([0, *ends[:-1]], ends)]


@runtime_checkable
class Packer(Protocol):
    """What fine-tuning asks of a packer: a file's texts, pairs, words to tag, and long documents
    in windows -> the encoder's three inputs (`kbert.config.ENCODER_INPUTS`), numpy int32
    [rows, sequence_length], and `Rows` where rows differ in length.

    Its methods take Python lists of str and return numpy. `kbert.text.graph_packer.BertPreprocessor`
    packs in the graph, in batches run two at a time; `PythonPreprocessor` packs in Python, with no
    TensorFlow. Both give the same ids, dtypes and errors (`kbert.finetuning.encoding` calls either).

    Example:
    >>> pre = PythonPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=6)
    >>> isinstance(pre, Packer)
    True
    >>> features, starts = pre.encode_windows(["one two three four five"], stride=2)
    >>> features["input_ids"].shape, starts.to_list()
    ((2, 6), [[0, 2]])
    """

    vocab_file: str
    do_lower_case: bool
    sequence_length: int

    def encode(self, texts, texts_b=None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Texts (and second texts, "" or None for none) -> (features, truncated: bool [rows])."""

    def encode_words(self, sentences) -> tuple[dict[str, np.ndarray], Rows, np.ndarray]:
        """Sentences of words -> (features, each word's first-piece position ([CLS] is 0, -1 for
        a word cut off) as `Rows` [sentences, (words)], truncated: bool [sentences]), each word
        tokenized on its own."""

    def encode_windows(self, texts, stride: int) -> tuple[dict[str, np.ndarray], Rows]:
        """Documents -> (the features of each window, the windows' starts as `Rows` [documents, (windows)])."""

    def encode_word_windows(self, sentences, stride: int) -> tuple[dict[str, np.ndarray], Rows, Rows]:
        """Documents of words -> (the features of each window, the windows' starts, each word's
        first piece counted from 0 in its document as `Rows` [documents, (words)])."""


def pack_texts(tokenizer, texts, texts_b=None, *, sequence_length: int = 128) -> dict[str, np.ndarray]:
    """The encoder's inputs for `texts` (and, for sentence pairs, `texts_b`), as run_classifier.py packs them.

    Args:
        tokenizer: `kbert.Tokenizer`. The model's vocabulary and casing.
        texts: list of str. The first (or only) text of each example.
        texts_b: optional list of str, as long as `texts`. The second text of each pair; an empty
            one packs as a single text, as in the original.
        sequence_length: int. Every row's length (the original's max_seq_length).

    Returns:
        dict of int32 [len(texts), sequence_length] numpy arrays: `input_ids`, `input_mask`
        (1 = real token), `segment_ids`.

    Raises:
        KbertError: texts_b of another length, a sequence length too short for `[CLS]` and the
            `[SEP]`s, or a vocabulary without them.

    Example:
    >>> import kbert
    >>> tokenizer = kbert.Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
    >>> x = pack_texts(tokenizer, ["Hello, world!"], ["Hi"], sequence_length=9)
    >>> tokenizer.convert_ids_to_tokens(x["input_ids"][0])
    ['[CLS]', 'hello', ',', 'world', '!', '[SEP]', 'hi', '[SEP]', '[PAD]']
    >>> x["segment_ids"][0].tolist(), x["input_mask"][0].tolist()
    ([0, 0, 0, 0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1, 0])
    >>> tokenizer.convert_ids_to_tokens(pack_texts(tokenizer, ["Hello, world!"], ["Hi"], sequence_length=7)["input_ids"][0])
    ['[CLS]', 'hello', ',', 'world', '[SEP]', 'hi', '[SEP]']
    """
    texts = list(texts)
    if texts_b is not None:
        texts_b = list(texts_b)
        if len(texts_b) != len(texts):
            raise KbertError(f"texts_b has {len(texts_b)} texts and texts {len(texts)}; pass one second text per text")
    sequence_length = int(sequence_length)
    least = 3 if texts_b is not None else 2
    if sequence_length < least:
        separators = "two [SEP]s" if texts_b is not None else "[SEP]"
        raise KbertError(
            f"sequence_length={sequence_length} cannot hold [CLS] and {separators}; pass sequence_length={least} or more"
        )
    missing = [token for token in ("[CLS]", "[SEP]") if token not in tokenizer.vocab]
    if missing:
        raise KbertError(
            f"{tokenizer.vocab_file} has no {' or '.join(missing)}; pack_texts needs a BERT vocab.txt that has both"
        )
    cls, sep = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    features, _ = _pack_pairs(_token_ids(tokenizer, texts, texts_b), sequence_length, cls, sep)
    return features


def _token_ids(tokenizer, texts, texts_b) -> list:
    """[(ids of a, ids of b)] of each example; b's are [] for a single text or an empty second one."""

    def ids(text):
        return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))

    if texts_b is None:
        return [(ids(a), []) for a in texts]
    return [(ids(a), ids(b) if b else []) for a, b in zip(texts, texts_b)]


def _pack_pairs(pairs, sequence_length: int, cls_id: int, sep_id: int) -> tuple[dict, np.ndarray]:
    """(ids of a, ids of b) of each example -> (the three inputs, truncated), as
    run_classifier.py packs them: a pair whose b is empty packs as a single text."""
    rows, truncated = [], np.zeros(len(pairs), bool)
    for i, (a, b) in enumerate(pairs):
        if b:
            truncated[i] = len(a) + len(b) > sequence_length - 3
            _truncate_pair(a, b, sequence_length - 3)
            rows.append(([cls_id, *a, sep_id, *b, sep_id], len(a) + 2))
        else:
            truncated[i] = len(a) > sequence_length - 2
            rows.append(_single(a, sequence_length, cls_id, sep_id))
    return _fill(rows, sequence_length), truncated


def _truncate_pair(a: list, b: list, budget: int):
    # run_classifier._truncate_seq_pair: a token at a time from the longer list (b on a tie),
    # so that a short text keeps all its tokens.
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()


def _single(tokens, sequence_length: int, cls_id: int, sep_id: int) -> tuple[list, int]:
    """The row "[CLS] tokens [SEP]", the tokens cut to fit, and its length: all of it is segment 0."""
    ids = [cls_id, *tokens[: sequence_length - 2], sep_id]
    return ids, len(ids)


def window_rows(documents, room: int, stride: int, pack) -> tuple[list, list]:
    """(each window's row, `pack(its tokens)`; each document's windows' starts) of documents given
    as token id lists: run_squad.py's windows of `room` tokens, `stride` apart (`sliding_windows`).

    >>> window_rows([[5, 6, 7]], room=2, stride=1, pack=list)
    ([[5, 6], [6, 7]], [[0, 1]])
    """
    windows = sliding_windows([len(tokens) for tokens in documents], room, stride, empty_window=True)
    starts = [[] for _ in documents]
    rows = []
    for document, start in zip(windows.document.tolist(), windows.start.tolist()):
        starts[document].append(start)
        rows.append(pack(documents[document][start : start + room]))
    return rows, starts


def _fill(rows, sequence_length: int) -> dict[str, np.ndarray]:
    """Rows of (ids, how many of them are segment 0) -> the three inputs, int32, zero padded."""
    out = {name: np.zeros((len(rows), sequence_length), np.int32) for name in ENCODER_INPUTS}
    for row, (ids, first_segment) in enumerate(rows):
        out["input_ids"][row, : len(ids)] = ids
        out["input_mask"][row, : len(ids)] = 1
        out["segment_ids"][row, first_segment : len(ids)] = 1
    return out


def checked_sequence_length(sequence_length) -> int:
    """A packer's row length as an int, or a ValueError when it cannot hold [CLS] x [SEP].

    >>> checked_sequence_length(2)
    Traceback (most recent call last):
    ...
    ValueError: sequence_length must be at least 3 ([CLS] x [SEP]), got 2
    """
    if int(sequence_length) < 3:
        raise ValueError(f"sequence_length must be at least 3 ([CLS] x [SEP]), got {sequence_length}")
    return int(sequence_length)


def require_tokens(vocab_file, vocab, *tokens) -> None:
    """A one-line `KbertError` unless `vocab` holds every one of `tokens`."""
    missing = [token for token in tokens if token not in vocab]
    if missing:
        raise KbertError(f"{vocab_file} has no {', '.join(missing)}; use the vocab.txt the model was trained with")


def special_token_ids(vocab_file, vocab) -> tuple[int, int, int | None]:
    """A packer's ids of [CLS] and [SEP], which it needs, and of [UNK] (None where the vocabulary
    has none: only words to tag need it).

    >>> special_token_ids("vocab.txt", {"[CLS]": 101, "[SEP]": 102})
    (101, 102, None)
    >>> special_token_ids("vocab.txt", {"[CLS]": 101})
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: vocab.txt has no [SEP]; use the vocab.txt the model was trained with
    """
    require_tokens(vocab_file, vocab, "[CLS]", "[SEP]")
    return vocab["[CLS]"], vocab["[SEP]"], vocab.get(UNK)


class PythonPreprocessor:
    """`kbert.text.graph_packer.BertPreprocessor`'s packing in Python and numpy, with the
    Python tokenizer: the same ids, and no TensorFlow (a `Packer`).

    Its methods take Python lists and return numpy arrays (lists of lists where rows differ in
    length); `kbert.finetuning.encoding`'s functions take it wherever they take a `BertPreprocessor`.

    Args:
        vocab_file: str. The model's vocab.txt.
        do_lower_case: bool. As the model was trained.
        sequence_length: int. Every row's length.

    Example:
    >>> pre = PythonPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=8)
    >>> features, truncated = pre.pack(["Hello, world!"], ["Bye."])  # "!" does not fit
    >>> features["input_ids"].tolist(), features["segment_ids"].tolist(), truncated.tolist()
    ([[101, 7592, 1010, 2088, 102, 9061, 1012, 102]], [[0, 0, 0, 0, 0, 1, 1, 1]], [True])
    """

    def __init__(self, vocab_file, do_lower_case: bool = True, sequence_length: int = DEFAULT_MAX_SEQ_LENGTH):
        self.vocab_file, self.do_lower_case = str(vocab_file), bool(do_lower_case)
        self.sequence_length = checked_sequence_length(sequence_length)
        self.tokenizer = Tokenizer(self.vocab_file, do_lower_case=self.do_lower_case)
        self.cls_id, self.sep_id, self.unk_id = special_token_ids(self.vocab_file, self.tokenizer.vocab)

    def ids(self, text: str) -> list:
        """The WordPiece ids of `text`."""
        return self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(text))

    def _single(self, tokens) -> tuple[list, int]:
        return _single(tokens, self.sequence_length, self.cls_id, self.sep_id)

    def pack(self, texts, texts_b=None):
        """Texts (and second texts, "" or None for none) -> (the three inputs, truncated), as
        `BertPreprocessor.pack`: `truncated` a bool [batch], True where tokens were cut."""
        return _pack_pairs(_token_ids(self.tokenizer, texts, texts_b), self.sequence_length, self.cls_id, self.sep_id)

    def _word_pieces(self, words) -> tuple:
        """(pieces, first): a sentence's pieces, each word tokenized on its own ("[UNK]" for a
        word with none), and each word's first piece counted from 0."""
        if self.unk_id is None:  # the packing needs it for a word with no pieces
            require_tokens(self.vocab_file, {}, UNK)
        pieces, first = [], []
        for word in words:
            first.append(len(pieces))
            pieces.extend(self.ids(word) or [self.unk_id])
        return pieces, first

    def pack_words(self, sentences):
        """Sentences of words -> (the three inputs, each word's first-piece position ([CLS] is
        0, -1 for a word cut off), truncated), as `BertPreprocessor.pack_words`."""
        rows, positions, truncated = [], [], np.zeros(len(sentences), bool)
        for i, words in enumerate(sentences):
            pieces, first = self._word_pieces(words)
            truncated[i] = len(pieces) > self.sequence_length - 2
            rows.append(self._single(pieces))
            positions.append([f + 1 if f + 1 <= self.sequence_length - 2 else -1 for f in first])
        return _fill(rows, self.sequence_length), positions, truncated

    def _windows(self, documents, stride: int):
        """(the three inputs of each window, the windows' starts) of documents given as token id
        lists, as `kbert.text.graph_packer.pack_token_windows` packs them."""
        rows, starts = window_rows(documents, self.sequence_length - 2, stride, self._single)
        return _fill(rows, self.sequence_length), starts

    def pack_windows(self, texts, stride: int):
        """Texts of any length -> (the three inputs of each window, the windows' starts), as
        `BertPreprocessor.pack_windows`."""
        return self._windows([self.ids(text) for text in texts], stride)

    def pack_word_windows(self, sentences, stride: int):
        """Sentences of words of any length -> (the three inputs of each window, the windows'
        starts, each word's first piece in its sentence), as `BertPreprocessor.pack_word_windows`."""
        pieces = [self._word_pieces(words) for words in sentences]
        features, starts = self._windows([p for p, _ in pieces], stride)
        return features, starts, [first for _, first in pieces]

    # === The Packer's methods: a whole file's lists, ragged results as `Rows` ===

    def encode(self, texts, texts_b=None):
        """`pack`, as a `Packer`."""
        return self.pack(texts, texts_b)

    def encode_words(self, sentences):
        """`pack_words`, as a `Packer`: the positions as `Rows`."""
        features, positions, truncated = self.pack_words(sentences)
        return features, Rows.from_lists(positions), truncated

    def encode_windows(self, texts, stride: int):
        """`pack_windows`, as a `Packer`: the starts as `Rows`."""
        features, starts = self.pack_windows(texts, stride)
        return features, Rows.from_lists(starts)

    def encode_word_windows(self, sentences, stride: int):
        """`pack_word_windows`, as a `Packer`: the starts and first pieces as `Rows`."""
        features, starts, first = self.pack_word_windows(sentences, stride)
        return features, Rows.from_lists(starts), Rows.from_lists(first)
