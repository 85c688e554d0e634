"""Fine-tuning features: examples read by `kbert.finetuning.readers` -> model inputs, as numpy arrays.

The packing is `kbert.text.graph_packer.BertPreprocessor`'s, the one every export runs in its
SavedModel: `encode_texts` packs as run_classifier.py's `convert_single_example`,
`encode_tagged` packs CoNLL words with each word's tag on its first WordPiece, and
`encode_choices` packs one sentence pair per (context, ending). A file is packed once (by the
graph packer in batches run in parallel) and kept as numpy arrays for `model.fit` and `predict`.

With `--long-text windows`, `encode_text_windows` and `encode_tagged_windows` pack each
document whole, as overlapping windows (`BertPreprocessor.pack_windows`, in the graph like the
rest), and say which window is which document's (`kbert.finetuning.windows.Windows`).

On Keras' JAX and PyTorch backends, where TensorFlow may be absent, the packer is a
`kbert.text.packing.PythonPreprocessor`: the same packing in Python and numpy, with the Python
tokenizer (the original's `FullTokenizer`), giving the same ids. Every function here takes either
(a `kbert.text.packing.Packer`) and calls the same methods on it: Python lists in, numpy out.
"""

from __future__ import annotations

import logging

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.finetuning.windows import Windows, containing_windows, max_context_windows
from kbert.runtime.errors import KbertError, option
from kbert.text.packing import Packer, Rows

_MAX_LISTED = 10  # tags named in an error message

log = logging.getLogger("kbert")


def log_truncated(path, truncated: int, total: int, max_seq_length: int, what: str = "examples"):
    """The one warning for texts cut to the sequence length, in every command's words (finetune,
    predict, evaluate): how many of how many, and the option that sets the length.

    >>> import io, logging
    >>> handler = logging.StreamHandler(stream := io.StringIO())
    >>> logging.getLogger("kbert").addHandler(handler)
    >>> log_truncated("test.tsv", 2, 10, 16)
    >>> logging.getLogger("kbert").removeHandler(handler)
    >>> stream.getvalue()
    'test.tsv: 2 of 10 examples longer than max_seq_length=16 were truncated\\n'
    """
    if truncated:
        log.warning(
            "%s: %d of %d %s longer than %s were truncated",
            path,
            truncated,
            total,
            what,
            option("max_seq_length", max_seq_length),
        )


