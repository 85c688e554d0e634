"""Reading create_pretraining_data.py's TFRecords with tf.data: sharded, interleaved, shuffled.

The input of TensorFlow's engine (`kbert.pretraining.tf_engine`), and its checks of the records
(the messages of `kbert.pretraining.record_checks`, which JAX and PyTorch runs check with).
"""

from __future__ import annotations

import tensorflow as tf

from kbert.pretraining.record_checks import (
    CHECKED_RECORDS,
    check_features,
    named,
    no_records,
    not_examples,
    other_shape,
    outside_vocabulary,
)
from kbert.pretraining.record_encoder import INPUT_KEYS, LABEL_KEYS
from kbert.runtime.errors import KbertError, op_error_text
from kbert.runtime.records import check_records_file


def feature_spec(max_seq_length: int, max_predictions_per_seq: int, keys=(INPUT_KEYS, LABEL_KEYS)):
    """The features run_pretraining.py's input_fn parses, with the same lengths and types (those
    of `keys`, the (features, labels) a run reads: masked-LM-only records hold fewer)."""
    seq, pred = max_seq_length, max_predictions_per_seq
    spec = {
        "input_ids": tf.io.FixedLenFeature([seq], tf.int64),
        "input_mask": tf.io.FixedLenFeature([seq], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([seq], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([pred], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    return {key: spec[key] for key in (*keys[0], *keys[1])}


def check_records(
    files,
    max_seq_length: int,
    max_predictions_per_seq: int,
    flag: str = "--data",
    vocab_size: int | None = None,
    objective=None,
):
    """`kbert.pretraining.record_checks.check_records` read by tf.data: the same checks and
    messages, and one more for a file TensorFlow cannot read as TFRecords."""
    for path in files:
        check_records_file(path, named(flag))
        try:
            first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
        except tf.errors.OpError as e:
            raise KbertError(
                f"{path}: not a readable TFRecord file (TensorFlow says: {op_error_text(e)}); "
                f"{named(flag)} takes the records kbert create-data (or create_pretraining_data.py) makes "
                f"from text: make them first"
            ) from None
        if first is None:
            raise no_records(path)
        try:
            example = tf.train.Example.FromString(first.numpy())
        except Exception:
            raise not_examples(path) from None
        features = example.features.feature
        check_features(path, set(features), objective)
        seq = len(features["input_ids"].int64_list.value)
        pred = len(features["masked_lm_positions"].int64_list.value)
        if (seq, pred) != (max_seq_length, max_predictions_per_seq):
            raise other_shape(path, seq, pred, max_seq_length, max_predictions_per_seq)
        if vocab_size is not None:
            _check_token_ids(path, vocab_size)


def _check_token_ids(path: str, vocab_size: int):
    """Raise a one-line `KbertError` naming the record and id if a token id of the first
    CHECKED_RECORDS records of `path` is outside [0, vocab_size)."""
    spec = {key: tf.io.VarLenFeature(tf.int64) for key in ("input_ids", "masked_lm_ids")}
    records = tf.data.TFRecordDataset(path).take(CHECKED_RECORDS)
    try:
        batches = list(records.batch(CHECKED_RECORDS).map(lambda r: tf.io.parse_example(r, spec)))
    except tf.errors.OpError:
        return  # a record whose checksum fails: the run names it where it meets it (tf_engine's corrupt_records)
    for record in batches:
        for key, ids in record.items():
            bad = tf.where((ids.values < 0) | (ids.values >= vocab_size))
            if bad.shape[0]:
                index = int(bad[0][0])
                row, value = int(ids.indices[index][0]), int(ids.values[index])
                raise outside_vocabulary(path, row, value, key, vocab_size)


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
    keys=(INPUT_KEYS, LABEL_KEYS),
):
    """(features, labels) batches of `batch_size` (per replica), from run_pretraining.py records.

    Training data repeats, is sharded per input pipeline (worker), interleaved over files and
    shuffled with a fixed seed, so `skip_batches` resumes at the same place in the stream. `keys`
    are the (features, labels) read (`feature_spec`).
    """
    spec = feature_spec(max_seq_length, max_predictions_per_seq, keys)
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
        features = {k: example[k] for k in keys[0]}
        labels = {k: example[k] for k in keys[1]}
        if "next_sentence_labels" in labels:
            labels["next_sentence_labels"] = tf.reshape(labels["next_sentence_labels"], [])
        return features, labels

    if skip_batches:  # skip raw records, before the cost of parsing them
        ds = ds.skip(skip_batches * batch_size)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE)
