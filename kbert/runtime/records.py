"""TFRecord files without TensorFlow: their frames, their checks, and tf.train.Example's bytes.

A TFRecord file is a sequence of frames: the record's length (uint64, little-endian), the
masked CRC32C of those 8 bytes, the record, and the record's masked CRC32C (CRC32C in C,
google-crc32c). `tfrecord_frames` writes them, `read_frames` reads them with both checksums
checked, and `check_records_file` walks the frames' headers to tell a truncated file, a text file
or any other file from a records file, and names it, where TensorFlow would stop mid-training
with a DataLossError.

Records are protobuf messages (tf.train.Example, TensorBoard's Event) in the wire format, which
is a few nested length-delimited fields and varints: `encode_varint` and `decode_varint` are its
numbers, and `parse_example` decodes an Example, so neither TensorFlow nor protobuf is needed.

Example:
>>> import tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
>>> _ = open(path, "wb").write(tfrecord_frames([b"first", b"second"])[0])
>>> [(offset, data) for offset, data in read_frames(path)]
[(0, b'first'), (21, b'second')]
"""

from __future__ import annotations

import array
import os
import struct

import google_crc32c

from kbert.runtime.errors import KbertError, os_error_or

_HEADER = struct.Struct("<QI")  # the length and its CRC
_CRC = struct.Struct("<I")  # the record's CRC, after it


def masked_crc(data: bytes) -> int:
    """The CRC32C TFRecord stores: rotated right by 15 bits, plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frames(records) -> tuple[bytes, array.array]:
    """The records framed as a TFRecord file holds them, joined, and each frame's length.

    A frame is the record's length (uint64), its masked CRC32C, the record, the record's masked
    CRC32C: frames joined in any order, or files of them concatenated, are TFRecord files.

    Example:
    >>> import tempfile, tensorflow as tf
    >>> frames, lengths = tfrecord_frames([b"first", b"second"])
    >>> list(lengths)
    [21, 22]
    >>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
    >>> _ = open(path, "wb").write(frames)
    >>> [r.numpy() for r in tf.data.TFRecordDataset(path)]
    [b'first', b'second']
    """
    pack_length, pack_crc = struct.Struct("<Q").pack, _CRC.pack
    parts = []
    for record in records:
        length = pack_length(len(record))
        parts += (length, pack_crc(masked_crc(length)), record, pack_crc(masked_crc(record)))
    return b"".join(parts), array.array("Q", (len(r) + _HEADER.size + _CRC.size for r in records))


def check_records_file(path, flag: str = "") -> int:
    """Raise a one-line `KbertError` naming `path` unless it is a whole TFRecord file; return
    how many records it holds. Reads each frame's 12-byte header and skips over the record,
    so it costs one seek per record, not a read of the data.

    Example:
    >>> import tempfile, tensorflow as tf
    >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
    >>> with tf.io.TFRecordWriter(path) as writer:
    ...     writer.write(b"first"); writer.write(b"second")
    >>> check_records_file(path)
    2
    >>> os.truncate(path, 40)
    >>> check_records_file(path)
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: ...data.tfrecord: truncated TFRecord file (its record 2 ends past the file's end, at byte 43 of 40); make the records again, or leave this file out
    """
    name = f"{flag} {path}".strip()
    size = os.path.getsize(path)
    if size == 0:
        raise KbertError(f"{name}: the file is empty; pass TFRecord files from kbert create-data")
    count, offset = 0, 0
    with open(path, "rb") as f:
        while offset < size:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise KbertError(
                    f"{name}: truncated TFRecord file (it ends inside the header of record "
                    f"{count + 1}); make the records again, or leave this file out"
                )
            length, crc = _HEADER.unpack(header)
            if masked_crc(header[:8]) != crc:
                what = "not a TFRecord file" if count == 0 else f"corrupt TFRecord file (record {count + 1})"
                raise KbertError(
                    f"{name}: {what}; pass TFRecord files from kbert create-data or create_pretraining_data.py"
                )
            offset += _HEADER.size + length + _CRC.size
            count += 1
            if offset > size:
                raise KbertError(
                    f"{name}: truncated TFRecord file (its record {count} ends past the file's end, "
                    f"at byte {offset} of {size}); make the records again, or leave this file out"
                )
            f.seek(offset)
    return count


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
            end = start + _HEADER.size + length + _CRC.size
            while len(buffer) < end:
                more = f.read(max(chunk_size, end - len(buffer)))
                if not more:
                    raise _corrupt(path, "truncated", offset, "the file ends inside it")
                buffer, end, start = buffer[start:] + more, end - start, 0
            data = buffer[start + _HEADER.size : end - _CRC.size]
            if masked_crc(data) != _CRC.unpack_from(buffer, end - _CRC.size)[0]:
                raise _corrupt(path, "corrupted", offset + _HEADER.size, "a record's checksum fails")
            yield offset, data
            offset += end - start
            start = end


# --- the protobuf wire format ---
# Example{1: Features}; Features{1: repeated map entry {1: key, 2: Feature}};
# Feature{1: BytesList | 2: FloatList | 3: Int64List}; each list {1: repeated value}, packed
# (one length-delimited field) or not (one field per value). Wire types: 0 varint, 1 fixed64,
# 2 length-delimited, 5 fixed32. numpy is imported where values are decoded, not above: create-data's
# workers frame their records with this module and start faster without it.


def encode_varint(value: int) -> bytes:
    """A non-negative int as a protobuf varint: 7 bits a byte, low bits first.

    >>> encode_varint(1), encode_varint(300)
    (b'\\x01', b'\\xac\\x02')
    """
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(data, pos: int) -> tuple[int, int]:
    """The varint that starts at `data[pos]`, and the position after it.

    >>> decode_varint(b"\\x00\\xac\\x02", 1)
    (300, 3)
    """
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
        key, pos = decode_varint(data, pos)
        wire = key & 7
        if wire == 0:
            value, pos = decode_varint(data, pos)
        elif wire == 2:
            size, pos = decode_varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"wire type {wire}")
        if pos > end:
            raise ValueError("a field runs past its message")
        yield key >> 3, wire, value


def _packed_varints(data: bytes):
    """Packed varints as int64, decoded with numpy (each value's 7-bit groups summed)."""
    import numpy as np

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
    import numpy as np

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

    Raises:
        ValueError: `data` is not an Example's bytes.

    Example:
    >>> import tensorflow as tf
    >>> record = tf.train.Example(features=tf.train.Features(feature={
    ...     "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[101, 7, -1])),
    ...     "weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 0.5]))})).SerializeToString()
    >>> example = parse_example(record)
    >>> example["ids"].tolist(), example["weights"].tolist()
    ([101, 7, -1], [1.0, 0.5])
    >>> parse_example(b"\\x0a\\x05")
    Traceback (most recent call last):
    ...
    ValueError: not a tf.train.Example (a field runs past its message)
    """
    try:
        return _example(data)
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"not a tf.train.Example ({e})") from None


def _example(data: bytes) -> dict:
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
