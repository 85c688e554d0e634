"""The pretraining losses as TensorFlow's engine trains them: a faster softmax cross-entropy.

`tf.nn.sparse_softmax_cross_entropy_with_logits` over BERT's 30,522-token vocabulary runs
single-pass but barely parallel on CPU, so forward and backward take longer than the same
arithmetic written as exp / sum / log with its gradient `softmax - one_hot`. The results agree
with `kbert.pretraining.losses`' `keras.ops` form to float32 rounding (timings and differences:
docs/performance.md, "What makes kbert's step faster"; tests/pretraining/test_losses.py holds
them). Here the passes without a transcendental function (the row maximum and the shift by it;
the gradient's scaling and its one-hot subtraction) are XLA-compiled, one pass each; the exp and
log stay TensorFlow's: XLA:CPU's exp differs from it by about 4e-6 relative.
"""

from __future__ import annotations

import tensorflow as tf

from kbert.pretraining import losses


def pretraining_losses(outputs, labels):
    """`kbert.pretraining.losses.pretraining_losses` with this module's cross-entropy: the same
    numbers as the `keras.ops` form, to float32 rounding.

    Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> out = {"mlm_logits": rng.normal(size=(2, 3, 50)).astype("float32"),
    ...        "nsp_logits": rng.normal(size=(2, 2)).astype("float32")}
    >>> labels = {"masked_lm_ids": rng.integers(0, 50, (2, 3)), "masked_lm_weights": np.ones((2, 3), "float32"),
    ...           "next_sentence_labels": np.array([0, 1])}
    >>> ours, theirs = pretraining_losses(out, labels), losses.pretraining_losses(out, labels)
    >>> sorted(ours) == sorted(theirs) and all(np.isclose(float(ours[k]), float(theirs[k]), atol=1e-5) for k in ours)
    True
    """
    return losses.pretraining_losses(outputs, labels, cross_entropy=cross_entropy_and_hits)


def sparse_softmax_cross_entropy(labels, logits):
    """-log softmax(logits)[label] per row; labels int [N], logits float32 [N, classes].

    Example:
    >>> import numpy as np
    >>> logits = np.array([[2.0, 1.0, 0.1], [0.0, 0.0, 5.0]], "float32")
    >>> ours = sparse_softmax_cross_entropy(np.array([0, 2]), logits).numpy()
    >>> theirs = np.log(np.exp(logits).sum(-1)) - logits[[0, 1], [0, 2]]
    >>> bool(np.allclose(ours, theirs, atol=1e-6))
    True
    """
    return cross_entropy_and_hits(labels, logits)[0]


def cross_entropy_and_hits(labels, logits):
    """`kbert.pretraining.losses.cross_entropy_and_hits`, with the gradient written out and the
    passes XLA-compiled.

    Example:
    >>> loss, hit = cross_entropy_and_hits([0, 0], tf.constant([[2.0, 1.0], [0.0, 3.0]]))
    >>> hit.numpy().tolist()
    [True, False]
    """
    labels = tf.cast(labels, tf.int32)
    shifted, top = _shift_by_row_max(tf.stop_gradient(logits))
    exp = tf.exp(shifted)
    total = tf.reduce_sum(exp, axis=-1)

    @tf.custom_gradient
    def cross_entropy(logits):
        loss = tf.math.log(total) + top - tf.gather(logits, labels, batch_dims=1)

        def grad(upstream):
            # d loss / d logits = softmax - one_hot(label), without building the one-hot.
            return _softmax_minus_one_hot(exp, upstream / total, labels, upstream)

        return loss, grad

    return cross_entropy(logits), tf.gather(logits, labels, batch_dims=1) >= top


@tf.function(jit_compile=True, reduce_retracing=True)
def _shift_by_row_max(logits):
    top = tf.reduce_max(logits, axis=-1)
    return logits - top[:, None], top


@tf.function(jit_compile=True, reduce_retracing=True)
def _softmax_minus_one_hot(exp, scale, labels, upstream):
    is_label = tf.range(tf.shape(exp)[-1])[None, :] == labels[:, None]
    return exp * scale[:, None] - tf.where(is_label, upstream[:, None], tf.zeros([], exp.dtype))
