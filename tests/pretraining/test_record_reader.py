"""The TensorFlow-free records reader against TensorFlow's own reading of `kbert create-data`'s
records: every feature of every record equal, damaged files named in one line."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, UNCASED_VOCAB, run_kbert
from kbert.pretraining.record_reader import numpy_batches
from kbert.pretraining.tf_dataset import feature_spec
from kbert.runtime.errors import KbertError
from kbert.runtime.records import parse_example, read_frames

SEQ, PREDS = 64, 10


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    for shard_count in (1, 3):
        run_kbert(
            "create-data",
            "--input",
            os.path.join(FIXTURES, "sample_text.txt"),
            "--vocab",
            UNCASED_VOCAB,
            "--output",
            out / f"data{shard_count}.tfrecord",
            "--max-seq-length",
            str(SEQ),
            "--max-predictions-per-seq",
            str(PREDS),
            "--dupe-factor",
            "2",
            "--shards",
            str(shard_count),
            "--workers",
            "1",
        )
    return out


def tf_examples(path):
    import tensorflow as tf

    spec = feature_spec(SEQ, PREDS)
    return [
        {k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()} for r in tf.data.TFRecordDataset(path)
    ]


def test_every_feature_of_every_record_is_tensorflows(records):
    path = records / "data1.tfrecord"
    want = tf_examples(path)
    got = [parse_example(data) for _, data in read_frames(path, chunk_size=1000)]  # frames across chunk ends
    assert len(got) == len(want) > 20
    for ours, theirs in zip(got, want):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            assert ours[key].dtype == value.dtype, key
            np.testing.assert_array_equal(ours[key], value, err_msg=key)


def test_batches_hold_every_record_once_as_the_tf_pipeline_types_them(records):
    from kbert.pretraining.tf_dataset import pretraining_dataset

    files = sorted(str(p) for p in records.glob("data3.tfrecord-*"))
    assert len(files) == 3
    tf_batch = next(iter(pretraining_dataset(files, 4, SEQ, PREDS, training=False)))
    want = sorted(tuple(row) for f in files for row in (e["input_ids"] for e in tf_examples(f)))
    batches = list(numpy_batches(files, 4, SEQ, PREDS, training=False))
    for ours, theirs in zip(batches[0], tf_batch):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            assert (ours[key].dtype, ours[key].shape) == (value.dtype.as_numpy_dtype, tuple(value.shape)), key
    got = sorted(tuple(row) for features, _ in batches for row in features["input_ids"])
    assert got == want
    # Two input pipelines over three files: each reads its own files, together all of them.
    halves = [list(numpy_batches(files, 1, SEQ, PREDS, training=False, shard=(i, 2))) for i in range(2)]
    both = sorted(tuple(f["input_ids"][0]) for half in halves for f, _ in half)
    assert both == want and all(halves)


def test_training_batches_repeat_shuffled_and_the_same_for_a_seed(records):
    files = sorted(str(p) for p in records.glob("data3.tfrecord-*"))
    total = sum(1 for f in files for _ in read_frames(f))

    def first(n, seed):
        batches = numpy_batches(files, 8, SEQ, PREDS, seed=seed)
        return np.concatenate([next(batches)[0]["input_ids"] for _ in range(n)])

    a, b, other = first(total // 8 + 3, 1), first(total // 8 + 3, 1), first(total // 8 + 3, 2)
    assert len(a) > total  # it repeats past one pass
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, other)
    in_order = np.concatenate([f["input_ids"] for f, _ in numpy_batches(files, 8, SEQ, PREDS, training=False)])
    assert not np.array_equal(a[: len(in_order)], in_order)


def test_a_flipped_byte_is_one_line_naming_the_file_and_offset(records, tmp_path):
    data = bytearray((records / "data1.tfrecord").read_bytes())
    second = 12 + int.from_bytes(data[:8], "little") + 4
    data[second + 12 + 30] ^= 0x40
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    with pytest.raises(KbertError) as raised:
        list(numpy_batches([str(bad)], 2, SEQ, PREDS, training=False))
    message = str(raised.value)
    assert message == (
        f"{bad}: corrupted record at {second + 12} (a record's checksum fails); make the file again "
        f"(kbert create-data) or copy it again"
    )
    assert "\n" not in message
    # TensorFlow names the same offset.
    import tensorflow as tf

    with pytest.raises(tf.errors.DataLossError, match=f"corrupted record at {second + 12}"):
        list(tf.data.TFRecordDataset(str(bad)))


def test_a_truncated_file_is_one_line(records, tmp_path):
    data = (records / "data1.tfrecord").read_bytes()
    bad = tmp_path / "cut.tfrecord"
    bad.write_bytes(data[:-7])
    last = [offset for offset, _ in read_frames(records / "data1.tfrecord")][-1]
    with pytest.raises(KbertError) as raised:
        list(numpy_batches([str(bad)], 2, SEQ, PREDS, training=False))
    assert str(raised.value) == (
        f"{bad}: truncated record at {last} (the file ends inside it); make the file again "
        f"(kbert create-data) or copy it again"
    )


def test_records_of_another_shape_are_one_line(records):
    with pytest.raises(
        KbertError, match=r"the record at 0 has 64 int64 values for input_ids \(expected 128 int64\); these"
    ):
        next(numpy_batches([str(records / "data1.tfrecord")], 2, 128, PREDS, training=False))


def test_it_imports_no_tensorflow(records):
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from kbert.pretraining.record_reader import numpy_batches\n"
        f"features, labels = next(numpy_batches([{str(records / 'data1.tfrecord')!r}], 2, {SEQ}, {PREDS}))\n"
        "assert features['input_ids'].shape == (2, 64)\n"
        "assert not [m for m in sys.modules if m.startswith('tensorflow') and sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("data", [b"\x0f", b"\x80", b"\x0a\xff\xff\xff\xff\x0f", b"plain text, not a proto"])
def test_a_frame_that_is_not_an_example_is_one_line(tmp_path, data):
    from kbert.runtime.records import tfrecord_frames

    path = tmp_path / "other.tfrecord"
    path.write_bytes(tfrecord_frames([data])[0])
    with pytest.raises(
        KbertError, match=r"other.tfrecord: the record at 0 (is not a tf.train.Example|lacks input_ids)"
    ):
        next(numpy_batches([str(path)], 1, SEQ, PREDS, training=False))


def test_a_missing_or_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(KbertError, match="missing.tfrecord") as raised:
        next(numpy_batches([str(tmp_path / "missing.tfrecord")], 1, SEQ, PREDS))
    assert "\n" not in str(raised.value)
