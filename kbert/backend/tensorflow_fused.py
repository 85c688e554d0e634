"""Training-time kernels for BERT's element-wise work: GELU, dropout, attention softmax, LayerNorm.

Also the bias adds next to them (dense layers', the MLM logits'). Written as plain TensorFlow
ops, each of these is several passes over a [batch·seq, width] tensor, forward and again
backward (GELU alone is eight), and on a CPU those passes cost as much as the matmuls around them. Here each one is a `tf.custom_gradient` whose forward and
backward are XLA-compiled functions, so each tensor is read and written once per direction.
The arithmetic is the original's (`modeling.gelu`, `modeling.dropout`, `layer_norm`), in
float32 even when the tensors are bfloat16, except plain `dropout`, which scales in the
tensor's own dtype as keras' Dropout does.

Only training uses them. Inference keeps the plain ops, which TF's graph optimizer already
fuses into oneDNN's matmul, and which a SavedModel serves without XLA. Inside `disabled()`,
training runs the plain ops too (tests/model/test_layers.py checks that both paths agree);
`kbert.model.layers.use_fused` is the one place the layers ask which path to take.

Example:
>>> x = tf.constant([[-1.0, 0.0, 2.0]])
>>> [round(float(v), 4) for v in gelu(x, tf.zeros([3]))[0]]
[-0.1587, 0.0, 1.9545]
"""

from __future__ import annotations

import contextlib
import math

import tensorflow as tf

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# False inside `disabled()`.
_ENABLED = [True]


def enabled() -> bool:
    """Whether training uses these kernels: True unless inside `disabled()`."""
    return _ENABLED[0]


@contextlib.contextmanager
def disabled():
    """Train through the plain Keras ops instead of these kernels, inside this block.

    The layers ask when they are called, so a `tf.function` keeps the path it was traced with:
    call Keras' `fit` (which traces its training step) inside the block, not just compile.

    Example:
    >>> with disabled():
    ...     enabled()
    False
    >>> enabled()
    True
    """
    previous = _ENABLED[0]
    _ENABLED[0] = False
    try:
        yield
    finally:
        _ENABLED[0] = previous


@tf.function(jit_compile=True, reduce_retracing=True)
def _gelu_forward(x, bias):
    f = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
    return tf.cast(0.5 * f * (1.0 + tf.math.erf(f * _SQRT_HALF)), x.dtype)


@tf.function(jit_compile=True, reduce_retracing=True)
def _gelu_backward(x, bias, upstream):
    # d/dx x·Φ(x) = Φ(x) + x·φ(x). Recomputed from x rather than saved: one more erf is
    # cheaper than writing and reading back a second activation-sized tensor.
    f = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
    cdf = 0.5 * (1.0 + tf.math.erf(f * _SQRT_HALF))
    pdf = tf.exp(-0.5 * f * f) * _INV_SQRT_2PI
    d_x = tf.cast(upstream, tf.float32) * (cdf + f * pdf)
    # The bias's gradient, summed in float32 in the same loop (TF's BiasAddGrad sums bfloat16
    # in bfloat16, and reads the tensor once more).
    d_bias = tf.reduce_sum(d_x, axis=tf.range(tf.rank(d_x) - 1))
    return tf.cast(d_x, x.dtype), tf.cast(d_bias, bias.dtype)


@tf.custom_gradient
def gelu(x, bias):
    """Exact (erf) GELU of x + bias, as modeling.gelu: 0.5·y·(1 + erf(y/√2)) with y = x + bias.

    One fused pass each way, which includes the dense layer's bias add and its gradient.
    x: [..., width]; bias: [width].
    """
    return _gelu_forward(x, bias), lambda upstream: _gelu_backward(x, bias, upstream)


def _unpack(noise, x):
    # 16-bit noise arrives as uint32 words, two draws per word; split them inside the fused
    # loop instead of materializing a uint16 copy.
    if noise.dtype == tf.uint32:
        noise = tf.reshape(tf.reshape(tf.bitcast(noise, tf.uint16), [-1])[: tf.size(x)], tf.shape(x))
    return noise


@tf.function(jit_compile=True, reduce_retracing=True)
def _keep_and_scale(x, noise, threshold, scale, like):
    kept = tf.where(_unpack(noise, x) >= threshold, tf.cast(x, scale.dtype) * scale, tf.zeros([], scale.dtype))
    return tf.cast(kept, like.dtype)


def _dropout_noise(x, rate: float, seed):
    """(noise, threshold): keep an element where noise >= threshold."""
    if x.dtype == tf.float32:
        # The draw keras' Dropout makes (`stateless_dropout`), so float32 masks match it bit for bit.
        return (tf.random.stateless_uniform(tf.shape(x), seed, dtype=tf.float32), tf.constant(rate, tf.float32))
    words = (tf.size(x) + 1) // 2
    return (
        tf.random.stateless_uniform([words], seed, minval=None, maxval=None, dtype=tf.uint32),
        tf.constant(round(rate * 65536), tf.uint16),
    )


