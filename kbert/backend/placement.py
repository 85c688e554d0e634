"""What `--strategy` may name, and which process of a multi-worker run writes the shared files.

Both are read from the flag and TF_CONFIG alone, before any backend sets up its devices, so they
hold on every backend and import none.

Example:
>>> check_strategy("mirrored")
>>> writes_shared_files("cpu")
True
"""

from __future__ import annotations

import json
import os

from kbert.runtime.errors import KbertError

STRATEGIES = ("auto", "cpu", "gpu", "mirrored", "multi-worker", "tpu")


def check_strategy(name: str):
    """Raise a one-line `KbertError` unless `name` is one of `STRATEGIES`."""
    if name not in STRATEGIES:
        raise KbertError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")


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
