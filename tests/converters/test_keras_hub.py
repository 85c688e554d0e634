"""`kbert convert to-keras-hub / from-keras-hub`: presets that real keras-hub writes and loads.

Every preset here is loaded by keras-hub itself (`from_preset`), and every preset read was
written by keras-hub's own `save_to_preset`. The reference numbers are the original code's
(fixtures/tf1-tiny/expected.npz) and keras-hub's own outputs.
"""

import json
import os

import keras
import keras_hub
import numpy as np
import pytest

import kbert
from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from helpers import EXPECTED

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

IDS = {k: EXPECTED[k].astype("int32") for k in ("input_ids", "input_mask", "segment_ids")}
UNIQUE_VOCAB = os.path.join(FIXTURES, "model-garden-tfhub", "vocab.txt")  # tf1-tiny's, repeats renamed


def _keras_hub_outputs(backbone):
    return backbone(
        {"token_ids": IDS["input_ids"], "segment_ids": IDS["segment_ids"], "padding_mask": IDS["input_mask"]},
        training=False,
    )


def _tanh_copy(tmp_path):
    """tf1-tiny as a kbert model that computes the tanh GELU, as keras-hub does."""
    run_kbert("convert", "from-tf1", TINY, tmp_path / "tiny")
    model = kbert.load(tmp_path / "tiny")
    config = json.load(open(tmp_path / "tiny" / "bert_config.json"))
    config["hidden_act"] = "gelu_tanh"
    tanh = kbert.BertPretrainer(
        kbert.BertConfig.from_dict({k: v for k, v in config.items() if k in kbert.BertConfig.field_names()})
    )
    tanh.set_weights(model.get_weights())
    kbert.save(tanh, tmp_path / "tanh", vocab_file=os.path.join(TINY, "vocab.txt"), do_lower_case=True)
    return tmp_path / "tanh"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("keras_hub")
    run_kbert("convert", "from-tf1", TINY, base / "tiny")
    report = json.loads(run_kbert("convert", "to-keras-hub", base / "tiny", base / "preset").stdout)
    return base, report


def test_keras_hub_loads_an_original_model_and_the_gelu_difference_is_reported(tiny):
    base, report = tiny
    assert sorted(os.listdir(base / "preset")) == [
        "assets",
        "config.json",
        "metadata.json",
        "model.weights.h5",
        "preprocessor.json",
        "task.json",  # a BertMaskedLM: the trained masked-LM head goes too
        "task.weights.h5",
        "tokenizer.json",
    ]
    backbone = keras_hub.models.BertBackbone.from_preset(str(base / "preset"))
    theirs = _keras_hub_outputs(backbone)
    # keras-hub's tanh GELU against the original's erf GELU: close, never exact.
    gap = np.abs(np.asarray(theirs["sequence_output"]) - EXPECTED["sequence_output"])[IDS["input_mask"] == 1].max()
    assert 1e-5 < gap < 1e-2
    assert report["hidden_act"] == "gelu" and 1e-5 < report["max_abs_difference"]["sequence_output"] < 1e-2
    assert 1e-5 < report["max_abs_difference"]["pooled_output"] < 1e-2
    assert report["renamed_repeated_tokens"] == 3  # keras-hub refuses repeated tokens

    tokenizer = keras_hub.models.BertTokenizer.from_preset(str(base / "preset"))
    ours = kbert.Tokenizer(os.path.join(TINY, "vocab.txt"))
    for text in ("the man went to the store", "He bought a gallon of milk."):
        assert np.asarray(tokenizer(text)).tolist() == ours.convert_tokens_to_ids(ours.tokenize(text))

    classifier = keras_hub.models.BertTextClassifier.from_preset(str(base / "preset"), num_classes=3)
    assert classifier.predict(["the man went to the store", "penguins are birds"], verbose=0).shape == (2, 3)


def test_a_tanh_model_is_exact_in_keras_hub(tmp_path):
    tanh = _tanh_copy(tmp_path)
    report = json.loads(run_kbert("convert", "to-keras-hub", tanh, tmp_path / "preset").stdout)
    assert report["max_abs_difference"]["sequence_output"] < 1e-5
    backbone = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "preset"))
    ours = kbert.load(tanh).encoder(IDS)
    for name in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(np.asarray(_keras_hub_outputs(backbone)[name]), np.asarray(ours[name]), atol=1e-5)


