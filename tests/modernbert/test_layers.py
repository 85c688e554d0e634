"""ModernBERT's sliding-window attention in blocks equals the full attention under the window mask."""

import keras
import numpy as np
import pytest

from kbert.modernbert.layers import MASKED_SCORE, global_attention, windowed_attention


def full_window_attention(q, k, v, real, window):
    seq = q.shape[2]
    positions = np.arange(seq)
    seen = (np.abs(positions[:, None] - positions[None, :]) <= window)[None, None] & real[:, None, None, :]
    scores = np.where(seen, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), MASKED_SCORE)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("seq", [1, 3, 4, 5, 23])
@pytest.mark.parametrize("window", [1, 4])
def test_blocks_give_the_full_masked_attention(seq, window):
    rng = np.random.default_rng(seq * 10 + window)
    q, k, v = (rng.normal(size=(2, 3, seq, 8)).astype("float32") for _ in range(3))
    real = np.ones((2, seq), bool)
    real[1, max(1, seq - 3) :] = False  # a padded row beside a full one
    ours = keras.ops.convert_to_numpy(windowed_attention(q, k, v, real, window))
    expected = full_window_attention(q, k, v, real, window)
    keep = real[:, None, :, None].repeat(3, 1)  # the real queries' rows
    np.testing.assert_allclose(np.where(keep, ours, 0), np.where(keep, expected, 0), atol=1e-5)


@pytest.mark.parametrize("seq, chunk", [(1, 4), (7, 4), (8, 4), (9, 16)])
def test_global_attention_in_chunks_of_queries_gives_the_whole_one(seq, chunk):
    rng = np.random.default_rng(seq + chunk)
    q, k, v = (rng.normal(size=(2, 3, seq, 8)).astype("float32") for _ in range(3))
    real = np.ones((2, seq), bool)
    real[1, max(1, seq - 2) :] = False
    ours = keras.ops.convert_to_numpy(global_attention(q, k, v, real, chunk))
    expected = full_window_attention(q, k, v, real, window=seq)
    keep = real[:, None, :, None].repeat(3, 1)
    np.testing.assert_allclose(np.where(keep, ours, 0), np.where(keep, expected, 0), atol=1e-5)
