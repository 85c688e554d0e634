"""Shared test helpers: fixture paths, and running `kbert` as a user runs it."""

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import traceback
import warnings

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

TESTS = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(TESTS, "fixtures")
TINY = os.path.join(FIXTURES, "tf1-tiny")
UNCASED_VOCAB = os.path.join(FIXTURES, "vocab-uncased.txt")
REFERENCE = os.path.join(TESTS, "reference")


def kbert_command():
    exe = os.path.join(os.path.dirname(sys.executable), "kbert")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "kbert.cli.main"]


# `kbert` in a process whose Nth checkpoint save fails as a full disk would: its files are
# written, then recording it as complete (the file TensorFlow writes last) fails.
# N: env KBERT_TEST_FAIL_AT.
_FAIL_NTH_CHECKPOINT = """
import os
from tensorflow.python.checkpoint import checkpoint_management
real_save, real_record, saves = (checkpoint_management.CheckpointManager.save,
                                 checkpoint_management.update_checkpoint_state_internal, [0])
def counted_save(self, *args, **kwargs):
    saves[0] += 1
    return real_save(self, *args, **kwargs)
def failing_record(*args, **kwargs):
    if saves[0] == int(os.environ["KBERT_TEST_FAIL_AT"]):
        raise OSError(28, "No space left on device")
    return real_record(*args, **kwargs)
checkpoint_management.CheckpointManager.save = counted_save
checkpoint_management.update_checkpoint_state_internal = failing_record
from kbert.cli.main import main
main()
"""


def failing_checkpoint_command():
    return [sys.executable, "-c", _FAIL_NTH_CHECKPOINT]


def fail_nth_checkpoint(monkeypatch, n: int):
    """In this process, what failing_checkpoint_command does in its own: the Nth checkpoint save
    writes its files, then recording it as complete fails as a full disk would (for run_kbert, which
    spares the run a new process and its TensorFlow import). Undone with the test's monkeypatch."""
    from tensorflow.python.checkpoint import checkpoint_management

    real_save, real_record, saves = (
        checkpoint_management.CheckpointManager.save,
        checkpoint_management.update_checkpoint_state_internal,
        [0],
    )

    def counted_save(self, *args, **kwargs):
        saves[0] += 1
        return real_save(self, *args, **kwargs)

    def failing_record(*args, **kwargs):
        if saves[0] == n:
            raise OSError(28, "No space left on device")
        return real_record(*args, **kwargs)

    monkeypatch.setattr(checkpoint_management.CheckpointManager, "save", counted_save)
    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", failing_record)


# Commands that run in a process of their own even without `env`: create-data (worker processes),
# unless it is given one worker (`--workers 1` makes its instances in the calling process) or --help.
OWN_PROCESS = {"create-data"}


def _starts_processes(args) -> bool:
    if not OWN_PROCESS & set(args[:1]) or "--help" in args:
        return False
    return not any(a == "--workers" and b == "1" for a, b in zip(args, args[1:]))


