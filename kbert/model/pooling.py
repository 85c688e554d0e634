"""Sentence embeddings from token vectors: sentence-transformers' pooling and normalisation.

`pool` turns an encoder's `sequence_output` [batch, seq, H] and its `input_mask` [batch, seq]
into one vector per text, as `sentence_transformers.models.Pooling` does for a BERT's token
embeddings; `l2_normalize` is its `Normalize` module. Both are `keras.ops` only, so they run on
every Keras backend and inside an exported graph; `SentencePooling` is the two as a layer.
"""

from __future__ import annotations

import keras
from keras import ops

# The pooling modes kbert computes, by kbert's name; sentence-transformers names the last
# "mean_sqrt_len_tokens" (converters/hf.py maps the names).
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len")


def pool(sequence_output, input_mask, mode: str):
    """One vector per text from its token vectors: [batch, seq, H], [batch, seq] -> [batch, H].

    cls: the first token's vector ([CLS]). mean: the mean over real tokens (`input_mask` 1).
    max: the largest value of each dimension over real tokens. mean_sqrt_len: the sum over
    real tokens divided by the square root of their number. Padding never counts.

    Args:
        sequence_output: float [batch, seq, H]. The encoder's token vectors.
        input_mask: int or float [batch, seq]. 1 for a real token, 0 for padding.
        mode: str. One of `POOLING_MODES`.

    Example:
    >>> import numpy as np
    >>> tokens = np.array([[[1.0, 4.0], [3.0, -2.0], [9.0, 9.0]]], "float32")
    >>> mask = np.array([[1, 1, 0]])
    >>> [ops.convert_to_numpy(pool(tokens, mask, m)).astype("float64").round(4).tolist() for m in POOLING_MODES]
    [[[1.0, 4.0]], [[2.0, 1.0]], [[3.0, 4.0]], [[2.8284, 1.4142]]]
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling {mode!r}: use one of {', '.join(POOLING_MODES)}")
    sequence_output = ops.convert_to_tensor(sequence_output)
    if mode == "cls":
        return sequence_output[:, 0, :]
    mask = ops.expand_dims(ops.cast(input_mask, sequence_output.dtype), -1)
    if mode == "max":
        # Padding can never be the largest value (sentence-transformers fills it with -inf).
        return ops.max(ops.where(mask > 0, sequence_output, float("-inf")), axis=1)
    total = ops.sum(sequence_output * mask, axis=1)
    # At least one token's worth, as sentence-transformers clamps it (1e-9): a text of no real
    # tokens gives zeros, not NaN.
    count = ops.maximum(ops.sum(mask, axis=1), 1e-9)
    return total / (count if mode == "mean" else ops.sqrt(count))


def l2_normalize(vectors):
    """Each row divided by its Euclidean length (at least 1e-12, as torch's `F.normalize`).

    >>> ops.convert_to_numpy(l2_normalize([[3.0, 4.0], [0.0, 0.0]])).astype("float64").round(4).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    vectors = ops.convert_to_tensor(vectors, "float32")
    norm = ops.sqrt(ops.sum(ops.square(vectors), axis=-1, keepdims=True))
    return vectors / ops.maximum(norm, 1e-12)


@keras.saving.register_keras_serializable(package="kbert")
class SentencePooling(keras.layers.Layer):
    """`pool`, then `l2_normalize` when `normalize`: (sequence_output, input_mask) -> [batch, H].

    Args:
        pooling: str. One of `POOLING_MODES`.
        normalize: bool. L2-normalise each vector (a sentence-transformers `Normalize` module).

    Example:
    >>> import numpy as np
    >>> layer = SentencePooling("mean", normalize=True)
    >>> vectors = layer(np.array([[[3.0, 0.0], [3.0, 8.0]]], "float32"), np.array([[1, 1]]))
    >>> ops.convert_to_numpy(vectors).astype("float64").round(4).tolist()
    [[0.6, 0.8]]
    """

    def __init__(self, pooling: str, normalize: bool = False, **kwargs):
        super().__init__(**kwargs)
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling {pooling!r}: use one of {', '.join(POOLING_MODES)}")
        self.pooling, self.normalize = pooling, bool(normalize)

    def call(self, sequence_output, input_mask):
        vectors = pool(sequence_output, input_mask, self.pooling)
        return l2_normalize(vectors) if self.normalize else vectors

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling, "normalize": self.normalize}
