"""The TensorFlow ops `kbert.text.windows` runs its window arithmetic on when given tensors.

`kbert.text.windows` writes run_squad.py's windows once, over a namespace of array ops: numpy's
for arrays, and `GRAPH_OPS` for tensors, eagerly or inside a tf.function (the graph packer's
windows, and the max-context windows an export serves). It is imported only when a tensor is
seen, so the numpy path never loads TensorFlow.

Example:
>>> int(GRAPH_OPS.max_or_zero(tf.constant([3, 7])))
7
"""

from __future__ import annotations

import types

import tensorflow as tf


def _ragged_range(low, high):
    """(values, rows): the ranges low[i]..high[i] - 1 one after the other, and each value's i."""
    ranges = tf.ragged.range(tf.cast(low, tf.int32), tf.cast(high, tf.int32))
    return ranges.flat_values, tf.cast(ranges.value_rowids(), tf.int32)


GRAPH_OPS = types.SimpleNamespace(
    ints=lambda x: tf.cast(x, tf.int32),
    wide=lambda x: tf.cast(x, tf.int64),
    float64=lambda x: tf.cast(x, tf.float64),
    minimum=tf.minimum,
    maximum=tf.maximum,
    where=tf.where,
    take=tf.gather,
    size=lambda x: tf.size(x),
    max_or_zero=lambda x: tf.maximum(tf.reduce_max(x), 0),
    searchsorted=lambda a, v: tf.searchsorted(a, v, side="right"),
    ragged_range=_ragged_range,
    segment_max=tf.math.unsorted_segment_max,
    segment_min=tf.math.unsorted_segment_min,
    int_max=tf.int32.max,
)
