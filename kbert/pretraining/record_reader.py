"""Pretraining records read without TensorFlow: TFRecord frames, tf.train.Example, numpy batches.

The reading half of `record_encoder`: on a machine with JAX or PyTorch and no TensorFlow,
`numpy_batches` gives the (features, labels) batches that `dataset.pretraining_dataset` gives
with tf.data -- the same keys, int32 ids, float32 weights -- from the records `kbert create-data`
(or create_pretraining_data.py) writes. Every frame's two checksums are checked (CRC32C in C,
google-crc32c), so a damaged file is one line naming it and the record's offset, in TensorFlow's
words. Examples are decoded from the protobuf wire format here (a few nested length-delimited
messages and packed varints), so neither TensorFlow nor protobuf is needed.

Example:
>>> import os, tempfile
>>> from kbert.pretraining.record_encoder import tfrecord_frames
>>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
>>> _ = open(path, "wb").write(tfrecord_frames([b"first", b"second"])[0])
>>> [(offset, data) for offset, data in read_frames(path)]
[(0, b'first'), (21, b'second')]
"""

from __future__ import annotations

import queue
import struct
import threading

import numpy as np

from kbert.errors import KbertError, os_error_or
from kbert.records import masked_crc

LABEL_KEYS = ("masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
FLOAT_KEYS = ("masked_lm_weights",)

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


def _corrupt(path, what: str, offset: int, why: str) -> KbertError:
    return KbertError(
        f"{path}: {what} record at {offset} ({why}); make the file again (kbert create-data) or copy it again"
    )


def read_frames(path, chunk_size: int = 1 << 22):
    """(offset, record bytes) for each record of the TFRecord file `path`, both checksums checked.

    A bad checksum or a file that ends inside a record raises a one-line `KbertError` naming the
    file and the offset, as TensorFlow's reader words it ("corrupted record at 12").
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise os_error_or(
            e, f"{path}: cannot be read ({e.strerror or e}); pass TFRecord files from kbert create-data"
        ) from None
    with f:
        buffer, start, offset = b"", 0, 0  # buffer holds the file from `offset - start`
        while True:
            if len(buffer) - start < _HEADER.size:
                buffer, start = buffer[start:] + f.read(chunk_size), 0
                if len(buffer) == 0:
                    return
                if len(buffer) < _HEADER.size:
                    raise _corrupt(path, "truncated", offset, "the file ends inside it")
            length, length_crc = _HEADER.unpack_from(buffer, start)
            if masked_crc(buffer[start : start + 8]) != length_crc:
                raise _corrupt(path, "corrupted", offset, "a record's checksum fails")
            end = start + _HEADER.size + length + 4
            while len(buffer) < end:
                more = f.read(max(chunk_size, end - len(buffer)))
                if not more:
                    raise _corrupt(path, "truncated", offset, "the file ends inside it")
                buffer, end, start = buffer[start:] + more, end - start, 0
            data = buffer[start + _HEADER.size : end - 4]
            if masked_crc(data) != _CRC.unpack_from(buffer, end - 4)[0]:
                raise _corrupt(path, "corrupted", offset + _HEADER.size, "a record's checksum fails")
            yield offset, data
            offset += end - start
            start = end


# --- tf.train.Example from the wire format ---
# Example{1: Features}; Features{1: repeated map entry {1: key, 2: Feature}};
# Feature{1: BytesList | 2: FloatList | 3: Int64List}; each list {1: repeated value}, packed
# (one length-delimited field) or not (one field per value). Wire types: 0 varint, 1 fixed64,
# 2 length-delimited, 5 fixed32.


def _varint(data, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(data):
    """(field number, wire type, value) of a message: ints for varints, bytes otherwise."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"wire type {wire}")
        if pos > end:
            raise ValueError("a field runs past its message")
        yield key >> 3, wire, value


def _packed_varints(data: bytes) -> np.ndarray:
    """Packed varints as int64, decoded with numpy (each value's 7-bit groups summed)."""
    raw = np.frombuffer(data, np.uint8)
    if not (raw >= 0x80).any():  # every value below 128: one byte each
        return raw.astype(np.int64)
    if raw[-1] >= 0x80:
        raise ValueError("a varint runs past its field")
    ends = np.flatnonzero(raw < 0x80)
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    within = np.arange(len(raw)) - starts.repeat(ends - starts + 1)
    groups = (raw & 0x7F).astype(np.uint64) << (7 * within).astype(np.uint64)
    return np.add.reduceat(groups, starts).view(np.int64)  # two's complement, as int64 is sent


def _values(feature: bytes):
    """A Feature's values: an int64 or float32 array, or a list of bytes."""
    for kind, _, values in _fields(feature):
        if kind == 1:  # BytesList
            return [v for _, _, v in _fields(values)]
        ints, floats = [], []
        for number, wire, value in _fields(values):
            if number != 1:
                continue
            if kind == 3:
                ints.append(_packed_varints(value) if wire == 2 else np.array([value], np.uint64).view(np.int64))
            else:
                floats.append(np.frombuffer(value, "<f4"))
        parts = ints if kind == 3 else floats
        dtype = np.int64 if kind == 3 else np.float32
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
    return np.zeros(0, np.int64)  # an empty Feature: no list set


def parse_example(data: bytes) -> dict:
    """A serialized tf.train.Example as {name: values}: int64 or float32 arrays, lists of bytes.

    Example:
    >>> from kbert.pretraining.record_encoder import ExampleBytes
    >>> record = ExampleBytes(8, 2, 100).record([b"\\x65", b"\\x07", b"\\x66"], 1, [1], [b"\\x09"], True)
    >>> example = parse_example(record)
    >>> example["input_ids"].tolist(), example["masked_lm_weights"].tolist()
    ([101, 7, 102, 0, 0, 0, 0, 0], [1.0, 0.0])
    """
    example = {}
    for number, wire, features in _fields(data):
        if number != 1 or wire != 2:
            continue
        for entry_number, _, entry in _fields(features):
            if entry_number != 1:
                continue
            key, feature = None, b""
            for field, _, value in _fields(entry):
                if field == 1:
                    key = bytes(value).decode()
                elif field == 2:
                    feature = value
            example[key] = _values(feature)
    return example


def pretraining_example(data: bytes, path, offset: int, max_seq_length: int, max_predictions_per_seq: int):
    """One record as dataset.pretraining_dataset parses it: (features, labels) of numpy values,
    the int64 features as int32; a record without a feature or with another length is one line."""
    try:
        example = parse_example(data)
    except (ValueError, IndexError, UnicodeDecodeError):
        raise KbertError(
            f"{path}: the record at {offset} is not a tf.train.Example; recreate the file with kbert create-data"
        ) from None
    lengths = dict.fromkeys(("input_ids", "input_mask", "segment_ids"), max_seq_length)
    lengths.update(masked_lm_positions=max_predictions_per_seq, masked_lm_ids=max_predictions_per_seq)
    lengths.update(masked_lm_weights=max_predictions_per_seq, next_sentence_labels=1)
    out = {}
    for key, length in lengths.items():
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
    out["next_sentence_labels"] = out["next_sentence_labels"][0]
    return {k: out[k] for k in INPUT_KEYS}, {k: out[k] for k in LABEL_KEYS}


def _records(files, training: bool, seed: int, shard: tuple[int, int]):
    """(path, offset, bytes) in the order dataset.pretraining_dataset reads them: the files of
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


def _example_stream(files, training, seed, shard, skip, max_seq_length, max_predictions_per_seq):
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
            yield pretraining_example(record[2], record[0], record[1], max_seq_length, max_predictions_per_seq)
        rng.shuffle(buffer)
        records = buffer
    for path, offset, data in records:
        if skip:
            skip -= 1
            continue
        yield pretraining_example(data, path, offset, max_seq_length, max_predictions_per_seq)


def _stack(examples):
    features = {k: np.stack([f[k] for f, _ in examples]) for k in INPUT_KEYS}
    labels = {k: np.stack([lab[k] for _, lab in examples]) for k in LABEL_KEYS}
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
):
    """(features, labels) numpy batches from run_pretraining.py records, without TensorFlow.

    The same dicts as `dataset.pretraining_dataset` (int32 ids, float32 masked_lm_weights,
    next_sentence_labels of shape [batch]). Training data repeats, each pass over the files in a
    seeded order, through a 4096-record shuffle buffer, and drops a last partial batch; `shard`
    is (this input pipeline, how many). Batches are made in a background thread, up to
    `prefetch` ahead, so an accelerator does not wait for the parsing.

    Example:
    >>> import os, tempfile
    >>> from kbert.pretraining.record_encoder import ExampleBytes, tfrecord_frames
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
                files, training, seed, shard, skip_batches * batch_size, max_seq_length, max_predictions_per_seq
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
