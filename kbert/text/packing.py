"""Texts -> the encoder's three inputs as numpy arrays, in Python: run_classifier.py's packing.

`pack_texts` packs as google-research/bert's `convert_single_example` does: `[CLS] a [SEP]`, or
`[CLS] a [SEP] b [SEP]` with segment id 1 on b and its `[SEP]`; a pair too long loses tokens from
the end of its longer text, one at a time (`_truncate_seq_pair`), a single text its last tokens;
then zeros up to the sequence length. It needs no TensorFlow, so its arrays feed `model.fit` and
`predict` on every Keras backend. (`kbert.BertPreprocessor` packs the same way in the graph, for
tf.data pipelines and exports.)
"""

from __future__ import annotations

import numpy as np

from kbert.errors import KbertError

INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")


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
    out = {name: np.zeros((len(texts), sequence_length), np.int32) for name in INPUT_NAMES}
    for row, text in enumerate(texts):
        a = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))
        b = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(texts_b[row])) if texts_b and texts_b[row] else []
        if b:
            _truncate_pair(a, b, sequence_length - 3)
            ids, segments = [cls, *a, sep, *b, sep], [0] * (len(a) + 2) + [1] * (len(b) + 1)
        else:
            ids = [cls, *a[: sequence_length - 2], sep]
            segments = [0] * len(ids)
        out["input_ids"][row, : len(ids)] = ids
        out["input_mask"][row, : len(ids)] = 1
        out["segment_ids"][row, : len(ids)] = segments
    return out


def _truncate_pair(a: list, b: list, budget: int):
    # run_classifier._truncate_seq_pair: a token at a time from the longer list (b on a tie),
    # so that a short text keeps all its tokens.
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()
