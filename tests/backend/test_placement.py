"""--strategy on TensorFlow, and which process of a run writes --model-dir, from TF_CONFIG as a multi-worker run sets it."""

import json

import pytest

from kbert.backend.placement import writes_shared_files
from kbert.backend.tensorflow import make_strategy
from kbert.runtime.errors import KbertError, command_line_names

WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
WITH_CHIEF = {"chief": ["127.0.0.1:0"], "worker": ["127.0.0.1:1", "127.0.0.1:2"]}


@pytest.mark.parametrize(
    "cluster, task, writes",
    [
        (WORKERS, {"type": "worker", "index": 0}, True),
        (WORKERS, {"type": "worker", "index": 1}, False),
        (WITH_CHIEF, {"type": "chief", "index": 0}, True),
        (WITH_CHIEF, {"type": "worker", "index": 0}, False),  # TensorFlow's rule: the chief task, if there is one
        (WITH_CHIEF, {"type": "evaluator", "index": 0}, False),
    ],
)
def test_only_the_chief_of_a_multi_worker_run_writes_the_model_dir(monkeypatch, cluster, task, writes):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    assert writes_shared_files("multi-worker") is writes
    assert writes_shared_files("cpu") is True  # TF_CONFIG is for multi-worker runs only


def test_a_broken_tf_config_is_left_to_the_strategy_to_report(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    assert writes_shared_files("multi-worker") is True


def test_a_strategy_error_names_the_argument_in_python_and_the_flag_on_the_command_line(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(KbertError) as raised:
        make_strategy("multi-worker")
    assert str(raised.value).startswith("strategy='multi-worker' needs TF_CONFIG, e.g. {"), raised.value
    with command_line_names({"--strategy"}), pytest.raises(KbertError) as raised:
        make_strategy("multi-worker")
    assert str(raised.value).startswith("--strategy multi-worker needs TF_CONFIG, e.g. {"), raised.value