def test_a_fine_tuned_classifier_keeps_its_head(tmp_path):
    tanh = _tanh_copy(tmp_path)
    classifier = kbert.bert_classifier(kbert.load(tanh), num_classes=3)
    head = classifier.get_layer("classifier_head")
    head.set_weights([np.random.default_rng(0).normal(size=w.shape).astype("float32") for w in head.get_weights()])
    kbert.save(classifier, tmp_path / "classifier", vocab_file=os.path.join(TINY, "vocab.txt"))
    report = json.loads(run_kbert("convert", "to-keras-hub", tmp_path / "classifier", tmp_path / "preset").stdout)
    assert report["task"] == "BertTextClassifier"
    task = keras_hub.models.BertTextClassifier.from_preset(str(tmp_path / "preset"))  # the trained head
    texts = ["the man went to the store", "penguins are flightless birds"]
    theirs = task.predict(texts, verbose=0)
    packed = kbert.BertPreprocessor(os.path.join(TINY, "vocab.txt"), True, 64)(np.array(texts))
    ours = kbert.load(tmp_path / "classifier")(packed)
    np.testing.assert_allclose(theirs, np.asarray(ours["logits"] if isinstance(ours, dict) else ours), atol=1e-5)


def _keras_hub_preset(path):
    keras.utils.set_random_seed(7)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=300,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=64,
        num_segments=2,
    )
    # Random biases and LayerNorm parameters too, so a swapped weight cannot pass unseen.
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        weight.assign(rng.normal(scale=0.2, size=weight.shape).astype("float32") + ("gamma" in weight.path))
    backbone.save_to_preset(str(path))
    keras_hub.models.BertTokenizer(vocabulary=UNIQUE_VOCAB, lowercase=True).save_to_preset(str(path))
    return backbone


def test_from_keras_hub_is_exact(tmp_path):
    backbone = _keras_hub_preset(tmp_path / "preset")
    report = json.loads(run_kbert("convert", "from-keras-hub", tmp_path / "preset", tmp_path / "model").stdout)
    assert report["weights_loaded"] == 39 and report["fresh_heads"] == ["masked_lm", "next_sentence"]
    assert report["hidden_act"] == "gelu_tanh" and report["do_lower_case"] is True
    assert json.load(open(tmp_path / "model" / "bert_config.json"))["hidden_act"] == "gelu_tanh"
    ours = kbert.load(tmp_path / "model").encoder(IDS)
    theirs = _keras_hub_outputs(backbone)
    for name in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(np.asarray(ours[name]), np.asarray(theirs[name]), atol=1e-5)


def test_round_trip_through_keras_hub_keeps_every_encoder_weight_bit_for_bit(tiny, tmp_path):
    base, _ = tiny
    run_kbert("convert", "from-keras-hub", base / "preset", tmp_path / "back")
    original = {w.path: w.numpy() for w in kbert.load(base / "tiny").encoder.weights if "seed_generator" not in w.path}
    back = {w.path: w.numpy() for w in kbert.load(tmp_path / "back").encoder.weights if "seed_generator" not in w.path}
    assert len(original) == 39 and original.keys() == back.keys()
    assert all(np.array_equal(original[p], back[p]) for p in original)
    # The vocabulary comes back with its repeated tokens renamed, every id unchanged for the tokenizer.
    ours, theirs = (kbert.Tokenizer(str(v)) for v in (os.path.join(TINY, "vocab.txt"), tmp_path / "back" / "vocab.txt"))
    assert ours.vocab == {t: i for t, i in theirs.vocab.items() if not t.startswith("[unused_repeat_")}


def test_bad_input_one_line_and_nothing_written(tiny, tmp_path):
    base, _ = tiny

    def fails(*args, fragment):
        result = run_kbert("convert", *args, tmp_path / "out", check=False)
        assert_user_error(result, fragment)
        assert not os.path.exists(tmp_path / "out")

    keras_hub.models.GPT2Backbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16
    ).save_to_preset(str(tmp_path / "gpt2"))
    (tmp_path / "gpt2" / "assets" / "tokenizer").mkdir(parents=True)
    (tmp_path / "gpt2" / "assets" / "tokenizer" / "vocabulary.txt").write_text("a\n")
    (tmp_path / "gpt2" / "tokenizer.json").write_text("{}")
    fails("from-keras-hub", tmp_path / "gpt2", fragment="GPT2Backbone")
    fails("from-keras-hub", tmp_path / "nowhere", fragment="no such file or folder; pass a keras-hub preset")
    os.makedirs(tmp_path / "half")
    (tmp_path / "half" / "config.json").write_text((base / "preset" / "config.json").read_text())
    fails(
        "from-keras-hub",
        tmp_path / "half",
        fragment="config.json but no weights (model.safetensors for a Hugging Face model, model.weights.h5 for a keras-hub preset)",
    )
    fails("to-keras-hub", tmp_path / "nowhere", fragment="nowhere")
    result = run_kbert("convert", "to-keras-hub", base / "tiny", base / "preset", check=False)  # exists
    assert_user_error(result, "--overwrite")
