"""The strict loader every format goes through (converters/loading.py)."""

import numpy as np
import pytest

import kbert
from kbert.converters.loading import Stored, load_pretrainer, stored_weights
from kbert.converters.names import tf1_to_kbert_paths
from kbert.runtime.errors import KbertError

CONFIG = kbert.BertConfig(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=24,
    initializer_range=0.02,
)


def tf1_arrays(model):
    return {
        name: np.asarray(value)
        for name, value in stored_weights(
            model, tf1_to_kbert_paths(CONFIG.num_hidden_layers), format_name="TF1"
        ).items()
    }


def stored(arrays, **kwargs):
    return Stored(
        where="src",
        shapes={n: a.shape for n, a in arrays.items()},
        paths=tf1_to_kbert_paths(CONFIG.num_hidden_layers),
        read=lambda name, shape: arrays[name],
        config_name="bert_config.json",
        **kwargs,
    )


def test_every_weight_is_assigned_from_the_source_and_heads_it_lacks_get_the_original_initializer():
    arrays = tf1_arrays(kbert.bert_pretrainer(CONFIG))
    without_heads = {n: a for n, a in arrays.items() if not n.startswith("cls/")}
    model, fresh = load_pretrainer(CONFIG, stored(without_heads))
    assert fresh == ["masked_lm", "next_sentence"]
    loaded = tf1_arrays(model)
    for name, value in without_heads.items():
        np.testing.assert_array_equal(loaded[name], value)
    # The fresh heads hold modeling.py's initial values, not the unfilled memory.
    np.testing.assert_array_equal(loaded["cls/predictions/transform/LayerNorm/gamma"], np.ones(16))
    np.testing.assert_array_equal(loaded["cls/predictions/output_bias"], np.zeros(40))
    kernel = loaded["cls/seq_relationship/output_weights"]
    assert np.all(np.abs(kernel) <= 2 * 0.02 + 1e-7) and 0.005 < kernel.std() < 0.03


def test_a_model_built_under_bfloat16_gets_bfloat16_weights(monkeypatch):
    import keras

    arrays = tf1_arrays(kbert.bert_pretrainer(CONFIG))
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("bfloat16")
    try:
        model, _ = load_pretrainer(CONFIG, stored(arrays))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    word = model.encoder.embeddings.word_embeddings.embeddings
    assert word.dtype == "bfloat16"
    np.testing.assert_allclose(
        np.asarray(word.numpy(), np.float32), arrays["bert/embeddings/word_embeddings"], rtol=1e-2, atol=1e-3
    )


@pytest.mark.parametrize(
    "change, fragments",
    [
        (
            lambda a: a.pop("bert/encoder/layer_1/output/dense/bias"),
            ["src: 1 weight missing from the source", "bert/encoder/layer_1/output/dense/bias"],
        ),
        (
            lambda a: a.update({"bert/encoder/layer_2/output/dense/bias": np.zeros(16, np.float32)}),
            ["1 unknown weight", "more layers than num_hidden_layers in bert_config.json"],
        ),
        (
            lambda a: a.update({"bert/encoder/layer_0/intermediate/dense/kernel": np.zeros((16, 64), np.float32)}),
            [
                "bert/encoder/layer_0/intermediate/dense/kernel: the source has shape [16, 64] but bert_config.json "
                "gives [16, 32]; check intermediate_size"
            ],
        ),
    ],
)
def test_unknown_missing_and_misshapen_weights_are_refused_before_anything_is_read(change, fragments):
    arrays = tf1_arrays(kbert.bert_pretrainer(CONFIG))
    change(arrays)
    reads = []
    bad = stored(arrays)
    bad.read = lambda name, shape: reads.append(name)
    with pytest.raises(KbertError) as error:
        load_pretrainer(CONFIG, bad)
    for fragment in fragments:
        assert fragment in str(error.value)
    assert reads == []


def test_a_weight_the_format_cannot_name_is_refused_on_writing_unless_skipped():
    classifier = kbert.bert_classifier(CONFIG, 3)
    with pytest.raises(KbertError, match="classifier_head/output_weights has no name in TF1"):
        stored_weights(classifier, tf1_to_kbert_paths(2), format_name="TF1")
    assert len(stored_weights(classifier, tf1_to_kbert_paths(2), format_name="TF1", unnamed="skip")) == 5 + 16 * 2 + 2
