"""The frame every command runs in (kbert.cli.frame), on the cases a new user found beside the
tested ones: a killed create-data and its workers, quoted globs, binary files given as text,
outputs another user must read, and what an interrupted run leaves behind."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (
    FIXTURES,
    TINY,
    UNCASED_VOCAB,
    assert_user_error,
    kbert_command,
    popen_interruptible,
    run_kbert,
    sigint_state,
)
from kbert.runtime.processes import child_processes

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")


def big_corpus(path: Path, copies: int = 1000) -> Path:
    """sample_text.txt many times over: a create-data run of several seconds on 2 workers."""
    path.write_text((Path(SAMPLE).read_text() + "\n") * copies)
    return path


def start_create_data(tmp_path, out):
    corpus = big_corpus(tmp_path / "corpus.txt")
    return subprocess.Popen(
        kbert_command()
        + [
            "create-data",
            "--input",
            str(corpus),
            "--vocab",
            UNCASED_VOCAB,
            "--output",
            str(out),
            "--workers",
            "2",
            "--dupe-factor",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_workers(process, folder, count=2, timeout=120):
    """The pids of create-data's spawned workers, once they make chunks and the output's
    temporary file exists (other children come and go while Python starts: ldconfig, ...)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = {pid for pid in child_processes(process.pid) if b"spawn_main" in _cmdline(pid)}
        if len(workers) >= count and temporaries(folder):
            time.sleep(1.0)  # let them make chunks
            return workers
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError("create-data started no workers")


def _cmdline(pid) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def temporaries(folder: Path):
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


@pytest.mark.slow
def test_create_data_killed_with_9_takes_its_workers_along_and_the_next_run_sweeps_its_temporaries(tmp_path):
    out = tmp_path / "out.tfrecord"
    process = start_create_data(tmp_path, out)
    workers = wait_for_workers(process, tmp_path)
    process.kill()
    # The caller reading its output does not hang: the workers held its stdout and stderr.
    process.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in workers if os.path.exists(f"/proc/{pid}") and _state(pid) != "Z"] == []
    assert temporaries(tmp_path) != []  # what kill -9 leaves: nothing could remove it
    run_kbert("create-data", "--input", SAMPLE, "--vocab", UNCASED_VOCAB, "--output", out, "--dupe-factor", "1",
              "--workers", "1")  # fmt: skip
    assert temporaries(tmp_path) == []
    assert out.stat().st_size > 0


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_create_data_stops_cleanly_on_sigterm(tmp_path):
    out = tmp_path / "out.tfrecord"
    process = start_create_data(tmp_path, out)
    workers = wait_for_workers(process, tmp_path)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    # Nothing beside the message: tests/pretraining/test_worker_pool.py has the pool race that
    # once added CPython's thread and resource-tracker tracebacks here.
    assert stderr.strip().splitlines() == [
        "kbert: kbert create-data stopped by SIGTERM; its partial outputs were removed, nothing was written"
    ]
    assert stdout == ""
    # Stopped: gone, or a zombie left for init to reap (when the interpreter's shutdown hung and
    # the frame's guard ended the process, its stopped workers are reparented unreaped).
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in workers if os.path.exists(f"/proc/{pid}") and _state(pid) != "Z"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_quoted_glob_and_a_comma_list_name_the_same_files_as_the_shell_would(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = Path(SAMPLE).read_text().split("\n\n")
    for i, part in enumerate(text):
        (corpus / f"part{i}.txt").write_text(part + "\n")
    outputs = {}
    for name, inputs in (
        ("quoted", [str(corpus / "*.txt")]),
        ("comma", [",".join(str(corpus / f"part{i}.txt") for i in range(len(text)))]),
        ("listed", [str(corpus / f"part{i}.txt") for i in range(len(text))]),
    ):
        out = tmp_path / f"{name}.tfrecord"
        result = run_kbert(
            "create-data",
            "--input",
            *inputs,
            "--vocab",
            UNCASED_VOCAB,
            "--output",
            out,
            "--dupe-factor",
            "1",
            "--workers",
            "1",
        )
        outputs[name] = (out.read_bytes(), json.loads(result.stdout)["documents"])
        vocab = tmp_path / f"{name}.vocab.txt"
        run_kbert("vocab", "--input", *inputs, "--output", vocab, "--size", "200")
        outputs[name] += (vocab.read_text(),)
    assert outputs["quoted"] == outputs["comma"] == outputs["listed"]
    assert outputs["quoted"][1] == len(text)


def test_binary_files_given_as_text_are_refused_by_name(tmp_path):
    import tensorflow as tf

    records = tmp_path / "data.tfrecord"
    with tf.io.TFRecordWriter(str(records)) as writer:
        for i in range(200):
            writer.write(
                tf.train.Example(
                    features=tf.train.Features(
                        feature={"ids": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i, i + 128))))}
                    )
                ).SerializeToString()
            )
    elf = tmp_path / "program"
    with open(sys.executable, "rb") as f:
        elf.write_bytes(f.read(17_000))
    for path in (records, elf):
        result = run_kbert(
            "create-data", "--input", path, "--vocab", UNCASED_VOCAB, "--output", tmp_path / "out.tfrecord", check=False
        )
        assert_user_error(result, f"--input {path}: not", "pass text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.tfrecord", "program"]


