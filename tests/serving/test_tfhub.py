"""`kbert export --format tfhub`: TF Hub's BERT encoder and preprocessor, run by their consumers.

The consumers are real: `tensorflow_hub.KerasLayer` on tf-keras (as TensorFlow's "Classify
text with BERT" tutorial runs it), Keras 3's `TFSMLayer`, and a fresh Python with only
tensorflow and tensorflow_text. The reference is the original code's outputs on the tiny
checkpoint (fixtures/tf1-tiny/expected.npz) and run_classifier's packing (`convert_single_example`,
run by the original code).
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the preprocessor's ops, as TF Hub's users import it)

import kbert
from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from helpers import EXPECTED, original_outputs, original_packing
from kbert.text.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

VOCAB = os.path.join(TINY, "vocab.txt")
LINES = [line.strip() for line in open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8") if line.strip()][
    :40
]
HUB_INPUTS = {"input_word_ids": "input_ids", "input_mask": "input_mask", "input_type_ids": "segment_ids"}
IDS = {hub: EXPECTED[ours].astype("int32") for hub, ours in HUB_INPUTS.items()}


PACK_LENGTHS = (3, 5, 16, 64)
TEXTS, TEXTS_B = LINES[:-1], LINES[1:]
TEXTS_B[3] = ""  # a pair whose second text is empty is packed as a single text


@pytest.fixture(scope="module")
def run_classifier(tmp_path_factory):
    """convert_single_example's features of TEXTS alone and paired with TEXTS_B, at each length:
    {(length, paired): {"input_ids": [examples, length], "input_mask": ..., "segment_ids": ...}}."""
    keys = [(n, paired) for n in PACK_LENGTHS for paired in (False, True)]
    cases = [(a, b if paired else None, n) for n, paired in keys for a, b in zip(TEXTS, TEXTS_B)]
    packed = iter(original_packing(cases, VOCAB, tmp_path_factory.mktemp("original")))
    out = {}
    for key in keys:
        rows = np.array([next(packed) for _ in TEXTS], np.int32)  # [examples, 3, length]
        out[key] = {name: rows[:, k] for k, name in enumerate(("input_ids", "input_mask", "segment_ids"))}
    return out


@pytest.fixture
def hub_export(tiny_hub_export):
    return tiny_hub_export


def test_writes_encoder_and_preprocessor_with_their_assets(hub_export):
    base, summary = hub_export
    assert summary["encoder"] == str(base / "hub" / "encoder") and summary["mlm"] is True
    assert summary["seq_length"] == 64  # 128 by default, capped at the model's 64 positions
    for part in ("encoder", "preprocessor"):
        assert os.path.isfile(base / "hub" / part / "saved_model.pb")
        assert open(base / "hub" / part / "assets" / "vocab.txt").read() == open(VOCAB).read()
    config = json.load(open(base / "hub" / "encoder" / "assets" / "bert_config.json"))
    assert config["hidden_act"] == "gelu" and config["num_hidden_layers"] == 2
    assert [p.name for p in base.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_encoder_gives_the_original_outputs(hub_export):
    base, _ = hub_export
    encoder = tf.saved_model.load(str(base / "hub" / "encoder"))
    out = encoder(IDS, training=False)
    for name in ("pooled_output", "sequence_output"):
        np.testing.assert_allclose(out[name].numpy(), EXPECTED[name], atol=1e-5)
    ours = original_outputs(kbert.load(base / "tiny"))
    for name in ("pooled_output", "sequence_output"):
        np.testing.assert_allclose(out[name].numpy(), np.asarray(ours[name]), atol=1e-5)
    np.testing.assert_array_equal(out["default"].numpy(), out["pooled_output"].numpy())
    assert len(out["encoder_outputs"]) == 2
    np.testing.assert_array_equal(out["encoder_outputs"][-1].numpy(), out["sequence_output"].numpy())
    assert bool(encoder.do_lower_case.numpy()) is True
    assert len(encoder.trainable_variables) == 39 and len(encoder.regularization_losses) == 0

    mlm = encoder.mlm({**IDS, "masked_lm_positions": EXPECTED["masked_lm_positions"].astype("int32")})
    np.testing.assert_allclose(tf.nn.log_softmax(mlm["mlm_logits"]).numpy(), EXPECTED["mlm_log_probs"], atol=1e-5)
    nsp = encoder.nsp(IDS)
    np.testing.assert_allclose(tf.nn.log_softmax(nsp["nsp_logits"]).numpy(), EXPECTED["nsp_log_probs"], atol=1e-5)

    # training=True turns dropout on: two calls differ, and differ from inference.
    first, second = (encoder(IDS, training=True)["pooled_output"].numpy() for _ in range(2))
    assert np.abs(first - second).max() > 1e-3 and np.abs(first - out["pooled_output"].numpy()).max() > 1e-3


def test_keras_3_loads_both_with_tfsmlayer(hub_export, run_classifier):
    base, _ = hub_export
    preprocessor = keras.layers.TFSMLayer(str(base / "hub" / "preprocessor"), call_endpoint="serve")
    encoder = keras.layers.TFSMLayer(str(base / "hub" / "encoder"), call_endpoint="serve")
    out = encoder(IDS)
    np.testing.assert_allclose(np.asarray(out["pooled_output"]), EXPECTED["pooled_output"], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out["encoder_outputs_1"]), np.asarray(out["sequence_output"]))
    packed = preprocessor(tf.constant(LINES[:3]))
    expected = run_classifier[64, False]
    for hub, ours in HUB_INPUTS.items():
        np.testing.assert_array_equal(np.asarray(packed[hub]), expected[ours][:3])


@pytest.mark.parametrize("length", PACK_LENGTHS)
def test_preprocessor_packs_as_run_classifier(hub_export, run_classifier, length):
    base, _ = hub_export
    preprocessor = tf.saved_model.load(str(base / "hub" / "preprocessor"))
    tokenizer = Tokenizer(VOCAB)
    texts, texts_b = TEXTS, TEXTS_B
    tokens = preprocessor.tokenize(tf.constant(texts))
    assert tokens.shape.rank == 3 and tokens.dtype == tf.int32  # [batch, words, wordpieces]
    assert tokens.merge_dims(1, 2).to_list() == [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t)) for t in texts]
    tokens_b = preprocessor.tokenize(tf.constant(texts_b))
    for segments, b in (([tokens], None), ([tokens, tokens_b], texts_b), ([tokens.merge_dims(1, 2)], None)):
        packed = preprocessor.bert_pack_inputs(segments, seq_length=length)
        expected = run_classifier[length, b is not None]
        for hub, ours in HUB_INPUTS.items():
            np.testing.assert_array_equal(packed[hub].numpy(), expected[ours], err_msg=f"{hub} pair={b is not None}")
    if length == 64:  # the default seq_length, and the root call
        default = preprocessor.bert_pack_inputs([tokens])
        assert default["input_word_ids"].shape == (len(texts), 64)
        expected = run_classifier[64, False]
        np.testing.assert_array_equal(preprocessor(tf.constant(texts))["input_word_ids"].numpy(), expected["input_ids"])
        special = {k: int(v) for k, v in preprocessor.tokenize.get_special_tokens_dict().items()}
        assert special["vocab_size"] == 300 and special["start_of_sequence_id"] == tokenizer.vocab["[CLS]"]


# Both consumers outside kbert, in one fresh Python. First a plain script (or TF Serving): only
# tensorflow and tensorflow_text, the others cannot be imported. Then TensorFlow's "Classify text
# with BERT" tutorial's model, with tf-keras and tensorflow_hub as it runs them (kbert and
# keras_hub still cannot be imported).
CONSUMERS = r"""
import json, sys
sys.modules["kbert"] = sys.modules["keras_hub"] = sys.modules["tensorflow_hub"] = None
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401
export, expected_file, fresh_texts, fresh_out = sys.argv[1:5]
preprocessor = tf.saved_model.load(export + "/preprocessor")
encoder = tf.saved_model.load(export + "/encoder")
out = encoder(preprocessor(tf.constant(json.loads(fresh_texts))), training=False)
np.save(fresh_out, out["pooled_output"].numpy())

