"""A full disk, a permission, a signal, an empty file, records of another vocabulary: each is one
line naming the path and the cause (exit 1), or the exit status a shell expects, and nothing is
left half-written.

A full disk is a real one: a small tmpfs mounted for the test (root only; skipped elsewhere).
A permission is real too: the command runs without root's DAC override (setpriv).
"""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import TINY, UNCASED_VOCAB, assert_user_error, kbert_command, popen_interruptible, run_kbert

SAMPLE = os.path.join(os.path.dirname(TINY), "sample_text.txt")
VOCAB = os.path.join(TINY, "vocab.txt")
SHAPE = ["--max-seq-length", "32", "--max-predictions-per-seq", "5"]
FULL = "no space left on device"


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(kib): a real file system of that size (a tmpfs), unmounted after the test."""
    mounted = []

    def mount(kib: int) -> Path:
        folder = tmp_path / f"disk-{len(mounted)}"
        folder.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(folder)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): a full disk needs root")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Pretraining records of sample_text.txt with the tiny model's vocabulary, and with the real uncased one."""
    folder = tmp_path_factory.mktemp("records")
    for name, vocab in (("tiny.tfrecord", VOCAB), ("uncased.tfrecord", UNCASED_VOCAB)):
        run_kbert(
            "create-data", "--input", SAMPLE, "--vocab", vocab, "--output", folder / name, *SHAPE, "--dupe-factor", "2",
            "--workers", "1",
        )  # fmt: skip
    return folder


def pretrain(model_dir, data, *extra, own_process=None):
    start = [] if "--resume" in extra else ["--config", os.path.join(TINY, "bert_config.json"), "--vocab", VOCAB]
    return run_kbert(
        "pretrain", "--model-dir", model_dir, "--data", data, *start, *SHAPE, "--batch-size", "8", *extra,
        check=False, own_process=own_process,
    )  # fmt: skip


