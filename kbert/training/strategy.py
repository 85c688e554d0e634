"""`--strategy auto|cpu|gpu|mirrored|multi-worker|tpu`: one flag picks the tf.distribute strategy."""

from __future__ import annotations

import json
import os
import socket

import keras
import tensorflow as tf

from kbert.errors import KbertError, first_line, option

STRATEGIES = ("auto", "cpu", "gpu", "mirrored", "multi-worker", "tpu")

# Tests (and CPU-only users who want to try mirrored training) split the CPU into N logical
# devices; this must happen before TensorFlow initialises its devices.
LOGICAL_CPUS_ENV = "KBERT_LOGICAL_CPUS"


def split_cpu_if_asked():
    """Honour KBERT_LOGICAL_CPUS=N: expose the CPU as N logical devices (before any TF op)."""
    n = int(os.environ.get(LOGICAL_CPUS_ENV, "0") or 0)
    if n > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError:
            pass  # already initialised by an earlier call in this process


def use_mixed_precision(enabled: bool):
    """Turn on Keras' mixed precision if `enabled`: float16 compute (with loss scaling) on a GPU,
    bfloat16 elsewhere (CPUs with AVX512-BF16 or AMX, TPUs); variables stay float32."""
    if enabled:
        gpu = bool(tf.config.list_logical_devices("GPU"))
        keras.mixed_precision.set_global_policy("mixed_float16" if gpu else "mixed_bfloat16")


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
