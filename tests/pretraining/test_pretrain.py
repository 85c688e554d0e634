"""`kbert pretrain` end to end on records made by google-research's own create_pretraining_data.py."""

import dataclasses
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import TINY, assert_user_error, run_kbert
from kbert.cli.pretrain import pretrain_command
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.train import pretrain
from kbert.runtime.errors import KbertError, command_line_names

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

SAMPLE = os.path.join(os.path.dirname(TINY), "sample_text.txt")
VOCAB = os.path.join(TINY, "vocab.txt")
SHAPE = ["--max-seq-length", "32", "--max-predictions-per-seq", "5"]


@pytest.fixture(scope="module")
def original_records(tmp_path_factory):
    """Records written by the original script (PyPI bert-tensorflow 1.0.4) from sample_text.txt."""
    out = tmp_path_factory.mktemp("records") / "original.tfrecord"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert.create_pretraining_data",
            f"--input_file={SAMPLE}",
            f"--output_file={out}",
            f"--vocab_file={VOCAB}",
            "--do_lower_case=True",
            "--max_seq_length=32",
            "--max_predictions_per_seq=5",
            "--dupe_factor=5",
            "--random_seed=7",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def no_dropout_init(tmp_path_factory, tiny_model_dir):
    """The converted original checkpoint with dropout off, as a --init starting point."""
    path = tmp_path_factory.mktemp("init") / "tiny"
    shutil.copytree(tiny_model_dir, path)
    config = json.load(open(path / "bert_config.json"))
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (path / "bert_config.json").write_text(json.dumps(config))
    return path


def _pretrain(model_dir, records, *extra, check=True, env=None, config=None):
    start = (
        []
        if "--resume" in extra or "--init" in extra
        else ["--config", config or os.path.join(TINY, "bert_config.json"), "--vocab", VOCAB]
    )
    return run_kbert(
        "pretrain",
        "--model-dir",
        model_dir,
        "--data",
        records,
        *start,
        *SHAPE,
        "--batch-size",
        "8",
        *extra,
        check=check,
        env=env,
    )


def test_every_pretrain_option_is_a_flag_with_the_same_default():
    """cli/pretrain.py hands its flags to PretrainOptions by name, so the two lists must match."""
    flags = {
        # A typer.Option's default, or the plain default of a shared Annotated option (kbert.cli.options).
        name: getattr(parameter.default, "default", parameter.default)
        for name, parameter in inspect.signature(pretrain_command).parameters.items()
        if name != "ctx"
    }
    fields = {field.name: field.default for field in dataclasses.fields(PretrainOptions)}
    # Where the model and data are: pretrain()'s own arguments, not options.
    assert flags.keys() - fields.keys() == {"model_dir", "data", "config", "vocab", "init", "lowercase"}
    # For Python callers only: the command always shows progress.
    assert fields.keys() - flags.keys() == {"progress"}
    assert {name: flags[name] for name in fields if name in flags} == {
        name: default for name, default in fields.items() if name in flags
    }


def test_pretrain_then_resume(tmp_path, original_records):
    out = tmp_path / "bert"
    result = _pretrain(
        out,
        original_records,
        "--steps",
        "20",
        "--save-every",
        "10",
        "--learning-rate",
        "1e-3",
        "--eval-data",
        original_records,
        "--eval-steps",
        "2",
    )
    metrics = json.loads(result.stdout)
    for key in ("step", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "sequences_per_second"):
        assert key in metrics
    assert metrics["step"] == 20 and metrics["sequences_per_second"] > 0
    assert metrics["loss"] == pytest.approx(metrics["mlm_loss"] + metrics["nsp_loss"], rel=1e-5)
    assert set(metrics["eval"]) == {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"}
    for name in ("bert_config.json", "vocab.txt", "model.weights.h5", "loss.png", "metrics.jsonl"):
        assert (out / name).is_file(), name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "logs" / "train").iterdir())
    history = [json.loads(line) for line in open(out / "metrics.jsonl") if '"split"' not in line]
    assert history[-1]["loss"] < history[0]["loss"]  # it learns

    result = _pretrain(out, original_records, "--steps", "30", "--save-every", "10", "--resume")
    assert "resumed from step 20" in result.stderr
    assert "--steps 30 extends the run from 20 steps" in result.stderr
    assert json.load(open(out / "pretrain_run.json"))["options"]["steps"] == 30  # a bare --resume goes on to 30
    assert json.loads(result.stdout)["step"] == 30 and json.loads(result.stdout)["resumed_from"] == 20
    # The result is a model directory the other commands accept.
    assert json.loads(run_kbert("convert", "inspect", out).stdout)["heads"] == {
        "masked_lm": "trained",
        "next_sentence": "trained",
        "pooler": "trained",
    }
    run_kbert("convert", "to-tf1", out, tmp_path / "tf1")
    fill = json.loads(run_kbert("fill-mask", out, "the [MASK] is here.", "--top-k", "3").stdout)
    assert len(fill["masks"]) == 1 and len(fill["masks"][0]["predictions"]) == 3


