"""`kbert pretrain` interrupted by real signals (SIGTERM, SIGINT, kill -9) and resumed.

Each interrupted run is a real `kbert pretrain` process; the signals are sent to it by the operating
system. An interrupted and resumed run must end with the weights of the run that was never interrupted:
the same data order, dropout draws and optimizer state. Runs that no signal reaches (the reference,
the resumed runs, a failing checkpoint write) run in this process, through run_kbert: they read and
write only the model directory, and a new process would spend most of its time importing TensorFlow.
"""

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from conftest import TINY, assert_user_error, fail_nth_checkpoint, kbert_command, run_kbert
from helpers import largest_difference, saved_weights
from test_pretrain import SAMPLE, SHAPE, VOCAB, PortTaken, check_ports, wait_for_workers, worker_envs

pytestmark = pytest.mark.slow

# Dropout stays on (the tiny config's 0.1): its draws must resume too. Enough steps that a signal
# sent after a logged step lands before the run's end on a busy machine (about 100 steps a second).
STEPS = 300
RUN = [*SHAPE, "--batch-size", "8", "--steps", str(STEPS), "--steps-per-loop", "2", "--learning-rate", "1e-3"]


def pretrain_args(model_dir, records, *extra):
    start = [] if "--resume" in extra else ["--config", os.path.join(TINY, "bert_config.json"), "--vocab", VOCAB]
    return ["pretrain", "--model-dir", str(model_dir), "--data", str(records), *start, *RUN, *extra]


def start(model_dir, records, *extra, env=None):
    """`kbert pretrain` in a process of its own, for a signal to interrupt; its stdout and stderr
    go to files (`process.out`, `process.err`), as test_pretrain.start_worker's do."""
    out, err = (open(f"{model_dir}.{time.monotonic_ns()}.{name}", "w+") for name in ("out", "err"))
    command = kbert_command() + pretrain_args(model_dir, records, *extra)
    process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
    process.out, process.err = out, err
    return process


def pretrain_here(model_dir, records, *extra):
    """`kbert pretrain` run to its end in this process: (exit status, stdout, stderr)."""
    result = run_kbert(*pretrain_args(model_dir, records, *extra), check=False)
    return result.returncode, result.stdout, result.stderr


def finish(process, timeout=300):
    (result,) = wait_for_workers([process], timeout)
    return result


def logged_steps(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if line.endswith("\n") and '"split"' not in line]


def wait_for(condition, *processes, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        assert all(p.poll() is None for p in processes), "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def sample_records(tmp_path_factory):
    """Records of sample_text.txt by kbert's create-data, in this process: what they hold does not
    matter here (test_pretrain.py trains on the original script's)."""
    from kbert.pretraining.create_data import create_pretraining_data

    out = tmp_path_factory.mktemp("records") / "sample.tfrecord"
    create_pretraining_data(
        [SAMPLE], VOCAB, str(out), max_seq_length=32, max_predictions_per_seq=5, dupe_factor=5, seed=7, workers=1
    )
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, sample_records):
    out = tmp_path_factory.mktemp("reference") / "bert"
    code, stdout, log = pretrain_here(out, sample_records)
    assert code == 0, log[-2000:]
    return saved_weights(out)


def interrupt(model_dir, records, number, *extra, after_step):
    """Start a run, send it `number` once it has logged `after_step`; returns (code, stderr, last logged step)."""
    process = start(model_dir, records, *extra)
    wait_for(lambda: logged_steps(model_dir) and logged_steps(model_dir)[-1] >= after_step, process)
    process.send_signal(number)
    code, _, log = finish(process)
    return code, log, logged_steps(model_dir)[-1]


def test_sigterm_then_sigint_save_the_step_reached_and_the_resumed_run_is_exact(
    tmp_path, sample_records, uninterrupted
):
    out = tmp_path / "bert"
    code, log, last = interrupt(out, sample_records, signal.SIGTERM, after_step=6)
    assert code == 143, log[-2000:]
    lines = log.strip().splitlines()
    said = f"continue with `kbert pretrain --model-dir {out} --resume`"
    assert lines[-1] == f"kbert: interrupted at step {last}: checkpoint saved; {said}"
    assert "Traceback" not in log
    # No step lost: the checkpoint is at the last step the run logged.
    assert (out / "checkpoints" / f"ckpt-{last}.index").exists() and 6 <= last < STEPS
    # The run's flags are recorded: one that would change its result is refused, naming both values.
    assert_user_error(
        run_kbert("pretrain", "--model-dir", out, "--resume", "--batch-size", "16", check=False),
        "started with --batch-size 8, not 16; leave --batch-size out",
    )

    # The same flags typed again are accepted.
    code, log, second = interrupt(out, sample_records, signal.SIGINT, "--resume", after_step=last + 4)
    assert code == 130, log[-2000:]
    assert log.strip().splitlines()[-1] == f"kbert: interrupted at step {second}: checkpoint saved; {said}"
    assert (out / "checkpoints" / f"ckpt-{second}.index").exists()

    # The line printed, typed as shown: the recorded flags, nothing else.
    typed = shlex.split(said.split("`")[1])
    assert typed[:2] == ["kbert", "pretrain"]
    result = run_kbert(*typed[1:], check=False)
    code, stdout, log = result.returncode, result.stdout, result.stderr
    assert code == 0, log[-2000:]
    assert f"resumed from step {second}" in log and json.loads(stdout)["step"] == STEPS
    difference = largest_difference(saved_weights(out), uninterrupted)
    print(f"largest weight difference after two interruptions: {difference:.3g}")
    assert difference <= 1e-6