def dropout(x, rate: float, seed):
    """Zero each element with probability `rate` and scale the rest by 1/(1-rate).

    float32 tensors draw the same uniform noise as keras' Dropout (`stateless_dropout`) for
    the same seed, so results are bit for bit those of keras. Narrower tensors draw 16 bits
    per element, two per Philox word: half the random-number work, and a finer threshold
    than keras' bfloat16 noise, whose 7 bits make the rate 0.1 into 13/128 = 0.1016.

    Args:
        x: the tensor.
        rate: python float in [0, 1).
        seed: int32 [2], a stateless seed.

    Example:
    >>> y = dropout(tf.ones([1000]), 0.1, tf.constant([1, 2]))
    >>> sorted(set(round(float(v), 4) for v in y.numpy()))
    [0.0, 1.1111]
    """
    noise, threshold = _dropout_noise(x, rate, seed)
    scale = tf.constant(1.0 / (1.0 - rate), x.dtype)
    like = tf.zeros([], x.dtype)

    @tf.custom_gradient
    def apply(x):
        # The gradient is the same mask and scale, applied to the upstream gradient.
        return (
            _keep_and_scale(x, noise, threshold, scale, like),
            lambda upstream: _keep_and_scale(upstream, noise, threshold, scale, like),
        )

    return apply(x)


@tf.function(jit_compile=True, reduce_retracing=True)
def _bias_keep_and_scale(x, bias, noise, threshold, scale):
    biased = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
    return tf.cast(tf.where(_unpack(noise, x) >= threshold, biased * scale, 0.0), x.dtype)


@tf.function(jit_compile=True, reduce_retracing=True)
def _bias_keep_and_scale_backward(upstream, bias, noise, threshold, scale):
    d_x = tf.where(_unpack(noise, upstream) >= threshold, tf.cast(upstream, tf.float32) * scale, 0.0)
    d_bias = tf.reduce_sum(d_x, axis=tf.range(tf.rank(d_x) - 1))
    return tf.cast(d_x, upstream.dtype), tf.cast(d_bias, bias.dtype)


def bias_dropout(x, bias, rate: float, seed):
    """dropout(x + bias): a dense layer's bias add, the dropout after it, and the bias's gradient
    (summed in float32) in one pass each way. The mask is `dropout`'s for the same seed.

    Example:
    >>> y = bias_dropout(tf.zeros([1000, 2]), tf.constant([1.0, 2.0]), 0.1, tf.constant([1, 2]))
    >>> sorted(set(round(float(v), 4) for v in y.numpy().ravel()))
    [0.0, 1.1111, 2.2222]
    """
    noise, threshold = _dropout_noise(x, rate, seed)
    scale = tf.constant(1.0 / (1.0 - rate), tf.float32)

    @tf.custom_gradient
    def apply(x, bias):
        return (
            _bias_keep_and_scale(x, bias, noise, threshold, scale),
            lambda upstream: _bias_keep_and_scale_backward(upstream, bias, noise, threshold, scale),
        )

    return apply(x, bias)


def _row_sum(f, weight=1.0):
    """Σ over the last axis (times `weight`), keepdims, as a matrix-vector product: XLA:CPU's own
    row reductions over a few hundred columns are slower than oneDNN's product, for LayerNorm's
    forward and the attention backward alike (timings: docs/performance.md, "What makes kbert's
    step faster")."""
    shape = tf.shape(f)
    rows = tf.reshape(f, [-1, shape[-1]])  # a plain 2-D product; a batched one is slower again
    sums = tf.linalg.matmul(rows, tf.fill([shape[-1], 1], tf.cast(weight, f.dtype)))
    return tf.reshape(sums, tf.concat([shape[:-1], [1]], 0))


def _row_mean(f):
    return _row_sum(f, 1.0 / tf.cast(tf.shape(f)[-1], f.dtype))


@tf.function(jit_compile=True, reduce_retracing=True)
def _attention_logits(scores, adder, scale):
    return tf.cast(scores, tf.float32) * scale + adder


@tf.function(jit_compile=True, reduce_retracing=True)
def _attention_backward(upstream, probs, noise, threshold, keep_scale, scale, like):
    d_probs = tf.where(_unpack(noise, probs) >= threshold, tf.cast(upstream, tf.float32) * keep_scale, 0.0)
    # Softmax's gradient, as TF's SoftmaxGrad: p·(dp - Σ dp·p).
    d_logits = probs * (d_probs - _row_sum(d_probs * probs))
    return tf.cast(d_logits * scale, like.dtype)