def everything(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- a full disk ---


def test_a_model_directory_on_a_full_disk_is_one_line_and_nothing_is_left(small_disk):
    disk = small_disk(200)  # room for bert_config.json and vocab.txt, not for the weights
    # Its own process: h5py crashes the process when the disk fills while it writes.
    result = run_kbert("convert", "from-tf1", TINY, disk / "tiny", "--lowercase", check=False, own_process=True)
    assert_user_error(result, f"{disk / 'tiny'}: {FULL} for model.weights.h5 (it needs at least")
    assert result.returncode == 1
    assert everything(disk) == []  # no temporary directory, no lock


def test_a_write_that_names_no_file_names_the_output(small_disk, tiny_model_dir):
    disk = small_disk(200)
    result = run_kbert("convert", "to-hf", tiny_model_dir, disk / "hf", check=False)
    assert_user_error(result, f"{disk / 'hf'}: {FULL}; free some space")
    assert result.returncode == 1 and everything(disk) == []


def test_create_data_shards_on_a_full_disk_leave_no_temporaries(small_disk):
    disk = small_disk(8)
    result = run_kbert(
        "create-data", "--input", SAMPLE, "--vocab", VOCAB, "--output", disk / "data.tfrecord", *SHAPE, "--shards", "2",
        "--workers", "1", check=False,
    )  # fmt: skip
    assert_user_error(result, f"{disk / 'data.tfrecord'}: {FULL}")
    assert result.returncode == 1 and everything(disk) == []


def test_pretraining_whose_first_checkpoint_does_not_fit(small_disk, records):
    disk = small_disk(1024)  # a checkpoint of the tiny model with Adam's slots takes more
    result = pretrain(disk / "run", records / "tiny.tfrecord", "--steps", "2", "--save-every", "2")
    assert_user_error(
        result, f"writing the checkpoint for step 2 failed: {disk / 'run' / 'checkpoints'}: {FULL}", alone=False
    )
    assert "no checkpoint was saved" in result.stderr and "previous checkpoint" not in result.stderr
    assert result.returncode == 1 and everything(disk) == []  # a new run leaves no directory behind


def test_pretraining_whose_model_file_does_not_fit_keeps_its_checkpoint(small_disk, records):
    disk = small_disk(1500)  # the one checkpoint fits; the weights file beside it does not
    result = pretrain(disk / "run", records / "tiny.tfrecord", "--steps", "2", "--save-every", "2", own_process=True)
    assert_user_error(result, f"{disk / 'run'}: {FULL} for model.weights.h5", alone=False)
    assert result.returncode == 1
    left = everything(disk / "run")
    assert "checkpoints/ckpt-2.index" in left and not [p for p in left if "tmp" in p or "weights" in p], left
    # Space freed, --resume writes what the trained run lacked, without training again.
    subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
    resumed = pretrain(disk / "run", records / "tiny.tfrecord", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["step"] == 2 and "model.weights.h5" in everything(disk / "run")


# --- permissions ---

WITHOUT_DAC_OVERRIDE = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
    "--",
]


def run_without_dac_override(*args):
    env = {k: v for k, v in os.environ.items() if k != "KBERT_DEBUG"}
    return subprocess.run(
        WITHOUT_DAC_OVERRIDE + kbert_command() + [str(a) for a in args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("name", ["model.weights.h5", "vocab.txt"])
def test_an_unreadable_model_file_is_a_permission_not_damage(tmp_path, tiny_model_dir, name):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / name).chmod(0o000)
    result = run_without_dac_override("fill-mask", model, "the [MASK] is here.")
    assert_user_error(result, f"{model / name}: permission denied; give this user access to it")
    assert result.returncode == 1 and "damaged" not in result.stderr


@pytest.mark.parametrize("command", ["from-tf1", "inspect"])
def test_an_unreadable_checkpoint_is_a_permission_not_damage(tmp_path, command):
    source = tmp_path / "tf1"
    shutil.copytree(TINY, source)
    (source / "bert_model.ckpt.data-00000-of-00001").chmod(0o000)
    out = [tmp_path / "out"] if command == "from-tf1" else []
    result = run_without_dac_override("convert", command, source, *out)
    assert_user_error(result, f"{source / 'bert_model.ckpt.data-00000-of-00001'}: permission denied")
    assert result.returncode == 1 and "damaged" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "out").exists()


# --- records, empty files, metrics ---


def test_records_of_another_vocabulary_are_refused_before_training(tmp_path, records):
    # The uncased vocabulary's ids run to 30,521; the tiny model has 300 words.
    result = pretrain(tmp_path / "run", records / "uncased.tfrecord", "--steps", "2")
    assert_user_error(
        result, f"{records / 'uncased.tfrecord'}: record 1 holds token id", "outside the model's vocabulary of 300"
    )
    assert result.returncode == 1 and not (tmp_path / "run").exists()


def test_an_empty_file_among_inputs_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    one = ("--workers", "1")  # in this process: the output is the same for any number of workers
    run_kbert("create-data", "--input", SAMPLE, "--vocab", VOCAB, "--output", tmp_path / "alone.tfrecord", *one)
    mixed = run_kbert(
        "create-data", "--input", f"{SAMPLE},{tmp_path / 'empty.txt'}", "--vocab", VOCAB,
        "--output", tmp_path / "mixed.tfrecord", *one,
    )  # fmt: skip
    assert f"--input {tmp_path / 'empty.txt'}: the file is empty; skipped" in mixed.stderr
    assert (tmp_path / "mixed.tfrecord").read_bytes() == (tmp_path / "alone.tfrecord").read_bytes()
    # All of them empty: still refused.
    only = run_kbert(
        "create-data", "--input", tmp_path / "empty.txt", "--vocab", VOCAB, "--output", tmp_path / "none.tfrecord", *one,
        check=False,
    )  # fmt: skip
    assert_user_error(only, "the file is empty")


def test_a_resumed_pretraining_logs_each_step_once(tmp_path, records):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(records / "tiny.tfrecord", data / "a.tfrecord")
    (data / "b.tfrecord").write_bytes(b"")  # an empty file in the glob is skipped, not fatal
    out = tmp_path / "run"
    result = pretrain(out, f"{data}/*.tfrecord", "--steps", "2", "--save-every", "2")
    assert result.returncode == 0, result.stderr
    assert f"--data {data / 'b.tfrecord'}: the file is empty; skipped" in result.stderr
    # A run killed after logging steps past its last checkpoint (3 and 4, the last cut short).
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "loss": 1.0}) + "\n" + json.dumps({"step": 4, "loss": 1.0})[:9])
    result = pretrain(out, f"{data}/*.tfrecord", "--steps", "4", "--save-every", "2", "--resume")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [row["step"] for row in rows] == [2, 4]
    assert rows[1]["loss"] == pytest.approx(json.loads(result.stdout)["loss"])


# --- signals to a Beam job ---


@pytest.mark.slow
@pytest.mark.parametrize("stop,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "sigint"])
def test_a_signal_to_a_direct_runner_job_exits_as_the_local_path(tmp_path, stop, code):
    """The signal to kbert's own process only (`kill PID`, a scheduler's SIGTERM), not its group."""
    big = tmp_path / "big.txt"
    big.write_text((Path(SAMPLE).read_text(encoding="utf-8") + "\n") * 400, encoding="utf-8")
    out = tmp_path / "out" / "data.tfrecord"
    process = popen_interruptible(
        kbert_command()
        + ["create-data", "--input", str(big), "--vocab", UNCASED_VOCAB, "--output", str(out)]
        + ["--dupe-factor", "10", "--runner", "DirectRunner"]
        + ["--pipeline-options", "--direct_num_workers=2 --direct_running_mode=multi_processing"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("out/kbert-temp-*/*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, "the job ended before it could be stopped; make the corpus bigger"
    os.kill(process.pid, stop)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == code, stderr.decode()[-2000:]
    assert stdout == b"" and "Traceback" not in stderr.decode()
    assert everything(tmp_path / "out") == []  # nothing half-written, no staging folder
