"""`kbert finetune / predict / evaluate` from the shell, on the original tiny checkpoint.

The data are small learnable tasks written over the tiny checkpoint's 300-word vocabulary;
each test runs the real commands and reads their JSON output and files.
"""

import json
import os

import numpy as np
import pytest

from conftest import assert_user_error, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, conll_sentences, sentiment_rows, write_conll, write_tsv

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

TRAIN_FLAGS = ["--epochs", "4", "--batch-size", "16", "--learning-rate", "1e-3", "--max-seq-length", "24"]


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("classify")
    train = write_tsv(work / "train.tsv", sentiment_rows(256, 0))
    dev = write_tsv(work / "dev.tsv", sentiment_rows(64, 1))
    out = work / "model"
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", train, "--dev", dev, "--output", out, *TRAIN_FLAGS
    )
    return work, out, result


def test_classify_learns_and_writes_a_complete_model_dir(classify_run):
    work, out, result = classify_run
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["accuracy"] >= 0.9, metrics
    assert set(metrics) >= {"accuracy", "macro_f1", "mcc", "epoch"}
    assert sorted(os.listdir(out)) == ["bert_config.json", "eval_results.json", "logs", "model.weights.h5", "vocab.txt"]
    config = json.load(open(out / "bert_config.json"))
    assert (config["kbert_model"], config["task"], config["labels"], config["max_seq_length"]) == (
        "classifier",
        "classify",
        ["neg", "pos"],
        24,
    )
    history = json.load(open(out / "eval_results.json"))["history"]
    assert len(history) == 4 and history[-1]["loss"] < history[0]["loss"]
    assert any(name.startswith("events.out.tfevents") for _, _, files in os.walk(out / "logs") for name in files)
    assert "epoch 1:" in result.stderr and "dev_accuracy" in result.stderr


def test_classify_predict_and_evaluate(classify_run):
    work, out, _ = classify_run
    rows = [("gold glorious great.", "pos"), ("dead dust the dread.", "neg")]
    lines = run_kbert("predict", out, "--input", write_tsv(work / "pred.tsv", rows)).stdout.strip().splitlines()
    predictions = [json.loads(line) for line in lines]
    assert [p["label"] for p in predictions] == ["pos", "neg"]
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-4 for p in predictions)
    # Prediction input without labels: a text-only file.
    unlabeled = write_tsv(work / "unlabeled.tsv", [(r[0],) for r in rows], header=("text",))
    assert len(run_kbert("predict", out, "--input", unlabeled).stdout.strip().splitlines()) == 2
    metrics = json.loads(run_kbert("evaluate", out, "--input", work / "dev.tsv").stdout)
    assert metrics["examples"] == 64 and metrics["accuracy"] >= 0.9


def test_evaluate_rejects_labels_never_seen_in_training(classify_run, tmp_path):
    _, out, _ = classify_run
    bad = write_tsv(tmp_path / "bad.tsv", [("gold.", "pos"), ("dead.", "maybe"), ("dust.", "unsure")])
    assert_user_error(
        run_kbert("evaluate", out, "--input", bad, check=False), "'maybe'", "'unsure'", "never trained on"
    )


def test_regress_sentence_pairs(tmp_path, tiny_model_dir):
    # STS-B-like: the score is 5 x the share of cue words the two sentences agree on.
    rng = np.random.default_rng(0)

    def rows(n):
        out = []
        for _ in range(n):
            a, same = rng.choice(POSITIVE), rng.random() < 0.5
            b = a if same else rng.choice(NEGATIVE)
            out.append((f"the {a} city.", f"a {b} camp.", 5.0 if same else 0.0))
        return out

    header = ("text", "text_b", "label")
    train = write_tsv(tmp_path / "train.tsv", rows(256), header)
    dev = write_tsv(tmp_path / "dev.tsv", rows(64), header)
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "regress",
        "--train",
        train,
        "--dev",
        dev,
        "--output",
        tmp_path / "model",
        *TRAIN_FLAGS,
    )
    metrics = json.loads(result.stdout)
    assert metrics["pearson"] > 0.8, metrics
    assert set(metrics) >= {"pearson", "spearman", "mse"}
    first = json.loads(run_kbert("predict", tmp_path / "model", "--input", dev).stdout.splitlines()[0])
    assert isinstance(first["prediction"], float)