def test_refuses_to_overwrite_a_run_and_to_resume_it_with_other_flags(tmp_path, original_records):
    out = tmp_path / "bert"
    _pretrain(out, original_records, "--steps", "2", "--save-every", "2", "--mixed-precision")
    # "auto" is recorded as the type it meant here, so a resume on another machine computes alike.
    recorded = json.load(open(out / "pretrain_run.json"))["options"]
    assert (recorded["mixed_precision"], recorded["mixed_precision_dtype"]) == (True, "bfloat16")
    assert_user_error(
        _pretrain(out, original_records, "--resume", "--steps", "4", "--mixed-precision-dtype", "float16", check=False),
        "was started with --mixed-precision-dtype bfloat16, not float16",
    )
    assert_user_error(_pretrain(out, original_records, "--steps", "4", check=False), "--resume")
    assert_user_error(
        _pretrain(out, original_records, "--resume", "--steps", "4", "--batch-size", "16", check=False),
        f"--resume: the run in {out} was started with --batch-size 8, not 16; leave --batch-size out "
        f"to continue it as it was, or start another run in a new --model-dir",
    )
    assert_user_error(
        _pretrain(out, original_records, "--resume", "--steps", "1", check=False),
        "started with --steps 2, not 1",
        "give more than 2",
    )
    other = tmp_path / "other.tfrecord"
    shutil.copyfile(original_records, other)
    assert_user_error(
        _pretrain(out, other, "--resume", "--steps", "4", check=False),
        f"started with --data {original_records} (1 file), not {other} (1 file, other names or sizes)",
    )
    # --data is the recorded one; a run that reached its --steps says how to go further.
    assert_user_error(
        run_kbert("pretrain", "--model-dir", out, "--resume", check=False),
        "already at step 2 of --steps 2; raise --steps",
        alone=False,
    )
    assert_user_error(
        run_kbert(
            "pretrain",
            "--model-dir",
            tmp_path / "new",
            "--config",
            os.path.join(TINY, "bert_config.json"),
            "--vocab",
            VOCAB,
            check=False,
        ),
        "--data is required",
    )
    assert not (tmp_path / "new").exists()


def test_mirrored_over_two_cpus_equals_one_device(tmp_path, original_records, no_dropout_init):
    """The global batch is split over replicas and gradients summed: from the same weights and
    without dropout, the two runs must end with the same weights."""
    single, mirrored = tmp_path / "single", tmp_path / "mirrored"
    common = (
        "--init",
        no_dropout_init,
        "--steps",
        "6",
        "--save-every",
        "6",
        "--learning-rate",
        "1e-3",
        "--warmup-steps",
        "0",
    )
    first = json.loads(_pretrain(single, original_records, *common, "--strategy", "cpu").stdout)
    result = _pretrain(mirrored, original_records, *common, "--strategy", "mirrored", env={"KBERT_LOGICAL_CPUS": "2"})
    assert json.loads(result.stdout)["replicas"] == 2
    a, b = _weights(single), _weights(mirrored)
    assert a.keys() == b.keys()
    start = _weights(no_dropout_init)
    assert max(float(np.abs(a[k] - start[k]).max()) for k in a) > 1e-3  # training moved the weights
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=2e-5, err_msg=key)
    assert json.loads(result.stdout)["loss"] == pytest.approx(first["loss"], abs=1e-4)


