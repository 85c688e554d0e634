"""Reading create_pretraining_data.py's TFRecords with tf.data: sharded, interleaved, shuffled.

`find_files` and `check_records` also serve JAX and PyTorch runs, which read the records with
`record_reader` and import no TensorFlow.
"""

from __future__ import annotations

import glob
import logging
import os

import keras

from kbert.errors import KbertError, on_command_line, op_error_text, option
from kbert.pretraining.record_encoder import INPUT_KEYS, LABEL_KEYS
from kbert.records import check_records_file

if keras.config.backend() == "tensorflow":
    import tensorflow as tf


def feature_spec(max_seq_length: int, max_predictions_per_seq: int):
    """The features run_pretraining.py's input_fn parses, with the same lengths and types."""
    seq, pred = max_seq_length, max_predictions_per_seq
    return {
        "input_ids": tf.io.FixedLenFeature([seq], tf.int64),
        "input_mask": tf.io.FixedLenFeature([seq], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([seq], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([pred], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _named(flag: str) -> str:
    """`--data` or `--eval-data` as the caller names it: the flag, or `pretrain`'s argument (data, eval_data)."""
    return option(flag.lstrip("-").replace("-", "_"), flag=flag)


def find_files(pattern: str, flag: str = "--data") -> list[str]:
    """The record files a --data glob names (comma-separated globs allowed), sorted."""
    files = sorted({f for part in pattern.split(",") if part for f in glob.glob(part)})
    files = [f for f in files if os.path.isfile(f)]
    empty = [f for f in files if os.path.getsize(f) == 0]
    if empty and len(empty) < len(files):  # skipped, as create_pretraining_data.py skips empty input
        for path in empty:
            logging.getLogger("kbert").warning(f"{_named(flag)} {path}: the file is empty; skipped")
        files = [f for f in files if f not in empty]
    if not files:
        raise KbertError(
            f"{_named(flag)} {pattern!r} matches no files; make records with `kbert create-data` "
            f"and pass their path or a glob such as 'data/*.tfrecord'"
        )
    return files


# Records of each file whose token ids check_records compares with the vocabulary: enough to
# catch records made with another vocab.txt, which shows in the first records already.
CHECKED_RECORDS = 256


def check_records(
    files, max_seq_length: int, max_predictions_per_seq: int, flag: str = "--data", vocab_size: int | None = None
):
    """Walk every file's record framing to its end (`kbert.records.check_records_file`: the
    headers only), then read the first record of each: a cut-short, corrupt or wrongly sized
    file is named here, before anything is written, rather than failing deep inside tf.data
    after the run has started. With `vocab_size`, the token ids of each file's first
    CHECKED_RECORDS records must lie in the vocabulary (made with another vocab.txt, they
    would fail in a gather mid-run on a CPU, and read zeros unnoticed on a GPU)."""
    if keras.config.backend() != "tensorflow":
        return _check_records_without_tensorflow(files, max_seq_length, max_predictions_per_seq, flag, vocab_size)
    for path in files:
        check_records_file(path, _named(flag))
        try:
            first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
        except tf.errors.OpError as e:
            raise KbertError(
                f"{path}: not a readable TFRecord file (TensorFlow says: {op_error_text(e)}); "
                f"{_named(flag)} takes the records kbert create-data (or create_pretraining_data.py) makes "
                f"from text: make them first"
            ) from None
        if first is None:
            raise KbertError(f"{path}: holds no records; recreate it with kbert create-data")
        try:
            example = tf.train.Example.FromString(first.numpy())
        except Exception:
            raise KbertError(
                f"{path}: its records are not tf.train.Example protos; recreate it with kbert create-data"
            ) from None
        features = example.features.feature
        missing = [k for k in INPUT_KEYS + LABEL_KEYS if k not in features]
        if missing:
            raise _not_pretraining_records(path, missing)
        seq = len(features["input_ids"].int64_list.value)
        pred = len(features["masked_lm_positions"].int64_list.value)
        if (seq, pred) != (max_seq_length, max_predictions_per_seq):
            raise _other_shape(path, seq, pred, max_seq_length, max_predictions_per_seq)
        if vocab_size is not None:
            _check_token_ids(path, vocab_size)


def _check_records_without_tensorflow(files, max_seq_length, max_predictions_per_seq, flag, vocab_size):
    """`check_records` by kbert's own record reader (CRC-checked): the same checks and messages."""
    from kbert.records import parse_example, read_frames

    for path in files:
        check_records_file(path, _named(flag))
        checked = 0
        for _, record in read_frames(path):
            try:
                example = parse_example(record)
            except (ValueError, IndexError, UnicodeDecodeError):
                raise KbertError(
                    f"{path}: its records are not tf.train.Example protos; recreate it with kbert create-data"
                ) from None
            if checked == 0:
                missing = [k for k in INPUT_KEYS + LABEL_KEYS if k not in example]
                if missing:
                    raise _not_pretraining_records(path, missing)
                seq, pred = len(example["input_ids"]), len(example["masked_lm_positions"])
                if (seq, pred) != (max_seq_length, max_predictions_per_seq):
                    raise _other_shape(path, seq, pred, max_seq_length, max_predictions_per_seq)
            checked += 1
            if vocab_size is not None:
                for key in ("input_ids", "masked_lm_ids"):
                    bad = ((example[key] < 0) | (example[key] >= vocab_size)).nonzero()[0]
                    if len(bad):
                        raise _outside_vocabulary(path, checked - 1, int(example[key][bad[0]]), key, vocab_size)
            if vocab_size is None or checked == CHECKED_RECORDS:
                break
        if checked == 0:
            raise KbertError(f"{path}: holds no records; recreate it with kbert create-data")


def _not_pretraining_records(path, missing) -> KbertError:
    return KbertError(
        f"{path}: records lack {', '.join(missing)}; these are not pretraining records (make them with kbert create-data)"
    )


def _other_shape(path, seq, pred, max_seq_length, max_predictions_per_seq) -> KbertError:
    return KbertError(
        f"{path}: records have max_seq_length {seq} and max_predictions_per_seq "
        f"{pred}, but {'the flags say' if on_command_line() else 'the call says'} {max_seq_length} and "
        f"{max_predictions_per_seq}; pass {option('max_seq_length', seq)} "
        f"{option('max_predictions_per_seq', pred)}"
    )


def _outside_vocabulary(path, row, value, key, vocab_size) -> KbertError:
    return KbertError(
        f"{path}: record {row + 1} holds token id {value} ({key}), outside the model's "
        f"vocabulary of {vocab_size:,} (ids 0 to {vocab_size - 1:,}); the records were made "
        f"with another vocab.txt: make them again with the model's (`kbert create-data --vocab`)"
    )


def _check_token_ids(path: str, vocab_size: int):
    """Raise a one-line `KbertError` naming the record and id if a token id of the first
    CHECKED_RECORDS records of `path` is outside [0, vocab_size)."""
    spec = {key: tf.io.VarLenFeature(tf.int64) for key in ("input_ids", "masked_lm_ids")}
    records = tf.data.TFRecordDataset(path).take(CHECKED_RECORDS)
    try:
        batches = list(records.batch(CHECKED_RECORDS).map(lambda r: tf.io.parse_example(r, spec)))
    except tf.errors.OpError:
        return  # a record whose checksum fails: the run names it where it meets it (train._corrupt_records)
    for record in batches:
        for key, ids in record.items():
            bad = tf.where((ids.values < 0) | (ids.values >= vocab_size))
            if bad.shape[0]:
                index = int(bad[0][0])
                row, value = int(ids.indices[index][0]), int(ids.values[index])
                raise _outside_vocabulary(path, row, value, key, vocab_size)


def find_corrupt_record(files) -> str | None:
    """Read every record of `files` with their checksums; the first error, naming its file.

    Slow (it reads all the data): only for the message of a run that met a corrupt record.
    """
    for path in files:
        try:
            for _ in tf.data.TFRecordDataset(path, buffer_size=1 << 22).batch(65536):
                pass
        except tf.errors.OpError as e:
            return f"{path}: {op_error_text(e)}"
    return None


def pretraining_dataset(
    files,
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    training: bool = True,
    seed: int = 12345,
    input_context=None,
    skip_batches: int = 0,
):
    """(features, labels) batches of `batch_size` (per replica), from run_pretraining.py records.

    Training data repeats, is sharded per input pipeline (worker), interleaved over files and
    shuffled with a fixed seed, so `skip_batches` resumes at the same place in the stream.
    """
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    ds = tf.data.Dataset.from_tensor_slices(list(files))
    shards = input_context.num_input_pipelines if input_context else 1
    index = input_context.input_pipeline_id if input_context else 0
    shard_files = len(files) >= shards
    if shard_files and shards > 1:
        ds = ds.shard(shards, index)
    if training:
        ds = ds.repeat().shuffle(len(files), seed=seed)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(4, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if not shard_files and shards > 1:
        ds = ds.shard(shards, index)  # fewer files than workers: split the records instead
    if training:
        ds = ds.shuffle(4096, seed=seed)

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        example = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in example.items()}
        features = {k: example[k] for k in INPUT_KEYS}
        labels = {k: example[k] for k in LABEL_KEYS}
        labels["next_sentence_labels"] = tf.reshape(labels["next_sentence_labels"], [])
        return features, labels

    if skip_batches:  # skip raw records, before the cost of parsing them
        ds = ds.skip(skip_batches * batch_size)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE)