def test_tag_conll(tmp_path, tiny_model_dir):
    train = write_conll(tmp_path / "train.conll", conll_sentences(256, 0))
    dev = write_conll(tmp_path / "dev.conll", conll_sentences(64, 1))
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "tag",
        "--train",
        train,
        "--dev",
        dev,
        "--output",
        tmp_path / "model",
        "--epochs",
        "8",
        "--batch-size",
        "16",
        "--learning-rate",
        "2e-3",
        "--max-seq-length",
        "32",
    )
    metrics = json.loads(result.stdout)
    assert metrics["f1"] >= 0.8, metrics
    assert set(metrics) >= {"precision", "recall", "f1"}
    assert json.loads(run_kbert("evaluate", tmp_path / "model", "--input", dev).stdout)["f1"] == pytest.approx(
        metrics["f1"], abs=1e-6
    )
    # "cassius" is two WordPieces (cass ##ius): one tag per word all the same.
    words = ["the", "great", "city", "cassius"]
    write_conll(tmp_path / "one.conll", [(words, ["O"] * 4)])
    predicted = json.loads(run_kbert("predict", tmp_path / "model", "--input", tmp_path / "one.conll").stdout)
    assert predicted["words"] == words and len(predicted["tags"]) == 4


def squad_json(n, seed, v2=False):
    """Questions whose answer is the place word of a short context."""
    rng = np.random.default_rng(seed)
    places = ["city", "camp", "desert", "highway", "cabin", "stream", "street"]
    paragraphs = []
    for i in range(n):
        place = str(rng.choice(places))
        filler = " ".join(rng.choice(FILLER[:10], size=int(rng.integers(2, 6))))
        context = f"{filler} he was at the {place} in the morning ."
        start = context.index(f"the {place}") + 4
        qa = {
            "id": f"q{i}",
            "question": "where was he ?",
            "answers": [{"text": place, "answer_start": start}],
            "is_impossible": False,
        }
        if v2 and i % 3 == 0:
            qa = {"id": f"q{i}", "question": "where was the guide ?", "answers": [], "is_impossible": True}
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "v2.0" if v2 else "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


@pytest.mark.parametrize("v2", [False, True], ids=["v1.1", "v2.0"])
def test_squad(tmp_path, tiny_model_dir, v2):
    for name, n, seed in (("train", 192, 0), ("dev", 48, 1)):
        (tmp_path / f"{name}.json").write_text(json.dumps(squad_json(n, seed, v2)))
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "squad",
        "--train",
        tmp_path / "train.json",
        "--dev",
        tmp_path / "dev.json",
        "--output",
        tmp_path / "model",
        "--epochs",
        "4",
        "--batch-size",
        "16",
        "--learning-rate",
        "1e-3",
        "--max-seq-length",
        "32",
        "--doc-stride",
        "16",
        "--max-query-length",
        "8",
    )
    metrics = json.loads(result.stdout)
    assert set(metrics) >= {"exact_match", "f1"}
    assert metrics["exact_match"] >= 60.0, metrics  # percent, as the official script
    predictions = json.load(open(tmp_path / "model" / "predictions.json"))
    assert len(predictions) == 48 and all(isinstance(v, str) for v in predictions.values())
    if v2:
        assert "NoAns_exact" in metrics
    evaluated = json.loads(run_kbert("evaluate", tmp_path / "model", "--input", tmp_path / "dev.json").stdout)
    assert evaluated["exact_match"] == pytest.approx(metrics["exact_match"], abs=1e-6)


def test_encoder_predict_gives_pooled_and_per_layer_features(tmp_path, tiny_model_dir):
    lines = tmp_path / "lines.txt"
    lines.write_text("the gold city ||| a dead camp\nglorious\n")
    pooled = [json.loads(x) for x in run_kbert("predict", tiny_model_dir, "--input", lines).stdout.splitlines()]
    assert len(pooled) == 2 and len(pooled[0]["pooled_output"]) == 64
    rows = [
        json.loads(x)
        for x in run_kbert("predict", tiny_model_dir, "--input", lines, "--layers", "-1,-2").stdout.splitlines()
    ]
    tokens = [f["token"] for f in rows[0]["features"]]
    assert tokens == ["[CLS]", "the", "gold", "city", "[SEP]", "a", "dead", "camp", "[SEP]"]
    assert [layer["index"] for layer in rows[0]["features"][0]["layers"]] == [-1, -2]
    assert len(rows[0]["features"][0]["layers"][0]["values"]) == 64


