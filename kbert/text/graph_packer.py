"""`BertPreprocessor`: strings (or sentence pairs, or tagged words) -> the model's three inputs, inside the graph.

This is kbert's one packing of text: `kbert finetune`, `predict` and `evaluate` run it over
their files (`kbert.finetuning.encoding`), and every export runs it in its SavedModel.

Texts are packed exactly as google-research/bert's `run_classifier.convert_single_example`:
`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, segment 0 up to the first [SEP] and 1 after,
mask 1 on real tokens, zero padding to `sequence_length`. A pair that is too long is cut
as `_truncate_seq_pair` cuts it, one token at a time from the end of the longer text
(from the second when they are equal), written here in closed form so it runs batched.

Words to tag (CoNLL's) are kbert's own rule (`pack_word_pieces`): each word tokenized on its
own, "[UNK]" for a word with no pieces, the pieces cut at `sequence_length - 2`, and each
word's tag read at its first piece. Tokens are `GraphTokenizer`'s, which are the original
tokenizer's.

Documents longer than the window (`kbert finetune --long-text windows`) are packed whole, as
overlapping windows (`window_starts`, `pack_token_windows`, `pack_word_windows`): SQuAD's doc
spans over the document's tokens, each window packed as a single text of its own.

`BertPreprocessor` is a `kbert.text.packing.Packer`: its `encode*` methods take a whole file's
Python strings, pack it in batches two at a time, and return numpy arrays, as
`kbert.text.packing.PythonPreprocessor` does in Python.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import keras
import numpy as np
import tensorflow as tf

import kbert.config
from kbert.config import ENCODER_INPUTS, VOCAB_FILE, load_config
from kbert.text.graph_tokenizer import GraphTokenizer
from kbert.text.packing import Rows, checked_sequence_length, require_tokens, special_token_ids
from kbert.text.tokenizer import UNK, load_vocab
from kbert.text.windows import sliding_windows


def truncated_pair_lengths(len_a, len_b, budget):
    """How many tokens of a and of b `_truncate_seq_pair(a, b, budget)` keeps (batched).

    The original pops from the longer list (from b on a tie) until the pair fits, so: a pair
    that fits is kept; if the shorter one fits in half the budget it is kept whole and the
    longer gets the rest; otherwise a gets ceil(budget/2) and b floor(budget/2).

    Example:
    >>> [int(v) for v in truncated_pair_lengths(tf.constant([3, 10, 10, 2]), tf.constant([4, 10, 3, 9]), 7)[0]]
    [3, 4, 4, 2]
    """
    len_a, len_b = tf.cast(len_a, tf.int32), tf.cast(len_b, tf.int32)
    shorter = tf.minimum(len_a, len_b)
    fits = len_a + len_b <= budget
    shorter_kept_whole = 2 * shorter <= budget
    half_b = budget // 2
    keep_a = tf.where(
        fits, len_a, tf.where(shorter_kept_whole, tf.where(len_a <= len_b, len_a, budget - len_b), budget - half_b)
    )
    keep_b = tf.where(
        fits, len_b, tf.where(shorter_kept_whole, tf.where(len_a <= len_b, budget - len_a, len_b), half_b)
    )
    return keep_a, keep_b


def _head(ragged, keep):
    """The first `keep[i]` items of each row of a RaggedTensor."""
    positions = tf.ragged.range(ragged.row_lengths())
    return tf.ragged.boolean_mask(ragged, positions < tf.cast(keep, positions.dtype)[:, None])


def pack_token_ids(a, b, sequence_length, cls_id: int, sep_id: int) -> dict:
    """Token ids of texts (and of second texts) -> the model's three inputs, as run_classifier packs.

    `convert_single_example` packs a pair only when the second text has tokens: a row whose
    `b` is empty is packed as a single text (with its longer budget), and a second text cut to
    nothing gets no [SEP] of its own.

    Args:
        a, b: int RaggedTensors [batch, (tokens)]; `b` None for single texts.
        sequence_length: int or int32 scalar tensor. Output length.
        cls_id, sep_id: ids of [CLS] and [SEP].

    Example:
    >>> out = pack_token_ids(tf.ragged.constant([[7, 8, 9], [7]]), tf.ragged.constant([[5, 6], []]), 6, 1, 2)
    >>> out["input_ids"].numpy().tolist(), out["segment_ids"].numpy().tolist()
    ([[1, 7, 8, 2, 5, 2], [1, 7, 2, 0, 0, 0]], [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]])
    """
    # Written as one [batch, sequence_length] grid of positions: which part each position
    # holds ([CLS], a, [SEP], b, [SEP] or padding) follows from the kept lengths alone.
    len_a = tf.cast(a.row_lengths(), tf.int32)
    keep_a = tf.minimum(len_a, sequence_length - 2)
    keep_b = tf.zeros_like(keep_a)
    if b is not None:
        len_b = tf.cast(b.row_lengths(), tf.int32)
        pair_a, pair_b = truncated_pair_lengths(len_a, len_b, sequence_length - 3)
        keep_a = tf.where(len_b > 0, pair_a, keep_a)
        keep_b = tf.where(len_b > 0, pair_b, keep_b)
    position = tf.range(sequence_length)[None, :]
    ka, kb = keep_a[:, None], keep_b[:, None]
    in_a = (position >= 1) & (position <= ka)
    b_from = ka + 2
    in_b = (position >= b_from) & (position < b_from + kb)
    length = b_from + tf.where(kb > 0, kb + 1, 0)
    ids = tf.where(in_a, _take(a, in_a, position - 1), 0)
    if b is not None:
        ids = tf.where(in_b, _take(b, in_b, position - b_from), ids)
    specials = tf.where(position == 0, cls_id, tf.where((position == ka + 1) | (position == length - 1), sep_id, 0))
    ids = tf.where(in_a | in_b, ids, tf.cast(specials, ids.dtype))
    real = position < length
    return {
        "input_ids": tf.where(real, ids, tf.zeros_like(ids)),
        "input_mask": tf.cast(real, ids.dtype),
        "segment_ids": tf.cast((position >= b_from) & real, ids.dtype),
    }


def _take(ragged, inside, offset):
    """[batch, length] grid: row i's token at `offset[i, j]` where `inside`, 0 elsewhere."""
    values = tf.concat([ragged.flat_values, tf.zeros([1], ragged.flat_values.dtype)], 0)  # [..., a 0 to point at]
    starts = tf.cast(ragged.row_starts(), tf.int32)[:, None]
    return tf.gather(values, tf.where(inside, starts + offset, tf.shape(values)[0] - 1))


