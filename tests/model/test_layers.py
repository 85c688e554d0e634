"""Each layer's training path (kbert.backend.tensorflow_fused's kernels) against its plain path (the Keras ops
inference runs, here with training=True inside `fused.disabled()`): the same values and the same
gradients with respect to every weight, float32 to float32 rounding. With dropout on, both paths
draw their masks from the same seed generators, so they agree too."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert.backend import tensorflow_fused as fused
from kbert.config import BertConfig
from kbert.model import layers

KERNELS = ("gelu", "dropout", "bias_dropout", "attention_probs", "layer_norm", "bias_add_float32")


def tiny_config(dropout: float) -> BertConfig:
    # initializer_range 0.5 rather than 0.02: weights large enough that the attention is not
    # uniform and every gradient is far from 0.
    return BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        type_vocab_size=2,
        initializer_range=0.5,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


@pytest.fixture(autouse=True)
def seeded():
    keras.utils.set_random_seed(0)  # the same initial weights and seed-generator states each run


@pytest.fixture
def kernels_run(monkeypatch):
    """The names of the fused kernels called since the set was last cleared."""
    ran = set()

    def spy_on(name, kernel):
        def spy(*args):
            ran.add(name)
            return kernel(*args)

        return spy

    for name in KERNELS:
        monkeypatch.setattr(fused, name, spy_on(name, getattr(fused, name)))
    return ran


def both_paths(layer, call, kernels_run, inputs=()):
    """[(output, gradients w.r.t. layer.trainable_variables and `inputs`, kernels called)] for
    training=True through the fused kernels, then through the plain ops, each from the same
    variable and seed-generator state."""
    call()  # builds the layer, so that its variables exist
    state = [v.numpy() for v in layer.variables]  # the seed generators' states are among them
    results = []
    for scope in (contextlib.nullcontext(), fused.disabled()):
        for variable, value in zip(layer.variables, state):
            variable.assign(value)
        kernels_run.clear()
        with scope, tf.GradientTape() as tape:
            tape.watch(list(inputs))
            out = call()
        upstream = tf.random.stateless_normal(tf.shape(out), [5, 6])
        grads = tape.gradient(out, layer.trainable_variables + list(inputs), output_gradients=upstream)
        results.append((out, [tf.convert_to_tensor(g) for g in grads], set(kernels_run)))
    return results


def max_difference(a, b) -> float:
    """max |a - b| relative to max(1, max |b|)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def assert_paths_agree(results, layer, kernels, tol=1e-6):
    (ours, our_grads, ran), (theirs, their_grads, plain_ran) = results
    assert ran == set(kernels), "the fused path should run exactly these kernels"
    assert plain_ran == set(), "fused.disabled() should keep every kernel out"
    assert max_difference(ours, theirs) <= tol, ("output", max_difference(ours, theirs))
    assert len(our_grads) == len(layer.trainable_variables) > 0
    for variable, a, b in zip(layer.trainable_variables, our_grads, their_grads):
        if variable.path.endswith("key/bias"):
            # Softmax ignores a constant added to every score of a row, and that is all the key
            # bias adds (q·b): its gradient is 0 but for rounding, on both paths.
            assert max(np.abs(np.asarray(a)).max(), np.abs(np.asarray(b)).max()) < 1e-5
            continue
        assert np.abs(np.asarray(b)).max() > 0.1, variable.path  # a gradient worth comparing
        # A weight's gradient sums over every position, in another order on each path: float32
        # rounding of that sum reached 1.03e-6 (relative) for a LayerNorm gamma with one of the
        # dropout masks the suite's order gives (seen in CI), so weights get twice `tol`.
        assert max_difference(a, b) <= 2 * tol, (variable.path, max_difference(a, b))


def test_use_fused_is_the_one_switch():
    assert layers.use_fused(True) and not layers.use_fused(False) and not layers.use_fused(None)
    with fused.disabled():
        assert not layers.use_fused(True)
        with fused.disabled():
            pass
        assert not layers.use_fused(True)
    assert layers.use_fused(True)
    with pytest.raises(ValueError), fused.disabled():
        raise ValueError
    assert fused.enabled()


