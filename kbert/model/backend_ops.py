"""The few ops the model runs in a backend's own form, chosen here once for the Keras backend in use.

The layers are `keras.ops` throughout and give the same numbers on TensorFlow, JAX and PyTorch.
On TensorFlow, three ops take a faster TensorFlow form, and training runs through
`kbert.model.fused`'s XLA kernels (`fused`; None on the other backends, where the layers train
through the plain ops):

- `take_positions`: tf.gather with batch_dims, whose gradient is much cheaper than
  take_along_axis' with equal results (docs/performance.md, "Figures behind the code's comments");
- `matmul_transposed`: transpose_b reads the [vocab, H] word-embedding table as it is stored,
  where a transpose would copy all its rows every step, and its gradient once more (XLA folds the
  transpose into the product on JAX, and PyTorch's is a view);
- `empty`: `tf.raw_ops.Empty`, memory left as it was, for weights a loader assigns next.

Example:
>>> import numpy as np
>>> x = np.arange(12, dtype="float32").reshape(1, 4, 3)
>>> keras.ops.convert_to_numpy(take_positions(x, np.array([[2, 0]], "int32"))).tolist()
[[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]]
>>> keras.ops.convert_to_numpy(matmul_transposed(np.ones((1, 3), "float32"), x[0])).tolist()
[[3.0, 12.0, 21.0, 30.0]]
"""

from __future__ import annotations

import keras
from keras import ops


def take_positions(x, positions):
    """x[b, positions[b, p]] for every b and p: [batch, seq, H] and int [batch, P] -> [batch, P, H]."""
    return ops.take_along_axis(x, ops.expand_dims(ops.cast(positions, "int32"), -1), axis=1)


def matmul_transposed(a, b):
    """a · bᵀ for 2-D a [n, k] and b [m, k]."""
    return ops.matmul(a, ops.transpose(b))


def empty(shape, dtype=None):
    """A tensor of `shape` whose values are whatever the memory held (zeros where a backend has no such op)."""
    return ops.empty(shape, dtype=dtype or "float32")


fused = None

if keras.config.backend() == "tensorflow":
    import tensorflow as tf

    from kbert.model import fused  # noqa: F401 (the layers import it from here)

    def take_positions(x, positions):
        return tf.gather(x, ops.cast(positions, "int32"), batch_dims=1)

    def matmul_transposed(a, b):
        return tf.linalg.matmul(a, b, transpose_b=True)

    def empty(shape, dtype=None):
        return tf.raw_ops.Empty(shape=tf.constant(shape, tf.int32), dtype=tf.as_dtype(dtype or "float32"), init=False)