def truncated_rows(a, b, sequence_length):
    """Whether `pack_token_ids` cuts each row: a single text (or a pair whose `b` is empty)
    longer than sequence_length - 2 tokens, a pair longer than sequence_length - 3.

    Example:
    >>> truncated_rows(tf.ragged.constant([[7, 8, 9], [7, 8, 9, 9]]), tf.ragged.constant([[5, 6], []]), 6).numpy()
    array([ True, False])
    """
    len_a = a.row_lengths()
    if b is None:
        return len_a > tf.cast(sequence_length - 2, len_a.dtype)
    len_b = b.row_lengths()
    specials = tf.where(len_b > 0, tf.constant(3, len_a.dtype), 2)  # an empty b packs as a single text
    return len_a + len_b > tf.cast(sequence_length, len_a.dtype) - specials


def window_starts(num_tokens, room, stride):
    """Where each document's windows start, and how many tokens each holds: SQuAD's doc spans
    (`kbert.text.windows.sliding_windows`), as RaggedTensors, in the graph.

    A document of n tokens becomes windows of `room` tokens starting at 0, stride, 2 x stride,
    ..., up to the first window that reaches the document's end, which is the last and may be
    shorter. Every token is in at least one window. A document that fits (n <= room) is one
    window of all of it, and an empty one is one empty window, as truncation packs them.

    Args:
        num_tokens: int tensor [batch]. Each document's length in tokens.
        room: int or int32 scalar tensor. Tokens per window (sequence_length - 2: [CLS], [SEP]).
        stride: int or int32 scalar tensor. Tokens between the starts of two windows,
            1 <= stride < room (`kbert.finetuning.options.window_stride` checks it).

    Returns:
        (starts, lengths): int32 RaggedTensors [batch, (windows)]: the index of each window's
        first token in its document, and its number of tokens.

    Example (10 tokens, windows of 6, stride 3: tokens 0-5, 3-8 and 6-9):
    >>> starts, lengths = window_starts(tf.constant([3, 10, 0]), room=6, stride=3)
    >>> starts.to_list(), lengths.to_list()
    ([[0], [0, 3, 6], [0]], [[3], [6, 6, 4], [0]])
    """
    windows = sliding_windows(tf.convert_to_tensor(num_tokens), room, stride, empty_window=True)
    starts = tf.RaggedTensor.from_row_lengths(windows.start, tf.cast(windows.count, tf.int64))
    return starts, starts.with_flat_values(windows.length)


