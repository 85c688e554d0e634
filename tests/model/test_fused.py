"""kbert.backend.tensorflow_fused's training kernels against the plain TensorFlow ops they replace: same values,
same gradients (float32 to float32 rounding; bfloat16 against a float32 reference)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from kbert.backend import tensorflow_fused as fused

SEED = tf.constant([7, 11])


def value_and_grads(fn, inputs, upstream):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = fn(*inputs)
    return out, tape.gradient(out, inputs, output_gradients=upstream)


def close(a, b, tol):
    a, b = np.asarray(tf.cast(a, tf.float32)), np.asarray(tf.cast(b, tf.float32))
    np.testing.assert_allclose(a, b, atol=tol * max(1.0, np.abs(b).max()), rtol=0)


def plain_gelu(x, bias):
    y = x + bias
    return 0.5 * y * (1.0 + tf.math.erf(y / math.sqrt(2.0)))


def test_gelu_with_bias_matches_the_formula_and_its_gradient():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(0, 2, (64, 48)), tf.float32)
    bias = tf.constant(rng.normal(0, 1, 48), tf.float32)
    upstream = tf.constant(rng.normal(0, 1, (64, 48)), tf.float32)
    ours, our_grads = value_and_grads(fused.gelu, [x, bias], upstream)
    theirs, their_grads = value_and_grads(plain_gelu, [x, bias], upstream)
    close(ours, theirs, 1e-6)
    for a, b in zip(our_grads, their_grads):
        close(a, b, 1e-6)
    # bfloat16 tensors: the bias gradient is summed in float32, so it stays close to float32's.
    _, bf16_grads = value_and_grads(
        fused.gelu, [tf.cast(x, tf.bfloat16), tf.cast(bias, tf.bfloat16)], tf.cast(upstream, tf.bfloat16)
    )
    close(bf16_grads[1], their_grads[1], 0.02)


def test_float32_dropout_is_keras_dropout_bit_for_bit():
    x = tf.random.stateless_normal([8, 16, 32], [1, 2])
    ours = fused.dropout(x, 0.1, SEED)
    theirs = tf.nn.experimental.stateless_dropout(x, 0.1, SEED)  # what keras' Dropout calls
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    upstream = tf.random.stateless_normal([8, 16, 32], [3, 4])
    _, (grad,) = value_and_grads(lambda t: fused.dropout(t, 0.1, SEED), [x], upstream)
    # The gradient is the mask times the same float32 scale, 1/0.9 rounded once.
    expected = np.where(ours.numpy() != 0, upstream.numpy() * np.float32(1 / 0.9), np.float32(0))
    np.testing.assert_array_equal(grad.numpy(), expected)


def test_bfloat16_dropout_keeps_nine_in_ten_and_scales_them():
    x = tf.ones([256, 1024], tf.bfloat16)
    y = fused.dropout(x, 0.1, SEED).numpy().astype(np.float32)
    assert set(np.unique(y)) == {0.0, float(tf.cast(1 / 0.9, tf.bfloat16))}
    assert abs((y != 0).mean() - 0.9) < 0.003  # 262,144 draws: 0.003 is about 5 standard deviations
    other = fused.dropout(x, 0.1, tf.constant([7, 12])).numpy()
    assert 0.80 < ((y != 0) == (other != 0)).mean() < 0.84  # independent masks agree 0.9² + 0.1² of the time


def test_attention_probs_match_softmax_then_dropout():
    rng = np.random.default_rng(1)
    scores = tf.constant(rng.normal(0, 4, (2, 4, 16, 16)), tf.float32)
    mask = np.ones((2, 16), np.float32)
    mask[1, 11:] = 0
    adder = tf.constant(((1.0 - mask) * -10000.0)[:, None, None, :])
    upstream = tf.constant(rng.normal(0, 1, (2, 4, 16, 16)), tf.float32)

    def plain(s):
        probs = tf.nn.softmax(s * 0.25 + adder)
        return tf.nn.experimental.stateless_dropout(probs, 0.1, SEED)

    ours, (our_grad,) = value_and_grads(lambda s: fused.attention_probs(s, adder, 0.25, 0.1, SEED), [scores], upstream)
    theirs, (their_grad,) = value_and_grads(plain, [scores], upstream)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    close(our_grad, their_grad, 1e-6)
    assert np.abs(their_grad.numpy()).max() > 0.01


@pytest.mark.parametrize("dtype, tol", [(tf.float32, 2e-6), (tf.bfloat16, 0.02)])
def test_layer_norm_matches_keras(dtype, tol):
    import keras

    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(1, 3, (32, 64)), tf.float32)
    gamma = tf.constant(rng.normal(1, 0.2, 64), tf.float32)
    beta = tf.constant(rng.normal(0, 0.2, 64), tf.float32)
    upstream = tf.constant(rng.normal(0, 1, (32, 64)), tf.float32)
    theirs, their_grads = value_and_grads(
        lambda x, g, b: keras.ops.layer_normalization(x, g, b, -1, 1e-12), [x, gamma, beta], upstream
    )
    ours, our_grads = value_and_grads(
        lambda x, g, b: fused.layer_norm(x, g, b, 1e-12), [tf.cast(x, dtype), gamma, beta], tf.cast(upstream, dtype)
    )
    assert ours.dtype == dtype
    close(ours, theirs, tol)
    for a, b in zip(our_grads, their_grads):
        close(a, b, tol)


def test_bias_add_float32_and_its_gradient():
    logits = tf.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], tf.bfloat16)
    bias = tf.constant([0.5, -1.0, 0.0])
    upstream = tf.constant([[1.0, 0.0, 2.0], [3.0, 1.0, -1.0]])
    out, (d_logits, d_bias) = value_and_grads(fused.bias_add_float32, [logits, bias], upstream)
    assert out.dtype == tf.float32 and d_logits.dtype == tf.bfloat16
    np.testing.assert_array_equal(out.numpy(), [[1.5, 1.0, 3.0], [4.5, 4.0, 6.0]])
    np.testing.assert_array_equal(d_bias.numpy(), [4.0, 1.0, 1.0])
    np.testing.assert_array_equal(tf.cast(d_logits, tf.float32).numpy(), upstream.numpy())


def test_bias_dropout_is_dropout_of_the_biased_input_with_the_bias_gradient():
    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(0, 1, (64, 32)), tf.float32)
    bias = tf.constant(rng.normal(0, 1, 32), tf.float32)
    upstream = tf.constant(rng.normal(0, 1, (64, 32)), tf.float32)
    ours, (d_x, d_bias) = value_and_grads(lambda x, b: fused.bias_dropout(x, b, 0.1, SEED), [x, bias], upstream)
    theirs, (their_d_x, their_d_bias) = value_and_grads(
        lambda x, b: fused.dropout(x + b, 0.1, SEED), [x, bias], upstream
    )
    close(ours, theirs, 1e-6)
    close(d_x, their_d_x, 1e-6)
    close(d_bias, their_d_bias, 1e-6)
    assert 0.85 < float(tf.reduce_mean(tf.cast(ours != 0, tf.float32))) < 0.95
