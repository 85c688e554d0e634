"""TFRecord files checked in pure Python, before TensorFlow reads them.

A TFRecord file is a sequence of frames: the record's length (uint64, little-endian), the
masked CRC32C of those 8 bytes, the record, and the record's masked CRC32C. Walking the
frames' headers tells a truncated file, a text file or any other file from a records file,
and names it, where TensorFlow would stop mid-training with a DataLossError.
"""

from __future__ import annotations

import os
import struct

import google_crc32c

from kbert.errors import KbertError

_HEADER = 12  # the length and its CRC
_FOOTER = 4  # the record's CRC


def masked_crc(data: bytes) -> int:
    """The CRC32C TFRecord stores: rotated right by 15 bits, plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


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
    kbert.errors.KbertError: ...data.tfrecord: truncated TFRecord file (its record 2 ends past the file's end, at byte 43 of 40); make the records again, or leave this file out
    """
    name = f"{flag} {path}".strip()
    size = os.path.getsize(path)
    if size == 0:
        raise KbertError(f"{name}: the file is empty; pass TFRecord files from kbert create-data")
    count, offset = 0, 0
    with open(path, "rb") as f:
        while offset < size:
            header = f.read(_HEADER)
            if len(header) < _HEADER:
                raise KbertError(
                    f"{name}: truncated TFRecord file (it ends inside the header of record "
                    f"{count + 1}); make the records again, or leave this file out"
                )
            length, crc = struct.unpack("<QI", header)
            if masked_crc(header[:8]) != crc:
                what = "not a TFRecord file" if count == 0 else f"corrupt TFRecord file (record {count + 1})"
                raise KbertError(
                    f"{name}: {what}; pass TFRecord files from kbert create-data or create_pretraining_data.py"
                )
            offset += _HEADER + length + _FOOTER
            count += 1
            if offset > size:
                raise KbertError(
                    f"{name}: truncated TFRecord file (its record {count} ends past the file's end, "
                    f"at byte {offset} of {size}); make the records again, or leave this file out"
                )
            f.seek(offset)
    return count