def _windows_of(tokens, starts, lengths):
    """The tokens of each window: a RaggedTensor [windows, (tokens)] over `tokens` [batch, (tokens)]."""
    first = tf.gather(tokens.row_starts(), starts.value_rowids()) + tf.cast(starts.flat_values, tf.int64)
    index = tf.ragged.range(first, first + tf.cast(lengths.flat_values, tf.int64))
    return index.with_values(tf.gather(tokens.flat_values, index.flat_values))


def pack_token_windows(tokens, sequence_length, stride, cls_id: int, sep_id: int):
    """Token ids of documents -> the three inputs of each of their windows (`window_starts`),
    each window packed as a single text: "[CLS] window [SEP]", segment 0, zero padding.

    Windows are made here, in the graph, from the ragged token ids the tokenizer gives, with
    the same gathers `pack_token_ids` uses: no Python loop over documents, so packing a file
    in windows costs about what truncating it costs, and an export can run the same ops.

    Args:
        tokens: int RaggedTensor [batch, (tokens)].
        sequence_length: int or int32 scalar tensor. Output length; each window holds
            sequence_length - 2 tokens.
        stride: int or int32 scalar tensor. Tokens between two windows' starts.
        cls_id, sep_id: ids of [CLS] and [SEP].

    Returns:
        (features, starts): the three inputs, int32 [windows, sequence_length], the windows
        of the first document first, each document's in order; and `window_starts`' starts,
        [batch, (windows)] (`starts.value_rowids()`: each window's document).

    Example:
    >>> features, starts = pack_token_windows(tf.ragged.constant([[7, 8, 9, 10, 11], [12]]), 5, 2, 1, 2)
    >>> features["input_ids"].numpy().tolist(), starts.to_list()
    ([[1, 7, 8, 9, 2], [1, 9, 10, 11, 2], [1, 12, 2, 0, 0]], [[0, 2], [0]])
    """
    starts, lengths = window_starts(tokens.row_lengths(), sequence_length - 2, stride)
    return pack_token_ids(_windows_of(tokens, starts, lengths), None, sequence_length, cls_id, sep_id), starts


def _word_tokens(pieces, unk_id: int):
    """(tokens [batch, (pieces)], first [batch, (words)]): each sentence's pieces, "[UNK]" for a
    word with none, and each word's first piece counted from 0 in its sentence."""
    words = pieces.values  # [words, (pieces)]
    count = tf.maximum(words.row_lengths(), 1)  # a word with no pieces gets one: [UNK]
    unk = tf.fill([tf.shape(count)[0], 1], tf.constant(unk_id, words.dtype))
    words = _head(tf.concat([words, unk], axis=1), count)
    tokens = pieces.with_values(words).merge_dims(1, 2)  # [batch, (pieces)]
    before = tf.cumsum(count, exclusive=True)
    sentence_start = tf.gather(tf.concat([before, tf.reduce_sum(count, keepdims=True)], 0), pieces.row_starts())
    return tokens, pieces.with_values(before - tf.repeat(sentence_start, pieces.row_lengths()))