def attention_probs(scores, adder, scale: float, rate: float, seed):
    """dropout(softmax(scores·scale + adder)): modeling.attention_layer's probabilities in training.

    The softmax itself stays TF's (oneDNN's, with its exact exp); the scaling, mask add and
    casts before it, the dropout after it, and the whole backward are fused around it.

    Args:
        scores: [batch, heads, seq, seq], Q·Kᵀ in the compute dtype.
        adder: float32, broadcastable to scores: 0 for real tokens, -10000 for padding.
        scale: python float, 1/√head_size.
        rate, seed: as `dropout`; the noise is drawn exactly as `dropout` draws it for scores.

    Returns: scores' dtype and shape.
    """
    noise, threshold = _dropout_noise(scores, rate, seed)
    keep_scale = tf.constant(1.0 / (1.0 - rate), tf.float32)
    scale = tf.constant(scale, tf.float32)
    like = tf.zeros([], scores.dtype)

    @tf.custom_gradient
    def probs(scores):
        p = tf.nn.softmax(_attention_logits(scores, adder, scale))
        return (
            _keep_and_scale(p, noise, threshold, keep_scale, like),
            lambda upstream: _attention_backward(upstream, p, noise, threshold, keep_scale, scale, like),
        )

    return probs(scores)


@tf.function(jit_compile=True, reduce_retracing=True)
def _layer_norm_forward(x, gamma, beta, epsilon):
    f = tf.cast(x, tf.float32)
    mean = _row_mean(f)
    variance = _row_mean(tf.math.squared_difference(f, mean))
    inv = tf.math.rsqrt(variance + epsilon)
    scaled = inv * gamma
    return tf.cast(f * scaled + (beta - mean * scaled), x.dtype), mean, inv


@tf.function(jit_compile=True, reduce_retracing=True)
def _layer_norm_backward(upstream, x, gamma, mean, inv):
    f = tf.cast(x, tf.float32)
    dy = tf.cast(upstream, tf.float32)
    normed = (f - mean) * inv
    rows = tf.range(tf.rank(f) - 1)
    d_gamma = tf.reduce_sum(dy * normed, axis=rows)
    d_beta = tf.reduce_sum(dy, axis=rows)
    g = dy * gamma
    d_x = inv * (g - _row_mean(g) - normed * _row_mean(g * normed))
    return tf.cast(d_x, x.dtype), d_gamma, d_beta


def layer_norm(x, gamma, beta, epsilon: float):
    """LayerNorm over the last axis, computed in float32; returns x's dtype.

    Args: x [..., H]; gamma, beta float32 [H]; epsilon python float (1e-12 in BERT).

    Example:
    >>> y = layer_norm(tf.constant([[1.0, 2.0, 3.0]]), tf.ones([3]), tf.zeros([3]), 1e-12)
    >>> [round(float(v), 4) for v in y[0]]
    [-1.2247, 0.0, 1.2247]
    """
    epsilon = tf.constant(epsilon, tf.float32)

    @tf.custom_gradient
    def norm(x, gamma, beta):
        y, mean, inv = _layer_norm_forward(x, gamma, beta, epsilon)
        return y, lambda upstream: _layer_norm_backward(upstream, x, gamma, mean, inv)

    # On [rows, H]: XLA:CPU sums gamma's and beta's gradients over one row axis faster than over
    # several (timings: docs/performance.md, "What makes kbert's step faster").
    return tf.reshape(norm(tf.reshape(x, [-1, tf.shape(x)[-1]]), gamma, beta), tf.shape(x))


@tf.function(jit_compile=True, reduce_retracing=True)
def _bias_add_forward(logits, bias):
    return tf.cast(logits, tf.float32) + bias


@tf.function(jit_compile=True, reduce_retracing=True)
def _bias_add_backward(upstream, like):
    rows = tf.range(tf.rank(upstream) - 1)
    return tf.cast(upstream, like.dtype), tf.reduce_sum(upstream, axis=rows)


def bias_add_float32(logits, bias):
    """float32(logits) + bias, with its gradient (the cast back and the bias's column sum) in
    one pass. For the masked-LM logits: [batch·P, 30,522] is the largest activation in BERT.

    Example:
    >>> bias_add_float32(tf.constant([[1.0, 2.0]], tf.bfloat16), tf.constant([0.5, -1.0])).numpy().tolist()
    [[1.5, 1.0]]
    """

    @tf.custom_gradient
    def add(logits, bias):
        like = tf.zeros([], logits.dtype)  # carries logits' dtype into the compiled backward
        return _bias_add_forward(logits, bias), lambda upstream: _bias_add_backward(upstream, like)

    return add(logits, bias)
