"""`model.fit` in user code, written as a user writes it: load a converted checkpoint, put a
classifier head on it, train on a tf.data pipeline of raw strings, evaluate, save, reload,
predict. The data is a learnable toy task over the tiny checkpoint's 300-word vocabulary."""

import json
import os
import subprocess
import sys

import pytest

from conftest import TESTS

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

USER_CODE = r'''
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
    model = kbert.bert_classifier(pretrained, num_classes=2)
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

kbert.save(model, os.path.join(out_dir, "model_dir"))    # a kbert model directory too
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
'''


def run_user_code(tiny_model_dir, tmp_path, mirrored):
    env = dict(os.environ, PYTHONPATH=TESTS, TF_CPP_MIN_LOG_LEVEL="3")
    if mirrored:
        env["KBERT_LOGICAL_CPUS"] = "2"
    script = tmp_path / "user_code.py"
    script.write_text(("import kbert.training.strategy; kbert.training.strategy.split_cpu_if_asked()\n" if mirrored else "") + USER_CODE)
    out = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(tmp_path), "1" if mirrored else "0"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mirrored", [False, True], ids=["one-device", "mirrored-2-cpus"])
def test_user_fits_evaluates_saves_reloads_and_predicts(tiny_model_dir, tmp_path, mirrored):
    result = run_user_code(tiny_model_dir, tmp_path, mirrored)
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