def _weights(model_dir):
    out = {}
    with h5py.File(model_dir / "model.weights.h5", "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def free_ports(n: int) -> list:
    """`n` distinct ports free on 127.0.0.1: all held at once while they are picked, so that two
    workers of one cluster are never handed the same port (which hangs both)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def worker_envs(n: int) -> list:
    """The environments of `n` workers of one multi-worker cluster on new ports of 127.0.0.1."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(n)]}
    return [
        dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        for index in range(n)
    ]


# What a worker says when its port was taken between free_ports and its own bind, seconds later
# (by any process on the machine: an outgoing connection is given a free port too).
PORT_TAKEN = "Could not start gRPC server"


def wait_for_workers(processes, timeout=300, expected=(0,)) -> list:
    """Each worker's (exit status, stdout, stderr), its output read from the files `start_worker`
    gives it. The first worker to fail (an exit status not `expected`) ends the others: its peers
    would wait for it until `timeout`."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes):
        if any(p.poll() not in (None, *expected) for p in processes) or time.monotonic() > deadline:
            for p in processes:
                p.kill()
                p.wait()
            break
        time.sleep(0.1)
    results = []
    for p in processes:
        p.out.seek(0), p.err.seek(0)
        results.append((p.returncode, p.out.read(), p.err.read()))
    return results


def start_worker(command, env, logs) -> subprocess.Popen:
    """`command` as one worker, its stdout and stderr written to files in `logs` (no pipe fills up
    while the workers are waited for together)."""
    out, err = (open(os.path.join(logs, f"{time.monotonic_ns()}.{name}"), "w+") for name in ("out", "err"))
    process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
    process.out, process.err = out, err
    return process


class PortTaken(Exception):
    """A worker's port was taken before it could bind it: its cluster can start again on new ports."""


def check_ports(results) -> list:
    """`wait_for_workers`' results, unless a worker found its port taken (PortTaken)."""
    if any(PORT_TAKEN in err for _, _, err in results):
        raise PortTaken([err[-500:] for _, _, err in results])
    return results


def run_workers(commands, logs, attempts=3) -> list:
    """`commands` run as the workers of one cluster, to their end: `wait_for_workers`' results. A
    cluster one of whose workers found its port taken starts again, on new ports."""
    for attempt in range(attempts):
        processes = [start_worker(c, env, logs) for c, env in zip(commands, worker_envs(len(commands)))]
        try:
            return check_ports(wait_for_workers(processes))
        except PortTaken:
            if attempt + 1 == attempts:
                raise


WORKER = """
import json, os, sys
import numpy as np
from kbert.pretraining.train import pretrain
result, model = pretrain(sys.argv[1], sys.argv[2], config_file=sys.argv[3], vocab_file=sys.argv[4],
                         max_seq_length=32, max_predictions_per_seq=5, steps=6, batch_size=8, save_every=3,
                         strategy="multi-worker", progress=False, return_model=True)
np.savez(sys.argv[5], *[w.numpy() for w in model.weights])
print(json.dumps(result))
"""


def test_multi_worker_two_processes_end_identical(tmp_path, original_records):
    config = os.path.join(TINY, "bert_config.json")
    commands = [
        [sys.executable, "-c", WORKER, tmp_path / "bert", original_records, config, VOCAB, tmp_path / f"worker{i}.npz"]
        for i in range(2)
    ]
    outputs = run_workers([[str(a) for a in c] for c in commands], tmp_path)
    for code, _, err in outputs:
        assert code == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs]
    assert [r["replicas"] for r in results] == [2, 2] and [r["step"] for r in results] == [6, 6]
    first, second = np.load(tmp_path / "worker0.npz"), np.load(tmp_path / "worker1.npz")
    assert len(first.files) == 46
    for key in first.files:
        np.testing.assert_array_equal(first[key], second[key])
    # Only the chief (worker 0) writes the model directory.
    assert (tmp_path / "bert" / "model.weights.h5").is_file()


