"""`kbert finetune` interrupted (SIGTERM, SIGINT, kill -9, a failed checkpoint write) and resumed.

Each interrupted run is a real `kbert finetune` process. A resumed run must continue from the step
where it stopped and end as the uninterrupted run ends: the same weights, the same best epoch and
the same eval_results.json. Runs that no signal reaches (the reference, the resumed runs, a failing
checkpoint write) run in this process, through run_kbert: they read and write only their output
directories, and a new process would spend most of its time importing TensorFlow.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import TINY, fail_nth_checkpoint, kbert_command, run_kbert
from helpers import largest_difference, saved_weights, sentiment_rows, write_tsv

pytestmark = pytest.mark.slow

# 256 examples in batches of 16: 16 steps an epoch, 80 in all (room for a signal to land before
# the end on a busy machine). Runs a signal interrupts, and the run whose write fails, save a
# checkpoint every 5 steps (SAVE_OFTEN); the others only at each epoch's end (how often a run
# saves may differ on resume, and is not what these tests compare).
EPOCHS = 5
SAVE_OFTEN = ("--save-every", "5")
FLAGS = [
    "--task",
    "classify",
    "--epochs",
    str(EPOCHS),
    "--batch-size",
    "16",
    "--learning-rate",
    "1e-3",
    "--max-seq-length",
    "24",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    work = tmp_path_factory.mktemp("data")
    return (write_tsv(work / "train.tsv", sentiment_rows(256, 0)), write_tsv(work / "dev.tsv", sentiment_rows(64, 1)))


def finetune_args(out, data, *extra):
    train, dev = data
    return [str(TINY), "--train", str(train), "--dev", str(dev), "--output", str(out), *FLAGS, *extra]


def command(out, data, *extra):
    return kbert_command() + ["finetune", *finetune_args(out, data, *extra)]


def run(out, data, *extra):
    """`kbert finetune` run to its end in this process (run_kbert's CompletedProcess)."""
    return run_kbert("finetune", *finetune_args(out, data, *extra), check=False)


def saved_step(out):
    try:
        with open(f"{out}.partial/state.json") as f:
            return json.load(f)["step"]
    except (OSError, ValueError):  # not written yet, or being replaced
        return 0


def assert_same_run(out, reference):
    difference = largest_difference(saved_weights(out), saved_weights(reference))
    print(f"largest weight difference: {difference:.3g}")
    assert difference <= 1e-6
    ours, want = (json.load(open(os.path.join(p, "eval_results.json"))) for p in (out, reference))
    assert ours["best"]["epoch"] == want["best"]["epoch"]
    assert len(ours["history"]) == len(want["history"]) == EPOCHS
    for a, b in zip(ours["history"], want["history"]):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-6) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("reference") / "model"
    result = run(out, data)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not os.path.exists(f"{out}.partial")  # an ended run leaves no partial state
    return out


