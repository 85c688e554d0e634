import keras
import numpy as np
import pytest

import kbert
from helpers import assert_round_trips
from kbert.model.bert import BertEncoder, BertPretrainer

CONFIG = kbert.BertConfig(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
    type_vocab_size=2,
)


def _inputs(batch=2, seq=9, predictions=3, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CONFIG.vocab_size, (batch, seq)).astype("int32")
    mask = np.ones_like(ids)
    mask[-1, seq // 2 :] = 0  # a padded row
    return {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": (np.arange(seq) >= seq // 2).astype("int32")[None].repeat(batch, 0),
        "masked_lm_positions": rng.integers(0, seq // 2, (batch, predictions)).astype("int32"),
    }


def _encoder_inputs(inputs):
    return {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}


def test_input_and_output_names_are_the_contract():
    encoder = kbert.bert_encoder(CONFIG)
    assert sorted(encoder.input) == ["input_ids", "input_mask", "segment_ids"]
    assert sorted(encoder.output) == ["pooled_output", "sequence_output"]
    pretrainer = kbert.bert_pretrainer(CONFIG)
    assert sorted(pretrainer.input) == ["input_ids", "input_mask", "masked_lm_positions", "segment_ids"]
    assert sorted(pretrainer.output) == ["mlm_logits", "nsp_logits", "pooled_output", "sequence_output"]
    for tensor in pretrainer.input.values():
        assert tensor.dtype == "int32" and tuple(tensor.shape) == (None, None)


def test_sequence_length_is_dynamic():
    model = kbert.bert_pretrainer(CONFIG)
    for seq in (5, 17, 40):
        out = model(_inputs(seq=seq))
        assert tuple(out["sequence_output"].shape) == (2, seq, 32)
        assert tuple(out["mlm_logits"].shape) == (2, 3, 120)
        assert tuple(out["nsp_logits"].shape) == (2, 2)


def test_padding_does_not_change_real_tokens():
    model = kbert.bert_encoder(CONFIG)
    inputs = _encoder_inputs(_inputs(batch=1, seq=6))
    short = model(inputs)["sequence_output"].numpy()
    padded = {k: np.pad(v, ((0, 0), (0, 4))) for k, v in inputs.items()}
    longer = model(padded)["sequence_output"].numpy()
    np.testing.assert_allclose(longer[:, :6], short, atol=1e-5)


def test_dropout_only_in_training():
    model = kbert.bert_pretrainer(CONFIG)
    inputs = _inputs()
    a, b = model(inputs, training=False), model(inputs, training=False)
    np.testing.assert_array_equal(a["sequence_output"], b["sequence_output"])
    c, d = model(inputs, training=True), model(inputs, training=True)
    assert not np.allclose(c["sequence_output"], d["sequence_output"])
    assert not np.allclose(a["sequence_output"], c["sequence_output"])


def test_get_config_from_config_round_trip():
    model = kbert.bert_pretrainer(CONFIG)
    clone = BertPretrainer.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    clone.set_weights(model.get_weights())
    inputs = _inputs()
    np.testing.assert_array_equal(model(inputs)["mlm_logits"], clone(inputs)["mlm_logits"])
    encoder = kbert.bert_encoder(CONFIG)
    assert BertEncoder.from_config(encoder.get_config()).get_config() == encoder.get_config()


def test_keras_saving_round_trip(tmp_path):
    model = kbert.bert_pretrainer(CONFIG)
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    inputs = _inputs()
    np.testing.assert_array_equal(model(inputs)["nsp_logits"], restored(inputs)["nsp_logits"])


@pytest.fixture
def policy():
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


def test_mixed_bfloat16(policy):
    reference = kbert.bert_pretrainer(CONFIG)
    policy("mixed_bfloat16")
    model = kbert.bert_pretrainer(CONFIG)
    model.set_weights(reference.get_weights())
    assert all(w.dtype == "float32" for w in model.weights)  # variables stay float32
    inputs = _inputs()
    out, ref = model(inputs), reference(inputs)
    assert out["sequence_output"].dtype == "bfloat16"
    assert out["mlm_logits"].dtype == "float32" and out["nsp_logits"].dtype == "float32"
    assert np.isfinite(out["mlm_logits"].numpy()).all()
    np.testing.assert_allclose(out["pooled_output"].numpy().astype("float32"), ref["pooled_output"], atol=0.1)
    np.testing.assert_allclose(out["mlm_logits"], ref["mlm_logits"], atol=0.3)


def test_mixed_float16_builds_and_trains_a_step(policy):
    policy("mixed_float16")
    model = kbert.bert_pretrainer(CONFIG)
    inputs = _inputs()
    out = model(inputs, training=True)
    assert out["sequence_output"].dtype == "float16" and out["mlm_logits"].dtype == "float32"
    assert np.isfinite(out["mlm_logits"].numpy()).all()


def test_save_and_load_model_dir(tmp_path):
    model = kbert.bert_pretrainer(CONFIG)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(CONFIG.vocab_size)))
    kbert.save(model, tmp_path / "model", vocab_file=str(vocab), do_lower_case=False)
    loaded = kbert.load(tmp_path / "model")
    assert isinstance(loaded, BertPretrainer) and loaded.do_lower_case is False
    inputs = _inputs()
    np.testing.assert_array_equal(model(inputs)["mlm_logits"], loaded(inputs)["mlm_logits"])

    encoder = kbert.bert_encoder(CONFIG)
    kbert.save(encoder, tmp_path / "encoder", vocab_file=str(vocab))
    loaded = kbert.load(tmp_path / "encoder")
    assert isinstance(loaded, BertEncoder)
    np.testing.assert_array_equal(
        encoder(_encoder_inputs(inputs))["pooled_output"], loaded(_encoder_inputs(inputs))["pooled_output"]
    )


def test_load_errors(tmp_path):
    with pytest.raises(kbert.KbertError, match="no such model directory"):
        kbert.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "bert_config.json").write_text(CONFIG.to_json_string())
    with pytest.raises(kbert.KbertError, match="no such weights file"):
        kbert.load(tmp_path / "empty")


def test_model_fit_runs():
    """User code calls model.fit on kbert models: a plain Keras compile/fit on the NSP logits."""
    encoder_inputs = _encoder_inputs(_inputs(batch=8))
    model = kbert.bert_pretrainer(CONFIG)
    inputs = dict(encoder_inputs, masked_lm_positions=np.zeros((8, 1), "int32"))
    nsp = keras.Model(model.input, model.output["nsp_logits"])
    nsp.compile(
        optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = nsp.fit(inputs, np.array([0, 1] * 4), epochs=3, batch_size=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize(
    "build",
    [
        kbert.bert_encoder,
        kbert.bert_pretrainer,
        lambda c: kbert.bert_classifier(c, 3),
        lambda c: kbert.bert_classifier(c, 1),
        lambda c: kbert.bert_tagger(c, 4),
        kbert.bert_span_predictor,
        kbert.bert_multiple_choice,
    ],
    ids=["encoder", "pretrainer", "classifier", "regressor", "tagger", "span_predictor", "multiple_choice"],
)
def test_every_model_round_trips(build, tmp_path):
    model = build(CONFIG)
    inputs = _inputs() if isinstance(model, BertPretrainer) else _encoder_inputs(_inputs())
    if isinstance(model, kbert.BertMultipleChoice):  # [batch, choices, seq]: the same 2 rows as 3 choices
        inputs = {k: np.stack([v, v[::-1], v], axis=1) for k, v in inputs.items()}
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(CONFIG.vocab_size)))
    assert_round_trips(model, inputs, tmp_path, vocab_file=str(vocab))
