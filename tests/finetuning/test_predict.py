"""Local `kbert predict` and `kbert predict --server` print the same JSON for the same model,
for every task that exports; the multiple-choice task end to end; and an 800-row `kbert
predict --server --output` job whose server is killed and restarted, or which is itself killed
(kill -9) and resumed: every row comes out exactly once.

The server is tests/serving/standin_server.py (the real tensorflow_model_server cannot be installed
here; see tests/serving/test_client.py), serving what `kbert export` wrote.
"""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import assert_user_error, kbert_command, run_kbert
from helpers import (
    FILLER,
    NEGATIVE,
    POSITIVE,
    complete_lines,
    start_standin_server,
    swag_rows,
    write_conll,
    write_swag,
    write_tsv,
)
from kbert.finetuning.output import partial_path

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them


@pytest.fixture(scope="module")
def choice_run(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("choice")
    # 128 questions: 1.0 dev accuracy with seeds 12345, 1 and 2 (64 reached 0.98 to 1.0).
    train, dev = write_swag(work / "train.csv", swag_rows(128, 0)), write_swag(work / "val.csv", swag_rows(64, 1))
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "choice",
        "--train",
        train,
        "--dev",
        dev,
        "--output",
        work / "model",
        "--epochs",
        "4",
        "--batch-size",
        "16",
        "--learning-rate",
        "1e-3",
        "--max-seq-length",
        "16",
    )
    return work, work / "model", json.loads(result.stdout)


def test_choice_learns_predicts_and_evaluates(choice_run):
    work, model, metrics = choice_run
    assert metrics["accuracy"] >= 0.9, metrics
    config = json.load(open(model / "bert_config.json"))
    assert (config["task"], config["kbert_model"], config["max_seq_length"]) == ("choice", "multiple_choice", 16)
    evaluated = json.loads(run_kbert("evaluate", model, "--input", work / "val.csv").stdout)
    assert evaluated["examples"] == 64 and evaluated["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    # SWAG's test.csv has no label column.
    rows = swag_rows(8, 2)
    test = write_swag(work / "test.csv", rows, labels=False)
    predictions = [json.loads(line) for line in run_kbert("predict", model, "--input", test).stdout.splitlines()]
    assert [p["label"] for p in predictions] == [r[4] for r in rows]
    assert all(len(p["probabilities"]) == 4 and abs(sum(p["probabilities"]) - 1) < 1e-4 for p in predictions)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir, choice_run):
    """A tagger, a single-text classifier, a regressor, an encoder and the multiple-choice model,
    each exported by `kbert export` and served by the stand-in server; plus each one's input file.
    The first three are untrained heads (what a head learned does not matter to this comparison),
    saved with the task metadata `kbert finetune` records."""
    import keras

    import kbert

    work = tmp_path_factory.mktemp("served")
    keras.utils.set_random_seed(2)
    base = kbert.load(tiny_model_dir)
    heads = {
        "tagger": (kbert.bert_tagger(base, 3), {"task": "tag", "labels": ["B-LOC", "I-LOC", "O"]}),
        "sentiment": (
            kbert.bert_classifier(base, 2),
            {"task": "classify", "labels": ["neg", "pos"], "text_pairs": False},
        ),
        "similarity": (kbert.bert_classifier(base, 1), {"task": "regress", "text_pairs": False}),
    }
    models = {"choice": choice_run[1], "encoder": tiny_model_dir}
    for name, (model, info) in heads.items():
        model.task_info = dict(info, max_seq_length=16)
        kbert.save(model, work / name)
        models[name] = work / name
    configs = []
    for name, model in models.items():
        pairs = ["--text-pairs"] if name == "encoder" else []
        run_kbert("export", model, work / "exports" / name, "--max-seq-length", "16", *pairs)
        configs.append(work / "exports" / name / "models.config")
    process, ready = start_standin_server(configs, work / "server.log")
    try:
        inputs = {
            # CoNLL words, one of them two WordPieces (cass ##ius) and one past --max-seq-length.
            "tagger": write_conll(
                work / "in.conll", [(["the", "great", "city", "cassius"], ["O"] * 4), (["camp"] * 20, ["O"] * 20)]
            ),
            "sentiment": write_tsv(
                work / "in.tsv", [("gold glorious great.",), ("dead dust the dread.",)], header=("text",)
            ),
            "similarity": write_tsv(work / "in-scores.tsv", [("gold.",), ("dead.",)], header=("text",)),
            "choice": write_swag(work / "in.csv", swag_rows(5, 3), labels=False),
            "encoder": work / "in.txt",
        }
        (work / "in.txt").write_text("gold glorious great.\ndead dust ||| the dread.\n")
        yield {
            "grpc": f"127.0.0.1:{ready['grpc_port']}",
            "rest": f"http://127.0.0.1:{ready['rest_port']}",
            "models": models,
            "inputs": inputs,
        }
    finally:
        process.terminate()
        process.wait(timeout=30)


