"""kbert's cross-entropy against TensorFlow's fused kernel: same loss, same gradient."""

import numpy as np
import tensorflow as tf

from kbert.pretraining.losses import sparse_softmax_cross_entropy


def test_matches_tensorflow_loss_and_gradient_on_a_bert_sized_vocabulary():
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


def test_extreme_logits_stay_finite():
    logits = tf.constant([[1000.0, -1000.0, 0.0], [-1e30, 0.0, 1e30]])
    labels = tf.constant([1, 0])
    loss = sparse_softmax_cross_entropy(labels, logits).numpy()
    np.testing.assert_allclose(loss, tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits).numpy())