del sys.modules["tensorflow_hub"]
import tensorflow_hub as hub
import tf_keras

tf_keras.utils.set_random_seed(0)
expected = np.load(expected_file)
preprocessor = hub.KerasLayer(export + "/preprocessor", name="preprocessing")
encoder = hub.KerasLayer(export + "/encoder", trainable=True, name="BERT_encoder")
ids = {name: expected[name] for name in ("input_word_ids", "input_mask", "input_type_ids")}
pooled = encoder(ids)["pooled_output"].numpy()

text_input = tf_keras.layers.Input(shape=(), dtype=tf.string, name="text")
net = encoder(preprocessor(text_input))["pooled_output"]
net = tf_keras.layers.Dense(1, activation=None, name="classifier")(net)
model = tf_keras.Model(text_input, net)
model.compile(optimizer=tf_keras.optimizers.Adam(1e-3),
              loss=tf_keras.losses.BinaryCrossentropy(from_logits=True), metrics=["accuracy"])
texts = np.array([line for line in expected["texts"]])
labels = np.array([i % 2 for i in range(len(texts))], dtype="float32")
before = [w.numpy().copy() for w in encoder.trainable_weights]
# The loss per epoch is noisy (the encoder's own dropout is on while training), so learning is
# judged by the loss in inference mode before and after.
loss_before = model.evaluate(texts, labels, verbose=0)[0]
model.fit(texts, labels, epochs=30, batch_size=16, verbose=0)
loss_after = model.evaluate(texts, labels, verbose=0)[0]
changed = sum(not np.array_equal(a, w.numpy()) for a, w in zip(before, encoder.trainable_weights))
print(json.dumps({"pooled_diff": float(np.abs(pooled - expected["pooled_output"]).max()),
                  "loss_before": loss_before, "loss_after": loss_after, "changed": changed, "trainable": len(before),
                  "modules": sorted(m for m in ("kbert", "keras_hub") if sys.modules.get(m) is not None)}))