def assert_same_json(remote, local, where=""):
    """Equal keys, strings, ints and list lengths; floats equal to 1e-5, the agreement the docs
    promise: the server's graph and Keras' predict differ in float32's last bits, and each side
    rounds to 6 digits. Over 2,000 encoder rows of distinct texts the export's pooled outputs
    differ from Keras' by up to 4.8e-6 before rounding (the one-kernel LayerNorm form: 5.8e-6),
    so 5e-6 after rounding was hit by rounding alone."""
    assert type(remote) is type(local), (where, remote, local)
    if isinstance(local, dict):
        assert list(remote) == list(local), (where, remote, local)
        for key in local:
            assert_same_json(remote[key], local[key], f"{where}.{key}")
    elif isinstance(local, list):
        assert len(remote) == len(local), (where, remote, local)
        for i, (r, v) in enumerate(zip(remote, local)):
            assert_same_json(r, v, f"{where}[{i}]")
    elif isinstance(local, float):
        assert abs(remote - local) <= 1e-5, (where, remote, local)
    else:
        assert remote == local, (where, remote, local)


@pytest.mark.parametrize("name", ["tagger", "sentiment", "similarity", "choice", "encoder"])
def test_local_and_server_predict_print_the_same_json(served, name):
    local = run_kbert(
        "predict", served["models"][name], "--input", served["inputs"][name], "--max-seq-length", "16"
    ).stdout
    lines = [json.loads(line) for line in local.splitlines()]
    for protocol in ("grpc", "rest"):
        remote = run_kbert(
            "predict", "--server", served[protocol], "--model", name, "--input", served["inputs"][name]
        ).stdout
        assert_same_json([json.loads(line) for line in remote.splitlines()], lines, protocol)
    if name == "tagger":
        assert lines[0]["words"] == ["the", "great", "city", "cassius"] and len(lines[0]["tags"]) == 4
        assert len(lines[1]["tags"]) == 20  # words cut off by --max-seq-length still get a tag


# === A batch job that rides out a server restart, and one that is killed and resumed ===

ROWS = 800  # past the 200 rows a test waits for before it stops the job or its server, by far
WORDS = POSITIVE + NEGATIVE + FILLER


