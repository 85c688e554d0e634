"""Reading create_pretraining_data.py's TFRecords with tf.data: sharded, interleaved, shuffled.

The input of TensorFlow's engine (`kbert.pretraining.tf_engine`). The records are checked before a
run by `kbert.pretraining.record_checks`, on every backend alike; `find_corrupt_record` names the
file of a record whose checksum fails mid-run.
"""

from __future__ import annotations

import tensorflow as tf

from kbert.pretraining.record_encoder import INPUT_KEYS, LABEL_KEYS
from kbert.runtime.errors import op_error_text


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
