"""Pretraining records read without TensorFlow: numpy batches of their examples.

The reading half of `record_encoder`: on a machine with JAX or PyTorch and no TensorFlow,
`numpy_batches` gives the (features, labels) batches that `tf_dataset.pretraining_dataset` gives
with tf.data -- the same keys, int32 ids, float32 weights -- from the records `kbert create-data`
(or create_pretraining_data.py) writes. The frames and the Examples are `kbert.runtime.records`': every
frame's two checksums are checked, so a damaged file is one line naming it and the record's
offset, in TensorFlow's words.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.pretraining.record_encoder import INPUT_KEYS, LABEL_KEYS
from kbert.runtime.errors import KbertError
from kbert.runtime.records import parse_example, read_frames

FLOAT_KEYS = ("masked_lm_weights",)


def pretraining_example(
    data: bytes, path, offset: int, max_seq_length: int, max_predictions_per_seq: int, keys=(INPUT_KEYS, LABEL_KEYS)
):
    """One record as tf_dataset.pretraining_dataset parses it: (features, labels) of numpy values,
    the int64 features as int32; a record without a feature or with another length is one line.
    `keys` are the (features, labels) the run reads: BERT's records' (the default), or
    masked-LM-only records' (`record_encoder.MLM_INPUT_KEYS`, `MLM_LABEL_KEYS`)."""
    try:
        example = parse_example(data)
    except ValueError:
        raise KbertError(
            f"{path}: the record at {offset} is not a tf.train.Example; recreate the file with kbert create-data"
        ) from None
    input_keys, label_keys = keys
    lengths = dict.fromkeys(ENCODER_INPUTS, max_seq_length)
    lengths.update(masked_lm_positions=max_predictions_per_seq, masked_lm_ids=max_predictions_per_seq)
    lengths.update(masked_lm_weights=max_predictions_per_seq, next_sentence_labels=1)
    out = {}
    for key in (*input_keys, *label_keys):
        length = lengths[key]
        values = example.get(key)
        want = np.float32 if key in FLOAT_KEYS else np.int64
        if not isinstance(values, np.ndarray) or values.dtype != want or len(values) != length:
            kind = getattr(values, "dtype", "bytes")
            found = "lacks" if values is None else f"has {len(values)} {kind} values for"
            raise KbertError(
                f"{path}: the record at {offset} {found} {key} (expected {length} {np.dtype(want)}); these are not "
                f"pretraining records of max_seq_length {max_seq_length} and max_predictions_per_seq "
                f"{max_predictions_per_seq} (make them with kbert create-data)"
            )
        out[key] = values if key in FLOAT_KEYS else values.astype(np.int32)
    if "next_sentence_labels" in out:
        out["next_sentence_labels"] = out["next_sentence_labels"][0]
    return {k: out[k] for k in input_keys}, {k: out[k] for k in label_keys}


def _records(files, training: bool, seed: int, shard: tuple[int, int]):
    """(path, offset, bytes) in the order tf_dataset.pretraining_dataset reads them: the files of
    this shard (all of them when there are fewer files than shards), the files
    reshuffled each pass while training, interleaved one record at a time from up to four open
    files."""
    index, count = shard
    files = list(files)
    shard_files = len(files) >= count
    if shard_files and count > 1:
        files = files[index::count]
    rng = np.random.default_rng(seed)

    def file_order():
        while True:
            order = list(rng.permutation(len(files))) if training else list(range(len(files)))
            yield from (files[i] for i in order)
            if not training:
                return

    pending = file_order()
    readers = []
    for path in pending:
        readers.append((path, read_frames(path)))
        if len(readers) == min(4, len(files)):
            break
    position = 0
    while readers:
        position %= len(readers)
        path, reader = readers[position]
        item = next(reader, None)
        if item is None:  # this file is done: the next in order takes its place in the cycle
            following = next(pending, None)
            if following is None:
                readers.pop(position)
            else:
                readers[position] = (following, read_frames(following))
            continue
        yield path, *item
        position += 1


def _example_stream(files, training, seed, shard, skip, max_seq_length, max_predictions_per_seq, keys):
    index, count = shard
    records = _records(files, training, seed, shard)
    if count > len(files):  # fewer files than shards: each takes every count-th record instead
        records = (record for i, record in enumerate(records) if i % count == index)
    if training:  # a shuffle buffer of 4096 records, as the tf.data pipeline's
        rng, buffer = np.random.default_rng(seed + 1), []
        for record in records:
            if len(buffer) < 4096:
                buffer.append(record)
                continue
            i = int(rng.integers(len(buffer)))
            buffer[i], record = record, buffer[i]
            if skip:
                skip -= 1
                continue
            yield pretraining_example(record[2], record[0], record[1], max_seq_length, max_predictions_per_seq, keys)
        rng.shuffle(buffer)
        records = buffer
    for path, offset, data in records:
        if skip:
            skip -= 1
            continue
        yield pretraining_example(data, path, offset, max_seq_length, max_predictions_per_seq, keys)


def _stack(examples):
    features = {k: np.stack([f[k] for f, _ in examples]) for k in examples[0][0]}
    labels = {k: np.stack([lab[k] for _, lab in examples]) for k in examples[0][1]}
    return features, labels


def numpy_batches(
    files,
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    training: bool = True,
    seed: int = 12345,
    shard: tuple[int, int] = (0, 1),
    skip_batches: int = 0,
    prefetch: int = 8,
    keys=(INPUT_KEYS, LABEL_KEYS),
):
    """(features, labels) numpy batches from run_pretraining.py records, without TensorFlow.

    The same dicts as `tf_dataset.pretraining_dataset` (int32 ids, float32 masked_lm_weights,
    next_sentence_labels of shape [batch]); `keys` are the (features, labels) read, as
    `pretraining_example` takes them. Training data repeats, each pass over the files in a
    seeded order, through a 4096-record shuffle buffer, and drops a last partial batch; `shard`
    is (this input pipeline, how many). Batches are made in a background thread, up to
    `prefetch` ahead, so an accelerator does not wait for the parsing.

    Example:
    >>> import os, tempfile
    >>> from kbert.pretraining.record_encoder import ExampleBytes
    >>> from kbert.runtime.records import tfrecord_frames
    >>> encoder = ExampleBytes(8, 2, 100)
    >>> records = [encoder.record([b"\\x65", bytes([n]), b"\\x66"], 1, [1], [b"\\x09"], n % 2 == 1) for n in range(5)]
    >>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
    >>> _ = open(path, "wb").write(tfrecord_frames(records)[0])
    >>> batches = list(numpy_batches([path], 2, 8, 2, training=False))
    >>> [(f["input_ids"].shape, f["input_ids"].dtype.name, l["next_sentence_labels"].tolist()) for f, l in batches]
    [((2, 8), 'int32', [0, 1]), ((2, 8), 'int32', [0, 1]), ((1, 8), 'int32', [0])]
    """
    stop = threading.Event()
    batches = queue.Queue(maxsize=max(1, prefetch))
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            examples = _example_stream(
                files, training, seed, shard, skip_batches * batch_size, max_seq_length, max_predictions_per_seq, keys
            )
            batch = []
            for example in examples:
                batch.append(example)
                if len(batch) == batch_size:
                    if not put(_stack(batch)):
                        return
                    batch = []
            if batch and not training:
                put(_stack(batch))
            put(done)
        except BaseException as e:  # raised again in the reading thread
            put(e)

    thread = threading.Thread(target=produce, name="kbert-records", daemon=True)
    thread.start()
    try:
        while True:
            item = batches.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
