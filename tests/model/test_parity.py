"""kbert against outputs computed by google-research/bert's own code (fixtures/tf1-tiny)."""

import os

import numpy as np
import pytest

import kbert
from conftest import TINY
from helpers import EXPECTED, original_code_report, original_outputs
from kbert.converters import load_tf1_checkpoint


@pytest.fixture(scope="module")
def converted():
    return original_outputs(load_tf1_checkpoint(TINY))


@pytest.mark.parametrize(
    "name", ["embedding_output", "sequence_output", "pooled_output", "mlm_log_probs", "nsp_log_probs"]
)
def test_matches_original_to_1e5(converted, name):
    got = np.asarray(converted[name])
    assert got.shape == EXPECTED[name].shape
    np.testing.assert_allclose(got, EXPECTED[name], atol=1e-5, rtol=0)


def test_padded_row_is_really_padded():
    # Row 2 of the fixture is padded: the test above covers the -10000 attention mask.
    assert EXPECTED["input_mask"][1].min() == 0 and EXPECTED["input_mask"][0].min() == 1


def test_model_dir_reproduces_original(tiny_model_dir):
    out = original_outputs(kbert.load(tiny_model_dir))
    for name, value in out.items():
        np.testing.assert_allclose(np.asarray(value), EXPECTED[name], atol=1e-5, rtol=0)


def test_original_code_loads_to_tf1_output(tiny_model_dir, tmp_path):
    """to-tf1's checkpoint, loaded by the original code with get_assignment_map_from_checkpoint
    + tf.compat.v1.train.init_from_checkpoint, computes the original outputs."""
    from conftest import run_kbert

    run_kbert("convert", "to-tf1", tiny_model_dir, tmp_path / "tf1")
    report = original_code_report(tmp_path / "tf1", os.path.join(TINY, "expected.npz"))
    assert report["not_initialized"] == []
    assert report["initialized_from_checkpoint"] == report["trainable_variables"] == 46
    for name, diff in report["max_abs_diff"].items():
        assert diff <= 1e-5, (name, diff)
