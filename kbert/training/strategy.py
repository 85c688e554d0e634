"""`--strategy auto|cpu|gpu|mirrored|multi-worker|tpu`: one flag picks the tf.distribute strategy on
TensorFlow (`make_strategy`), and the devices Keras trains on with JAX or PyTorch (`keras_devices`)."""

from __future__ import annotations

import json
import os
import socket

import keras

from kbert.errors import KbertError, first_line, option

if keras.config.backend() == "tensorflow":  # JAX and PyTorch runs import no TensorFlow
    import tensorflow as tf

STRATEGIES = ("auto", "cpu", "gpu", "mirrored", "multi-worker", "tpu")

# Tests (and CPU-only users who want to try mirrored training) split the CPU into N logical
# devices; this must happen before TensorFlow initialises its devices.
LOGICAL_CPUS_ENV = "KBERT_LOGICAL_CPUS"


def split_cpu_if_asked():
    """Honour KBERT_LOGICAL_CPUS=N: expose the CPU as N logical devices (before any TF op)."""
    n = int(os.environ.get(LOGICAL_CPUS_ENV, "0") or 0)
    if n > 1:
        import tensorflow as tf  # also called where Keras runs on another backend (export, on JAX)

        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError:
            pass  # already initialised by an earlier call in this process


def use_mixed_precision(enabled: bool):
    """Turn on Keras' mixed precision if `enabled`: float16 compute (with loss scaling) on a GPU,
    bfloat16 elsewhere (CPUs with AVX512-BF16 or AMX, TPUs); variables stay float32."""
    if enabled:
        keras.mixed_precision.set_global_policy("mixed_float16" if _has_gpu() else "mixed_bfloat16")


def _has_gpu() -> bool:
    """Whether the Keras backend computes on a GPU."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        return bool(tf.config.list_logical_devices("GPU"))
    if backend == "jax":
        import jax

        return jax.default_backend() == "gpu"
    import torch

    return torch.cuda.is_available()


def make_strategy(name: str = "auto", tpu: str | None = None):
    """The tf.distribute strategy for `name`.

    - auto: all local GPUs (mirrored) if there are several, the GPU if one, else the CPU.
    - cpu / gpu: one device.
    - mirrored: MirroredStrategy over all local GPUs, or all logical CPU devices.
    - multi-worker: MultiWorkerMirroredStrategy; needs TF_CONFIG (cluster + task).
    - tpu: TPUStrategy on the TPU named by `tpu` (or the one TPUClusterResolver finds).
    """
    if name not in STRATEGIES:
        raise KbertError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")
    # Multi-worker and TPU set-up must come before anything initialises TensorFlow's devices.
    if name == "multi-worker":
        if not os.environ.get("TF_CONFIG"):
            raise KbertError(
                f"{option('strategy', 'multi-worker')} needs TF_CONFIG, e.g. "
                '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                '"task": {"type": "worker", "index": 0}} on each worker'
            )
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise KbertError(f"TF_CONFIG is not valid JSON ({e}); fix the environment variable") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        return _tpu_strategy(tpu)
    split_cpu_if_asked()
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "auto":
        if len(gpus) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "cpu":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if name == "gpu":
        if not gpus:
            raise KbertError(
                f"{option('strategy', 'gpu')}: TensorFlow sees no GPU here; "
                f"install a CUDA build of TensorFlow or use {option('strategy', 'cpu')}"
            )
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    # mirrored
    if gpus:
        return tf.distribute.MirroredStrategy()
    # No NCCL on CPU: reduce through one device.
    return tf.distribute.MirroredStrategy([d.name for d in cpus], cross_device_ops=tf.distribute.ReductionToOneDevice())


def keras_devices(name: str = "auto", tpu: str | None = None) -> list:
    """The devices a JAX or PyTorch run trains on, for `--strategy name`; several devices are
    spread over with `keras.distribution.DataParallel` (JAX only). A strategy that does not map
    to the backend raises a one-line `KbertError` saying what to use.

    - auto: JAX: every local GPU or TPU device, else one CPU; PyTorch: the GPU if there is one, else the CPU.
    - cpu / gpu: one device of that kind.
    - mirrored (JAX): every local device, GPUs or TPU cores, or the CPU devices that
      XLA_FLAGS=--xla_force_host_platform_device_count=N makes.
    - tpu (JAX): the TPU cores of this TPU VM.
    - multi-worker: TensorFlow only.

    Example:
    >>> len(keras_devices("cpu"))  # doctest: +SKIP
    1
    """
    backend = keras.config.backend()
    if name not in STRATEGIES:
        raise KbertError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")
    if name == "multi-worker":
        raise KbertError(
            f"{option('strategy', 'multi-worker')} (tf.distribute over several machines) runs on TensorFlow only; "
            f"run with KERAS_BACKEND=tensorflow, or train on this machine's devices with {option('strategy', 'auto')}"
        )
    if tpu:
        raise KbertError(
            f"{option('tpu', tpu)} names a TPU for TensorFlow's TPUStrategy; on {backend} leave it out "
            f"(JAX uses the TPU of the TPU VM it runs on, with {option('strategy', 'tpu')}), "
            "or run with KERAS_BACKEND=tensorflow"
        )
    if backend == "torch":
        return _torch_devices(name)
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


def _torch_devices(name: str) -> list:
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


def _tpu_strategy(tpu):
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        _probe(resolver.master())  # connecting to a dead address would hang, not fail
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # ValueError, URLError, OpError...: all mean "no TPU here"
        raise KbertError(
            f"{option('strategy', 'tpu')}: no TPU reachable{f' at {tpu!r}' if tpu else ''} ({first_line(e)}); "
            f"run on a Cloud TPU VM or pass {option('tpu', 'NAME')}"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def _probe(master: str, timeout: float = 10.0):
    """Raise ConnectionError unless the TPU worker at `master` (grpc://host:port) accepts a connection."""
    if not master.startswith("grpc://"):
        return  # a local TPU VM ("" or "local"): nothing to dial
    host, _, port = master[len("grpc://") :].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout):
        pass


def is_chief(strategy) -> bool:
    """Whether this worker writes the real checkpoints and logs (the chief, or a single machine)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    return _is_chief_task(resolver.task_type, resolver.task_id, _tf_config().get("cluster") or {})


def _is_chief_task(task_type: str, task_id: int, cluster: dict) -> bool:
    # As TensorFlow's multi_worker_util.is_chief: the "chief" task if the cluster has one, else worker 0.
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and task_id == 0


def _tf_config() -> dict:
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return {}  # make_strategy names what is wrong with it
    return config if isinstance(config, dict) else {}


def writes_shared_files(name: str) -> bool:
    """Whether this process, with `--strategy name`, is the one that writes --model-dir: any
    process but the non-chief workers of a multi-worker run (told apart by TF_CONFIG, before
    the strategy is made).

    Example:
    >>> writes_shared_files("cpu")
    True
    """
    if name != "multi-worker":
        return True
    config = _tf_config()
    task = config.get("task") or {}
    try:
        return _is_chief_task(task.get("type", "worker"), int(task.get("index", 0)), config.get("cluster") or {})
    except (AttributeError, TypeError, ValueError):
        return True  # make_strategy or TensorFlow names what is wrong with TF_CONFIG
