"""benchmarks/gpu_check.py runs where the GPU machines run it: TensorFlow absent. Here --smoke runs
every part of it tiny on the CPU (both Keras backends, every contender) and the report says so."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


@pytest.mark.slow
def test_the_smoke_run_reports_every_run_without_tensorflow(tmp_path):
    # Every process the script starts inherits PYTHONPATH, so none of them can import TensorFlow.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--steps", "2"], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert set(report) >= {"model", "steps", "warmup", "runs", "ratios", "seconds"}
    assert report["reader_sequences_per_second 4x32"] > 0
    runs = report["runs"]
    names = ["kbert-pretrain-jax", "kbert-pretrain-jax-float16", "kbert-pretrain-torch", "kbert-fit-jax"]
    names += ["kbert-fit-torch", "hf-torch-eager", "hf-torch-compile", "keras-hub-jax"]
    assert sorted(runs) == sorted(f"{name} 4x32" for name in names)
    for name, run in runs.items():
        assert "error" not in run and run["device"] == "cpu", (name, run)
        # A random start over BERT's 30,522 tokens: the masked-LM loss starts near ln(30522) = 10.3.
        assert all(9 < loss < 12 for loss in run["losses"]), (name, run["losses"])
        if name.startswith("kbert-pretrain-jax-float16"):
            continue
        assert run["sequences_per_second"] > 0, name
        if name.startswith("kbert-pretrain"):  # kbert pretrain's own record: two loops of --steps steps
            assert len(run["losses"]) == len(run["loop_seconds"]) == 2 and run["mixed_precision"] == "mixed_bfloat16"
        else:
            assert len(run["losses"]) == report["warmup"] + 2 and len(run["step_seconds"]) == len(run["losses"]) - 1
    # float16: trained a loop, checkpointed its loss scale, resumed from it for a second loop.
    float16 = runs["kbert-pretrain-jax-float16 4x32"]
    assert float16["ok"] and float16["resumed_from"] == 2 and float16["mixed_precision"] == "mixed_float16", float16
    scales = float16["loss_scale"]
    assert scales["step 4"]["step_counter"] == scales["step 2"]["step_counter"] + 2, scales
    for backend in ("jax", "torch"):  # the encoder against google-research/bert's own outputs, once a backend
        outputs = runs[f"kbert-pretrain-{backend} 4x32"]["outputs"]
        assert outputs["ok"] and max(outputs["max_abs_difference"].values()) <= 1e-5, outputs
        assert "outputs" not in runs[f"kbert-fit-{backend} 4x32"]
    ours = "kbert-pretrain-jax"
    assert set(report["ratios"]) == {f"{ours}/keras-hub-jax 4x32", f"{ours}/hf-torch-compile 4x32"}


def test_an_unknown_run_is_one_line():
    done = subprocess.run([sys.executable, SCRIPT, "--runs", "kbert-tpu"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown run kbert-tpu; choose from kbert-pretrain-jax," in done.stderr
    assert "Traceback" not in done.stderr


def test_a_run_that_fails_leaves_the_others_in_its_process_to_run(monkeypatch, capsys):
    """--smoke runs each backend's runs in one process: one run's exception is its own report."""
    monkeypatch.syspath_prepend(os.path.dirname(SCRIPT))
    import gpu_check

    def run_one(args, run):
        if run == "keras-hub-jax":
            raise ValueError("no keras-hub here")
        return {"device": "cpu", "run": run}

    monkeypatch.setattr(gpu_check, "run_one", run_one)
    assert gpu_check.main(["--smoke", "--run", "kbert-pretrain-jax,keras-hub-jax,kbert-fit-jax"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "kbert-pretrain-jax": {"device": "cpu", "run": "kbert-pretrain-jax"},
        "keras-hub-jax": {"error": "ValueError: no keras-hub here"},
        "kbert-fit-jax": {"device": "cpu", "run": "kbert-fit-jax"},
    }


def test_runs_past_the_budget_are_reported_as_not_run(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    command = [sys.executable, SCRIPT, "--smoke", "--budget", "0", "--runs", "kbert-pretrain-jax,hf-torch-eager"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout)["runs"]
    assert runs == {
        "kbert-pretrain-jax 4x32": {"error": "not run: the --budget of 0 s was spent"},
        "hf-torch-eager 4x32": {"error": "not run: the --budget of 0 s was spent"},
    }


def test_a_failed_run_makes_the_exit_status_1(monkeypatch, capsys):
    """The whole check (--smoke too) reports every run and exits 1 when one of them failed."""
    monkeypatch.syspath_prepend(os.path.dirname(SCRIPT))
    import gpu_check

    def spawn(runs, shape, records, args, check_outputs, timeout):
        assert os.path.getsize(records) > 0  # the records were made, for real
        return {run: {"error": "RuntimeError: CUDA out of memory"} for run in runs}

    monkeypatch.setattr(gpu_check, "spawn", spawn)
    assert gpu_check.main(["--smoke", "--runs", "kbert-pretrain-jax"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["runs"] == {
        "kbert-pretrain-jax 4x32": {"error": "RuntimeError: CUDA out of memory"}
    }
    assert "gpu_check: 1 of 1 runs failed: kbert-pretrain-jax 4x32" in captured.err


def test_the_default_output_is_outside_the_checkout(tmp_path, monkeypatch, capsys):
    """Without --output the report goes to the temp folder; benchmarks/results/ is left as it was."""
    monkeypatch.syspath_prepend(os.path.dirname(SCRIPT))
    import tempfile

    import gpu_check

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    results = os.path.join(ROOT, "benchmarks", "results")
    before = sorted(os.listdir(results))
    # The full check with --budget 0: the records are made and the report written, and no run starts.
    assert gpu_check.main(["--budget", "0", "--runs", "kbert-pretrain-jax"]) == 0
    assert sorted(os.listdir(results)) == before
    (written,) = list(tmp_path.glob("*-gpu-check.json"))
    assert json.loads(written.read_text())["runs"] == {
        name: {"error": "not run: the --budget of 0 s was spent"}
        for name in ("kbert-pretrain-jax 256x128", "kbert-pretrain-jax 32x512")
    }
    assert f"written to {written}" in capsys.readouterr().err
