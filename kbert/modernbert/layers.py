"""ModernBERT's layers, with transformers' `ModernBertModel` numerics: rotary positions with one
theta for global and one for local layers, global attention on some layers and a sliding window
on the others, fused QKV without biases, a GeGLU feed-forward and pre-LayerNorm blocks.

Each layer's sublayers are named as transformers names its modules (`Wqkv`, `Wo`, `Wi`,
`attn_norm`, `mlp_norm`), which the converter reads them by.
"""

from __future__ import annotations

import numpy as np
from keras import layers, ops

from kbert.backend import real_token_index
from kbert.model.layers import activation
from kbert.modernbert.config import SLIDING, ModernBertConfig

# What a score a token may not see is set to before the softmax: its weight is then exactly 0,
# and a row with nothing to see (a padding token far from every real one) stays finite.
MASKED_SCORE = -1e9


def layer_norm(config: ModernBertConfig, name: str):
    return layers.LayerNormalization(epsilon=config.norm_eps, center=config.norm_bias, name=name)


def inverse_frequencies(theta: float, head_size: int) -> np.ndarray:
    """1 / theta^(2i/d) in float32, computed as transformers computes it (so the angles agree bit for bit).

    >>> inverse_frequencies(10000.0, 4).tolist()
    [1.0, 0.009999999776482582]
    """
    exponents = np.arange(0, head_size, 2, dtype=np.float32) / np.float32(head_size)
    return (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)


class RotaryAngles(layers.Layer):
    """cos and sin [seq, head_size] of each position's rotation, for one theta."""

    def __init__(self, theta: float, head_size: int, **kwargs):
        super().__init__(**kwargs)
        self.theta, self.head_size = float(theta), int(head_size)

    def call(self, input_mask):
        positions = ops.cast(ops.arange(ops.shape(input_mask)[1]), "float32")
        freqs = positions[:, None] * ops.convert_to_tensor(inverse_frequencies(self.theta, self.head_size))[None, :]
        angles = ops.concatenate([freqs, freqs], axis=-1)
        return ops.cos(angles), ops.sin(angles)

    def compute_output_spec(self, input_mask):
        from keras import KerasTensor

        shape = (input_mask.shape[1], self.head_size)
        return KerasTensor(shape, dtype="float32"), KerasTensor(shape, dtype="float32")  # two: one would stand for both


def _rotate(x, cos, sin):
    half = ops.shape(x)[-1] // 2
    rotated = ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _attend(q, k, v, seen):
    """softmax(q·kᵀ/√d, over what each query may see)·v; scores in float32."""
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * (ops.shape(q)[-1] ** -0.5)
    scores = ops.where(seen, ops.cast(scores, "float32"), MASKED_SCORE)
    return ops.matmul(ops.cast(ops.softmax(scores, axis=-1), v.dtype), v)


def window_offsets(window: int) -> np.ndarray:
    """Which of three consecutive blocks' keys a query of the middle block may see: [w, 3w]
    booleans, |query - key| <= w, for blocks of `window` tokens.

    >>> window_offsets(1).astype(int).tolist()
    [[1, 1, 1]]
    """
    query = np.arange(window)[:, None] + window
    key = np.arange(3 * window)[None, :]
    return np.abs(query - key) <= window


def windowed_attention(q, k, v, real, window: int):
    """Attention of each token to the real tokens at most `window` positions away, in blocks of
    `window` tokens: a block's queries see their own block and the two beside it, so the scores
    take [seq, 3·window] per head, not [seq, seq]. The same weights as the full masked softmax:
    a key it leaves out is one the mask would have given weight 0.

    q, k, v: [batch, heads, seq, size]; real: [batch, seq] booleans.
    """
    batch, heads, seq, size = ops.shape(q)[0], ops.shape(q)[1], ops.shape(q)[2], ops.shape(q)[3]
    blocks = (seq + window - 1) // window
    padding = blocks * window - seq

    def in_blocks(x):  # [batch, heads, blocks, window, size]
        x = ops.pad(x, ((0, 0), (0, 0), (0, padding), (0, 0)))
        return ops.reshape(x, (batch, heads, blocks, window, size))

    def beside(x, axis):  # the block before, the block, the block after, side by side along `axis`
        edge = [(0, 0)] * len(x.shape)
        edge[2] = (1, 1)
        x = ops.pad(x, edge)
        return ops.concatenate([x[:, :, :-2], x[:, :, 1:-1], x[:, :, 2:]], axis=axis)

    keys, values = beside(in_blocks(k), 3), beside(in_blocks(v), 3)  # [batch, heads, blocks, 3·window, size]
    key_real = ops.reshape(ops.pad(real, ((0, 0), (0, padding))), (batch, 1, blocks, window))
    key_real = beside(key_real, 3)[:, :, :, None, :]  # [batch, 1, blocks, 1, 3·window]
    seen = ops.logical_and(key_real, ops.convert_to_tensor(window_offsets(window)))
    context = _attend(in_blocks(q), keys, values, seen)  # [batch, heads, blocks, window, size]
    return ops.reshape(context, (batch, heads, blocks * window, size))[:, :, :seq]