def test_only_a_plain_dense_takes_the_fused_path():
    def built(dense):
        dense.build((None, 8))
        return dense

    assert layers.use_fused(True, built(keras.layers.Dense(4)))

    class Scaled(keras.layers.Dense):
        def call(self, inputs, training=None):
            return 2.0 * super().call(inputs)

    lora = built(keras.layers.Dense(4))
    lora.enable_lora(2)
    int8 = built(keras.layers.Dense(4))
    int8.quantize("int8")
    for dense in (
        built(Scaled(4)),
        lora,
        int8,
        built(keras.layers.Dense(4, activation="relu")),
        built(keras.layers.Dense(4, use_bias=False)),
    ):
        assert not layers.use_fused(True, dense), dense


def test_layer_norm(kernels_run):
    layer = layers.layer_norm(tiny_config(0.0), "layer_norm")
    x = tf.random.stateless_normal([3, 5, 16], [1, 2], mean=1.0, stddev=3.0)
    layer.build(x.shape)
    layer.gamma.assign(tf.random.stateless_normal([16], [1, 3], mean=1.0, stddev=0.2))
    layer.beta.assign(tf.random.stateless_normal([16], [1, 4], stddev=0.2))
    results = both_paths(layer, lambda: layer(x, training=True), kernels_run)
    assert_paths_agree(results, layer, {"layer_norm"})


def test_dropout_is_keras_dropout_bit_for_bit(kernels_run):
    layer = layers.Dropout(0.1)
    x = tf.random.stateless_normal([4, 8, 16], [1, 5])
    (ours, (our_grad,), ran), (theirs, (their_grad,), plain_ran) = both_paths(
        layer, lambda: layer(x, training=True), kernels_run, inputs=[x]
    )
    assert ran == {"dropout"} and plain_ran == set()
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(our_grad.numpy(), their_grad.numpy())
    assert 0.85 < float(np.mean(ours.numpy() != 0)) < 0.95


def token_inputs():
    input_ids = tf.constant([[2, 7, 9, 30, 4, 0], [5, 39, 1, 3, 0, 0]])
    segment_ids = tf.constant([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0]])
    input_mask = tf.constant([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    return input_ids, segment_ids, input_mask


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_embeddings(dropout, kernels_run):
    layer = layers.BertEmbeddings(tiny_config(dropout))
    input_ids, segment_ids, _ = token_inputs()
    results = both_paths(layer, lambda: layer(input_ids, segment_ids, training=True), kernels_run)
    assert_paths_agree(results, layer, {"layer_norm"} | ({"dropout"} if dropout else set()))


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_transformer_layer(dropout, kernels_run):
    layer = layers.TransformerLayer(tiny_config(dropout))
    hidden = tf.random.stateless_normal([2, 6, 16], [2, 1])
    adder = layers.attention_adder(token_inputs()[2])  # the second example is padded
    results = both_paths(layer, lambda: layer(hidden, adder, training=True), kernels_run)
    kernels = {"layer_norm", "gelu"} | ({"attention_probs", "bias_dropout"} if dropout else set())
    assert_paths_agree(results, layer, kernels)


def test_transformer_layer_with_int8_dense_layers_trains_through_their_call(kernels_run):
    # The fused GELU and bias-dropout kernels would multiply by the raw int8 kernel and skip its
    # scale; the layer must send quantized Dense layers through Dense.call instead.
    layer = layers.TransformerLayer(tiny_config(0.1))
    hidden = tf.random.stateless_normal([2, 6, 16], [2, 2])
    adder = layers.attention_adder(token_inputs()[2])
    layer(hidden, adder)
    for dense in (layer.intermediate, layer.attention_output, layer.output_dense):
        dense.quantize("int8")
    results = both_paths(layer, lambda: layer(hidden, adder, training=True), kernels_run)
    assert_paths_agree(results, layer, {"layer_norm", "attention_probs", "dropout"})


def test_masked_lm_head(kernels_run):
    config = tiny_config(0.0)
    word_embeddings = keras.layers.Embedding(
        config.vocab_size, config.hidden_size, embeddings_initializer=layers.initializer(config, "embeddings")
    )
    word_embeddings.build((None,))
    layer = layers.MaskedLMHead(config, word_embeddings)
    sequence_output = tf.random.stateless_normal([2, 6, 16], [3, 1])
    positions = tf.constant([[1, 4, 0], [2, 3, 5]])
    layer.build(sequence_output.shape)
    layer.output_bias.assign(tf.random.stateless_normal([config.vocab_size], [3, 2]))
    results = both_paths(layer, lambda: layer(sequence_output, positions, training=True), kernels_run)
    assert_paths_agree(results, layer, {"layer_norm", "bias_add_float32"})