def _readable_by_nobody(path: Path) -> bool:
    """Whether user nobody, with no capability to bypass permissions, can read `path`."""
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    if path.is_dir():
        return subprocess.run(command + ["ls", str(path)], capture_output=True).returncode == 0
    return subprocess.run(command + ["cat", str(path)], capture_output=True).returncode == 0


@pytest.mark.slow
def test_outputs_are_readable_by_another_user_as_the_umask_says(tiny_model_dir):
    """TF Serving often runs as its own user: an export it cannot read is no export."""
    # Not under pytest's tmp_path: its folders are 0700, which would stop user nobody anyway.
    tmp_path = Path(tempfile.mkdtemp(prefix="kbert-umask-", dir="/tmp"))
    tmp_path.chmod(0o755)
    base = tmp_path / "exports"
    saved = os.umask(0o022)
    try:
        path = Path(json.loads(run_kbert("export", tiny_model_dir, base, "--max-seq-length", "16").stdout)["export"])
        converted = tmp_path / "converted"
        run_kbert("convert", "from-tf1", TINY, converted)
    finally:
        os.umask(saved)
    for root in (base, converted):
        for folder, _directories, files in os.walk(root):
            for entry in [folder] + [os.path.join(folder, f) for f in files]:
                mode = os.stat(entry).st_mode & 0o777
                assert mode & 0o044 == 0o044, (entry, oct(mode))
                assert _readable_by_nobody(Path(entry)), entry
    assert oct(path.stat().st_mode & 0o777) == oct(0o755)
    shutil.rmtree(tmp_path)