# Queries a global layer scores at once: its scores then take [chunk, seq] per head, not [seq, seq].
QUERY_CHUNK = 512


def global_attention(q, k, v, real, chunk: int = QUERY_CHUNK):
    """Attention of each token to every real token, `chunk` queries at a time (one after the
    other), so that a long text's scores never stand whole in memory.

    q, k, v: [batch, heads, seq, size]; real: [batch, seq] booleans.
    """
    batch, heads, seq, size = ops.shape(q)[0], ops.shape(q)[1], ops.shape(q)[2], ops.shape(q)[3]
    chunk = ops.minimum(seq, chunk) if not isinstance(seq, int) else min(seq, chunk)
    chunks = (seq + chunk - 1) // chunk
    q = ops.pad(q, ((0, 0), (0, 0), (0, chunks * chunk - seq), (0, 0)))
    q = ops.transpose(ops.reshape(q, (batch, heads, chunks, chunk, size)), (2, 0, 1, 3, 4))
    seen = real[:, None, None, :]
    context = ops.map(lambda part: _attend(part, k, v, seen), q)  # [chunks, batch, heads, chunk, size]
    context = ops.reshape(ops.transpose(context, (1, 2, 0, 3, 4)), (batch, heads, chunks * chunk, size))
    return context[:, :, :seq]


class Attention(layers.Layer):
    """Multi-head self-attention with fused, bias-free QKV and rotary positions: over every real
    token (`window` None), or over those at most `window` positions away."""

    def __init__(self, config: ModernBertConfig, window: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.head_size, self.window = config.num_attention_heads, config.head_size, window
        self.Wqkv = layers.Dense(3 * config.hidden_size, use_bias=config.attention_bias, name="Wqkv")
        self.Wo = layers.Dense(config.hidden_size, use_bias=config.attention_bias, name="Wo")

    def build(self, input_shape):
        self.Wqkv.build(input_shape)
        self.Wo.build(input_shape)

    def call(self, tokens, input_mask, index, cos, sin):
        batch, seq = ops.shape(input_mask)[0], ops.shape(input_mask)[1]
        width = 3 * self.heads * self.head_size
        qkv = ops.scatter(index[:, None], self.Wqkv(tokens), (batch * seq, width))  # back in [batch, seq] places
        qkv = ops.reshape(qkv, (batch, seq, 3, self.heads, self.head_size))
        q, k, v = (ops.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))  # [batch, heads, seq, size]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        real = ops.cast(input_mask, "bool")
        if self.window is None:
            context = global_attention(q, k, v, real)
        else:
            context = windowed_attention(q, k, v, real, self.window)
        context = ops.transpose(context, (0, 2, 1, 3))
        context = ops.reshape(context, (batch * seq, self.heads * self.head_size))
        return self.Wo(ops.take(context, index, axis=0))

    def compute_output_spec(self, tokens, input_mask, index, cos, sin):
        from keras import KerasTensor

        return KerasTensor(tokens.shape, dtype=self.compute_dtype)