def pack_word_windows(pieces, sequence_length, stride, cls_id: int, sep_id: int, unk_id: int):
    """Each sentence's words, as WordPiece ids -> the three inputs of each of its windows,
    the windows' starts, and each word's first piece in its sentence.

    The pieces are `pack_word_pieces`' ("[UNK]" for a word with none), in windows as
    `pack_token_windows` makes them; nothing is cut. A word's first piece `f` sits at position
    `f - start + 1` of each window that holds it.

    Args:
        pieces: int32 RaggedTensor [batch, (words), (pieces)].
        sequence_length, stride: as `pack_token_windows`.
        cls_id, sep_id, unk_id: ids of [CLS], [SEP] and [UNK].

    Returns:
        (features, starts, first): the three inputs, int32 [windows, sequence_length]; the
        windows' starts, int32 RaggedTensor [batch, (windows)]; each word's first piece
        counted from 0 in its sentence, an int32 RaggedTensor [batch, (words)].

    Example:
    >>> features, starts, first = pack_word_windows(tf.ragged.constant([[[7, 8], [], [9], [10]]]), 5, 2, 1, 2, 3)
    >>> features["input_ids"].numpy().tolist(), starts.to_list(), first.to_list()
    ([[1, 7, 8, 3, 2], [1, 3, 9, 10, 2]], [[0, 2]], [[0, 2, 3, 4]])
    """
    tokens, first = _word_tokens(pieces, unk_id)
    features, starts = pack_token_windows(tokens, sequence_length, stride, cls_id, sep_id)
    return features, starts, first.with_values(tf.cast(first.flat_values, tf.int32))


def pack_word_pieces(pieces, sequence_length, cls_id: int, sep_id: int, unk_id: int):
    """Each sentence's words, as WordPiece ids -> the model's three inputs, each word's first
    piece, and which sentences were cut.

    "[CLS] pieces [SEP]" with segment 0, mask 1 on real tokens, zero padding. A word with no
    pieces (only control characters, say) becomes "[UNK]", so every word has a first piece. A
    sentence of more than sequence_length - 2 pieces keeps its first sequence_length - 2; a
    word whose first piece is cut off gets position -1.

    Args:
        pieces: int32 RaggedTensor [batch, (words), (pieces)].
        sequence_length: int. Output length.
        cls_id, sep_id, unk_id: ids of [CLS], [SEP] and [UNK].

    Returns:
        (features, word_starts, truncated): the three inputs, int32 [batch, sequence_length];
        each word's first-piece position ([CLS] is 0), an int32 RaggedTensor [batch, (words)];
        and a bool [batch], True where pieces were cut.

    Example:
    >>> features, starts, cut = pack_word_pieces(tf.ragged.constant([[[7, 8], [], [9]]]), 5, 1, 2, 3)
    >>> features["input_ids"].numpy().tolist(), starts.to_list(), cut.numpy().tolist()
    ([[1, 7, 8, 3, 2]], [[1, 3, -1]], [True])
    """
    tokens, first = _word_tokens(pieces, unk_id)
    packed = pack_token_ids(tokens, None, sequence_length, cls_id, sep_id)
    # Each word's first piece, counted from 1 ([CLS] is 0), within its own sentence.
    first = first.flat_values + 1
    first = tf.cast(tf.where(first <= sequence_length - 2, first, -1), tf.int32)
    return packed, pieces.with_values(first), tokens.row_lengths() > sequence_length - 2


# === A whole file through the packer, in numpy (the `Packer` methods) ===

# Examples per call of the packer: at most _BATCH, and the file split evenly between the two
# threads below. Larger calls are faster per example (each distinct word is tokenized once
# per call) up to about this size (benchmarked in docs/performance.md, "Fine-tuning inputs").
_BATCH = 25_000
_THREADS = 2


def _strings(values):
    """str -> a tf.string tensor; a lone surrogate (JSON's "\\ud800") goes in as the invalid
    UTF-8 a client would send, which the tokenizer drops, rather than failing the whole file."""
    try:
        return tf.constant(values, tf.string, shape=[len(values)])
    except (UnicodeEncodeError, ValueError):  # TensorFlow's conversion raises either, by version
        return tf.constant([v.encode("utf-8", "surrogatepass") for v in values], tf.string, shape=[len(values)])


