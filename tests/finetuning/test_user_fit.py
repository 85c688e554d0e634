"""`model.fit` in user code, written as a user writes it: load a converted checkpoint, put a
classifier head on it, train on a tf.data pipeline of raw strings, evaluate, save, reload,
predict; then `kbert predict`, `kbert evaluate` and `kbert export` on the `.keras` file `model.save`
wrote and on the directory `kbert.save` wrote. The data is a learnable toy task over the tiny
checkpoint's 300-word vocabulary."""

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys

import pytest

from conftest import TESTS, run_kbert
from helpers import sentiment_texts, write_tsv

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

USER_CODE = r"""
import json, os, sys
import numpy as np
import keras
import tensorflow as tf
import kbert
from helpers import sentiment_texts

model_dir, out_dir, use_mirrored = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
train_texts, train_labels = sentiment_texts(256, seed=0)
test_texts, test_labels = sentiment_texts(64, seed=1)
keras.utils.set_random_seed(0)

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if use_mirrored else tf.distribute.get_strategy()
with strategy.scope():
    pretrained = kbert.load(model_dir)                       # a converted google-research checkpoint
    # The head declares what it predicts; the vocabulary comes from `pretrained`.
    model = kbert.bert_classifier(pretrained, num_classes=2, task_info={"labels": ["neg", "pos"]})
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
preprocessor = kbert.BertPreprocessor.for_model(pretrained, sequence_length=24)

def dataset(texts, labels, shuffle):
    ds = tf.data.Dataset.from_tensor_slices((texts, labels))
    if shuffle:
        ds = ds.shuffle(len(texts), seed=0)
    return ds.batch(16).map(lambda x, y: (preprocessor(x), y))

history = model.fit(dataset(train_texts, train_labels, True), epochs=4, verbose=0)
loss, accuracy = model.evaluate(dataset(test_texts, test_labels, False), verbose=0)
before = model.predict(preprocessor(tf.constant(test_texts)), verbose=0)["logits"]

model.save(os.path.join(out_dir, "classifier.keras"))
reloaded = keras.models.load_model(os.path.join(out_dir, "classifier.keras"))
after = reloaded.predict(preprocessor(tf.constant(test_texts)), verbose=0)["logits"]

kbert.save(model, os.path.join(out_dir, "model_dir"), task="classify", labels=["neg", "pos"])  # for the CLI too
from_dir = kbert.load(os.path.join(out_dir, "model_dir"))
after_dir = from_dir.predict(preprocessor(tf.constant(test_texts)), verbose=0)["logits"]

print(json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "first_loss": history.history["loss"][0], "last_loss": history.history["loss"][-1],
    "test_accuracy": accuracy,
    "reload_max_diff": float(np.abs(before - after).max()),
    "reloaded_weights_equal": all(np.array_equal(a, b) for a, b in zip(model.get_weights(), reloaded.get_weights())),
    "model_dir_weights_equal": all(np.array_equal(a, b) for a, b in zip(model.get_weights(), from_dir.get_weights())),
    "model_dir_max_diff": float(np.abs(before - after_dir).max()),
    "test_predicted_accuracy": float((before.argmax(-1) == test_labels).mean()),
}))
"""


