"""A Python session that fits a kbert model on TensorFlow does not print grappler's "Error in
PredictCost()" warnings (the CLI hides them too); TensorFlow's C++ errors still print, and
KBERT_DEBUG=1 shows everything."""

import os
import subprocess
import sys

import pytest

from conftest import TINY

pytestmark = pytest.mark.slow  # two fresh Pythons that import TensorFlow and fit

# The README's model.fit, on the tiny checkpoint, as a user's script runs it: keras (and so
# TensorFlow) imported before kbert.
FIT = f"""
import keras, numpy as np, kbert
pretrained = kbert.converters.load_tf1_checkpoint({TINY!r})
model = kbert.bert_classifier(pretrained, num_classes=2, task_info={{"labels": ["neg", "pos"]}})
tokenizer = kbert.Tokenizer(pretrained.vocab_file, do_lower_case=pretrained.do_lower_case)
x = kbert.pack_texts(tokenizer, ["the man went", "to the store"] * 8, sequence_length=16)
model.compile(optimizer=keras.optimizers.Adam(2e-5),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
model.fit(x, np.array([0, 1] * 8), batch_size=8, epochs=1, verbose=0)
from kbert.backend.tensorflow_compat import native_log_level
print("native log level", native_log_level())
"""


def fit(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KBERT_DEBUG")}
    clean.update(env, KERAS_BACKEND="tensorflow")
    result = subprocess.run([sys.executable, "-c", FIT], capture_output=True, text=True, env=clean, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_model_fit_prints_no_grappler_warnings():
    result = fit()
    assert "PredictCost" not in result.stderr, result.stderr[-3000:]
    assert "native log level 2" in result.stdout  # absl's kError: errors (and fatal ones) still print


def test_kbert_debug_shows_them():
    """The lines hidden above are there to hide: with KBERT_DEBUG=1 TensorFlow's level is its own."""
    result = fit(KBERT_DEBUG="1")
    assert "Error in PredictCost()" in result.stderr
    assert "native log level 0" in result.stdout