def interrupt(out, data, number, after_step, *extra):
    process = subprocess.Popen(
        command(out, data, *SAVE_OFTEN, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while saved_step(out) < after_step:
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(number)
    stdout, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


def test_signals_save_the_step_reached_and_resume_mid_epoch_exactly(tmp_path, data, reference):
    out = tmp_path / "model"
    code, stderr = interrupt(out, data, signal.SIGTERM, 20)  # in the second epoch (steps 17-32)
    assert code == 143, stderr[-2000:]
    line = stderr.strip().splitlines()[-1]
    step = saved_step(out)
    assert line == (
        f"kbert: interrupted at step {step}: checkpoint saved in {out}.partial; continue with the same "
        f"kbert finetune command and --resume"
    ), line
    assert "Traceback" not in stderr and not out.exists()
    # The unfinished run is kept: refused without --resume, and with --resume and a flag it did not start with.
    result = refused(out, data)
    assert result.returncode == 1 and "pass --resume to continue it" in result.stderr.strip().splitlines()[-1]
    result = refused(out, data, "--resume", "--epochs", str(EPOCHS + 1))
    assert (
        result.returncode == 1
        and f"was started with epochs {EPOCHS}, not {EPOCHS + 1}" in result.stderr.strip().splitlines()[-1]
    )
    assert saved_step(out) == step

    code, stderr = interrupt(out, data, signal.SIGINT, step + 5, "--resume")
    assert code == 130, stderr[-2000:]
    second = saved_step(out)
    assert second > step and f"resumed from step {step}" in stderr

    result = run(out, data, "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["resumed_from_step"] == second  # not the epoch's start
    assert not os.path.exists(f"{out}.partial")
    assert_same_run(out, reference)


def test_kill_9_then_resume_ends_as_the_uninterrupted_run(tmp_path, data, reference):
    out = tmp_path / "model"
    code, _ = interrupt(out, data, signal.SIGKILL, 25)
    assert code == -signal.SIGKILL
    result = run(out, data, "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    assert_same_run(out, reference)


def test_a_failed_checkpoint_write_stops_with_one_line_and_resume_works(tmp_path, data, reference, monkeypatch):
    out = tmp_path / "model"
    with monkeypatch.context() as patched:
        fail_nth_checkpoint(patched, 3)  # saves at steps 5, 10, then 15 fails
        result = run(out, data, *SAVE_OFTEN)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "kbert: error: writing the checkpoint for step 15 failed ([Errno 28] No space left on device); the "
        "previous checkpoint (step 10) is intact: fix the cause, then --resume"
    )
    assert saved_step(out) == 10 and not out.exists()
    result = run(out, data, "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["resumed_from_step"] == 10
    assert_same_run(out, reference)


def refused(out, data, *extra):
    """`kbert finetune` with `extra`, run in this process: a refusal needs no process of its own."""
    return run(out, data, *extra)


def test_resume_refusals(tmp_path, data):
    """--resume where no run was interrupted (the refusals of an interrupted run: the signals test)."""
    result = refused(tmp_path / "model", data, "--resume")
    assert result.returncode == 1 and "no unfinished run" in result.stderr.strip().splitlines()[-1]


# === a signal after training ended: finished is finished ===


def short_run(tmp_path):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(32, 0))
    flags = ["--task", "classify", "--epochs", "1", "--batch-size", "16", "--max-seq-length", "16"]
    return [str(TINY), "--train", str(train), "--output", str(tmp_path / "model"), *flags]


def test_a_signal_while_the_output_is_written_waits_for_it_and_the_run_ends_finished(tmp_path, monkeypatch, capfd):
    """SIGINT once training has ended (here: the moment the output is in place, before the run's own
    files are cleared): the run ends as a finished one, its output whole, and says so."""
    import kbert.finetuning.train as train_module

    write_output = train_module._write_output

    def write_then_signal(*args, **kwargs):
        write_output(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C arriving just after the rename

    monkeypatch.setattr(train_module, "_write_output", write_then_signal)
    out, train = tmp_path / "model", write_tsv(tmp_path / "train.tsv", sentiment_rows(32, 0))
    result = train_module.finetune(TINY, "classify", train, out, epochs=1, batch_size=16, max_seq_length=16)
    assert result["epoch"] == 1 and (out / "model.weights.h5").exists()
    assert not os.path.exists(f"{out}.partial")  # the run's own files cleared too
    stderr = capfd.readouterr().err
    assert f"kbert: SIGINT received after training ended: writing {out} first" in stderr
    assert f"kbert: {out} is complete: the run had finished training when SIGINT came" in stderr


def test_a_ctrl_c_after_the_run_is_complete_is_no_stop(tmp_path, monkeypatch):
    """The command's last moments (its result printed, TensorFlow's teardown): exit 0, not 130."""
    import kbert.cli.finetune as finetune_command

    print_result = finetune_command.print_result

    def signal_then_print(result):
        os.kill(os.getpid(), signal.SIGINT)
        print_result(result)

    monkeypatch.setattr(finetune_command, "print_result", signal_then_print)
    result = run_kbert("finetune", *short_run(tmp_path), check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["epoch"] == 1 and (tmp_path / "model" / "model.weights.h5").exists()
