"""compute_statistics reads records with kbert.runtime.records (no TensorFlow) and gives what tf.data's
parse of the same records gives, to the last bit; damaged or mixed records are one line."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from conftest import FIXTURES, UNCASED_VOCAB
from kbert.pretraining.create_data import create_pretraining_data
from kbert.pretraining.record_statistics import compute_statistics
from kbert.runtime.errors import KbertError
from kbert.text.tokenizer import load_vocab


def _statistics_with_tf_data(paths, vocab_file) -> dict:
    """The statistics as tf.data reads the records: tf.io.parse_example over batches of 4096."""
    mask_id = load_vocab(vocab_file)["[MASK]"]
    example = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(paths[:1]))).numpy()).features.feature
    seq, preds = len(example["input_ids"].int64_list.value), len(example["masked_lm_ids"].int64_list.value)
    spec = {name: tf.io.FixedLenFeature([seq], tf.int64) for name in ("input_ids", "input_mask")}
    spec.update({name: tf.io.FixedLenFeature([preds], tf.int64) for name in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([preds], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    sums = collections.Counter()
    for batch in tf.data.TFRecordDataset(paths).batch(4096).map(lambda r: tf.io.parse_example(r, spec)):
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
    n, masked = sums["instances"], sums["masked"]
    return {
        "instances": n,
        "mean_length": sums["tokens"] / n,
        "masked_share": sums["masked_share"] / n,
        "mask_token_share": sums["mask_token"] / masked,
        "kept_share": sums["kept"] / masked,
        "random_share": (masked - sums["mask_token"] - sums["kept"]) / masked,
        "random_next_share": sums["random_next"] / n,
    }


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Two files of pretraining records, more than one batch of 4096 in all."""
    out = tmp_path_factory.mktemp("records") / "sample.tfrecord"
    result = create_pretraining_data(
        [f"{FIXTURES}/sample_text.txt"], UNCASED_VOCAB, out, dupe_factor=400, shards=2, workers=1
    )
    return [str(path) for path in result["output_files"]]


def test_statistics_are_tf_datas_to_the_bit(records):
    ours = compute_statistics(records, UNCASED_VOCAB)
    assert ours["instances"] > 4096
    assert ours == _statistics_with_tf_data(records, UNCASED_VOCAB)


def test_a_damaged_record_file_is_one_line(records, tmp_path):
    damaged = tmp_path / "damaged.tfrecord"
    data = bytearray(open(records[0], "rb").read())
    data[40] ^= 0xFF  # inside the first record
    damaged.write_bytes(bytes(data))
    with pytest.raises(KbertError, match=r"damaged.tfrecord: corrupted record at 12 \(a record's checksum fails\)"):
        compute_statistics([damaged], UNCASED_VOCAB)


def test_records_of_another_length_are_one_line(records, tmp_path):
    other = tmp_path / "other.tfrecord"
    create_pretraining_data(
        [f"{FIXTURES}/sample_text.txt"], UNCASED_VOCAB, other, dupe_factor=1, workers=1, max_seq_length=64
    )
    with pytest.raises(
        KbertError, match=r"other.tfrecord: the record at 0 has 64 values for input_ids where the first"
    ):
        compute_statistics([records[0], other], UNCASED_VOCAB)