def test_tpu_without_a_tpu_is_a_clear_error(tmp_path, original_records):
    # A TPU address on 127.0.0.1 where nothing listens: the TPUClusterResolver is built and the
    # worker probed (tests send traffic only to 127.0.0.1, so no TPU name lookup here).
    address = f"grpc://127.0.0.1:{free_ports(1)[0]}"
    result = _pretrain(
        tmp_path / "bert", original_records, "--steps", "2", "--strategy", "tpu", "--tpu", address, check=False
    )
    assert_user_error(result, f"no TPU reachable at '{address}'", "--tpu NAME")


def test_missing_and_corrupt_data(tmp_path, original_records):
    assert_user_error(
        _pretrain(tmp_path / "a", tmp_path / "none-*.tfrecord", "--steps", "2", check=False),
        "none-*.tfrecord: no file matches; ",
        "; pass TFRecord files",
    )
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(b"\x00garbage" * 100)
    assert_user_error(_pretrain(tmp_path / "b", bad, "--steps", "2", check=False), str(bad), "not a TFRecord file")
    assert not (tmp_path / "b").exists()


def test_a_glob_that_matches_nothing_names_the_files_beside_it(tmp_path, monkeypatch):
    """create-data --shards 4 writes train.tfrecord-0000i-of-00004: a --data 'data/*.tfrecord' is
    answered with what data/ holds, so the user sees the names to write a glob for."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for i in range(4):
        (tmp_path / "data" / f"train.tfrecord-{i:05d}-of-00004").write_bytes(b"")
    result = _pretrain(tmp_path / "run", "data/*.tfrecord", "--steps", "2", check=False)
    assert_user_error(
        result,
        "--data data/*.tfrecord: no file matches; data/ holds train.tfrecord-00000-of-00004, "
        "train.tfrecord-00001-of-00004, train.tfrecord-00002-of-00004 and 1 more; pass TFRecord files",
    )
    assert not (tmp_path / "run").exists()


def test_an_unquoted_glob_is_answered_with_how_to_quote_it(tmp_path, monkeypatch):
    """The shell expands `--data data/*.tfrecord` into several words; the line says to quote it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for i in range(2):
        (tmp_path / "data" / f"train.tfrecord-{i:05d}-of-00002").write_bytes(b"")
    shards = ["data/train.tfrecord-00000-of-00002", "data/train.tfrecord-00001-of-00002"]
    result = run_kbert("pretrain", "--model-dir", "run", "--data", *shards, "--init", TINY, check=False)
    assert_user_error(
        result,
        f"--data takes one value, and the shell passed it 2 files ({' '.join(shards)}): quote the glob, "
        "--data 'data/train.tfrecord-0000*', so that kbert expands it, or join the files with commas",
    )
    assert not (tmp_path / "run").exists()


def test_a_new_model_whose_config_does_not_fit_its_vocabulary(tmp_path, original_records):
    """From scratch, bert_config.json is the user's to match to vocab.txt: the line says the number."""
    config = json.loads(open(os.path.join(TINY, "bert_config.json")).read())
    (tmp_path / "bert_config.json").write_text(json.dumps(dict(config, vocab_size=512)))
    result = _pretrain(
        tmp_path / "other", original_records, "--steps", "2", check=False, config=tmp_path / "bert_config.json"
    )
    assert_user_error(
        result, f"has 300 entries but {tmp_path / 'bert_config.json'} says vocab_size 512", "set it to 300 in"
    )
    assert not (tmp_path / "other").exists()


