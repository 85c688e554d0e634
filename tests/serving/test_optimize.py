"""`kbert.serving.optimize`: the export's rewrites of a built model give the model's own numbers.

The reference is the plain Keras model (kbert.model.layers, checked against google-research/bert
in tests/model/test_parity.py), run on the whole padded batch; the optimized model runs each
group of rows on its longest text, Q, K and V as one matmul, LayerNorms as one kernel. Real
tokens and pooled outputs must agree: to float32 rounding in float32, and in bfloat16 no further
from the float32 model than the plain bfloat16 model is (the rewritten form rounds differently).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kbert
from kbert.model import layers
from kbert.serving.optimize import (
    GROUP_ROWS,
    InferenceTransformerLayer,
    layer_norm_as_batch_norm,
    layer_norm_in_few_ops,
    optimize,
)

CONFIG = kbert.BertConfig(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=24,
    type_vocab_size=2,
    initializer_range=0.5,
)  # large weights: attention far from uniform


@pytest.fixture(autouse=True)
def seeded():
    keras.utils.set_random_seed(0)  # the same initial weights each run


@pytest.mark.parametrize("form", [layer_norm_as_batch_norm, layer_norm_in_few_ops], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-6), ("bfloat16", 0.05)])
@pytest.mark.parametrize("shape", [[3, 5, 16], [7, 16]])
def test_each_layer_norm_form_is_keras_layer_norm(shape, dtype, tol, form):
    """The export's LayerNorms give keras' LayerNorm's numbers, run eagerly and in a graph:
    `layer_norm_as_batch_norm` (TF's FusedBatchNormV3 kernel eagerly, _MklLayerNorm in a graph
    where oneDNN is on) and `layer_norm_in_few_ops`."""
    norm = layers.layer_norm(CONFIG, "keras_norm", dtype=dtype)
    x = tf.random.stateless_normal(shape, [1, 2], mean=1.0, stddev=3.0)
    norm.build(x.shape)
    norm.gamma.assign(tf.cast(tf.random.stateless_normal([16], [1, 3], mean=1.0, stddev=0.2), dtype))
    norm.beta.assign(tf.cast(tf.random.stateless_normal([16], [1, 4], stddev=0.2), dtype))
    x = tf.cast(x, dtype)
    expected = norm(x)

    def layer_norm(x):
        return form(x, tf.cast(norm.gamma, dtype), tf.cast(norm.beta, dtype), norm.epsilon)

    for run in (layer_norm, tf.function(layer_norm)):
        got = run(x)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_allclose(tf.cast(got, "float32"), tf.cast(expected, "float32"), rtol=0, atol=tol)


def trained_like(model, reference=None):
    """Weights moved off their initial values (no zero bias, no gain of exactly 1), as a trained
    model has them; or, with `reference`, the reference model's weights in this model's dtype."""
    rng = np.random.default_rng(0)
    for i, w in enumerate(model.weights):
        value = (
            reference.weights[i].numpy()
            if reference is not None
            else w.numpy().astype("float32") + rng.normal(0, 0.1, w.shape)
        )
        w.assign(tf.cast(value, w.dtype))


def built(make, precision="float32", reference=None):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)  # weights and compute in this dtype, as `kbert export`
    try:
        model = make(CONFIG)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    trained_like(model, reference)
    return model


def padded_batch(rows=2 * GROUP_ROWS + 3, seq=20, choices=None):
    """Token ids of many lengths (1 to `seq`, one row at full length), padded with 0s to `seq`."""
    rng = np.random.default_rng(1)
    shape = (rows, choices, seq) if choices else (rows, seq)
    lengths = rng.integers(1, seq + 1, shape[:-1])
    lengths.flat[0] = seq
    mask = (np.arange(seq) < lengths[..., None]).astype("int32")
    segments = (np.arange(seq) >= lengths[..., None] // 2).astype("int32") * mask
    return {
        "input_ids": rng.integers(1, CONFIG.vocab_size, shape).astype("int32") * mask,
        "input_mask": mask,
        "segment_ids": segments,
    }


def real(outputs, features):
    """float32 outputs, keeping only real tokens' values of per-token outputs."""
    mask = features["input_mask"].astype(bool)
    values = {k: np.asarray(tf.cast(v, "float32")) for k, v in outputs.items()}
    return {k: v[mask] if v.ndim == mask.ndim + 1 else v for k, v in values.items()}


OPTIONS = [
    {},
    {"constant_weights": True},
    {"fuse_qkv": False},
    {"layer_norm": "one-kernel"},
    {"layer_norm": "keras"},
    {"group_rows": 1 << 30},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
def test_optimized_encoder_gives_the_models_outputs_in_float32(options):
    encoder = built(kbert.bert_encoder)
    features = padded_batch()
    expected = real(encoder(features, training=False), features)
    got = real(optimize(encoder, **options)(features), features)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(got[key], expected[key], rtol=0, atol=1e-5, err_msg=key)


def test_optimized_encoder_in_bfloat16_is_as_close_to_float32_as_the_model():
    """bfloat16 rounds differently in the rewritten form (one [H, 3H] matmul; the LayerNorms
    rounded to bfloat16 once, after gamma and beta in float32), so its outputs are not the bfloat16 model's
    bit for bit: they must be no further from the float32 model than the bfloat16 model is."""
    reference = built(kbert.bert_encoder)
    encoder = built(kbert.bert_encoder, "bfloat16", reference)
    features = padded_batch()
    exact = real(reference(features, training=False), features)
    plain = real(encoder(features, training=False), features)
    got = real(optimize(encoder)(features), features)
    for key in ("sequence_output", "pooled_output"):
        # The mean error is the steady measure; the largest single error moves more from seed to seed.
        plain_error, error = np.abs(plain[key] - exact[key]), np.abs(got[key] - exact[key])
        assert error.mean() <= 1.1 * plain_error.mean(), (key, error.mean(), plain_error.mean())
        assert error.max() <= 2 * plain_error.max(), (key, error.max(), plain_error.max())


@pytest.mark.parametrize(
    "make, choices",
    [
        (lambda c: kbert.bert_classifier(c, 3), None),
        (lambda c: kbert.bert_tagger(c, 5), None),
        (kbert.bert_multiple_choice, 4),
    ],
    ids=["classify", "tag", "choice"],
)
def test_a_task_model_is_optimized_around_its_encoder_and_left_as_it_was(make, choices):
    model = built(make)
    weights = [id(w) for w in model.weights]
    features = padded_batch(rows=5 if choices else 2 * GROUP_ROWS + 3, choices=choices)
    expected = real(model(features, training=False), features)
    served = optimize(model)
    np.testing.assert_allclose(real(served(features), features)["logits"], expected["logits"], rtol=0, atol=1e-5)
    assert served.num_classes == model.num_classes  # attributes are the model's
    # The rewritten model runs the model's own weights (plus the concatenated Q, K, V) and layers;
    # the model itself gained nothing.
    assert [id(w) for w in model.weights] == weights
    assert set(weights) <= {id(w) for w in served.model.weights}
    inference = [
        layer for layer in served.model.get_layer("bert_encoder").layers if isinstance(layer, InferenceTransformerLayer)
    ]
    assert [layer.layer for layer in inference] == model.encoder.transformer_layers