def run_kbert(*args, check=True, env=None, own_process=None):
    """Run `kbert ARGS` as the console script does; returns CompletedProcess with text stdout/stderr.

    By default the command runs in this process, through the console script's own entry point
    (`kbert.cli.main.main`), with stdout and stderr captured and the exit status taken from its
    SystemExit: a new process would spend about 6 s of the machine's 2 cores importing
    TensorFlow for every call, and the suite makes about 150. Calls with `env` (logical CPUs,
    TF_CONFIG), create-data with worker processes, or `own_process=True`, run the real `kbert`
    executable in a new process, as a user's shell does; tests/test_cli_process.py checks that
    both ways print the same.
    """
    args = [str(a) for a in args]
    if own_process is None:
        own_process = bool(env) or _starts_processes(args)
    run = _run_in_new_process if own_process else _run_in_this_process
    result = run(args, env)
    if check and result.returncode != 0:
        raise AssertionError(f"kbert {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def _run_in_new_process(args, env):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("KBERT_DEBUG", None)
    return subprocess.run(kbert_command() + args, capture_output=True, text=True, env=full_env, timeout=600)


def _run_in_this_process(args, env):
    import keras

    from kbert.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, policy = dict(os.environ), keras.mixed_precision.global_policy()
    kbert_log = logging.getLogger("kbert")
    saved_handlers = list(kbert_log.handlers)
    # A finished finetune ignores SIGINT and SIGTERM to its exit: put them back for the next test.
    saved_signals = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    os.environ.pop("KBERT_DEBUG", None)
    code = 0
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(args)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # what Python does with an exception nothing caught (--debug)
                traceback.print_exc()
                code = 1
    finally:
        # What a command may change for the rest of its process, put back for the next test.
        os.environ.clear()
        os.environ.update(saved_env)
        keras.mixed_precision.set_global_policy(policy)
        kbert_log.handlers[:] = saved_handlers
        for number, handler in saved_signals.items():
            signal.signal(number, handler)
    return subprocess.CompletedProcess(["kbert"] + args, code, stdout.getvalue(), stderr.getvalue())


def popen_interruptible(args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(args, **kwargs) with SIGINT at its default in the new process, as a shell
    starts a command in the foreground, whatever this process inherited.

    A test run started in the background (`make test &`, nohup) ignores SIGINT, and every process
    it starts inherits that: a Ctrl-C test's command would run on as if no key was pressed. A
    Python handler, unlike "ignore", is reset to the default by exec, so one is set for the
    moment of the start (from the main thread, where pytest runs the tests).
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)


def sigint_state(pid: int) -> str:
    """How process `pid` treats SIGINT (ignored, blocked, caught), from /proc: said when a Ctrl-C
    test's process ran on as if it never got the signal.

    >>> sigint_state(os.getpid())
    'SIGINT: ignored no, blocked no, caught yes'
    """
    bit = 1 << (signal.SIGINT - 1)  # signal N is bit N - 1 of the masks
    masks = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("SigIgn", "SigBlk", "SigCgt"):
                masks[name] = int(value, 16)
    said = {
        name: "yes" if masks.get(key, 0) & bit else "no"
        for name, key in (("ignored", "SigIgn"), ("blocked", "SigBlk"), ("caught", "SigCgt"))
    }
    return "SIGINT: " + ", ".join(f"{name} {value}" for name, value in said.items())


def assert_user_error(result, *fragments, alone=True):
    """Exit non-zero, one line on stderr that names the problem, and no traceback.

    alone=False allows progress lines before it (an error in the middle of training).
    """
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if alone:
        assert len(lines) == 1, result.stderr
    assert sum(line.startswith("kbert: error: ") for line in lines) == 1, result.stderr
    assert lines[-1].startswith("kbert: error: "), lines[-1]
    for fragment in fragments:
        assert fragment in lines[-1], (fragment, lines[-1])
    assert result.stdout == ""


@pytest.fixture
def tiny_copy(tmp_path):
    """A writable copy of the original tiny checkpoint directory."""
    dst = tmp_path / "tf1-tiny"
    shutil.copytree(TINY, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny checkpoint converted once by the CLI, shared by read-only tests."""
    out = tmp_path_factory.mktemp("converted") / "tiny"
    run_kbert("convert", "from-tf1", TINY, out)
    return out


# Shared exports: each is made once per test process (pytest-xdist worker) and read by many test
# files, which only read them (a test that adds to an export base works on a copy of what it needs).


@pytest.fixture(scope="session")
def tiny_encoder_export(tiny_model_dir, tmp_path_factory):
    """`kbert export` of tiny_model_dir (float32, every default): (EXPORT_BASE, the command's JSON).
    EXPORT_BASE is .../tiny_encoder, holding version 1, models.config and batching_parameters.txt."""
    base = tmp_path_factory.mktemp("encoder-export") / "tiny_encoder"
    result = run_kbert("export", tiny_model_dir, base)
    return base, json.loads(result.stdout)


# The shared classifier's max_seq_length.
CLASSIFIER_LENGTH = 24


@pytest.fixture(scope="session")
def tiny_classifier(tiny_model_dir, tmp_path_factory):
    """A sentiment classifier fine-tuned by `kbert finetune` from tiny_model_dir on 32 sentence
    pairs (so its exports take `text_b`), one epoch of two steps: what it learned is whatever an
    export must reproduce, not a skill. Labels neg/pos, max_seq_length CLASSIFIER_LENGTH."""
    from helpers import sentiment_rows, write_tsv

    work = tmp_path_factory.mktemp("classifier")
    rows = [(text, "the city.", label) for text, label in sentiment_rows(32, 0)]
    train = write_tsv(work / "train.tsv", rows, header=("text", "text_b", "label"))
    run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", train, "--output", work / "model",
        "--epochs", "1", "--batch-size", "16", "--learning-rate", "1e-3", "--max-seq-length", CLASSIFIER_LENGTH,
    )  # fmt: skip
    return work / "model"


@pytest.fixture(scope="session")
def tiny_classifier_export(tiny_classifier, tmp_path_factory):
    """`kbert export` of tiny_classifier, from a copy of its directory deleted right after (an
    export needs nothing of the model directory): (EXPORT_BASE .../sentiment, the command's JSON)."""
    work = tmp_path_factory.mktemp("classifier-export")
    shutil.copytree(tiny_classifier, work / "copy")
    result = run_kbert("export", work / "copy", work / "sentiment")
    shutil.rmtree(work / "copy")
    return work / "sentiment", json.loads(result.stdout)


@pytest.fixture(scope="session")
def tiny_hub_export(tiny_model_dir, tmp_path_factory):
    """tf1-tiny converted, then exported with `kbert export --format tfhub`: (base dir, its JSON).
    base/"tiny" is (a copy of) the model directory, base/"hub" the export."""
    base = tmp_path_factory.mktemp("tfhub")
    shutil.copytree(tiny_model_dir, base / "tiny")
    result = run_kbert("export", base / "tiny", base / "hub", "--format", "tfhub")
    return base, json.loads(result.stdout)