def test_lengths_that_differ_from_the_flags(tmp_path, original_records):
    result = run_kbert(
        "pretrain",
        "--model-dir",
        tmp_path / "c",
        "--data",
        original_records,
        "--config",
        os.path.join(TINY, "bert_config.json"),
        "--vocab",
        VOCAB,
        "--max-seq-length",
        "64",
        "--steps",
        "2",
        check=False,
    )
    assert_user_error(
        result, "max_seq_length 32 and max_predictions_per_seq 5", "--max-seq-length 32 --max-predictions-per-seq 5"
    )


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, original_records):
    diverging = ("--steps", "40", "--learning-rate", "1e12", "--warmup-steps", "0")
    out = tmp_path / "bert"
    result = _pretrain(out, original_records, *diverging, "--save-every", "1", check=False)
    assert_user_error(
        result, "the loss became nan between steps 1 and 2", "last good checkpoint (step 1) is kept", alone=False
    )
    assert sorted(p.name for p in (out / "checkpoints").glob("*.index")) == ["ckpt-1.index"]
    # Diverged before its first checkpoint: a new run leaves nothing behind.
    result = _pretrain(tmp_path / "early", original_records, *diverging, "--save-every", "4", check=False)
    assert_user_error(result, "the loss became nan between steps 0 and 4", "no checkpoint was saved", alone=False)
    assert not (tmp_path / "early").exists()


def test_fill_mask_bad_input(tmp_path, tiny_model_dir):
    assert_user_error(run_kbert("fill-mask", tiny_model_dir, "no mask here", check=False), "has no [MASK]")
    assert_user_error(run_kbert("fill-mask", tmp_path / "nope", "a [MASK].", check=False), "no such model directory")
    assert_user_error(
        run_kbert("fill-mask", tiny_model_dir, "a [MASK].", "--top-k", "0", check=False),
        "Invalid value for '--top-k'",
        "greater than or equal to 1",
    )


def test_init_with_config_or_vocab_is_refused(tmp_path, tiny_model_dir, original_records):
    """--init brings its model's config and vocabulary: a --config or --vocab beside it would be
    ignored (and recorded as used), so the pair is refused before anything is written."""
    config = os.path.join(TINY, "bert_config.json")
    for given, said in [
        (["--config", config, "--vocab", VOCAB], f"--config {config} and --vocab {VOCAB} and --init {tiny_model_dir}"),
        (["--vocab", VOCAB], f"--vocab {VOCAB} and --init {tiny_model_dir}"),
    ]:
        args = ["--model-dir", tmp_path / "run", "--data", original_records, "--init", tiny_model_dir, *given]
        result = run_kbert("pretrain", *args, "--steps", "1", check=False)
        assert_user_error(
            result,
            f"{said}: a run starts from scratch (--config, --vocab) or continues from a model (--init), which brings "
            "its own config and vocabulary; drop one",
        )
        assert not (tmp_path / "run").exists()


def test_python_callers_read_their_own_argument_names(tmp_path):
    # pretrain() from Python names its keyword arguments; the same check under the `kbert pretrain`
    # command names its flags, as the CLI's tests read them.
    start = dict(config_file=os.path.join(TINY, "bert_config.json"), vocab_file=VOCAB, strategy="cpu")
    too_long = "{} exceeds max_position_embeddings 64 of the model; lower it"
    with pytest.raises(KbertError) as raised:
        pretrain(tmp_path / "a", str(tmp_path / "none.tfrecord"), max_seq_length=600, **start)
    assert str(raised.value) == too_long.format("max_seq_length=600")
    with command_line_names({"--max-seq-length"}), pytest.raises(KbertError) as raised:
        pretrain(tmp_path / "a", str(tmp_path / "none.tfrecord"), max_seq_length=600, **start)
    assert str(raised.value) == too_long.format("--max-seq-length 600")
    with pytest.raises(KbertError, match=r"^data is required: the TFRecords"):
        pretrain(tmp_path / "b", **start)
    with pytest.raises(KbertError) as raised:
        pretrain(tmp_path / "c", str(tmp_path / "none.tfrecord"), strategy="cpu")
    assert str(raised.value) == (
        "say where the model starts: config_file='bert_config.json' vocab_file='vocab.txt' (from scratch), "
        "init='MODEL_DIR' (continue), or resume=True"
    )
    with pytest.raises(KbertError, match=r"^learning_rate must be positive, got -1"):
        pretrain(tmp_path / "d", str(tmp_path / "none.tfrecord"), learning_rate=-1, **start)