@pytest.mark.slow
def test_ctrl_c_during_export_leaves_no_export_base(tmp_path, tiny_model_dir):
    base = tmp_path / "exports"
    process = popen_interruptible(
        kbert_command() + ["export", str(tiny_model_dir), str(base), "--max-seq-length", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not base.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the export ended before the test could interrupt it"
    state = sigint_state(process.pid)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, (state, stderr)
    assert stdout == ""
    assert sorted(os.listdir(tmp_path)) == []


def test_a_next_run_sweeps_what_a_killed_one_left(tmp_path):
    """kill -9 leaves the hidden temporary an output is built in (`kbert export --format tfhub`,
    a conversion: every directory output is built by kbert.runtime.files.atomic_output_dir); the next
    run of the same output removes it, as its pid no longer runs (a live writer's is left alone)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".hub.tmp-{dead.pid}-0123abcd"
    (stale / "encoder").mkdir(parents=True)
    (stale / "encoder" / "saved_model.pb").write_bytes(b"half")
    live = tmp_path / f".hub.tmp-{os.getpid()}-0123abcd"
    live.mkdir()
    run_kbert("convert", "from-tf1", TINY, tmp_path / "hub")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["hub", live.name])


def test_predict_never_writes_over_its_input_or_into_its_model(tmp_path, tiny_model_dir):
    data = tmp_path / "t.tsv"
    data.write_text("text\tlabel\ngold city\tpos\n")
    before = data.read_bytes()
    assert_user_error(
        run_kbert("predict", tiny_model_dir, "--input", data, "--output", data, "--overwrite", check=False),
        f"--output {data}: the output is also an input",
    )
    assert data.read_bytes() == before
    inside = Path(tiny_model_dir) / "predictions.jsonl"
    assert_user_error(
        run_kbert("predict", tiny_model_dir, "--input", data, "--output", inside, check=False), "lies inside the input"
    )
    assert not inside.exists()


def test_flags_a_served_model_cannot_take_are_named_for_what_they_are(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text("gold city\n")
    result = run_kbert(
        "predict", "--server", "localhost:1", "--model", "m", "--input", data, "--layers", "-1", check=False
    )
    assert_user_error(result, "--layers applies to a local model")
    assert "--max-seq-length" not in result.stderr
    result = run_kbert(
        "predict", "--server", "localhost:1", "--model", "m", "--input", data, "--max-seq-length", "8", check=False
    )
    assert_user_error(
        result,
        "--max-seq-length applies to a local model; the served model's export fixed it (`kbert export --max-seq-length`)",
    )


def test_a_stop_that_hangs_while_unwinding_still_exits_in_time(tmp_path):
    """A process pool's shutdown can hang once its workers are stopped (or a loaded machine be
    slow to unwind): after SIGTERM the frame gives the unwinding STOP_SECONDS, then removes the
    temporaries and the lock the unwinding had yet to remove, and exits with the same line and
    status, which stays true."""
    code = (
        "import sys, time, kbert.runtime.processes as p\n"
        "from kbert.runtime.files import temporary_name\n"
        "from kbert.runtime.locks import output_lock\n"
        "p.STOP_SECONDS = 1.0\n"
        "with p.stop_cleanly('kbert create-data'), output_lock(sys.argv[1]):\n"
        "    open(temporary_name(sys.argv[1]), 'w').write('half')\n"
        "    try:\n"
        "        print('ready', flush=True)\n"  # inside the try: the signal may come at once
        "        time.sleep(60)\n"
        "    except BaseException:\n"
        "        time.sleep(60)\n"  # hangs before it removes anything
    )
    out = tmp_path / "out.tfrecord"
    process = subprocess.Popen(
        [sys.executable, "-c", code, out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "ready\n"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143 and time.monotonic() - started < 10
    assert stderr.strip() == (
        "kbert: kbert create-data stopped by SIGTERM; its partial outputs were removed, nothing was written"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_stop_whose_interpreter_shutdown_hangs_still_exits_in_time():
    """After the unwinding, the interpreter's own shutdown can hang (joining a broken process
    pool's threads): STOP_SECONDS later the process exits with the signal's status, without a
    second message."""
    code = (
        "import atexit, sys, time, kbert.runtime.processes as p\n"
        "p.STOP_SECONDS = 1.0\n"
        "atexit.register(time.sleep, 60)\n"  # a shutdown that would hang
        "try:\n"
        "    with p.stop_cleanly('kbert create-data'):\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
        "except BaseException as e:\n"
        "    print(f'kbert: {e}', file=sys.stderr, flush=True)\n"  # as the CLI frame prints it
        "    sys.exit(143)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143 and time.monotonic() - started < 10
    assert stderr.strip().splitlines() == [
        "kbert: kbert create-data stopped by SIGTERM; its partial outputs were removed, nothing was written"
    ]


@pytest.mark.parametrize("number, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_that_lands_in_library_code_still_ends_as_the_stop(number, code):
    """A signal's exception can land inside a library that catches it and raises an error of its
    own with no chain back (gRPC, serializing a request: "Exception serializing request!"), and in
    `Thread.start`, which leaves the thread it was starting to fail on its first line. The command
    still ends as stopped, with the signal's status and no thread's traceback."""
    script = (
        "import _thread, os, signal, sys, time, kbert.runtime.processes as p\n"
        "from kbert.runtime.errors import stop_behind\n"
        "try:\n"
        "    with p.stop_cleanly('kbert predict'):\n"
        "        try:\n"
        f"            os.kill(os.getpid(), {int(number)})\n"
        "            time.sleep(30)\n"
        "        except BaseException:\n"
        "            _thread.start_new_thread(lambda: 1 / 0, ())\n"  # the thread the landing broke
        "            time.sleep(0.5)\n"
        "            raise RuntimeError('Exception serializing request!') from None\n"
        "except Exception as e:\n"  # as kbert.cli.main does
        "    stop = stop_behind(e)\n"
        "    print(f'kbert: {stop or e}', file=sys.stderr)\n"
        "    sys.exit(getattr(stop, 'exit_code', 130) if stop is not None else 1)\n"
    )
    process = popen_interruptible(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr and "ZeroDivisionError" not in stderr
    if number == signal.SIGTERM:
        assert stderr.strip() == (
            "kbert: kbert predict stopped by SIGTERM; its partial outputs were removed, nothing was written"
        )


@pytest.mark.parametrize("number, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_that_python_swallows_is_raised_again(number, code):
    """A signal's exception that lands in a garbage-collector callback (JAX registers one) is
    swallowed by Python ("Exception ignored in ..."): the command would run on to the end as if
    no signal had come. It is raised again, and the command stops."""
    script = (
        "import gc, os, sys, time, kbert.runtime.processes as p\n"
        "from kbert.runtime.errors import Interrupted\n"
        "def callback(phase, info):\n"
        "    if phase == 'start' and not fired:\n"
        "        fired.append(1)\n"
        f"        os.kill(os.getpid(), {int(number)})\n"
        "        time.sleep(0.2)\n"  # the handler runs here, inside the callback
        "fired = []\n"
        "gc.callbacks.append(callback)\n"
        "try:\n"
        "    with p.stop_cleanly('kbert predict'):\n"
        "        gc.collect()\n"
        "        for _ in range(100):\n"
        "            time.sleep(0.01)\n"
        "        print('ran on to the end', flush=True)\n"
        "except Interrupted as e:\n"
        "    sys.exit(e.exit_code)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n"
    )
    process = popen_interruptible(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == code and stdout == "", (stdout, stderr)
    assert "Exception ignored" not in stderr, stderr
