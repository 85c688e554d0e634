"""kbert.backend.event_log: event files written without TensorFlow, read back by TensorFlow's own
reader and by TensorBoard's, which must see the same steps, tags and values."""

import math
import os

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kbert.backend.event_log import EventLog

STEPS = [(0, {"loss": 11.25}), (7, {"loss": 9.5, "mlm_accuracy": 0.125}), (300, {"loss": float("nan"), "lr": 1e-4})]


def _write(log_dir):
    with EventLog(log_dir) as log:
        for step, values in STEPS:
            log.scalars(step, values)
        log.scalars(5, {})  # nothing to log writes no event
    return log.path


def test_tensorflow_reads_every_event(tmp_path):
    path = _write(str(tmp_path))
    assert os.path.basename(path).startswith("events.out.tfevents.")
    events = list(tf.compat.v1.train.summary_iterator(path))  # checks each frame's CRCs
    assert events[0].file_version == "brain.Event:2"
    assert [e.step for e in events[1:]] == [0, 7, 300]
    read = [{v.tag: v.simple_value for v in e.summary.value} for e in events[1:]]
    for (_, want), got in zip(STEPS, read, strict=True):
        assert got.keys() == want.keys()
        for tag, value in want.items():
            # stored as float32, as tf.summary stores scalars
            assert got[tag] == np.float32(value) or (math.isnan(got[tag]) and math.isnan(value))
    assert all(abs(e.wall_time - events[0].wall_time) < 60 for e in events)


def test_tensorboard_shows_the_scalars(tmp_path):
    _write(str(tmp_path))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "lr", "mlm_accuracy"]
    assert [(e.step, e.value) for e in events.Scalars("loss")][:2] == [(0, 11.25), (7, 9.5)]
    assert [e.step for e in events.Scalars("lr")] == [300]
    assert events.Scalars("lr")[0].value == np.float32(1e-4)


def test_two_logs_in_one_folder_do_not_overwrite_each_other(tmp_path):
    first, second = _write(str(tmp_path)), _write(str(tmp_path))
    assert first != second and os.path.exists(first) and os.path.exists(second)
