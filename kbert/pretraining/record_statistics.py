"""What pretraining records hold, read back from the records.

`compute_statistics` reads any writer's records (kbert's, the original script's, the Beam
pipeline's) and reports the shares create-data's own counts report, so two writers' outputs can
be compared: BERT's records, and masked-LM-only ones (no next_sentence_labels; a tokenizer.json's). The records are read by `kbert.runtime.records`, without TensorFlow, every frame's
checksums checked.
"""

from __future__ import annotations

import collections
import os

import numpy as np

from kbert.pretraining.record_kinds import is_tokenizer_json
from kbert.runtime.errors import KbertError
from kbert.runtime.records import parse_example, read_frames
from kbert.text.tokenizer import load_vocab

_KEYS = ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
_BATCH = 4096  # records summed at a time: the float sums add up in the same order whatever the file size


def compute_statistics(tfrecord_paths, vocab_file) -> dict:
    """What pretraining records hold, from the records themselves (any writer's).

    Args:
        tfrecord_paths: list of str. TFRecord files of pretraining Examples.
        vocab_file: str. The vocab.txt, or tokenizer.json, they were made with (for the mask token's id).

    Returns:
        dict: instances; mean_length (mean sum of input_mask); masked_share (mean of
        sum(masked_lm_weights) / sum(input_mask)); mask_token_share, kept_share, random_share
        (of all masked positions: the input id is the mask token, is the label, is another word);
        random_next_share (mean next_sentence_labels; records without them have none).

    Example:
    >>> import tempfile
    >>> from kbert.pretraining.create_data import create_pretraining_data
    >>> out = os.path.join(tempfile.mkdtemp(), "sample.tfrecord")
    >>> _ = create_pretraining_data(["tests/fixtures/sample_text.txt"],
    ...     "tests/fixtures/vocab-uncased.txt", out, dupe_factor=1, workers=1)
    >>> compute_statistics([out], "tests/fixtures/vocab-uncased.txt")["instances"]
    11
    """
    paths = [os.fspath(p) for p in tfrecord_paths]
    mask_id = _mask_id(os.fspath(vocab_file))
    first = next(read_frames(paths[0]), None)
    if first is None:
        raise KbertError(f"{paths[0]}: no records")
    example = _example(paths[0], *first)
    # Masked-LM-only records have no next_sentence_labels; any other missing key: _batches says so.
    keys = _KEYS if "next_sentence_labels" in example else _KEYS[:-1]
    lengths = {name: len(example.get(name, ())) for name in keys}
    sums = collections.Counter()
    for batch in _batches(paths, lengths):
        length = batch["input_mask"].sum(axis=1)
        weights = batch["masked_lm_weights"] > 0
        inputs = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], axis=1)
        is_mask = (inputs == mask_id) & weights
        is_kept = (inputs == batch["masked_lm_ids"]) & weights & ~is_mask
        sums["instances"] += len(length)
        sums["tokens"] += int(length.sum())
        sums["masked_share"] += float((batch["masked_lm_weights"].sum(axis=1) / length).sum())
        sums["masked"] += int(weights.sum())
        sums["mask_token"] += int(is_mask.sum())
        sums["kept"] += int(is_kept.sum())
        if "next_sentence_labels" in batch:
            sums["random_next"] += int(batch["next_sentence_labels"].sum())
    n, masked = max(sums["instances"], 1), max(sums["masked"], 1)
    result = {
        "instances": sums["instances"],
        "mean_length": sums["tokens"] / n,
        "masked_share": sums["masked_share"] / n,
        "mask_token_share": sums["mask_token"] / masked,
        "kept_share": sums["kept"] / masked,
        "random_share": (sums["masked"] - sums["mask_token"] - sums["kept"]) / masked,
    }
    if "next_sentence_labels" in lengths:
        result["random_next_share"] = sums["random_next"] / n
    return result


def _mask_id(vocab_file: str) -> int:
    if is_tokenizer_json(vocab_file):
        from kbert.modernbert.tokenizer import BpeTokenizer
        from kbert.pretraining.mlm_instances import mask_token_id

        return mask_token_id(BpeTokenizer(vocab_file))
    return load_vocab(vocab_file)["[MASK]"]


def _example(path, offset: int, data: bytes) -> dict:
    """A record's Example, or a one-line error naming the file and the record."""
    try:
        return parse_example(data)
    except ValueError:
        raise KbertError(
            f"{path}: the record at {offset} is not a tf.train.Example; pass pretraining records"
        ) from None


def _batches(paths, lengths: dict):
    """The records' features, _BATCH records at a time: {name: [records, length]} numpy arrays,
    int64 or float32 as stored. Every record must have the first record's lengths."""
    rows = {name: [] for name in lengths}
    for path in paths:
        for offset, data in read_frames(path):
            example = _example(path, offset, data)
            for name, length in lengths.items():
                values = example.get(name)
                if values is None or len(values) != length:
                    found = "lacks" if values is None else f"has {len(values)} values for"
                    raise KbertError(
                        f"{path}: the record at {offset} {found} {name} where the first record has {length}; "
                        "pass records made with one max_seq_length and max_predictions_per_seq"
                    )
                rows[name].append(values)
            if len(rows["input_ids"]) == _BATCH:
                yield {name: np.stack(values) for name, values in rows.items()}
                rows = {name: [] for name in lengths}
    if rows["input_ids"]:
        yield {name: np.stack(values) for name, values in rows.items()}