"""


@pytest.fixture(scope="module")
def consumers(tiny_hub_export, tmp_path_factory):
    """CONSUMERS run on the export: (the tutorial model's report, the plain script's pooled outputs
    of LINES[:5])."""
    base, _ = tiny_hub_export
    work = tmp_path_factory.mktemp("consumers")
    np.savez(work / "expected.npz", pooled_output=EXPECTED["pooled_output"], texts=np.array(LINES[:16]), **IDS)
    result = subprocess.run(
        [sys.executable, "-c", CONSUMERS, str(base / "hub"), str(work / "expected.npz"), json.dumps(LINES[:5]),
         str(work / "fresh.npy")],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), np.load(work / "fresh.npy")


def test_hub_keras_layer_fine_tunes_it_on_tf_keras(consumers):
    report, _ = consumers
    assert report["pooled_diff"] < 1e-5
    assert report["trainable"] == 39 and report["changed"] == 39  # every encoder weight was trained
    # It learns: 16 texts labelled by parity, memorised. Over seeds 0-5 the loss fell to 0.02-0.31 of its start.
    assert report["loss_after"] < 0.5 * report["loss_before"], report
    assert report["modules"] == []


def test_runs_in_a_fresh_process_with_only_tensorflow_and_tf_text(hub_export, run_classifier, consumers):
    base, _ = hub_export
    model = kbert.load(base / "tiny")
    features = {name: values[:5] for name, values in run_classifier[64, False].items()}
    ours = model.encoder(features, training=False)["pooled_output"]
    np.testing.assert_allclose(consumers[1], np.asarray(ours), atol=1e-5)


def test_bad_input_one_line_and_nothing_written(hub_export, tmp_path):
    base, _ = hub_export
    result = run_kbert("export", base / "tiny", tmp_path / "a", "--format", "tfhub", "--version", "2", check=False)
    assert_user_error(result, "--version")
    result = run_kbert("export", base / "tiny", tmp_path / "a", "--format", "tfhub", "--constant-weights", check=False)
    assert_user_error(result, "--constant-weights")
    result = run_kbert("export", tmp_path / "nowhere", tmp_path / "b", "--format", "tfhub", check=False)
    assert_user_error(result, "nowhere")
    result = run_kbert("export", base / "tiny", tmp_path / "c", "--format", "onnx", check=False)
    assert_user_error(result, "--format")
    result = run_kbert("export", base / "tiny", base / "hub", "--format", "tfhub", check=False)  # exists
    assert_user_error(result, "--overwrite")
    assert sorted(os.listdir(tmp_path)) == []


def test_a_fine_tuned_model_exports_its_encoder(hub_export, tmp_path):
    base, _ = hub_export
    classifier = kbert.bert_classifier(kbert.load(base / "tiny"), num_classes=3)
    kbert.save(classifier, tmp_path / "classifier", vocab_file=VOCAB)
    summary = json.loads(
        run_kbert(
            "export", tmp_path / "classifier", tmp_path / "hub", "--format", "tfhub", "--max-seq-length", "32"
        ).stdout
    )
    assert summary["mlm"] is False and summary["seq_length"] == 32
    encoder = tf.saved_model.load(str(tmp_path / "hub" / "encoder"))
    assert not hasattr(encoder, "mlm") and not hasattr(encoder, "nsp")
    np.testing.assert_allclose(encoder(IDS)["pooled_output"].numpy(), EXPECTED["pooled_output"], atol=1e-5)
    preprocessor = tf.saved_model.load(str(tmp_path / "hub" / "preprocessor"))
    assert preprocessor(tf.constant(["a b"]))["input_word_ids"].shape == (1, 32)
