"""Every fine-tuning task a ModernBERT takes, from the shell as a user runs them: regress and
embed, long documents in windows, and classify and tag on JAX and PyTorch (TensorFlow's classify
and tag are in test_modernbert.py)."""

import json

import numpy as np
import pytest
from test_modernbert import CONFIGS, SENTIMENT, make_hf_folder, train_tokenizer

from conftest import run_kbert

pytest.importorskip("torch")
pytest.importorskip("transformers")

FLAGS = ["--epochs", "2", "--batch-size", "8", "--learning-rate", "1e-3"]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modernbert") / "hf"
    make_hf_folder(folder, train_tokenizer(), **CONFIGS["masked_lm"])
    return folder


def rows_of(result) -> list:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_modernbert_regresses(hf_folder, tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"{t}\t{1.0 if y == 'pos' else 0.0}\n" for t, y in SENTIMENT * 4))
    result = json.loads(
        run_kbert(
            "finetune", hf_folder, "--task", "regress", "--train", train, "--dev", train, "--output",
            tmp_path / "out", "--max-seq-length", "24", *FLAGS,
        ).stdout
    )  # fmt: skip
    assert {"pearson", "spearman"} <= set(result)
    rows = rows_of(run_kbert("predict", tmp_path / "out", "--input", train))
    assert len(rows) == len(SENTIMENT) * 4 and all(isinstance(row["prediction"], float) for row in rows)


def test_a_modernbert_learns_embeddings_and_ranks(hf_folder, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "query\tdocument\n" + "".join(f"about {t.split()[-1]} {i}\t{t} {i}\n" for i, (t, _) in enumerate(SENTIMENT * 4))
    )
    result = json.loads(
        run_kbert(
            "finetune", hf_folder, "--task", "embed", "--train", pairs, "--dev", pairs, "--output",
            tmp_path / "out", "--pooling", "mean", "--normalize", "--max-seq-length", "24", *FLAGS,
        ).stdout
    )  # fmt: skip
    assert 0 <= result["ndcg@10"] <= 1
    texts = tmp_path / "texts.txt"
    texts.write_text("a great film\nan awful film\n")
    vectors = [row["embedding"] for row in rows_of(run_kbert("embed", tmp_path / "out", "--input", texts))]
    assert len(vectors) == 2 and abs(np.linalg.norm(vectors[0]) - 1) < 1e-5  # normalised, as recorded
    scores = json.loads(run_kbert("evaluate", tmp_path / "out", "--input", pairs).stdout)
    assert scores["ndcg@10"] == pytest.approx(result["ndcg@10"], abs=1e-6)
    # Exported, it serves each text's vector as kbert embed computes it.
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    exported = json.loads(run_kbert("export", tmp_path / "out", tmp_path / "served").stdout)
    served = tf.saved_model.load(exported["export"]).signatures["serving_default"]
    ours = served(text=tf.constant(["a great film", "an awful film"]))["embedding"].numpy()
    np.testing.assert_allclose(ours, np.array(vectors), atol=1e-5)


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_modernbert_reads_long_documents_in_windows_on_every_backend(hf_folder, tmp_path, backend):
    """Documents of several windows, the class in their last words: fine-tuned, predicted and
    evaluated per document, on TensorFlow in this process and on JAX and PyTorch in processes of
    their own (with TensorFlow, as a user's shell has it)."""
    filler = "the film went on and on with nothing much to see "
    rows = [(f"{filler * 3}{t}", y) for t, y in SENTIMENT * 3]
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    env = None if backend == "tensorflow" else {"KERAS_BACKEND": backend}
    result = run_kbert(
        "finetune", hf_folder, "--task", "classify", "--train", train, "--dev", train, "--output", tmp_path / "out",
        "--long-text", "windows", "--doc-stride", "8", "--max-seq-length", "16", *FLAGS, env=env,
    )  # fmt: skip
    assert "(stride 8)" in result.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["kbert_family"], config["long_text"], config["doc_stride"]) == ("modernbert", "windows", 8)
    predicted = rows_of(run_kbert("predict", tmp_path / "out", "--input", train, env=env))
    assert len(predicted) == len(rows) and all(sorted(p["probabilities"]) == ["neg", "pos"] for p in predicted)
    metrics = json.loads(run_kbert("evaluate", tmp_path / "out", "--input", train, env=env).stdout)
    assert metrics["examples"] == len(rows)
    accuracy = np.mean([p["label"] == y for p, (_, y) in zip(predicted, rows)])
    assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_modernbert_tags_on_jax_and_pytorch(hf_folder, tmp_path, backend):
    train = tmp_path / "train.conll"
    train.write_text("EU\tB-ORG\nrejects\tO\nGerman\tB-MISC\n\nPeter\tB-PER\nwins\tO\n\n" * 4)
    env = {"KERAS_BACKEND": backend}
    run_kbert(
        "finetune", hf_folder, "--task", "tag", "--train", train, "--output", tmp_path / "tagger",
        "--epochs", "1", "--max-seq-length", "16", "--batch-size", "4", env=env,
    )  # fmt: skip
    rows = rows_of(run_kbert("predict", tmp_path / "tagger", "--input", train, env=env))
    assert len(rows) == 8 and rows[0]["words"] == ["EU", "rejects", "German"] and len(rows[0]["tags"]) == 3
