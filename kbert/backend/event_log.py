"""TensorBoard event files written in pure Python, for training on any Keras backend.

TensorBoard reads `events.out.tfevents.*` files: TFRecord frames (`kbert.runtime.records`
frames them, CRC32C and all) around serialized `Event` protos. Training loops that run without
TensorFlow write their scalars here, and TensorBoard shows them as it shows `tf.summary` scalars.

The protos are encoded by hand, as kbert encodes its pretraining records: an Event is
`{1: double wall_time, 2: int64 step, 3: string file_version | 5: Summary summary}`, a Summary is
`{1: repeated Value}`, a Value is `{1: string tag, 2: float simple_value}`.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time

from kbert.runtime.records import encode_varint, tfrecord_frames

_files = itertools.count()  # tells apart two logs opened in the same second by one process


def _length_delimited(field: int, payload: bytes) -> bytes:
    return encode_varint(field << 3 | 2) + encode_varint(len(payload)) + payload


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    # wall_time is field 1 as a little-endian double (wire type 1), step field 2 as a varint.
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + encode_varint(step) + body


def _summary(values: dict) -> bytes:
    entries = b"".join(
        _length_delimited(1, _length_delimited(1, str(tag).encode()) + b"\x15" + struct.pack("<f", float(value)))
        for tag, value in values.items()
    )
    return _length_delimited(5, entries)


class EventLog:
    """A TensorBoard event file of scalars, in `log_dir`, written without TensorFlow.

    Each `scalars` call appends one event and flushes it, so TensorBoard (and a run stopped by a
    signal) sees every step logged so far.

    Args:
        log_dir: str. The folder to write `events.out.tfevents.*` in; made if missing.

    Example:
    >>> import tempfile
    >>> from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    >>> log_dir = tempfile.mkdtemp()
    >>> log = EventLog(log_dir)
    >>> log.scalars(10, {"loss": 2.5, "mlm_accuracy": 0.25})
    >>> log.close()
    >>> events = EventAccumulator(log_dir)
    >>> _ = events.Reload()
    >>> [(e.step, e.value) for e in events.Scalars("loss")]
    [(10, 2.5)]
    """

    def __init__(self, log_dir: str):
        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_files)}.v2"
        self.path = os.path.join(log_dir, name)
        self._file = open(self.path, "wb")
        self._write(_event(time.time(), 0, _length_delimited(3, b"brain.Event:2")))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Append one event holding `values` (tag -> number) at `step`. NaN and inf are kept:
        TensorBoard draws them, and a diverged loss should show."""
        if not values:
            return
        if step < 0:
            raise ValueError(f"step must be 0 or more, not {step}")
        self._write(_event(time.time(), int(step), _summary(values)))

    def _write(self, event: bytes) -> None:
        frames, _ = tfrecord_frames([event])
        self._file.write(frames)
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