def test_kill_9_then_resume_ends_with_the_uninterrupted_weights(tmp_path, sample_records, uninterrupted):
    out = tmp_path / "bert"
    process = start(out, sample_records, "--save-every", "4")
    wait_for(lambda: (out / "checkpoints" / "ckpt-8.index").exists(), process)
    process.send_signal(signal.SIGKILL)
    finish(process)
    # The latest complete checkpoint: ckpt-8's files may be there before it is recorded as complete.
    import tensorflow as tf

    latest = int(tf.train.latest_checkpoint(str(out / "checkpoints")).rsplit("-", 1)[1])
    assert latest >= 4
    # Flags that only change how it runs may differ: how often it saves, steps per compiled call.
    # (Saving once, at the end, also spares the resumed run some fifty checkpoint writes.)
    code, stdout, log = pretrain_here(
        out, sample_records, "--resume", "--save-every", str(STEPS), "--steps-per-loop", "3"
    )
    assert code == 0, log[-2000:]
    assert json.loads(stdout)["resumed_from"] == latest
    difference = largest_difference(saved_weights(out), uninterrupted)
    print(f"largest weight difference after kill -9: {difference:.3g}")
    assert difference <= 1e-6


def test_a_second_signal_stops_at_once_and_the_last_good_checkpoint_resumes(tmp_path, sample_records):
    import tensorflow as tf

    out = tmp_path / "bert"
    process = start(out, sample_records, "--save-every", "2", "--steps-per-loop", "1")
    wait_for(lambda: len(logged_steps(out)) >= 5, process)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    code, _, log = finish(process)
    # Whether the second came during the step, the save or the exit: at once, with its status.
    assert code in (143, 130), log[-2000:]
    assert "Traceback" not in log
    latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
    assert latest is not None
    # The resumed run saves once, at its end, in longer compiled calls (both may differ on resume).
    code, stdout, log = pretrain_here(
        out, sample_records, "--resume", "--save-every", str(STEPS), "--steps-per-loop", "10"
    )
    assert code == 0, log[-2000:]
    assert f"resumed from step {int(latest.rsplit('-', 1)[1])}" in log and json.loads(stdout)["step"] == STEPS


# The multi-worker runs: steps enough for a signal sent at step 4 to land well before the end.
WORKER_STEPS = 24


def test_one_workers_sigterm_makes_every_worker_save_the_same_step(tmp_path, sample_records):
    for attempt in range(3):  # a cluster one of whose workers found its port taken starts again
        try:
            return one_workers_sigterm(tmp_path / f"attempt-{attempt}", sample_records)
        except PortTaken:
            if attempt == 2:
                raise


def one_workers_sigterm(work, sample_records):
    out, started = work / "bert", []
    work.mkdir()

    def workers(*extra, model_dir=out):
        args = ["--strategy", "multi-worker", "--steps", str(WORKER_STEPS), *extra]
        started.extend(start(model_dir, sample_records, *args, env=env) for env in worker_envs(2))
        return started[-2:]

    try:
        # The same run never interrupted, started beside the one a signal interrupts (a cluster of
        # its own): two workers of one cluster spend much of each step waiting on each other.
        reference = work / "reference"
        uninterrupted = workers(model_dir=reference)
        chief, other = workers()
        try:
            wait_for(lambda: logged_steps(out) and logged_steps(out)[-1] >= 4, chief, other)
        except AssertionError:
            check_ports(wait_for_workers([chief, other], timeout=0))
            raise
        other.send_signal(signal.SIGTERM)  # the non-chief worker is preempted
        steps = []
        for code, _, log in wait_for_workers([chief, other], expected=(0, 143)):
            assert code == 143, log[-3000:]
            line = log.strip().splitlines()[-1]
            assert line.startswith("kbert: interrupted at step ") and line.endswith(
                f"checkpoint saved; continue with `kbert pretrain --model-dir {out} --resume`"
            )
            steps.append(int(line.split("step ")[1].split(":")[0]))
        assert steps[0] == steps[1] == logged_steps(out)[-1]
        assert (out / "checkpoints" / f"ckpt-{steps[0]}.index").exists()

        for code, stdout, log in check_ports(wait_for_workers(workers("--resume"))):
            assert code == 0, log[-3000:]
            assert f"resumed from step {steps[0]}" in log and json.loads(stdout)["step"] == WORKER_STEPS
        for code, _, log in check_ports(wait_for_workers(uninterrupted)):
            assert code == 0, log[-3000:]
    finally:  # a worker whose peer failed would wait for it forever
        for process in started:
            process.kill()
    # The same run never interrupted ends with the same weights.
    difference = largest_difference(saved_weights(out), saved_weights(reference))
    print(f"largest weight difference after a multi-worker interruption: {difference:.3g}")
    assert difference <= 1e-6


def test_a_failed_checkpoint_write_stops_with_one_line_and_resume_works(
    tmp_path, sample_records, uninterrupted, monkeypatch
):
    import tensorflow as tf

    out = tmp_path / "bert"
    with monkeypatch.context() as patched:
        fail_nth_checkpoint(patched, 2)  # step 4 saves, step 8 fails
        code, _, log = pretrain_here(out, sample_records, "--save-every", "4")
    assert code == 1, log[-2000:]
    assert log.strip().splitlines()[-1] == (
        "kbert: error: writing the checkpoint for step 8 failed ([Errno 28] No space left on device); the previous "
        "checkpoint (step 4) is intact: fix the cause, then --resume"
    )
    assert tf.train.latest_checkpoint(str(out / "checkpoints")).endswith("ckpt-4")
    code, stdout, log = pretrain_here(out, sample_records, "--save-every", str(STEPS), "--resume")
    assert code == 0, log[-2000:]
    assert "resumed from step 4" in log and json.loads(stdout)["step"] == STEPS
    assert largest_difference(saved_weights(out), uninterrupted) <= 1e-6
