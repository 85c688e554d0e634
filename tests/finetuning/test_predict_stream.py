"""Local `kbert predict --output` writes each chunk of rows as it is done: a run killed (kill -9),
stopped (SIGTERM) or interrupted (Ctrl-C) keeps every finished row, says so, and `--resume`
goes on without repeating or losing one (and refuses to append another model's rows, or rows of
other options), for an encoder and for a `--long-text windows`
classifier. And the smaller promises of `kbert predict`: rows that name their input line with
--skip-bad-rows, labels the model never saw, an encoder's TSV header, streams and symbolic links
as --output.
"""

import json
import os
import shutil
import signal
import subprocess
import threading

import numpy as np
import pytest

from conftest import assert_user_error, kbert_command, popen_interruptible, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, stop_mid_run, write_tsv
from kbert.finetuning.output import partial_path

WORDS = FILLER + POSITIVE + NEGATIVE


def distinct_texts(n, seed=0):
    """n distinct texts of the tiny vocabulary's words (the index written in words), so that a row
    repeated, lost or out of place shows."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        digits = [WORDS[(i // len(WORDS) ** k) % len(WORDS)] for k in range(3)]
        texts.append(" ".join(digits + list(rng.choice(FILLER, size=int(rng.integers(0, 6))))) + ".")
    return texts


def start_predict(model, source, output, *flags, interruptible=False):
    args = kbert_command() + [str(a) for a in ("predict", model, "--input", source, "--output", output, *flags)]
    env = {k: v for k, v in os.environ.items() if k != "KBERT_DEBUG"}
    start = popen_interruptible if interruptible else subprocess.Popen
    return start(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def assert_same_rows(resumed_path, full_path, key):
    """Row for row the uninterrupted run's values, to 1e-5 (a resumed run's batches are other
    rows, and a row's last float32 bits may depend on its batch's shape)."""
    resumed = [json.loads(line) for line in open(resumed_path)]
    full = [json.loads(line) for line in open(full_path)]
    assert len(resumed) == len(full)
    a = np.array([key(row) for row in resumed], np.float64)
    b = np.array([key(row) for row in full], np.float64)
    assert np.abs(a - b).max() <= 1e-5


@pytest.fixture(scope="module")
def encoder_input(tmp_path_factory, tiny_model_dir):
    """A 12,000-line input and the rows an uninterrupted local run writes for it."""
    work = tmp_path_factory.mktemp("stream")
    source = work / "in.txt"
    source.write_text("\n".join(distinct_texts(12_000)) + "\n")
    full = work / "full.jsonl"
    run_kbert("predict", tiny_model_dir, "--input", source, "--output", full, "--max-seq-length", "16")
    return source, full


def pooled(row):
    return row["pooled_output"]


@pytest.mark.slow
def test_a_killed_local_run_keeps_its_rows_and_resumes(tiny_model_dir, encoder_input, tmp_path):
    source, full = encoder_input
    out = tmp_path / "out.jsonl"
    job = start_predict(tiny_model_dir, source, out, "--max-seq-length", "16")
    written, _, _ = stop_mid_run(job, partial_path(out), signal.SIGKILL, 256, 12_000)
    assert not out.exists()
    kept = open(partial_path(out), "rb").read()
    # Another model, or another option that shapes a row, would append rows unlike these: refused.
    retrained = tmp_path / "retrained"
    shutil.copytree(tiny_model_dir, retrained)
    config = json.loads((retrained / "bert_config.json").read_text())
    (retrained / "bert_config.json").write_text(json.dumps(dict(config, hidden_dropout_prob=0.2)))
    for model, flags, said in [
        (retrained, ["--max-seq-length", "16"], f"holds the rows of {tiny_model_dir}, not of {retrained}"),
        (
            tiny_model_dir,
            ["--max-seq-length", "32"],
            "made with --max-seq-length 16, and this run has --max-seq-length 32",
        ),
        (
            tiny_model_dir,
            ["--max-seq-length", "16", "--layers", "-1"],
            "the default --layers, and this run has --layers -1",
        ),
    ]:
        refused = run_kbert("predict", model, "--input", source, "--output", out, *flags, "--resume", check=False)
        assert_user_error(refused, said, "or pass --overwrite to start again", alone=False)
        assert open(partial_path(out), "rb").read() == kept
    result = run_kbert(
        "predict", tiny_model_dir, "--input", source, "--output", out, "--max-seq-length", "16", "--resume"
    )
    assert json.loads(result.stdout) == {"output": str(out), "rows": 12_000, "rows_kept": written}
    assert_same_rows(out, full, pooled)


@pytest.mark.slow
@pytest.mark.parametrize("number, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_local_run_says_what_it_kept(tiny_model_dir, encoder_input, tmp_path, number, code):
    source, full = encoder_input
    out = tmp_path / "out.jsonl"
    job = start_predict(tiny_model_dir, source, out, "--max-seq-length", "16", interruptible=True)
    written, stdout, stderr = stop_mid_run(job, partial_path(out), number, 256, 12_000)
    assert job.returncode == code, stderr[-2000:]
    assert stdout == "" and "Traceback" not in stderr
    said = [line for line in stderr.splitlines() if "rows" in line]
    assert said == [
        f"kbert: {'kbert predict stopped by SIGTERM' if number == signal.SIGTERM else 'interrupted'}; "
        f"{partial_path(out)} keeps the {written} rows written so far ({written} by this run): run the same "
        f"command with --resume to go on from there"
    ]
    result = run_kbert(
        "predict", tiny_model_dir, "--input", source, "--output", out, "--max-seq-length", "16", "--resume"
    )
    assert json.loads(result.stdout)["rows_kept"] == written
    assert_same_rows(out, full, pooled)


def long_documents(n, seed=0):
    rng = np.random.default_rng(seed)
    texts = distinct_texts(n, seed)
    return [text + " " + " ".join(rng.choice(FILLER, size=int(rng.integers(5, 40)))) + "." for text in texts]


@pytest.fixture(scope="module")
def windows_classifier(tmp_path_factory, tiny_model_dir):
    """An untrained classifier on tf1-tiny that reads long texts in windows of 16 (stride 5)."""
    import keras

    import kbert

    keras.utils.set_random_seed(5)
    work = tmp_path_factory.mktemp("windows")
    model = kbert.bert_classifier(kbert.load(tiny_model_dir), 2)
    model.task_info = {"task": "classify", "labels": ["neg", "pos"], "max_seq_length": 16, "long_text": "windows"}
    model.task_info["doc_stride"] = 5
    kbert.save(model, work / "model")
    return work / "model"


@pytest.mark.slow
def test_a_killed_windows_run_keeps_whole_documents_and_resumes(windows_classifier, tmp_path):
    docs = long_documents(3000)
    source = write_tsv(tmp_path / "docs.tsv", [(text,) for text in docs], header=("text",))
    full = tmp_path / "full.jsonl"
    run_kbert("predict", windows_classifier, "--input", source, "--output", full)
    out = tmp_path / "out.jsonl"
    job = start_predict(windows_classifier, source, out)
    written, _, _ = stop_mid_run(job, partial_path(out), signal.SIGKILL, 256, len(docs))
    # One line per document: the partial rows are the first documents' answers, each whole.
    kept = [json.loads(line) for line in open(partial_path(out))]
    reference = [json.loads(line) for line in open(full)]
    assert [row["label"] for row in kept] == [row["label"] for row in reference[:written]]
    result = run_kbert("predict", windows_classifier, "--input", source, "--output", out, "--resume")
    assert json.loads(result.stdout) == {"output": str(out), "rows": len(docs), "rows_kept": written}
    assert_same_rows(out, full, lambda row: list(row["probabilities"].values()))


# === In process: what each row says, and where it goes ===


def test_the_first_row_comes_after_one_chunk_not_the_whole_file(tiny_model_dir, tmp_path, monkeypatch):
    """A spy on the model's batches: the first row is yielded once the first chunk of examples
    is run, long before the file's last batch (the kill tests above cannot tell this from a run
    that predicts everything, then writes fast)."""
    import keras

    from kbert.finetuning.predict import predict

    source = tmp_path / "in.txt"
    source.write_text("\n".join(distinct_texts(2000)) + "\n")
    calls = []
    run_batch = keras.Model.predict_on_batch

    def counted(model, x):
        calls.append(len(next(iter(x.values()))))
        return run_batch(model, x)

    monkeypatch.setattr(keras.Model, "predict_on_batch", counted)
    rows = predict(tiny_model_dir, source, max_seq_length=16, batch_size=8)
    next(rows)
    assert 0 < sum(calls) <= 256 and max(calls) == 8  # one chunk of batches of 8
    assert sum(1 for _ in rows) == 1999 and sum(calls) == 2000


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model_dir):
    import keras

    import kbert

    keras.utils.set_random_seed(7)
    work = tmp_path_factory.mktemp("classifier")
    model = kbert.bert_classifier(kbert.load(tiny_model_dir), 2)
    model.task_info = {"task": "classify", "labels": ["neg", "pos"], "max_seq_length": 16}
    kbert.save(model, work / "model")
    return work / "model"


def test_rows_name_their_input_line_when_bad_rows_are_skipped(classifier, tmp_path):
    from kbert.finetuning.predict import predict

    source = tmp_path / "in.tsv"
    source.write_text("text\tlabel\ngold glorious.\tpos\nnot\ta\trow\n\ndull awful.\tneg\ngreat.\tpos\n")
    rows = list(predict(classifier, source, skip_bad_rows=True, batch_size=2))
    assert [row["line"] for row in rows] == [2, 5, 6]
    alone = list(predict(classifier, write_tsv(tmp_path / "one.tsv", [("dull awful.",)], header=("text",))))
    assert {k: v for k, v in rows[1].items() if k != "line"} == alone[0]
    assert "line" not in alone[0]  # without --skip-bad-rows every row is its line's, in order


def test_blank_lines_that_move_rows_off_their_line_numbers_are_said(classifier, tiny_model_dir, tmp_path):
    """A blank line has no row, so the rows after it are not numbered as their lines: said on stderr,
    for a task's table and an encoder's lines alike (trailing blank lines move nothing: not said)."""
    table = tmp_path / "in.tsv"
    table.write_text("text\tlabel\ngold glorious.\tpos\n\ndull awful.\tneg\n\n\n")
    lines = tmp_path / "in.txt"
    lines.write_text("\ngold glorious.\n\n\ndull awful.\n\n")
    for model, source, said in [
        (classifier, table, "skipped 1 blank line (line 3)"),
        (tiny_model_dir, lines, "skipped 3 blank lines (lines 1, 3, 4)"),
    ]:
        result = run_kbert("predict", model, "--input", source, "--max-seq-length", "16")
        assert len(result.stdout.splitlines()) == 2
        assert f"{source}: {said}; the rows follow the other lines, in order" in result.stderr, result.stderr
    lines.write_text("gold glorious.\ndull awful.\n\n\n")
    assert "blank" not in run_kbert("predict", tiny_model_dir, "--input", lines, "--max-seq-length", "16").stderr


def test_predict_takes_labels_the_model_never_saw_and_evaluate_refuses_them(classifier, tmp_path):
    from kbert.finetuning.predict import evaluate, predict
    from kbert.runtime.errors import KbertError

    source = write_tsv(tmp_path / "in.tsv", [("gold.", "pos"), ("dull.", "meh")], header=("text", "label"))
    assert [row["label"] in ("neg", "pos") for row in predict(classifier, source)] == [True, True]
    with pytest.raises(KbertError, match="labels the model was never trained on: 'meh'"):
        evaluate(classifier, source)


def test_an_encoders_tsv_header_is_not_a_text(tiny_model_dir, tmp_path):
    from kbert.finetuning.predict import predict

    table = write_tsv(tmp_path / "in.tsv", [("gold glorious.", "pos"), ("dull.", "neg")], header=("text", "label"))
    lines = tmp_path / "in.txt"
    lines.write_text("gold glorious.\ndull.\n")
    assert list(predict(tiny_model_dir, table, max_seq_length=16)) == list(
        predict(tiny_model_dir, lines, max_seq_length=16)
    )


def test_output_dash_is_stdout_and_a_pipe_is_written_as_it_goes(tiny_model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("gold glorious.\ndull.\n")
    to_stdout = run_kbert("predict", tiny_model_dir, "--input", source, "--output", "-", "--max-seq-length", "16")
    plain = run_kbert("predict", tiny_model_dir, "--input", source, "--max-seq-length", "16")
    assert to_stdout.stdout == plain.stdout and len(plain.stdout.splitlines()) == 2
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]  # no "-", no partial file, no lock

    pipe = tmp_path / "pipe"  # what /dev/stdout is when a shell pipes it: a FIFO
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(pipe).read()))
    reader.start()
    result = run_kbert("predict", tiny_model_dir, "--input", source, "--output", pipe, "--max-seq-length", "16")
    reader.join(timeout=60)
    assert result.stdout == "" and received == [plain.stdout]
    refused = run_kbert("predict", tiny_model_dir, "--input", source, "--output", "-", "--resume", check=False)
    assert refused.returncode == 1 and "is a stream, which has no rows to resume" in refused.stderr


def test_an_output_that_is_a_symbolic_link_is_written_through(tiny_model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("gold glorious.\n")
    (tmp_path / "results").mkdir()
    target = tmp_path / "results" / "predictions.jsonl"
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    run_kbert("predict", tiny_model_dir, "--input", source, "--output", link, "--max-seq-length", "16")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(target.read_text().splitlines()) == 1


@pytest.mark.slow
def test_output_dev_stdout_redirected_to_a_file_by_the_shell(tiny_model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("gold glorious.\ndull.\n")
    plain = run_kbert("predict", tiny_model_dir, "--input", source, "--max-seq-length", "16").stdout
    with open(tmp_path / "redirected.jsonl", "w") as stdout:  # `kbert predict ... --output /dev/stdout > FILE`
        args = ["predict", tiny_model_dir, "--input", source, "--output", "/dev/stdout", "--max-seq-length", "16"]
        done = subprocess.run(
            kbert_command() + [str(a) for a in args], stdout=stdout, stderr=subprocess.PIPE, text=True
        )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "redirected.jsonl").read_text() == plain