def run_user_code(tiny_model_dir, tmp_path, mirrored, monkeypatch):
    """USER_CODE as a script: on one device in this process (as `python user_code.py ARGS` runs it,
    without a new process's TensorFlow import); under MirroredStrategy in a Python of its own, whose
    CPU is split into two logical devices before TensorFlow starts."""
    script = tmp_path / "user_code.py"
    argv = [str(script), str(tiny_model_dir), str(tmp_path), "1" if mirrored else "0"]
    if not mirrored:
        script.write_text(USER_CODE)
        monkeypatch.setattr(sys, "argv", argv)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            runpy.run_path(str(script), run_name="__main__")
        return json.loads(stdout.getvalue().strip().splitlines()[-1])
    env = dict(os.environ, PYTHONPATH=TESTS, TF_CPP_MIN_LOG_LEVEL="3", KBERT_LOGICAL_CPUS="2")
    script.write_text("import kbert.backend.tensorflow; kbert.backend.tensorflow.split_cpu_if_asked()\n" + USER_CODE)
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mirrored", [False, True], ids=["one-device", "mirrored-2-cpus"])
def test_user_fits_evaluates_saves_reloads_and_predicts(tiny_model_dir, tmp_path, mirrored, monkeypatch):
    result = run_user_code(tiny_model_dir, tmp_path, mirrored, monkeypatch)
    assert result["replicas"] == (2 if mirrored else 1)
    assert result["last_loss"] < result["first_loss"]
    assert result["test_accuracy"] >= 0.85, result  # chance is 0.5
    assert result["test_predicted_accuracy"] == pytest.approx(result["test_accuracy"], abs=1e-6)
    # The weights come back bit for bit. The predictions do too on one device; under
    # MirroredStrategy `before` ran split over the two replicas and the reloaded models on one
    # device, whose matmuls may round differently (seen here: 1.2e-7 on some hosts, 0 on others).
    assert result["reloaded_weights_equal"] and result["model_dir_weights_equal"], result
    tolerance = 1e-5 if mirrored else 0.0
    assert result["reload_max_diff"] <= tolerance, result
    assert result["model_dir_max_diff"] <= tolerance, result
    # The CLI uses what kbert.save wrote: the same test set, scored and predicted by kbert.
    texts, labels = sentiment_texts(64, seed=1)
    test = write_tsv(tmp_path / "test.tsv", [(t, "pos" if y else "neg") for t, y in zip(texts, labels)])
    metrics = json.loads(run_kbert("evaluate", tmp_path / "model_dir", "--input", test).stdout)
    assert metrics["examples"] == 64 and metrics["accuracy"] == pytest.approx(result["test_accuracy"], abs=1e-6)
    rows = [
        json.loads(line) for line in run_kbert("predict", tmp_path / "model_dir", "--input", test).stdout.splitlines()
    ]
    assert len(rows) == 64 and sum(row["label"] == ("pos" if y else "neg") for row, y in zip(rows, labels)) == round(
        64 * result["test_accuracy"]
    )
    if mirrored:
        return
    # The .keras file is the whole model too: head, labels, vocabulary (inside it) and casing.
    keras_file = tmp_path / "classifier.keras"
    assert json.loads(run_kbert("evaluate", keras_file, "--input", test).stdout) == metrics
    keras_rows = [json.loads(line) for line in run_kbert("predict", keras_file, "--input", test).stdout.splitlines()]
    assert [row["label"] for row in keras_rows] == [row["label"] for row in rows]
    for ours, theirs in zip(keras_rows, rows):
        assert ours["probabilities"] == pytest.approx(theirs["probabilities"], abs=1e-6)
    run_kbert("export", keras_file, tmp_path / "exports", "--max-seq-length", "24")
    import tensorflow as tf

    served = tf.saved_model.load(str(tmp_path / "exports" / "1")).signatures["serving_default"]
    answers = served(text=tf.constant(texts[:8]), text_b=tf.constant([""] * 8))  # pairs unless declared
    assert [label.decode() for label in answers["label"].numpy()] == [row["label"] for row in rows[:8]]


# === a head saved by kbert.save works with kbert predict / evaluate / export ===


@pytest.fixture(scope="module")
def user_classifier(tiny_model_dir):
    """A classifier as user code builds it (an untrained head: what it predicts does not matter)."""
    import keras

    import kbert

    keras.utils.set_random_seed(3)
    return kbert.bert_classifier(kbert.load(tiny_model_dir), num_classes=2)