class EncoderLayer(layers.Layer):
    """One pre-LayerNorm block: x + attention(norm(x)), then x + Wo(act(a) · g) with a, g = Wi(norm(x)).
    The first layer has no attention norm (the embeddings' norm precedes it).

    It runs on the real tokens only, [real tokens, H] (`RealTokens`): padding costs nothing but
    in the attention's scores, where each text's tokens are put back in their places.
    """

    def __init__(self, config: ModernBertConfig, index: int, **kwargs):
        super().__init__(**kwargs)
        self.layer_type = config.layer_types[index]
        self.sliding = self.layer_type == SLIDING
        self.attn_norm = layer_norm(config, "attn_norm") if index else None
        self.attn = Attention(config, config.window if self.sliding else None, name="attn")
        self.mlp_norm = layer_norm(config, "mlp_norm")
        self.Wi = layers.Dense(2 * config.intermediate_size, use_bias=config.mlp_bias, name="Wi")
        self.Wo = layers.Dense(config.hidden_size, use_bias=config.mlp_bias, name="Wo")
        self.act = activation(config.hidden_activation)

    def build(self, input_shape):
        for layer in (self.attn_norm, self.attn, self.mlp_norm, self.Wi):
            if layer is not None:
                layer.build(input_shape)
        self.Wo.build(tuple(input_shape[:-1]) + (self.Wi.units // 2,))

    def call(self, hidden, input_mask, index, rotary):
        cos, sin = rotary[self.layer_type]
        normed = hidden if self.attn_norm is None else self.attn_norm(hidden)
        hidden = hidden + self.attn(normed, input_mask, index, cos, sin)
        value, gate = ops.split(self.Wi(self.mlp_norm(hidden)), 2, axis=-1)
        return hidden + self.Wo(self.act(value) * gate)

    def compute_output_spec(self, hidden, input_mask, index, rotary):
        from keras import KerasTensor

        return KerasTensor(hidden.shape, dtype=self.compute_dtype)


class PredictionHead(layers.Layer):
    """transformers' `ModernBertPredictionHead`: dense, activation, norm (the MLM and task heads' first part)."""

    def __init__(self, config: ModernBertConfig, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(config.hidden_size, use_bias=config.classifier_bias, name="dense")
        self.norm = layer_norm(config, "norm")
        self.act = activation(config.classifier_activation)

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.norm.build(input_shape)

    def call(self, hidden):
        return self.norm(self.act(self.dense(hidden)))


class TiedDecoder(layers.Layer):
    """Logits against the token-embedding table, plus the decoder's bias."""

    def __init__(self, embeddings: layers.Embedding, use_bias: bool, **kwargs):
        super().__init__(**kwargs)
        self.embeddings, self.use_bias = embeddings, use_bias

    def build(self, input_shape):
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.embeddings.input_dim,), initializer="zeros")

    def call(self, hidden):
        logits = ops.matmul(hidden, ops.transpose(self.embeddings.embeddings))
        return logits + self.bias if self.use_bias else logits


class Pool(layers.Layer):
    """A sequence's vector for the classifier: its first token's (`cls`) or the mean of its real tokens'."""

    def __init__(self, pooling: str, **kwargs):
        super().__init__(**kwargs)
        self.pooling = pooling

    def call(self, hidden, input_mask):
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = ops.cast(input_mask, hidden.dtype)[..., None]
        return ops.sum(hidden * mask, axis=1) / ops.sum(mask, axis=1)

    def compute_output_spec(self, hidden, input_mask):
        from keras import KerasTensor

        return KerasTensor((hidden.shape[0], hidden.shape[2]), dtype=self.compute_dtype)


class RealTokens(layers.Layer):
    """Where the real tokens stand in the flattened [batch · seq] rows (`kbert.backend.real_token_index`)."""

    def call(self, input_mask):
        return real_token_index(input_mask)

    def compute_output_spec(self, input_mask):
        from keras import KerasTensor

        return KerasTensor((None,), dtype="int32")


class TakeTokens(layers.Layer):
    """The rows of a [batch, seq, ...] tensor at `index`: [real tokens, ...]."""

    def call(self, x, index):
        flat = ops.reshape(x, (-1, *x.shape[2:]))
        return ops.take(flat, index, axis=0)

    def compute_output_spec(self, x, index):
        from keras import KerasTensor

        return KerasTensor((None, *x.shape[2:]), dtype=x.dtype)


class PutTokens(layers.Layer):
    """[real tokens, H] back in their [batch, seq, H] places (padding: zeros)."""

    def call(self, tokens, index, input_mask):
        batch, seq = ops.shape(input_mask)[0], ops.shape(input_mask)[1]
        flat = ops.scatter(index[:, None], tokens, (batch * seq, tokens.shape[-1]))
        return ops.reshape(flat, (batch, seq, tokens.shape[-1]))

    def compute_output_spec(self, tokens, index, input_mask):
        from keras import KerasTensor

        return KerasTensor((input_mask.shape[0], input_mask.shape[1], tokens.shape[-1]), dtype=tokens.dtype)
