"""Fine-tuning features: examples read by `kbert.finetuning.readers` -> model inputs, as numpy arrays.

The packing is `kbert.text.preprocessing.BertPreprocessor`'s, the one every export runs in its
SavedModel: `encode_texts` packs as run_classifier.py's `convert_single_example`,
`encode_tagged` packs CoNLL words with each word's tag on its first WordPiece, and
`encode_choices` packs one sentence pair per (context, ending). A file is packed once, in
batches run in parallel, and kept as numpy arrays for `model.fit` and `predict`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf

from kbert.errors import KbertError

# Examples per call of the packer: at most _BATCH, and the file split evenly between the two
# threads below. Larger calls are faster per example (each distinct word is tokenized once
# per call) up to about this size (benchmarked in docs/performance.md, "Fine-tuning inputs").
_BATCH = 25_000
_THREADS = 2
_MAX_LISTED = 10  # tags named in an error message


def _strings(values) -> tf.Tensor:
    """str -> a tf.string tensor; a lone surrogate (JSON's "\\ud800") goes in as the invalid
    UTF-8 a client would send, which the tokenizer drops, rather than failing the whole file."""
    try:
        return tf.constant(values, tf.string, shape=[len(values)])
    except UnicodeEncodeError:
        return tf.constant([v.encode("utf-8", "surrogatepass") for v in values], tf.string, shape=[len(values)])


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
    names = ("input_ids", "input_mask", "segment_ids")
    if not batches:
        return {name: np.zeros((n, length), np.int32) for name in names}
    return {name: np.concatenate([features[name].numpy() for features in batches]) for name in names}


def encode_texts(preprocessor, texts, texts_b=None) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for single texts or pairs, exactly as run_classifier.py builds them.

    "[CLS] a [SEP]" or "[CLS] a [SEP] b [SEP]", segment 0 for the first part and 1 for
    "b [SEP]", mask 1 on real tokens, zero padding. A pair that does not fit loses tokens
    from the end of its longer text, one at a time (`_truncate_seq_pair`); a single text
    keeps its first sequence_length - 2 tokens. An empty second text (or one with no tokens)
    makes a single-text example, as in the original.

    Args:
        preprocessor: kbert.text.preprocessing.BertPreprocessor. Its vocabulary, casing and
            sequence_length.
        texts: list of str. The first texts.
        texts_b: list of str, or None. The second texts of pairs ("" or None for none).

    Returns:
        (features, truncated): a dict of int32 [N, sequence_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many examples lost tokens.

    Example:
    >>> from kbert.text.preprocessing import BertPreprocessor
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
    columns = [_strings(texts)] if texts_b is None else [_strings(texts), _strings([b or "" for b in texts_b])]
    batches = _pack_batches(preprocessor.pack, columns, n)
    truncated = sum(int(np.count_nonzero(cut)) for _, cut in batches)
    return _features([features for features, _ in batches], n, preprocessor.sequence_length), truncated


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


def encode_tagged(preprocessor, words, tags, label_ids: dict[str, int]):
    """Model inputs and per-token labels for tagging, each word's tag on its first WordPiece.

    Packed by `BertPreprocessor.pack_words`: "[CLS] pieces [SEP]" with segment 0, each word
    tokenized on its own, "[UNK]" for a word with no pieces, the pieces cut at
    sequence_length - 2; words whose first piece is cut off get position -1 and no label.

    Args:
        preprocessor: kbert.text.preprocessing.BertPreprocessor.
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
    >>> from kbert.text.preprocessing import BertPreprocessor
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
    sentences = tf.RaggedTensor.from_row_lengths(
        _strings([word for sentence in words for word in sentence]),
        np.asarray([len(sentence) for sentence in words], np.int64),
    )
    batches = _pack_batches(preprocessor.pack_words, [sentences], n)
    features = _features([features for features, _, _ in batches], n, length)
    positions = [row for _, starts, _ in batches for row in starts.to_list()]
    truncated = sum(int(np.count_nonzero(cut)) for _, _, cut in batches)
    labels = np.full((n, length), -1, np.int32)
    if tags is not None and n:
        flat = np.concatenate([starts.flat_values.numpy() for _, starts, _ in batches])
        rows = np.repeat(np.arange(n), [len(sentence) for sentence in words])
        ids = np.asarray([label_ids[tag] for sentence in tags for tag in sentence], np.int32)
        kept = flat >= 0
        labels[rows[kept], flat[kept]] = ids[kept]
    return features, labels, positions, truncated


def encode_choices(preprocessor, contexts, endings) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for multiple choice: each (context, ending) pair packed as `encode_texts`
    packs a sentence pair, as the BERT paper fine-tuned on SWAG.

    Args:
        preprocessor: kbert.text.preprocessing.BertPreprocessor.
        contexts: list of str. One context per question.
        endings: list of list of str. The endings of each question, the same number for all.

    Returns:
        (features, truncated): int32 [N, choices, sequence_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many pairs lost tokens.

    Example:
    >>> from kbert.text.preprocessing import BertPreprocessor
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