# --------------------------------------------------------------------------- bad input


def test_bad_rows_fail_with_line_numbers_or_are_skipped(tmp_path, tiny_model_dir):
    train = tmp_path / "train.tsv"
    rows = sentiment_rows(40, 0)
    lines = ["text\tlabel"] + [f"{t}\t{y}" for t, y in rows]
    lines[3] = "missing the label column"
    lines[7] = "one\ttoo\tmany"
    train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "model"
    assert_user_error(
        run_kbert(
            "finetune",
            tiny_model_dir,
            "--task",
            "classify",
            "--train",
            train,
            "--output",
            out,
            *TRAIN_FLAGS,
            check=False,
        ),
        "lines 4, 8",
        "--skip-bad-rows",
    )
    assert not out.exists()
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "classify",
        "--train",
        train,
        "--output",
        out,
        "--skip-bad-rows",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--max-seq-length",
        "24",
    )
    assert "skipped 2 bad rows (lines 4, 8)" in result.stderr
    assert json.loads(result.stdout)["epoch"] == 1


def test_empty_file_missing_file_and_bad_flags(tmp_path, tiny_model_dir):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    base = ["finetune", tiny_model_dir, "--task", "classify", "--output", tmp_path / "m"]
    assert_user_error(run_kbert(*base, "--train", empty, check=False), "empty.tsv")
    assert_user_error(run_kbert(*base, "--train", tmp_path / "nope.tsv", check=False), "nope.tsv")
    train = write_tsv(tmp_path / "t.tsv", sentiment_rows(8, 0))
    assert_user_error(
        run_kbert(
            "finetune", tiny_model_dir, "--task", "translate", "--train", train, "--output", tmp_path / "m", check=False
        ),
        "translate",
        "classify",
    )
    assert_user_error(
        run_kbert(*base, "--train", train, "--max-seq-length", "512", check=False), "max_position_embeddings 64"
    )


def test_non_utf8_and_truncation_are_reported(tmp_path, tiny_model_dir):
    rows = sentiment_rows(32, 0)
    data = b"text\tlabel\n" + b"".join(f"{t}\t{y}\n".encode() for t, y in rows)
    data += b"gold \xff\xfe glorious.\tpos\n" + (" ".join(["gold"] * 40) + ".\tpos\n").encode()
    train = tmp_path / "train.tsv"
    train.write_bytes(data)
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "classify",
        "--train",
        train,
        "--output",
        tmp_path / "m",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--max-seq-length",
        "24",
    )
    assert "replaced 1 invalid UTF-8" in result.stderr or "replaced 2 invalid UTF-8" in result.stderr, result.stderr
    assert "1 of 34 examples longer than --max-seq-length 24 were truncated" in result.stderr, result.stderr


def test_early_stopping_keeps_the_best_epoch(tmp_path, tiny_model_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(64, 0))
    # Dev labels are random, so the dev score stops improving; patience 1 stops the run early.
    rng = np.random.default_rng(3)
    dev = write_tsv(tmp_path / "dev.tsv", [(t, rng.choice(["neg", "pos"])) for t, _ in sentiment_rows(32, 1)])
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "classify",
        "--train",
        train,
        "--dev",
        dev,
        "--output",
        tmp_path / "m",
        "--epochs",
        "12",
        "--patience",
        "1",
        "--batch-size",
        "16",
        "--learning-rate",
        "1e-3",
        "--max-seq-length",
        "24",
    )
    history = json.load(open(tmp_path / "m" / "eval_results.json"))["history"]
    best = json.loads(result.stdout)
    assert len(history) < 12 and "early stop" in result.stderr
    assert best["accuracy"] == max(row["dev_accuracy"] for row in history)
    assert best["epoch"] == 1 + [row["dev_accuracy"] for row in history].index(best["accuracy"])


def test_finetune_under_mirrored_strategy(tmp_path, tiny_model_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(256, 0))
    dev = write_tsv(tmp_path / "dev.tsv", sentiment_rows(64, 1))
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "classify",
        "--train",
        train,
        "--dev",
        dev,
        "--output",
        tmp_path / "m",
        "--strategy",
        "mirrored",
        *TRAIN_FLAGS,
        env={"KBERT_LOGICAL_CPUS": "2"},
    )
    assert json.loads(result.stdout)["accuracy"] >= 0.9
    assert "2 replicas" in result.stderr, result.stderr
