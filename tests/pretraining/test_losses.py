"""kbert's cross-entropy against TensorFlow's fused kernel: same loss, same gradient, in both
forms (TensorFlow engine's and the keras.ops one)."""

import numpy as np
import pytest
import tensorflow as tf

from kbert.pretraining import losses, tf_losses

FORMS = pytest.mark.parametrize(
    "sparse_softmax_cross_entropy",
    [tf_losses.sparse_softmax_cross_entropy, losses.sparse_softmax_cross_entropy],
    ids=["tf_losses", "losses"],
)


@FORMS
def test_matches_tensorflow_loss_and_gradient_on_a_bert_sized_vocabulary(sparse_softmax_cross_entropy):
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(0, 4, (64, 30522)), tf.float32)
    labels = tf.constant(rng.integers(0, 30522, 64), tf.int32)
    upstream = tf.constant(rng.uniform(0, 1, 64), tf.float32)  # weights, as the MLM loss applies

    def loss_and_grad(fn):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = fn(labels, logits)
            total = tf.reduce_sum(loss * upstream)
        return loss.numpy(), tape.gradient(total, logits).numpy()

    ours, our_grad = loss_and_grad(sparse_softmax_cross_entropy)
    theirs, their_grad = loss_and_grad(lambda y, x: tf.nn.sparse_softmax_cross_entropy_with_logits(y, x))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(our_grad, their_grad, atol=1e-7)
    assert np.abs(their_grad).max() > 0.01  # the comparison is not between two zero arrays


@FORMS
def test_extreme_logits_stay_finite(sparse_softmax_cross_entropy):
    logits = tf.constant([[1000.0, -1000.0, 0.0], [-1e30, 0.0, 1e30]])
    labels = tf.constant([1, 0])
    loss = np.asarray(sparse_softmax_cross_entropy(labels, logits))
    np.testing.assert_allclose(loss, tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits).numpy())
