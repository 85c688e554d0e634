"""tests/reference/serving_session.py, which the export tests, the stand-in server, the serving
benchmarks and scripts/int8_accuracy.py load exports with: a SavedModel in a TF1 session, each
signature fed and fetched by its tensor names, as TF Serving runs it. Checked on a SavedModel
written here by TensorFlow alone, against values computed by hand."""

import subprocess
import sys

import numpy as np
import pytest

from conftest import REFERENCE

sys.path.insert(0, REFERENCE)
from serving_session import ServingSession, load, session_call


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    import tensorflow as tf

    module = tf.Module()
    module.scale = tf.Variable(3.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def lengths(text):
        length = tf.cast(tf.strings.length(text), tf.float32)
        return {"length": length, "scaled": length * module.scale}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def double(x):
        return {"doubled": 2.0 * x}

    path = tmp_path_factory.mktemp("saved") / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": lengths, "double": double})
    return path


def test_runs_each_signature_by_its_tensor_names(saved_model):
    served = ServingSession(saved_model)
    assert {"serving_default", "double"} <= set(served.signatures)
    got = served.run({"text": [b"ab", b"hello"]})
    np.testing.assert_array_equal(got["length"], [2.0, 5.0])
    np.testing.assert_array_equal(got["scaled"], [6.0, 15.0])
    assert set(served.run({"text": [b"abc"]}, outputs=["scaled"])) == {"scaled"}
    np.testing.assert_array_equal(served.run({"x": [1.5]}, "double")["doubled"], [3.0])
    feeds, fetches = served.tensor_names("double")
    assert set(feeds) == {"x"} and set(fetches) == {"doubled"}
    served.close()


def test_load_and_session_call_give_serving_default(saved_model):
    session, fetches, feed = load(saved_model)
    np.testing.assert_array_equal(session.run(fetches, {feed: [b"abcd"]})["scaled"], [12.0])
    np.testing.assert_array_equal(session_call(saved_model)([b"a", b""])["length"], [1.0, 0.0])


def test_imports_no_kbert():
    # An export must run where kbert is not installed: the tests that show it load through this module.
    code = f"import sys; sys.path.insert(0, {REFERENCE!r}); import serving_session; print('kbert' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "False"
