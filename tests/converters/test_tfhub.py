"""`kbert convert from-tfhub`: TF Hub BERT encoders into kbert, strictly, and back bit for bit.

The references are independent of kbert: tests/fixtures/model-garden-tfhub (the original
tf1-tiny checkpoint converted and exported by Model Garden's own code, with the outputs its
SavedModels compute; see its make.py) and tf1-tiny's expected.npz (the original code's).
"""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, assert_user_error, run_kbert
from helpers import EXPECTED, original_outputs

MG = os.path.join(FIXTURES, "model-garden-tfhub")
MG_OUTPUTS = np.load(os.path.join(MG, "outputs.npz"))
ENCODER_KEYS = ("input_ids", "input_mask", "segment_ids")
# make.py's texts, which Model Garden's preprocessor tokenized into outputs.npz.
TEXTS = [
    "the quick brown fox jumped over the lazy dog.",
    "This text is included to make sure Unicode is handled properly",
]


def _convert(tmp_path, *args):
    result = run_kbert("convert", "from-tfhub", *args, tmp_path / "out")
    return json.loads(result.stdout), kbert.load(tmp_path / "out")


def test_model_garden_encoder_with_mlm_equals_model_garden(tmp_path):
    report, model = _convert(tmp_path, os.path.join(MG, "encoder_mlm"))
    assert report["names"] == "Model Garden" and report["weights_loaded"] == 44
    assert report["fresh_heads"] == ["next_sentence"] and report["skipped"] == ["Variable"]  # do_lower_case
    # Model Garden's "gelu" is the tanh approximation; its metadata says so and kbert follows.
    assert report["hidden_act"] == "gelu_tanh" and report["vocab_from"] == "encoder"
    assert report["do_lower_case"] is True and report["do_lower_case_from"] == "encoder"
    assert json.load(open(tmp_path / "out" / "bert_config.json"))["hidden_act"] == "gelu_tanh"
    out = original_outputs(model)
    for name in ("pooled_output", "sequence_output"):
        np.testing.assert_allclose(np.asarray(out[name]), MG_OUTPUTS[name], atol=1e-5)
    inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS + ("masked_lm_positions",)}
    np.testing.assert_allclose(np.asarray(model(inputs)["mlm_logits"]), MG_OUTPUTS["mlm_logits"], atol=1e-5)
    # Against the original code (erf GELU), tanh leaves a visible gap: the weights are right,
    # the activation is Model Garden's.
    gap = np.abs(np.asarray(out["sequence_output"]) - EXPECTED["sequence_output"]).max()
    assert 1e-5 < gap < 1e-2


def test_model_garden_encoder_with_its_preprocessor(tmp_path):
    report, model = _convert(tmp_path, os.path.join(MG, "encoder"), "--preprocessor", os.path.join(MG, "preprocessor"))
    assert report["fresh_heads"] == ["masked_lm", "next_sentence"] and report["weights_loaded"] == 39
    assert report["vocab_from"] == "preprocessor" and report["do_lower_case_from"] == "preprocessor's graph"
    assert open(tmp_path / "out" / "vocab.txt").read() == open(os.path.join(MG, "vocab.txt")).read()
    np.testing.assert_allclose(
        np.asarray(original_outputs(model)["pooled_output"]), MG_OUTPUTS["pooled_output"], atol=1e-5
    )
    # On plain text, kbert's tokenizer (the original's) gives what Model Garden's preprocessor gave.
    packed = kbert.BertPreprocessor.for_model(tmp_path / "out", sequence_length=16)(tf.constant(TEXTS))
    np.testing.assert_array_equal(packed["input_ids"].numpy(), MG_OUTPUTS["preprocessed_input_word_ids"])
    np.testing.assert_array_equal(packed["segment_ids"].numpy(), MG_OUTPUTS["preprocessed_input_type_ids"])


