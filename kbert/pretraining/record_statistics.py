"""What pretraining records hold, read back from the records with TensorFlow.

`compute_statistics` reads any writer's records (kbert's, the original script's, the Beam
pipeline's) and reports the shares create-data's own counts report, so two writers' outputs can
be compared. It is the one part of create-data that imports TensorFlow, and only when called, so
importing it does not load TensorFlow.
"""

from __future__ import annotations

import collections
import os

from kbert.errors import KbertError
from kbert.text.tokenizer import load_vocab


def compute_statistics(tfrecord_paths, vocab_file) -> dict:
    """What pretraining records hold, from the records themselves (any writer's).

    Args:
        tfrecord_paths: list of str. TFRecord files of pretraining Examples.
        vocab_file: str. The vocab.txt they were made with (for the id of [MASK]).

    Returns:
        dict: instances; mean_length (mean sum of input_mask); masked_share (mean of
        sum(masked_lm_weights) / sum(input_mask)); mask_token_share, kept_share, random_share
        (of all masked positions: the input id is [MASK], is the label, is another word);
        random_next_share (mean next_sentence_labels).

    Example:
    >>> import tempfile
    >>> from kbert.pretraining.create_data import create_pretraining_data
    >>> out = os.path.join(tempfile.mkdtemp(), "sample.tfrecord")
    >>> _ = create_pretraining_data(["tests/fixtures/sample_text.txt"],
    ...     "tests/fixtures/vocab-uncased.txt", out, dupe_factor=1, workers=1)
    >>> compute_statistics([out], "tests/fixtures/vocab-uncased.txt")["instances"]
    11
    """
    import numpy as np  # here, not at the top: see the module doc
    import tensorflow as tf

    paths = [os.fspath(p) for p in tfrecord_paths]
    mask_id = load_vocab(vocab_file)["[MASK]"]
    first = next(iter(tf.data.TFRecordDataset(paths[:1])), None)
    if first is None:
        raise KbertError(f"{paths[0]}: no records")
    example = tf.train.Example.FromString(first.numpy()).features.feature
    seq = len(example["input_ids"].int64_list.value)
    preds = len(example["masked_lm_ids"].int64_list.value)
    spec = {name: tf.io.FixedLenFeature([seq], tf.int64) for name in ("input_ids", "input_mask")}
    spec.update({name: tf.io.FixedLenFeature([preds], tf.int64) for name in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([preds], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    data = tf.data.TFRecordDataset(paths).batch(4096).map(lambda r: tf.io.parse_example(r, spec))
    sums = collections.Counter()
    for batch in data:
        b = {k: v.numpy() for k, v in batch.items()}
        length = b["input_mask"].sum(axis=1)
        weights = b["masked_lm_weights"] > 0
        inputs = np.take_along_axis(b["input_ids"], b["masked_lm_positions"], axis=1)
        is_mask = (inputs == mask_id) & weights
        is_kept = (inputs == b["masked_lm_ids"]) & weights & ~is_mask
        sums["instances"] += len(length)
        sums["tokens"] += int(length.sum())
        sums["masked_share"] += float((b["masked_lm_weights"].sum(axis=1) / length).sum())
        sums["masked"] += int(weights.sum())
        sums["mask_token"] += int(is_mask.sum())
        sums["kept"] += int(is_kept.sum())
        sums["random_next"] += int(b["next_sentence_labels"].sum())
    n, masked = max(sums["instances"], 1), max(sums["masked"], 1)
    return {
        "instances": sums["instances"],
        "mean_length": sums["tokens"] / n,
        "masked_share": sums["masked_share"] / n,
        "mask_token_share": sums["mask_token"] / masked,
        "kept_share": sums["kept"] / masked,
        "random_share": (sums["masked"] - sums["mask_token"] - sums["kept"]) / masked,
        "random_next_share": sums["random_next"] / n,
    }