def test_kbert_save_records_the_task_predict_and_evaluate_need(user_classifier, tmp_path):
    import kbert

    kbert.save(user_classifier, tmp_path / "named", task="classify", labels=["neg", "pos"], max_seq_length=32)
    config = json.load(open(tmp_path / "named" / "bert_config.json"))
    assert {k: config[k] for k in ("kbert_model", "task", "labels", "max_seq_length", "do_lower_case")} == {
        "kbert_model": "classifier",
        "task": "classify",
        "labels": ["neg", "pos"],
        "max_seq_length": 32,
        "do_lower_case": True,
    }
    data = write_tsv(tmp_path / "data.tsv", [("gold glorious great.", "pos"), ("dead dust.", "neg")])
    rows = [json.loads(line) for line in run_kbert("predict", tmp_path / "named", "--input", data).stdout.splitlines()]
    assert len(rows) == 2 and all(set(row) == {"label", "probabilities"} for row in rows)  # not pooled outputs
    assert all(set(row["probabilities"]) == {"neg", "pos"} for row in rows)
    metrics = json.loads(run_kbert("evaluate", tmp_path / "named", "--input", data).stdout)
    assert metrics["examples"] == 2 and 0 <= metrics["accuracy"] <= 1

    # Saved with no task: a classifier's (labels are its class ids, as model.fit on 0/1 labels).
    kbert.save(user_classifier, tmp_path / "ids")
    config = json.load(open(tmp_path / "ids" / "bert_config.json"))
    assert (config["task"], config["labels"], config["max_seq_length"]) == ("classify", ["0", "1"], 64)
    ids = write_tsv(tmp_path / "ids.tsv", [("gold glorious great.", 1), ("dead dust.", 0)])
    rows = [json.loads(line) for line in run_kbert("predict", tmp_path / "ids", "--input", ids).stdout.splitlines()]
    assert len(rows) == 2 and set(rows[0]["probabilities"]) == {"0", "1"}
    assert json.loads(run_kbert("evaluate", tmp_path / "ids", "--input", ids).stdout)["examples"] == 2


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"task": "tag"}, "task 'tag' does not fit a classifier (bert_classifier); its tasks are classify, regress"),
        ({"task": "translate"}, "unknown task 'translate'; use one of classify, regress, rerank, tag, squad, choice"),
        ({"labels": ["neg"]}, "the classifier has 2 outputs, so give 2 different label names, in output order"),
        ({"labels": ["pos", "pos"]}, "give 2 different label names"),
        ({"labels": "neg,pos"}, "labels must be a list of label names (str), one per output"),
        ({"task": "regress"}, "task regress needs a classifier with one output (num_classes=1); this one has 2"),
        ({"max_seq_length": 0}, "max_seq_length 0: give the tokens per example the model was trained with, 3 to 64"),
        ({"max_seq_length": 65}, "3 to 64 (max_position_embeddings)"),
        ({"text_pairs": "yes"}, "text_pairs must be True (trained on sentence pairs) or False, got 'yes'"),
        ({"task": "classify", "text_pairs": True, "labels": ["a", "b"]}, None),
    ],
)
def test_kbert_save_refuses_metadata_that_does_not_fit_the_head(user_classifier, tmp_path, kwargs, fragment):
    import kbert
    from kbert.runtime.errors import KbertError

    if fragment is None:  # accepted
        kbert.save(user_classifier, tmp_path / "ok", **kwargs)
        assert json.load(open(tmp_path / "ok" / "bert_config.json"))["text_pairs"] is True
        return
    with pytest.raises(KbertError) as raised:
        kbert.save(user_classifier, tmp_path / "m", **kwargs)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "m").exists()


def test_kbert_save_refuses_a_task_for_an_encoder(tiny_model_dir, tmp_path):
    import kbert
    from kbert.runtime.errors import KbertError

    with pytest.raises(KbertError, match="task, labels describe a task head; a pretrainer has none"):
        kbert.save(kbert.load(tiny_model_dir), tmp_path / "m", task="classify", labels=["a", "b"])
