"""The original's initial values, and models built without them when every weight is loaded next.

`initializer(config, weight)` is modeling.py's rule: kernels, embedding tables and task heads'
`output_weights` draw from a truncated normal (cut at 2 stddev) with `initializer_range`
(`modeling.create_initializer`); biases and LayerNorm betas start at 0, gammas at 1.

`unfilled()` is for loaders (`kbert.load`, the converters), as transformers' `no_init_weights`
is for `from_pretrained`: inside it, a model's weights are created without drawing their
initial values, because the loader assigns every one of them by its `variable.path` next.
For BERT-base the draw takes longer than reading the whole checkpoint (measured in
benchmarks/convert_bench.py). A loader must assign every weight of a model built this way
(`kbert.converters.loading` does, and fails if it did not).
"""

from __future__ import annotations

import contextlib

import keras

from kbert.backend import empty
from kbert.config import BertConfig

# The weight names (the last part of a path) that start at 0 and at 1; any other weight draws.
ZERO_WEIGHTS = ("bias", "beta", "output_bias")
ONE_WEIGHTS = ("gamma",)

# True inside `unfilled()`.
_UNFILLED = [False]


def initializer(config: BertConfig, weight: str) -> keras.initializers.Initializer:
    """The original's initializer for a weight named `weight` ("kernel", "bias", "gamma", ...).

    Example:
    >>> config = BertConfig(vocab_size=10)
    >>> type(initializer(config, "kernel")).__name__, type(initializer(config, "beta")).__name__
    ('TruncatedNormal', 'Zeros')
    >>> with unfilled():
    ...     type(initializer(config, "kernel")).__name__
    'Unfilled'
    """
    original = original_initializer(config, weight)
    # Made even when unused: a Keras random initializer draws its seed from Python's `random`
    # when it is made, so building a model unfilled leaves the random state where building it
    # filled would (a head put on a loaded model then starts from the same weights either way).
    return Unfilled() if _UNFILLED[0] else original


def original_initializer(config: BertConfig, weight: str) -> keras.initializers.Initializer:
    """modeling.py's initializer for `weight`, inside `unfilled()` too (for the weights a loader
    has no value for: a head the checkpoint lacks)."""
    if weight in ZERO_WEIGHTS:
        return keras.initializers.Zeros()
    if weight in ONE_WEIGHTS:
        return keras.initializers.Ones()
    return keras.initializers.TruncatedNormal(stddev=config.initializer_range)


class Unfilled(keras.initializers.Initializer):
    """Memory for a weight, left as it was (`kbert.backend.empty`): for weights assigned next."""

    def __call__(self, shape, dtype=None):
        return empty(shape, dtype)


@contextlib.contextmanager
def unfilled():
    """Build models whose weights hold no initial values, for a loader to assign every one.

    Example:
    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...                           num_attention_heads=2, intermediate_size=16)
    >>> with unfilled():
    ...     encoder = kbert.bert_encoder(config)
    >>> for variable in encoder.weights:
    ...     _ = variable.assign(keras.ops.ones(variable.shape))
    """
    previous = _UNFILLED[0]
    _UNFILLED[0] = True
    try:
        yield
    finally:
        _UNFILLED[0] = previous
