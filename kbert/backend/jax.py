"""Keras' JAX backend: its devices (several spread over with `keras.distribution.DataParallel`),
and everything else as `kbert.backend.portable` does it without TensorFlow."""

from __future__ import annotations

import keras

from kbert.backend import portable

# Every other answer is the one shared with PyTorch: `kbert.backend.portable`'s.
from kbert.backend.portable import *  # noqa: F403
from kbert.runtime.errors import KbertError, option

# Keras' layers are plain Python objects here: a layer may hold others before Layer.__init__ runs.
LAYERS_ARE_MODULES = False

# Keras' training and inference steps compiled whole with XLA (`jit_compile`): without it JAX
# dispatches every op of every step on its own.
COMPILES_STEPS = True


def has_gpu() -> bool:
    """Whether JAX computes on a GPU."""
    import jax

    return jax.default_backend() == "gpu"


def gpu_compute_capability() -> float | None:
    """The first GPU's CUDA compute capability (9.0 for an H100), or None without a GPU (or where
    this jaxlib does not say)."""
    import jax

    if not has_gpu():
        return None
    value = getattr(jax.devices()[0], "compute_capability", None)
    return float(value) if value else None


def keras_devices(name: str = "auto", tpu: str | None = None) -> list:
    """The devices a JAX run trains on, for `--strategy name`; several devices are spread over
    with `keras.distribution.DataParallel`. A strategy that does not map to JAX raises a one-line
    `KbertError` saying what to use.

    - auto: every local GPU or TPU device, else one CPU.
    - cpu / gpu: one device of that kind.
    - mirrored: every local device, GPUs or TPU cores, or the CPU devices that
      XLA_FLAGS=--xla_force_host_platform_device_count=N makes.
    - tpu: the TPU cores of this TPU VM.
    - multi-worker: TensorFlow only.
    """
    portable.check_keras_strategy(name, tpu)
    import jax

    devices = jax.local_devices()
    platform = devices[0].platform
    if name == "tpu":
        if platform != "tpu":
            raise KbertError(
                f"{option('strategy', 'tpu')}: JAX sees no TPU here; run on a Cloud TPU VM with jax[tpu] installed, "
                f"or use {option('strategy', 'auto')}"
            )
        return devices
    if name == "cpu" and platform != "cpu":
        raise KbertError(
            f"{option('strategy', 'cpu')}: JAX computes on {platform} here; set JAX_PLATFORMS=cpu to train on the CPU"
        )
    if name == "gpu" and platform != "gpu":
        raise KbertError(
            f"{option('strategy', 'gpu')}: JAX sees no GPU here; install jax[cuda12] or use {option('strategy', 'cpu')}"
        )
    if name == "mirrored" or (name == "auto" and platform != "cpu"):
        return devices
    return devices[:1]


def pretraining_placement(strategy: str, tpu: str | None = None) -> list:
    """Where pretraining runs: the Keras devices for --strategy."""
    return keras_devices(strategy, tpu)


def real_token_index(input_mask):
    """Every row of the flattened [batch · seq]: under jit a shape cannot depend on the mask's
    values, so the layers that elsewhere skip padding run on all of it (the same values)."""
    return keras.ops.arange(keras.ops.shape(input_mask)[0] * keras.ops.shape(input_mask)[1], dtype="int32")
