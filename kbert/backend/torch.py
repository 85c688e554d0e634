"""Keras' PyTorch backend: one device (the GPU where there is one), PyTorch's own seed, layers
that are torch.nn.Modules, and everything else as `kbert.backend.portable` does it without
TensorFlow."""

from __future__ import annotations

from kbert.backend import portable

# Every other answer is the one shared with JAX: `kbert.backend.portable`'s.
from kbert.backend.portable import *  # noqa: F403
from kbert.runtime.errors import KbertError, option

# A Keras layer is a torch.nn.Module here, which refuses a sub-module set before its own __init__.
LAYERS_ARE_MODULES = True


def has_gpu() -> bool:
    """Whether PyTorch computes on a GPU."""
    import torch

    return torch.cuda.is_available()


def set_random_seed(seed: int):
    """Python's, numpy's and PyTorch's generators, without TensorFlow's."""
    import torch

    portable.set_random_seed(seed)
    torch.manual_seed(seed)


def keras_devices(name: str = "auto", tpu: str | None = None) -> list:
    """The device a PyTorch run trains on, for `--strategy name`: kbert trains on one. A
    strategy that does not map to PyTorch raises a one-line `KbertError` saying what to use.

    - auto: the GPU if there is one, else the CPU.
    - cpu / gpu: one device of that kind.
    - mirrored, tpu: JAX or TensorFlow; multi-worker: TensorFlow only.
    """
    portable.check_keras_strategy(name, tpu)
    import torch

    if name in ("mirrored", "tpu"):
        raise KbertError(
            f"{option('strategy', name)} is not available on PyTorch, where kbert trains on one device; "
            f"use {option('strategy', 'auto')}, or KERAS_BACKEND=jax or tensorflow to train on several"
        )
    cuda = torch.cuda.is_available()
    if name == "gpu" and not cuda:
        raise KbertError(
            f"{option('strategy', 'gpu')}: PyTorch sees no GPU here; install a CUDA build of PyTorch "
            f"or use {option('strategy', 'cpu')}"
        )
    if name == "cpu" and cuda:
        raise KbertError(
            f"{option('strategy', 'cpu')}: Keras computes on the GPU here; set CUDA_VISIBLE_DEVICES= "
            "(empty) to train on the CPU"
        )
    return ["cuda:0" if cuda else "cpu"]


def pretraining_placement(strategy: str, tpu: str | None = None) -> list:
    """Where pretraining runs: the Keras device for --strategy."""
    return keras_devices(strategy, tpu)