def encode_texts(preprocessor: Packer, texts, texts_b=None) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for single texts or pairs, exactly as run_classifier.py builds them.

    "[CLS] a [SEP]" or "[CLS] a [SEP] b [SEP]", segment 0 for the first part and 1 for
    "b [SEP]", mask 1 on real tokens, zero padding. A pair that does not fit loses tokens
    from the end of its longer text, one at a time (`_truncate_seq_pair`); a single text
    keeps its first sequence_length - 2 tokens. An empty second text (or one with no tokens)
    makes a single-text example, as in the original.

    Args:
        preprocessor: kbert.text.packing.Packer (BertPreprocessor or PythonPreprocessor). Its
            vocabulary, casing and sequence_length.
        texts: list of str. The first texts.
        texts_b: list of str, or None. The second texts of pairs ("" or None for none).

    Returns:
        (features, truncated): a dict of int32 [N, sequence_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many examples lost tokens.

    Example:
    >>> from kbert.text.graph_packer import BertPreprocessor
    >>> from kbert.text.tokenizer import Tokenizer
    >>> vocab = "tests/fixtures/vocab-uncased.txt"
    >>> features, truncated = encode_texts(BertPreprocessor(vocab, sequence_length=8), ["Is it?"], ["Yes."])
    >>> Tokenizer(vocab).convert_ids_to_tokens(features["input_ids"][0])
    ['[CLS]', 'is', 'it', '?', '[SEP]', 'yes', '.', '[SEP]']
    >>> features["segment_ids"][0].tolist(), truncated
    ([0, 0, 0, 0, 0, 1, 1, 1], 0)
    >>> features, truncated = encode_texts(BertPreprocessor(vocab, sequence_length=4), ["Is it?"])
    >>> Tokenizer(vocab).convert_ids_to_tokens(features["input_ids"][0]), truncated
    (['[CLS]', 'is', 'it', '[SEP]'], 1)
    """
    n = len(texts)
    if texts_b is not None and len(texts_b) != n:
        raise ValueError(f"{n} texts but {len(texts_b)} texts_b")
    features, cut = preprocessor.encode(texts, texts_b)
    return features, int(np.count_nonzero(cut))


def _windows(features, starts: Rows) -> tuple[dict[str, np.ndarray], Windows]:
    """A file's windows, from their features and the windows' starts (each document's number of
    windows, and each window's start): features and `Windows`. A window's length is its mask
    less [CLS] and [SEP], and a document ends where its last window does."""
    counts, start = starts.lengths, starts.values.astype(np.int32)
    length = (features["input_mask"].sum(1) - 2).astype(np.int32)
    document = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    last = np.cumsum(counts) - 1
    return features, Windows(document, start, length, (start[last] + length[last]).astype(np.int32))


def encode_text_windows(preprocessor: Packer, texts, doc_stride: int) -> tuple[dict[str, np.ndarray], Windows]:
    """Model inputs for single texts of any length: each text whole, in overlapping windows.

    Each window is packed as a single text, "[CLS] window [SEP]", its windows of
    sequence_length - 2 tokens starting every `doc_stride` tokens, the last ending at the
    text's end (`kbert.text.graph_packer.window_starts`). A text that fits is one window,
    packed exactly as `encode_texts` packs it.

    Args:
        preprocessor: kbert.text.packing.Packer (BertPreprocessor or PythonPreprocessor).
        texts: list of str. One document each.
        doc_stride: int. Tokens between two windows' starts, less than sequence_length - 2
            (`kbert.finetuning.options.window_stride`).

    Returns:
        (features, windows): int32 [windows, sequence_length] arrays "input_ids",
        "input_mask" and "segment_ids", each document's windows together and in order; and
        which document each window is, where it starts and how long it is.

    Example:
    >>> from kbert.text.graph_packer import BertPreprocessor
    >>> from kbert.text.tokenizer import Tokenizer
    >>> vocab = "tests/fixtures/vocab-uncased.txt"
    >>> features, windows = encode_text_windows(BertPreprocessor(vocab, sequence_length=6),
    ...                                         ["One, two, three.", "Yes."], doc_stride=2)
    >>> [Tokenizer(vocab).convert_ids_to_tokens(ids) for ids in features["input_ids"]]  # doctest: +NORMALIZE_WHITESPACE
    [['[CLS]', 'one', ',', 'two', ',', '[SEP]'], ['[CLS]', 'two', ',', 'three', '.', '[SEP]'],
     ['[CLS]', 'yes', '.', '[SEP]', '[PAD]', '[PAD]']]
    >>> windows.document.tolist(), windows.start.tolist(), windows.length.tolist()
    ([0, 0, 1], [0, 2, 0], [4, 4, 2])
    """
    return _windows(*preprocessor.encode_windows(texts, doc_stride))


def _check_tags(words, tags, label_ids):
    if len(tags) != len(words):
        raise ValueError(f"{len(words)} sentences but {len(tags)} tag lists")
    for i, (sentence, sentence_tags) in enumerate(zip(words, tags)):
        if len(sentence_tags) != len(sentence):
            raise ValueError(f"sentence {i} has {len(sentence)} words but {len(sentence_tags)} tags")
    unseen = {t for sentence in tags for t in sentence if t not in label_ids}
    if unseen:
        listed = sorted(unseen)
        more = f" and {len(listed) - _MAX_LISTED} more" if len(listed) > _MAX_LISTED else ""
        known = ", ".join(sorted(label_ids)[:_MAX_LISTED])
        raise KbertError(
            f"tags {', '.join(listed[:_MAX_LISTED])}{more} were not in the "
            f"training data (the model knows {known}"
            f"{', ...' if len(label_ids) > _MAX_LISTED else ''}); evaluate "
            "with data tagged with the training set's tags"
        )


def encode_tagged(preprocessor: Packer, words, tags, label_ids: dict[str, int]):
    """Model inputs and per-token labels for tagging, each word's tag on its first WordPiece.

    Packed by `BertPreprocessor.pack_words`: "[CLS] pieces [SEP]" with segment 0, each word
    tokenized on its own, "[UNK]" for a word with no pieces, the pieces cut at
    sequence_length - 2; words whose first piece is cut off get position -1 and no label.

    Args:
        preprocessor: kbert.text.packing.Packer (BertPreprocessor or PythonPreprocessor).
        words: list of list of str. The words of each sentence.
        tags: list of list of str, or None. One tag per word; None for prediction.
        label_ids: dict of str to int. The tags the model was trained on, and their ids.

    Returns:
        (features, labels, word_positions, truncated): features as `encode_texts` returns
        them; labels, int32 [N, sequence_length], the tag id on each word's first piece and
        -1 everywhere else (all -1 when `tags` is None); per sentence, each word's first
        piece position (-1 for a cut word); and how many sentences lost pieces.

    Raises:
        KbertError: a tag is not in `label_ids`.

    Example:
    >>> from kbert.text.graph_packer import BertPreprocessor
    >>> from kbert.text.tokenizer import Tokenizer
    >>> vocab = "tests/fixtures/vocab-uncased.txt"
    >>> features, labels, positions, truncated = encode_tagged(
    ...     BertPreprocessor(vocab, sequence_length=8), [["Peter", "is", "unaffable"]], [["B-PER", "O", "O"]],
    ...     {"O": 0, "B-PER": 1})
    >>> Tokenizer(vocab).convert_ids_to_tokens(features["input_ids"][0])
    ['[CLS]', 'peter', 'is', 'una', '##ffa', '##ble', '[SEP]', '[PAD]']
    >>> labels[0].tolist(), positions, truncated
    ([-1, 1, 0, 0, -1, -1, -1, -1], [[1, 2, 3]], 0)
    """
    if tags is not None:
        _check_tags(words, tags, label_ids)
    n, length = len(words), preprocessor.sequence_length
    features, positions, cut = preprocessor.encode_words(words)
    first, positions, truncated = positions.values, positions.to_list(), int(np.count_nonzero(cut))
    labels = np.full((n, length), -1, np.int32)
    if tags is not None and n:
        rows = np.repeat(np.arange(n), [len(sentence) for sentence in words])
        ids = np.asarray([label_ids[tag] for sentence in tags for tag in sentence], np.int32)
        kept = first >= 0
        labels[rows[kept], first[kept]] = ids[kept]
    return features, labels, positions, truncated


def encode_tagged_windows(preprocessor: Packer, words, tags, label_ids: dict[str, int], doc_stride: int):
    """Model inputs and per-token labels for tagging documents of any length, in overlapping windows.

    The pieces are `encode_tagged`'s (each word tokenized on its own, "[UNK]" for a word with
    none), in windows as `encode_text_windows` makes them. In training, a word's tag sits on
    its first piece in every window that holds that piece; a window without it has no label
    for the word. For prediction, each word is read in the one window where its first piece
    has the most context (`kbert.finetuning.windows.max_context_windows`), so every word is
    tagged exactly once.

    Args:
        preprocessor: kbert.text.packing.Packer (BertPreprocessor or PythonPreprocessor).
        words: list of list of str. The words of each document.
        tags: list of list of str, or None. One tag per word; None for prediction.
        label_ids: dict of str to int. The tags the model was trained on, and their ids.
        doc_stride: int. Tokens between two windows' starts, less than sequence_length - 2.

    Returns:
        (features, labels, windows, (window, position)): features as `encode_text_windows`
        returns them; labels, int32 [windows, sequence_length], -1 where there is none;
        the windows; and for each word of the file, documents in order, the window it is read
        from and its first piece's position there.

    Raises:
        KbertError: a tag is not in `label_ids`.

    Example (windows of 3 pieces, stride 2: "peter is una", "una ##ffa ##ble"; "una" ends the
    first window and starts the second, a tie of contexts the first window wins):
    >>> from kbert.text.graph_packer import BertPreprocessor
    >>> vocab = "tests/fixtures/vocab-uncased.txt"
    >>> features, labels, windows, (window, position) = encode_tagged_windows(
    ...     BertPreprocessor(vocab, sequence_length=5), [["Peter", "is", "unaffable"]], [["B-PER", "O", "B-MISC"]],
    ...     {"O": 0, "B-PER": 1, "B-MISC": 2}, doc_stride=2)
    >>> labels.tolist()
    [[-1, 1, 0, 2, -1], [-1, 2, -1, -1, -1]]
    >>> window.tolist(), position.tolist()
    ([0, 0, 0], [1, 2, 3])
    """
    if tags is not None:
        _check_tags(words, tags, label_ids)
    n, length = len(words), preprocessor.sequence_length
    sizes = np.asarray([len(sentence) for sentence in words], np.int64)
    if not n:
        return _tagged_windows(None, words, sizes, tags, label_ids, length)
    features, starts, first = preprocessor.encode_word_windows(words, doc_stride)
    features, windows = _windows(features, starts)
    return _tagged_windows((features, windows, first.values.astype(np.int64)), words, sizes, tags, label_ids)


def _tagged_windows(packed, words, sizes, tags, label_ids, length=None):
    """`encode_tagged_windows`' result from the packed windows (features, windows, each word's
    first piece in its document), None for no documents."""
    if packed is None:
        empty = np.zeros(0, np.int64)
        return (
            {name: np.zeros((0, length), np.int32) for name in ENCODER_INPUTS},
            np.zeros((0, length), np.int32),
            Windows.from_starts([], [], 0),
            (empty, empty),
        )
    features, windows, first = packed
    length = features["input_ids"].shape[1]
    document = np.repeat(np.arange(len(words)), sizes)
    labels = np.full((len(windows.document), length), -1, np.int32)
    if tags is not None:
        ids = np.asarray([label_ids[tag] for sentence in tags for tag in sentence], np.int32)
        which, window = containing_windows(windows, document, first)
        labels[window, first[which] - windows.start[window] + 1] = ids[which]
    return features, labels, windows, max_context_windows(windows, document, first)


def encode_choices(preprocessor: Packer, contexts, endings) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for multiple choice: each (context, ending) pair packed as `encode_texts`
    packs a sentence pair, as the BERT paper fine-tuned on SWAG.

    Args:
        preprocessor: kbert.text.packing.Packer (BertPreprocessor or PythonPreprocessor).
        contexts: list of str. One context per question.
        endings: list of list of str. The endings of each question, the same number for all.

    Returns:
        (features, truncated): int32 [N, choices, sequence_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many pairs lost tokens.

    Example:
    >>> from kbert.text.graph_packer import BertPreprocessor
    >>> from kbert.text.tokenizer import Tokenizer
    >>> vocab = "tests/fixtures/vocab-uncased.txt"
    >>> features, truncated = encode_choices(
    ...     BertPreprocessor(vocab, sequence_length=10), ["A man sits."], [["He smiles.", "He flies."]])
    >>> features["input_ids"].shape, truncated
    ((1, 2, 10), 0)
    >>> Tokenizer(vocab).convert_ids_to_tokens(features["input_ids"][0, 1])
    ['[CLS]', 'a', 'man', 'sits', '.', '[SEP]', 'he', 'flies', '.', '[SEP]']
    """
    n = len(contexts)
    choices = len(endings[0]) if endings else 0
    if any(len(row) != choices for row in endings):
        raise KbertError("every question needs the same number of endings")
    flat, truncated = encode_texts(
        preprocessor, [c for c in contexts for _ in range(choices)], [e for row in endings for e in row]
    )
    return {k: v.reshape(n, choices, preprocessor.sequence_length) for k, v in flat.items()}, truncated