class RestartableServer:
    """The stand-in in a process of its own, which a test may kill and start again on the same
    ports, as a server restart does."""

    def __init__(self, model_config, log_path):
        self.model_config, self.log_path = model_config, log_path
        self.process, ready = start_standin_server([model_config], log_path)
        self.ports = ready["grpc_port"], ready["rest_port"]
        self.address = {"grpc": f"127.0.0.1:{self.ports[0]}", "rest": f"http://127.0.0.1:{self.ports[1]}"}

    def kill(self):
        self.process.kill()  # SIGKILL: a crash, with no goodbye to the clients
        self.process.wait(timeout=30)

    def start(self):
        self.process, _ = start_standin_server([self.model_config], self.log_path, *self.ports)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def encoder_job(tmp_path_factory, tiny_model_dir):
    """The tiny encoder, exported and served; an 800-line input of distinct texts; and the lines
    an uninterrupted `kbert predict --server` prints for it: all distinct, so a row repeated or
    skipped cannot hide, and each the local model's row to within float rounding."""
    work = tmp_path_factory.mktemp("restart")
    run_kbert("export", tiny_model_dir, work / "exports" / "encoder", "--max-seq-length", "16")
    texts = [" ".join(WORDS[i // len(WORDS) ** k % len(WORDS)] for k in range(3)) + "." for i in range(ROWS)]
    (work / "in.txt").write_text("\n".join(texts) + "\n")
    local = run_kbert("predict", tiny_model_dir, "--input", work / "in.txt", "--max-seq-length", "16").stdout
    server = RestartableServer(work / "exports" / "encoder" / "models.config", work / "server.log")
    try:
        served = run_kbert(
            "predict",
            "--server",
            server.address["grpc"],
            "--model",
            "encoder",
            "--input",
            work / "in.txt",
            "--batch-size",
            "64",
        ).stdout.splitlines()
        assert len(set(served)) == ROWS
        # Row by row the local model's, to 1e-5 (see assert_same_json).
        assert np.abs(pooled(served) - pooled(local.splitlines())).max() <= 1e-5
        yield {"work": work, "input": work / "in.txt", "served": served, "server": server}
    finally:
        server.stop()


def pooled(lines):
    return np.array([json.loads(line)["pooled_output"] for line in lines])


def start_predict(job, protocol, output, *flags):
    """`kbert predict --server ... --output` in a process of its own, two rows per request (many
    requests, so a kill lands in the middle of the job); its stderr goes to a file."""
    stderr = open(f"{output}.stderr", "w")
    args = [
        "predict",
        "--server",
        job["server"].address[protocol],
        "--model",
        "encoder",
        "--input",
        job["input"],
        "--output",
        output,
        "--batch-size",
        "2",
        *flags,
    ]
    env = {k: v for k, v in os.environ.items() if k != "KBERT_DEBUG"}
    process = subprocess.Popen(
        kbert_command() + [str(a) for a in args], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
    )
    stderr.close()
    return process


def wait_for_rows(process, partial, rows, limit=300):
    """Poll until `partial` has `rows` complete lines; fails if the job ends first."""
    deadline = time.monotonic() + limit
    while complete_lines(partial) < rows:
        assert process.poll() is None, f"kbert predict ended before writing {rows} rows: {process.returncode}"
        assert time.monotonic() < deadline, f"no {rows} rows in {partial} within {limit} s"
        time.sleep(0.02)
    return complete_lines(partial)


def rows_accounted(lines, served):
    """How the lines of a job that was interrupted compare with an uninterrupted job's: rows
    duplicated, lost, out of place, and lines that are no row's.

    A line is a row's if its values are that row's to 1e-5 (the agreement of assert_same_json),
    not character for character: the jobs send different batches (two rows a request here, 64
    there), and where TensorFlow runs Eigen's matmuls (CPUs without AVX-512) a row's last float32
    bits depend on the shapes it was computed in. The rows are far apart (distinct texts),
    so no line is within 1e-5 of two rows."""
    reference = pooled(served)

    def values(line):  # a line that is no JSON row (half-written, say) matches nothing
        try:
            row = np.asarray(json.loads(line)["pooled_output"], np.float64)
        except (ValueError, KeyError, TypeError):
            return np.full(reference.shape[1], np.inf)
        return row if row.shape == reference.shape[1:] else np.full(reference.shape[1], np.inf)

    matched = []
    for start in range(0, len(lines), 100):  # [100, rows, H] differences at a time
        part = np.stack([values(line) for line in lines[start : start + 100]])
        distance = np.abs(part[:, None, :] - reference[None, :, :]).max(axis=-1)
        nearest = distance.argmin(axis=1)
        close = distance[np.arange(len(part)), nearest] <= 1e-5
        matched += [int(row) if ok else None for row, ok in zip(nearest, close)]
    found = {m for m in matched if m is not None}
    return {
        "duplicated": sum(m is not None for m in matched) - len(found),
        "lost": len(served) - len(found),
        "out_of_place": sum(m is not None and m != i for i, m in enumerate(matched)),
        "unknown": matched.count(None),
    }


EXACTLY_ONCE = {"duplicated": 0, "lost": 0, "out_of_place": 0, "unknown": 0}


@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_a_job_rides_out_a_server_restart(encoder_job, protocol, tmp_path):
    server, out = encoder_job["server"], tmp_path / "out.jsonl"
    job = start_predict(encoder_job, protocol, out, "--retries", "40", "--timeout", "600")
    try:
        wait_for_rows(job, partial_path(out), 200)
        server.kill()
        at_kill = complete_lines(partial_path(out))
        assert not out.exists() and at_kill < ROWS  # the kill landed mid-job
        time.sleep(1)  # down for a while: the client finds nothing listening
        server.start()
        stdout, _ = job.communicate(timeout=600)
    finally:
        job.kill()
        job.wait()
    stderr = open(f"{out}.stderr").read()
    assert job.returncode == 0, stderr
    assert json.loads(stdout) == {"output": str(out), "rows": ROWS, "rows_kept": 0}
    retried = [line for line in stderr.splitlines() if "unavailable" in line and "retrying in" in line]
    assert retried, stderr
    lines = out.read_text().splitlines()
    accounted = rows_accounted(lines, encoder_job["served"])
    print(
        f"{protocol}: server killed after row {at_kill}; {len(lines)} lines: {accounted}; the waits:",
        *retried,
        sep="\n  ",
    )
    assert len(lines) == ROWS and accounted == EXACTLY_ONCE
    assert not os.path.exists(partial_path(out))


def test_a_killed_job_resumes_without_repeating_or_skipping(encoder_job, tmp_path):
    out = tmp_path / "out.jsonl"
    job = start_predict(encoder_job, "grpc", out)
    try:
        wait_for_rows(job, partial_path(out), 200)
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        job.kill()
        job.wait()
    assert not out.exists()
    written = complete_lines(partial_path(out))
    assert 200 <= written < ROWS
    again = run_kbert(
        "predict",
        "--server",
        encoder_job["server"].address["grpc"],
        "--model",
        "encoder",
        "--input",
        encoder_job["input"],
        "--output",
        out,
        check=False,
    )
    # The killed job's lock is taken over with a notice (kbert.runtime.locks), then the partial is refused.
    assert_user_error(again, "pass --resume to go on from them", alone=False)
    assert again.stderr.startswith(f"kbert: taking over the lock of {out} left by a process that ended")
    result = run_kbert(
        "predict",
        "--server",
        encoder_job["server"].address["grpc"],
        "--model",
        "encoder",
        "--input",
        encoder_job["input"],
        "--output",
        out,
        "--resume",
        "--batch-size",
        "64",
    )
    assert json.loads(result.stdout) == {"output": str(out), "rows": ROWS, "rows_kept": written}
    lines = out.read_text().splitlines()
    accounted = rows_accounted(lines, encoder_job["served"])
    print(f"predict killed after {written} rows; after --resume, {len(lines)} lines: {accounted}")
    assert len(lines) == ROWS and accounted == EXACTLY_ONCE


def test_a_stopped_job_says_once_what_it_kept(encoder_job, tmp_path):
    out = tmp_path / "out.jsonl"
    job = start_predict(encoder_job, "grpc", out)
    try:
        wait_for_rows(job, partial_path(out), 200)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
    finally:
        job.kill()
        job.wait()
    stderr = open(f"{out}.stderr").read()
    written = complete_lines(partial_path(out))
    assert job.returncode == 143 and 200 <= written < ROWS, stderr
    assert [line for line in stderr.splitlines() if "rows" in line or "removed" in line] == [
        f"kbert: kbert predict stopped by SIGTERM; {partial_path(out)} keeps the {written} rows written so far "
        f"({written} by this run): run the same command with --resume to go on from there"
    ]


@pytest.mark.parametrize(
    "protocol, message",
    [
        ("grpc", "NOT_FOUND: Servable not found for request: Latest(nope)"),
        ("rest", "HTTP 404: Servable not found for request: Latest(nope)"),
    ],
)
def test_a_wrong_model_name_fails_at_once(encoder_job, protocol, message, tmp_path):
    out = tmp_path / "out.jsonl"
    result = run_kbert(
        "predict",
        "--server",
        encoder_job["server"].address[protocol],
        "--model",
        "nope",
        "--input",
        encoder_job["input"],
        "--output",
        out,
        check=False,
    )
    assert_user_error(result, message)  # one line: no retries
    assert os.listdir(tmp_path) == []


def test_giving_up_when_nothing_listens(encoder_job, tmp_path):
    out = tmp_path / "out.jsonl"
    args = [
        "predict",
        "--server",
        "127.0.0.1:1",
        "--model",
        "encoder",
        "--input",
        encoder_job["input"],
        "--output",
        out,
    ]
    by_count = run_kbert(*args, "--retries", "3", check=False)
    assert_user_error(
        by_count,
        "cannot reach TF Serving at 127.0.0.1:1",
        "(after 3 retries in ",
        "allow more time (retries, timeout; kbert predict --retries, --timeout)",
        alone=False,
    )
    waits = by_count.stderr.splitlines()[:-1]
    assert [w.rsplit("(", 1)[1] for w in waits] == ["1/3)", "2/3)", "3/3)"], by_count.stderr
    assert all(w.startswith("kbert: TF Serving at 127.0.0.1:1 unavailable (") for w in waits)
    # The deadline ends it long before 1,000 retries.
    by_deadline = run_kbert(*args, "--retries", "1000", "--timeout", "2", check=False)
    assert_user_error(by_deadline, "cannot reach TF Serving at 127.0.0.1:1", alone=False)
    assert 1 <= len(by_deadline.stderr.splitlines()) - 1 < 1000
    assert os.listdir(tmp_path) == []


def test_resuming_the_output_of_another_input_is_refused(encoder_job, tmp_path):
    out = tmp_path / "out.jsonl"
    partial = partial_path(out)
    open(partial, "w").write("{}\n" * (ROWS + 1))
    result = run_kbert(
        "predict",
        "--server",
        encoder_job["server"].address["rest"],
        "--model",
        "encoder",
        "--input",
        encoder_job["input"],
        "--output",
        out,
        "--resume",
        check=False,
    )
    assert_user_error(
        result,
        f"already has {ROWS + 1} rows, but the input has only {ROWS} examples",
        "pass --overwrite to start again",
        alone=False,
    )
    assert open(partial).read() == "{}\n" * (ROWS + 1) and not out.exists()
