"""kbert.backend answers the same questions on every backend: each of its backend modules defines
every name the package hands out, so a question asked on JAX or PyTorch is never missing there.

The modules for JAX and PyTorch import their libraries only inside the functions that use them,
so all three load here, on TensorFlow."""

import ast
import pathlib

import numpy as np
import pytest

import kbert.backend
from kbert.backend import jax as on_jax
from kbert.backend import portable
from kbert.backend import tensorflow as on_tensorflow
from kbert.backend import torch as on_torch

SEAM = pathlib.Path(kbert.backend.__file__)


def names_read_from_the_running_backend() -> set:
    """The attributes `kbert/backend/__init__.py` reads from the module it picked (`_running.NAME`)."""
    tree = ast.parse(SEAM.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_running"
    }


def test_the_seam_reads_its_answers_from_the_running_backend():
    assert {"finetuning_placement", "Checkpointer", "epoch_batches", "make_preprocessor"} <= (
        names_read_from_the_running_backend()
    )


@pytest.mark.parametrize("module", [on_tensorflow, on_jax, on_torch], ids=["tensorflow", "jax", "torch"])
def test_every_backend_answers_every_question(module):
    missing = sorted(name for name in names_read_from_the_running_backend() if not hasattr(module, name))
    assert not missing, f"{module.__name__} lacks {missing}"


def test_only_pytorch_layers_are_modules():
    assert (on_tensorflow.LAYERS_ARE_MODULES, on_jax.LAYERS_ARE_MODULES, on_torch.LAYERS_ARE_MODULES) == (
        False,
        False,
        True,
    )


def test_checkpoints_resume_only_on_the_kind_they_were_written_by():
    keras_kind = portable.Checkpointer("unused", model=None, keep=2)
    assert keras_kind.reads_run_of("jax") and keras_kind.reads_run_of("torch")
    assert not keras_kind.reads_run_of("tensorflow")
    assert keras_kind.record() == {"backend": "tensorflow"}  # the backend these tests run on


def test_both_orders_are_permutations_of_every_row():
    for order in (on_tensorflow.shuffled_order(40, seed=3), portable.shuffled_order(40, seed=3)):
        assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(40))
