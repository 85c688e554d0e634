"""Keras' PyTorch backend: one device (the GPU where there is one), PyTorch's own seed, layers
that are torch.nn.Modules, and everything else as `kbert.backend.portable` does it without
TensorFlow."""

from __future__ import annotations

import numpy as np

from kbert.backend import portable

# Every other answer is the one shared with JAX: `kbert.backend.portable`'s.
from kbert.backend.portable import *  # noqa: F403
from kbert.runtime.errors import KbertError, option

# A Keras layer is a torch.nn.Module here, which refuses a sub-module set before its own __init__.
LAYERS_ARE_MODULES = True

# Keras' steps run eagerly; torch.compile (`jit_compile`) is asked for, never the default.
COMPILES_STEPS = False


def has_gpu() -> bool:
    """Whether PyTorch computes on a GPU."""
    import torch

    return torch.cuda.is_available()


def gpu_compute_capability() -> float | None:
    """The GPU's CUDA compute capability (9.0 for an H100), or None without a GPU."""
    import torch

    if not has_gpu():
        return None
    major, minor = torch.cuda.get_device_capability()
    return float(f"{major}.{minor}")


def set_random_seed(seed: int):
    """Python's, numpy's and PyTorch's generators, without TensorFlow's."""
    import torch

    portable.set_random_seed(seed)
    torch.manual_seed(seed)


def generator_states() -> dict:
    """PyTorch's own generators, the CPU's and each GPU's: {"torch/cpu" or "torch/cuda:N": uint8 state}.

    Keras' Dropout without a seed draws its masks from them, not from its seed generator (on
    PyTorch it calls torch's dropout, which takes no seed), so a resume that did not put them
    back would draw other masks than the uninterrupted run.

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> states = generator_states()
    >>> first = torch.rand(3)
    >>> restore_generator_states(states)
    >>> bool(torch.equal(torch.rand(3), first))
    True
    """
    import torch

    states = {"torch/cpu": torch.get_rng_state().numpy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # no GPU kernel ran: nothing drawn there
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"torch/cuda:{index}"] = state.cpu().numpy()
    return states


def restore_generator_states(states: dict):
    """Put back what `generator_states` returned. The states of GPUs this machine lacks are
    left out: a run resumed on other devices draws other masks anyway."""
    import torch

    for name, state in states.items():
        value = torch.from_numpy(np.array(state, dtype=np.uint8))
        if name == "torch/cpu":
            torch.set_rng_state(value)
        elif name.startswith("torch/cuda:") and torch.cuda.is_available():
            index = int(name.split(":")[1])
            if index < torch.cuda.device_count():
                torch.cuda.set_rng_state(value, device=index)


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


# === The batches of an epoch ===


def epoch_batches(train_data, opts):
    """epoch_data(epoch, skip_batches): one epoch's `portable.Batches`, from a given batch on,
    read through `keras_batches`."""
    batches = portable.epoch_batches(train_data, opts, trim_multiple=8)  # eager: any width runs as it comes
    return lambda epoch, skip_batches: keras_batches(batches(epoch, skip_batches))


def keras_batches(batches):
    """`batches` (a `keras.utils.PyDataset`, or an iterable of (features, labels) batches) as
    Keras' `fit` and `evaluate` read them: a torch DataLoader over them, in their order, with a
    generator of its own.

    Keras would wrap them in a DataLoader of its own, whose every pass draws a seed from
    PyTorch's global generator; Keras' Dropout draws its masks from that generator too (on the
    CPU). Each `fit` call would then shift the masks of the steps after it, so a run resumed
    mid-epoch (one `fit` call more than the uninterrupted run) would draw other masks.

    >>> import keras, numpy as np
    >>> loader = keras_batches([({"x": np.ones((2, 3), "float32")}, np.arange(2, dtype="int32"))])
    >>> [(tuple(features["x"].shape), keras.ops.convert_to_numpy(labels).tolist()) for features, labels in loader]
    [((2, 3), [0, 1])]
    """
    import keras
    import torch

    if isinstance(batches, keras.utils.PyDataset):
        batches = _PyDatasetBatches(batches)

    class OnDevice(torch.utils.data.IterableDataset):
        """The batches as Keras' own DataLoader gives them: tensors on Keras' device."""

        def __iter__(self):
            for batch in batches:
                yield keras.tree.map_structure(keras.ops.convert_to_tensor, batch, none_is_leaf=False)

    # batch_size=None: each item is a batch already.
    return torch.utils.data.DataLoader(OnDevice(), batch_size=None, generator=torch.Generator())


class _PyDatasetBatches:
    """A PyDataset's batches, in order: its `len()` of them (a PyDataset need not stop by itself)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return (self.dataset[index] for index in range(len(self.dataset)))