def test_round_trip_through_tfhub_keeps_every_weight_bit_for_bit(tiny_hub_export, tmp_path):
    base, _ = tiny_hub_export  # tf1-tiny converted and exported by kbert export --format tfhub
    report, back = _convert(tmp_path, base / "hub" / "encoder", "--preprocessor", base / "hub" / "preprocessor")
    assert report["names"] == "kbert" and report["fresh_heads"] == [] and report["hidden_act"] == "gelu"
    original = kbert.load(base / "tiny")
    ours = {w.path: w.numpy() for w in original.weights}
    theirs = {w.path: w.numpy() for w in back.weights}
    weights = [p for p in ours if "seed_generator" not in p]
    assert len(weights) == 46 and all(np.array_equal(ours[p], theirs[p]) for p in weights)
    for name, value in original_outputs(back).items():
        np.testing.assert_allclose(np.asarray(value), EXPECTED[name], atol=1e-5)


@pytest.mark.skipif(
    not os.environ.get("KBERT_MODEL_GARDEN_PYTHON"),
    reason="needs Model Garden (tf-models-nightly) in a venv of its own: see fixtures/model-garden-tfhub/make.py",
)
def test_model_garden_fixture_is_what_model_garden_makes(tmp_path):
    """Remakes the committed fixture with Model Garden's code and compares what its SavedModels compute."""
    result = subprocess.run(
        [os.environ["KBERT_MODEL_GARDEN_PYTHON"], os.path.join(MG, "make.py"), str(tmp_path / "mg")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fresh = np.load(tmp_path / "mg" / "outputs.npz")
    assert sorted(fresh) == sorted(MG_OUTPUTS)
    for name in fresh:
        np.testing.assert_allclose(fresh[name], MG_OUTPUTS[name], atol=1e-6, err_msg=name)
    report, _ = _convert(tmp_path, tmp_path / "mg" / "encoder_mlm")
    assert report["weights_loaded"] == 44 and report["hidden_act"] == "gelu_tanh"


def _saved_module(path, **variables):
    module = tf.Module()
    module.weights_list = [tf.Variable(value, name=name) for name, value in variables.items()]
    tf.saved_model.save(module, str(path))
    return path


def test_bad_input_one_line_and_nothing_written(tmp_path):
    def fails(*args):
        result = run_kbert("convert", "from-tfhub", *args, tmp_path / "out", check=False)
        assert not os.path.exists(tmp_path / "out")
        return result

    assert_user_error(fails(tmp_path / "nowhere"), "no such file or folder; pass a TF Hub encoder SavedModel")
    os.makedirs(tmp_path / "empty")
    assert_user_error(fails(tmp_path / "empty"), "the directory is empty; pass a TF Hub encoder SavedModel")
    # A SavedModel that is not a BERT encoder: a preprocessor, and some other model.
    assert_user_error(fails(os.path.join(MG, "preprocessor")), "not a BERT encoder")
    other = _saved_module(tmp_path / "other", dense_kernel=np.ones((3, 3), "float32"))
    assert_user_error(fails(other), "not a BERT encoder")
    # A preprocessor whose vocabulary is not the encoder's.
    wrong = tmp_path / "wrong-preprocessor"
    shutil.copytree(os.path.join(MG, "preprocessor"), wrong)
    vocab = open(wrong / "assets" / "vocab.txt").read().splitlines()
    vocab[10], vocab[11] = vocab[11], vocab[10]
    (wrong / "assets" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    assert_user_error(fails(os.path.join(MG, "encoder"), "--preprocessor", wrong), "vocabulary differs")
    # Missing files: the encoder's vocabulary, its variables.
    broken = tmp_path / "broken"
    shutil.copytree(os.path.join(MG, "encoder"), broken)
    os.remove(broken / "assets" / "vocab.txt")
    assert_user_error(fails(broken), "vocab.txt")
    shutil.rmtree(broken / "variables")
    assert_user_error(fails(broken), "variables")
    # An activation kbert does not compute.
    assert_user_error(fails(os.path.join(MG, "encoder"), "--hidden-act", "swish"), "hidden_act")
