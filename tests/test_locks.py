"""One writer per output (kbert/runtime/locks.py): a second writer is refused with one line naming the
holder (pid, host, command, start time) before it touches anything, and a lock whose holder is
gone is taken over with a one-line notice. Every holder here is a process of its own, and
every kill a real signal."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, TINY, assert_user_error, kbert_command, run_kbert
from kbert.runtime.locks import lock_path

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
CONFIG = os.path.join(TINY, "bert_config.json")
VOCAB = os.path.join(TINY, "vocab.txt")
SHAPE = ["--max-seq-length", "32", "--max-predictions-per-seq", "5", "--batch-size", "8"]
HOST = socket.gethostname()

# Holds the lock of argv[1] until its stdin closes.
HOLDER = """
import sys
from kbert.runtime.locks import output_lock
with output_lock(sys.argv[1], "kbert holder " + sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held_by_another_process(output):
    """Another process holds the lock of `output` inside the block; yields that process."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(output)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline() == "held\n"
        yield process
    finally:
        process.stdin.close()
        process.wait(timeout=60)


def tree(path) -> dict:
    """Every file and folder under `path` with its size and modification time: what a writer changes."""
    found = {}
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(folder, name)
            stat = os.stat(full)
            found[os.path.relpath(full, path)] = (stat.st_size, stat.st_mtime_ns)
    return found


def _model_args(model_dir, out, records=None, preset=None):
    return {
        "convert from-tf1": ["convert", "from-tf1", TINY, out],
        "convert to-tf1": ["convert", "to-tf1", model_dir, out],
        "convert from-hf": ["convert", "from-hf", os.path.join(FIXTURES, "hf-tiny"), out],
        "convert to-hf": ["convert", "to-hf", model_dir, out],
        "convert from-tfhub": ["convert", "from-tfhub", os.path.join(FIXTURES, "model-garden-tfhub", "encoder"), out],
        "convert to-keras-hub": ["convert", "to-keras-hub", model_dir, out],
        "convert from-keras-hub": ["convert", "from-keras-hub", preset, out],
        "pretrain": [
            "pretrain",
            "--model-dir",
            out,
            "--data",
            records,
            "--config",
            CONFIG,
            "--vocab",
            VOCAB,
            *SHAPE,
            "--steps",
            "2",
        ],
        "finetune": ["finetune", model_dir, "--task", "classify", "--train", SAMPLE, "--output", out],
        "export": ["export", model_dir, out],
        "export --format tfhub": ["export", model_dir, out, "--format", "tfhub"],
        "create-data": ["create-data", "--input", SAMPLE, "--vocab", VOCAB, "--output", out],
    }


COMMANDS = list(_model_args("m", "o"))


@pytest.fixture(scope="module")
def keras_hub_preset(tmp_path_factory, tiny_model_dir):
    preset = tmp_path_factory.mktemp("keras-hub") / "preset"
    run_kbert("convert", "to-keras-hub", tiny_model_dir, preset)
    return preset


@pytest.mark.parametrize("command", COMMANDS)
def test_each_writing_command_is_refused_while_another_process_holds_its_output(
    tmp_path, tiny_model_dir, records, keras_hub_preset, command
):
    out = tmp_path / "out"
    with held_by_another_process(out) as holder:
        lock_before = open(lock_path(out)).read()
        result = run_kbert(*_model_args(tiny_model_dir, out, records, keras_hub_preset)[command], check=False)
        assert_user_error(
            result,
            f"{out} is being written by another process",
            f"pid {holder.pid} on {HOST}",
            f"command `kbert holder {out}`",
            "started 20",
        )
        assert not out.exists()
        assert open(lock_path(out)).read() == lock_before
    assert os.listdir(tmp_path) == []  # the holder took its lock file along


def test_a_failed_run_leaves_neither_its_lock_nor_the_folders_made_for_it(tmp_path):
    out = tmp_path / "new" / "deeper" / "model"
    result = run_kbert("convert", "from-tf1", tmp_path / "missing", out, check=False)
    assert_user_error(result, "no such file or folder; pass a google-research checkpoint")
    assert os.listdir(tmp_path) == []


ORPHAN = """
import os, sys, time
from kbert.runtime.locks import output_lock
lock = output_lock(sys.argv[1], "kbert parent")
lock.__enter__()
child = os.fork()
if child == 0:  # keeps the lock file open, so the flock stays held after its parent is gone
    os.close(1)
    time.sleep(600)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # ends without releasing: its pid is gone, its flock is not
"""


def test_a_lock_kept_by_an_orphan_of_a_dead_holder_is_taken_over(tmp_path):
    out = tmp_path / "tiny"
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN, str(out)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        parent.wait(timeout=60)
        holder = json.load(open(lock_path(out)))
        assert holder["pid"] == parent.pid
        result = run_kbert("convert", "from-tf1", TINY, out)
        notices = [line for line in result.stderr.splitlines() if "lock" in line]
        assert notices == [
            f"kbert: taking over the lock of {out} from a process that is no longer running "
            f"(pid {parent.pid} on {HOST}, command `kbert parent`, started {holder['started']})"
        ]
        assert (out / "bert_config.json").is_file()
        assert not os.path.exists(lock_path(out))
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("records") / "sample.tfrecord"
    run_kbert(
        "create-data",
        "--input",
        SAMPLE,
        "--vocab",
        VOCAB,
        "--output",
        out,
        "--max-seq-length",
        "32",
        "--max-predictions-per-seq",
        "5",
        "--dupe-factor",
        "2",
        "--workers",
        "1",
    )
    return out


def _last_checkpoint_step(model_dir) -> int:
    with open(os.path.join(model_dir, "checkpoints", "checkpoint")) as f:
        return int(f.readline().split('"')[1].rsplit("-", 1)[1])


@pytest.mark.slow
def test_a_second_pretrain_is_refused_and_a_killed_ones_lock_taken_over(tmp_path, records):
    out = tmp_path / "bert"
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        kbert_command()
        + [
            "pretrain",
            "--model-dir",
            str(out),
            "--data",
            str(records),
            "--config",
            CONFIG,
            "--vocab",
            VOCAB,
            *SHAPE,
            "--steps",
            "150",
            "--save-every",
            "5",
            "--steps-per-loop",
            "5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "checkpoint").exists():
            assert first.poll() is None, open(tmp_path / "first.log").read()[-3000:]
            assert time.monotonic() < deadline, "the first run wrote no checkpoint"
            time.sleep(0.2)
        holder = json.load(open(lock_path(out)))
        assert (holder["pid"], holder["host"]) == (first.pid, HOST)
        assert holder["command"].startswith(f"kbert pretrain --model-dir {out} ")
        first.send_signal(signal.SIGSTOP)  # it keeps its lock and writes nothing while the second tries
        before = tree(tmp_path)
        second = run_kbert(
            "pretrain", "--model-dir", out, "--data", records, *SHAPE, "--steps", "100000", "--resume", check=False
        )
        assert_user_error(
            second,
            f"{out} is being written by another process",
            f"pid {first.pid} on {HOST}",
            f"command `{holder['command']}`",
            f"started {holder['started']}",
        )
        assert tree(tmp_path) == before
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        log.close()
    step = _last_checkpoint_step(out)
    third = run_kbert("pretrain", "--model-dir", out, "--resume")  # the run's recorded flags
    notices = [line for line in third.stderr.splitlines() if "lock" in line]
    assert notices == [
        f"kbert: taking over the lock of {out} left by a process that ended without releasing it "
        f"(pid {first.pid} on {HOST}, command `{holder['command']}`, started {holder['started']})"
    ]
    assert f"resumed from step {step}" in third.stderr
    assert step < 150 and json.loads(third.stdout)["step"] == 150
    assert not os.path.exists(lock_path(out))


def test_library_writers_take_the_lock_as_the_commands_do(tmp_path, tiny_model_dir, records):
    """A script that calls the library gets the same one writer per output as the CLI."""
    from kbert.finetuning.train import finetune
    from kbert.pretraining.create_data import create_pretraining_data
    from kbert.pretraining.train import pretrain
    from kbert.runtime.errors import KbertError
    from kbert.serving.export import export_model
    from kbert.text.vocab_builder import build_vocab

    out = tmp_path / "out"
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\ngold city\tpos\ndead camp\tneg\n")
    calls = {
        "pretrain": lambda: pretrain(str(out), str(records), config_file=CONFIG, vocab_file=VOCAB, steps=2),
        "finetune": lambda: finetune(str(tiny_model_dir), "classify", str(train), str(out)),
        "export_model": lambda: export_model(str(tiny_model_dir), str(out)),
        "create_pretraining_data": lambda: create_pretraining_data([SAMPLE], VOCAB, str(out), workers=1),
        "build_vocab": lambda: build_vocab([SAMPLE], str(out), size=100),
    }
    with held_by_another_process(out) as holder:
        for name, call in calls.items():
            with pytest.raises(KbertError, match=f"is being written by another process \\(pid {holder.pid} "):
                call()
            assert not out.exists(), name
