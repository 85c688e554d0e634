"""The pretraining records' reader: files that are not whole records fail before training, in
one line, and leave nothing behind."""

import os

import numpy as np
import pytest

from conftest import TINY, assert_user_error, run_kbert
from kbert.pretraining.record_checks import CHECKED_RECORDS

SHAPE = ["--max-seq-length", "32", "--max-predictions-per-seq", "5"]


def write_records(path, n, seed=0):
    """`n` pretraining examples with create_pretraining_data.py's features, written by TensorFlow."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(n):
            features = {
                "input_ids": ints(rng.integers(5, 300, 32)),
                "input_mask": ints([1] * 32),
                "segment_ids": ints([0] * 16 + [1] * 16),
                "masked_lm_positions": ints(rng.integers(1, 32, 5)),
                "masked_lm_ids": ints(rng.integers(5, 300, 5)),
                "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * 5)),
                "next_sentence_labels": ints([rng.integers(0, 2)]),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


def pretrain(model_dir, data, *extra):
    return run_kbert(
        "pretrain",
        "--model-dir",
        model_dir,
        "--data",
        data,
        "--config",
        os.path.join(TINY, "bert_config.json"),
        "--vocab",
        os.path.join(TINY, "vocab.txt"),
        *SHAPE,
        "--batch-size",
        "4",
        "--steps",
        "2",
        *extra,
        check=False,
    )


def test_a_binary_file_as_data_is_one_whole_line(tmp_path):
    data = tmp_path / "some_random_bytes.bin"
    data.write_bytes(os.urandom(20000))
    result = pretrain(tmp_path / "bert", data)
    assert_user_error(result, f"--data {data}: not a TFRecord file")
    assert "function_node" not in result.stderr
    assert not (tmp_path / "bert").exists()


@pytest.mark.parametrize("flag", ["--data", "--eval-data"])
def test_a_truncated_records_file_is_named_before_anything_is_written(tmp_path, flag):
    whole = write_records(tmp_path / "whole.tfrecord", 20)
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(whole.read_bytes()[:1000])  # its first records read; the run would fail at the cut
    data, eval_data = (cut, whole) if flag == "--data" else (whole, cut)
    result = pretrain(tmp_path / "bert", data, "--eval-data", eval_data)
    assert_user_error(result, f"{flag} {cut}: truncated TFRecord file")
    assert not (tmp_path / "bert").exists()


def test_a_corrupt_record_met_mid_run_is_named_and_a_new_run_leaves_nothing(tmp_path):
    # Past the records checked before the run: the run meets it, in its first batches.
    data = write_records(tmp_path / "data.tfrecord", CHECKED_RECORDS + 20)
    raw = bytearray(data.read_bytes())
    raw[-10] ^= 0xFF  # inside the last record's data: its framing is whole, its checksum fails
    data.write_bytes(bytes(raw))
    result = pretrain(tmp_path / "bert", data)
    assert_user_error(
        result, f"{data}: corrupted record at", "make the file again", "no checkpoint was saved", alone=False
    )
    assert not (tmp_path / "bert").exists()


def test_a_corrupt_record_among_the_first_is_refused_before_the_run(tmp_path):
    data = write_records(tmp_path / "data.tfrecord", 20)
    raw = bytearray(data.read_bytes())
    raw[-10] ^= 0xFF
    data.write_bytes(bytes(raw))
    result = pretrain(tmp_path / "bert", data)
    assert_user_error(result, f"{data}: corrupted record at", "make the file again")
    assert not (tmp_path / "bert").exists()