def _word_strings(sentences):
    """Sentences of words (lists of str) -> a string RaggedTensor [sentences, (words)]."""
    return tf.RaggedTensor.from_row_lengths(
        _strings([word for sentence in sentences for word in sentence]),
        np.asarray([len(sentence) for sentence in sentences], np.int64),
    )


def _pack_batches(pack, columns, n: int) -> list:
    """`pack` over batches of rows of `columns`, two at a time (TF's kernels run without
    holding the GIL), results in order. Eagerly: a tf.function would be traced first, and
    tracing the tokenizer's graph costs more than packing a file of ten thousand examples,
    while at these batch sizes the ops' own work is nearly all of the time."""
    threads = min(_THREADS, os.cpu_count() or 1)
    batch = max(1, min(_BATCH, -(-n // threads)))
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: pack(*(c[i : i + batch] for c in columns)), range(0, n, batch)))


def _features(batches, n: int, length: int) -> dict[str, np.ndarray]:
    """The features of every batch, as one file's numpy arrays."""
    if not batches:
        return {name: np.zeros((n, length), np.int32) for name in ENCODER_INPUTS}
    return {name: np.concatenate([features[name].numpy() for features in batches]) for name in ENCODER_INPUTS}


def _rows(ragged) -> Rows:
    """One RaggedTensor [rows, (values)] per batch, as one file's `Rows`."""
    if not ragged:
        return Rows(np.zeros(0, np.int64), np.zeros(0, np.int64))
    return Rows(
        np.concatenate([r.row_lengths().numpy() for r in ragged]),
        np.concatenate([r.flat_values.numpy() for r in ragged]),
    )


def _truncated(cuts) -> np.ndarray:
    """One bool tensor [rows] per batch, as one file's bool array."""
    return np.concatenate([cut.numpy() for cut in cuts]) if cuts else np.zeros(0, bool)


@keras.saving.register_keras_serializable(package="kbert")
class BertPreprocessor(keras.layers.Layer):
    """Strings [batch] (or a pair of them) -> {"input_ids", "input_mask", "segment_ids"} int32 [batch, length].

    Use it in `tf.data` (`dataset.map`) or as the first layer of an exported model. It is a
    `kbert.text.packing.Packer`, as `PythonPreprocessor` is: the same packing, in Python.

    Args:
        vocab_file: str. The model's vocab.txt.
        do_lower_case: bool. As the model was trained (uncased models: True).
        sequence_length: int. Output length; longer texts are truncated as the original does.

    Example:
    >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=8)
    >>> out = pre((tf.constant(["Hello, world!"]), tf.constant(["Bye."])))
    >>> out["input_ids"].numpy().tolist(), out["segment_ids"].numpy().tolist()
    ([[101, 7592, 1010, 2088, 102, 9061, 1012, 102]], [[0, 0, 0, 0, 0, 1, 1, 1]])
    """

    def __init__(
        self,
        vocab_file,
        do_lower_case: bool = True,
        sequence_length: int = kbert.config.DEFAULT_MAX_SEQ_LENGTH,
        **kwargs,
    ):
        kwargs.pop("trainable", None)  # nothing to train; from_config passes it back
        kwargs.setdefault("dtype", "int32")
        super().__init__(trainable=False, **kwargs)
        self.vocab_file, self.do_lower_case = str(vocab_file), bool(do_lower_case)
        self.sequence_length = checked_sequence_length(sequence_length)
        self.cls_id, self.sep_id, self.unk_id = special_token_ids(self.vocab_file, load_vocab(self.vocab_file))
        self.tokenizer = GraphTokenizer(self.vocab_file, self.do_lower_case)

    @classmethod
    def for_model(cls, model_or_dir, sequence_length: int | None = None):
        """The preprocessor a kbert model (or model directory) was trained with.

        Args:
            model_or_dir: a kbert model (with `vocab_file`), or a kbert model directory.
            sequence_length: int. Output length; default: the length the model was fine-tuned
                with, else 128, capped at max_position_embeddings. A longer one raises ValueError.

        Example:
        >>> BertPreprocessor.for_model("tests/fixtures/tf1-tiny", sequence_length=128)
        Traceback (most recent call last):
        ...
        ValueError: sequence_length 128 exceeds the model's max_position_embeddings 64; pass sequence_length=64 or less
        """
        if isinstance(model_or_dir, (str, bytes)) or hasattr(model_or_dir, "__fspath__"):
            config = load_config(model_or_dir)
            vocab, lower = os.path.join(os.fspath(model_or_dir), VOCAB_FILE), config.extras.get("do_lower_case", True)
            trained_length = config.extras.get("max_seq_length")
        else:
            config = model_or_dir.config
            vocab, lower = model_or_dir.vocab_file, getattr(model_or_dir, "do_lower_case", True)
            trained_length = (getattr(model_or_dir, "task_info", None) or {}).get("max_seq_length")
        # Default: the length it was fine-tuned with, else 128, never past the model's positions.
        if sequence_length and sequence_length > config.max_position_embeddings:
            # Refused here, where the length is chosen: the model itself would fail deep inside
            # Keras ("Dimensions must be equal") at its first batch.
            raise ValueError(
                f"sequence_length {sequence_length} exceeds the model's max_position_embeddings "
                f"{config.max_position_embeddings}; pass sequence_length="
                f"{config.max_position_embeddings} or less"
            )
        length = sequence_length or kbert.config.sequence_length(
            None, config.max_position_embeddings, trained=trained_length
        )
        return cls(vocab, lower, length)

    def call(self, inputs):
        if isinstance(inputs, (tuple, list)):
            texts, texts_b = inputs if len(inputs) == 2 else (inputs[0], None)
        else:
            texts, texts_b = inputs, None
        texts = tf.convert_to_tensor(texts, tf.string)
        scalar = texts.shape.rank == 0
        if scalar:
            texts = texts[None]
            texts_b = None if texts_b is None else tf.convert_to_tensor(texts_b, tf.string)[None]
        out, _ = self.pack(texts, texts_b)
        return {k: v[0] for k, v in out.items()} if scalar else out

    def pack(self, texts, texts_b=None):
        """Texts [batch] (and second texts [batch], "" for none) -> (the three inputs, truncated),
        `truncated` a bool [batch]: True where the original's packing cut tokens.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, truncated = pre.pack(tf.constant(["Is it?", "Yes."]))
        >>> features["input_ids"].numpy().tolist(), truncated.numpy().tolist()
        ([[101, 2003, 2009, 1029, 102], [101, 2748, 1012, 102, 0]], [False, False])
        """
        a = self.tokenizer(tf.convert_to_tensor(texts, tf.string))
        b = None if texts_b is None else self.tokenizer(tf.convert_to_tensor(texts_b, tf.string))
        features = pack_token_ids(a, b, self.sequence_length, self.cls_id, self.sep_id)
        return features, truncated_rows(a, b, self.sequence_length)

    def pack_words(self, words):
        """Words to tag, a string RaggedTensor [batch, (words)] -> (the three inputs, each word's
        first-piece position, truncated), as `pack_word_pieces` packs them: each word is
        tokenized on its own.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=8)
        >>> features, starts, truncated = pre.pack_words(tf.ragged.constant([["Peter", "is", "unaffable"]]))
        >>> features["input_ids"].numpy().tolist(), starts.to_list(), truncated.numpy().tolist()
        ([[101, 2848, 2003, 14477, 20961, 3468, 102, 0]], [[1, 2, 3]], [False])
        """
        if self.unk_id is None:  # the packing needs it for a word with no pieces
            require_tokens(self.vocab_file, {}, UNK)
        pieces = tf.RaggedTensor.from_row_lengths(self.tokenizer(words.flat_values), words.row_lengths())
        return pack_word_pieces(pieces, self.sequence_length, self.cls_id, self.sep_id, self.unk_id)

    def pack_windows(self, texts, stride):
        """Texts [batch] -> (the three inputs of each window, the windows' starts), as
        `pack_token_windows` packs documents longer than the window.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, starts = pre.pack_windows(tf.constant(["Is it here?", "Yes."]), stride=2)
        >>> features["input_ids"].numpy().tolist(), starts.to_list()
        ([[101, 2003, 2009, 2182, 102], [101, 2182, 1029, 102, 0], [101, 2748, 1012, 102, 0]], [[0, 2], [0]])
        """
        tokens = self.tokenizer(tf.convert_to_tensor(texts, tf.string))
        return pack_token_windows(tokens, self.sequence_length, stride, self.cls_id, self.sep_id)

    def pack_word_windows(self, words, stride):
        """Words to tag, a string RaggedTensor [batch, (words)] -> (the three inputs of each
        window, the windows' starts, each word's first piece in its sentence), as
        `pack_word_windows` packs them.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, starts, first = pre.pack_word_windows(tf.ragged.constant([["Peter", "is", "unaffable"]]), 2)
        >>> starts.to_list(), first.to_list()
        ([[0, 2]], [[0, 1, 2]])
        """
        if self.unk_id is None:
            require_tokens(self.vocab_file, {}, UNK)
        pieces = tf.RaggedTensor.from_row_lengths(self.tokenizer(words.flat_values), words.row_lengths())
        return pack_word_windows(pieces, self.sequence_length, stride, self.cls_id, self.sep_id, self.unk_id)

    # === The Packer's methods: a whole file's lists -> numpy, in batches run two at a time ===

    def encode(self, texts, texts_b=None):
        """A file's texts (and second texts, "" or None for none) -> (the three inputs, truncated),
        numpy, as `pack` packs them (a `kbert.text.packing.Packer`).

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, truncated = pre.encode(["Is it here?"], ["Yes."])
        >>> features["input_ids"].tolist(), truncated.tolist()
        ([[101, 2003, 102, 2748, 102]], [True])
        """
        columns = [_strings(texts)] if texts_b is None else [_strings(texts), _strings([b or "" for b in texts_b])]
        batches = _pack_batches(self.pack, columns, len(texts))
        features = _features([features for features, _ in batches], len(texts), self.sequence_length)
        return features, _truncated([cut for _, cut in batches])

    def encode_words(self, sentences):
        """A file's sentences of words -> (the three inputs, each word's first-piece position as
        `Rows`, truncated), numpy, as `pack_words` packs them.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, positions, truncated = pre.encode_words([["Peter", "is", "unaffable"]])
        >>> positions.to_list(), truncated.tolist()
        ([[1, 2, 3]], [True])
        """
        batches = _pack_batches(self.pack_words, [_word_strings(sentences)], len(sentences))
        features = _features([features for features, _, _ in batches], len(sentences), self.sequence_length)
        return features, _rows([positions for _, positions, _ in batches]), _truncated([cut for _, _, cut in batches])

    def encode_windows(self, texts, stride: int):
        """A file's texts of any length -> (the three inputs of each window, the windows' starts as
        `Rows`), numpy, as `pack_windows` packs them.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, starts = pre.encode_windows(["Is it here?", "Yes."], stride=2)
        >>> features["input_ids"].shape, starts.to_list()
        ((3, 5), [[0, 2], [0]])
        """
        batches = _pack_batches(lambda t: self.pack_windows(t, stride), [_strings(texts)], len(texts))
        features = _features([features for features, _ in batches], len(texts), self.sequence_length)
        return features, _rows([starts for _, starts in batches])

    def encode_word_windows(self, sentences, stride: int):
        """A file's sentences of words of any length -> (the three inputs of each window, the
        windows' starts, each word's first piece in its sentence; both as `Rows`), numpy, as
        `pack_word_windows` packs them.

        >>> pre = BertPreprocessor("tests/fixtures/vocab-uncased.txt", sequence_length=5)
        >>> features, starts, first = pre.encode_word_windows([["Peter", "is", "unaffable"]], 2)
        >>> starts.to_list(), first.to_list()
        ([[0, 2]], [[0, 1, 2]])
        """
        batches = _pack_batches(lambda s: self.pack_word_windows(s, stride), [_word_strings(sentences)], len(sentences))
        features = _features([b[0] for b in batches], len(sentences), self.sequence_length)
        return features, _rows([b[1] for b in batches]), _rows([b[2] for b in batches])

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_file=self.vocab_file, do_lower_case=self.do_lower_case, sequence_length=self.sequence_length
        )
        return config
