"""Continued pretraining of a ModernBERT, as a user runs it: `kbert pretrain --init` of a converted
ModernBERT (or its Hugging Face folder) on masked-LM-only records trains the masked LM alone, with
transformers' loss, on TensorFlow, JAX and PyTorch; the result is a ModernBERT model directory that
fill-mask reads and that goes back to transformers. What does not apply is refused in one line.

The trainer's records here are written by TensorFlow's own `tf.train.Example` (the records of
`kbert create-data --vocab tokenizer.json` are checked in test_create_data.py, and one run below
trains on them), masked as the recipe masks: [CLS] text [SEP], a share of the text's tokens
replaced by [MASK].
"""

import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_modernbert import CONFIGS, SAMPLE, make_hf_folder, train_tokenizer

from conftest import run_kbert
from helpers import saved_weights

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SEQ, PREDS = 32, 10
FLAGS = ["--max-seq-length", SEQ, "--max-predictions-per-seq", PREDS, "--batch-size", "8", "--learning-rate", "1e-3"]


def largest_difference(a: dict, b: dict) -> float:
    """The largest |a - b| over every weight of two saved models (the tiny ModernBERT has 23)."""
    assert a.keys() == b.keys() and len(a) >= 20
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


def write_masked_lm_records(path, tokenizer, seed=0, copies=3):
    """Masked-LM-only records of the sample text's lines, written with tf.train.Example."""
    import tensorflow as tf

    rng = random.Random(seed)
    cls, sep, mask = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    with open(SAMPLE, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for line in lines * copies:
            ids = [cls, *tokenizer.encode(line, add_special_tokens=False).ids[: SEQ - 2], sep]
            candidates = list(range(1, len(ids) - 1))
            rng.shuffle(candidates)
            positions = sorted(candidates[: max(1, min(PREDS, round(len(ids) * 0.3)))])
            inputs = [mask if i in positions else token for i, token in enumerate(ids)]
            pad, free = SEQ - len(ids), PREDS - len(positions)
            features = {
                "input_ids": ints(inputs + [0] * pad),
                "input_mask": ints([1] * len(ids) + [0] * pad),
                "masked_lm_positions": ints(positions + [0] * free),
                "masked_lm_ids": ints([ids[p] for p in positions] + [0] * free),
                "masked_lm_weights": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[1.0] * len(positions) + [0.0] * free)
                ),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The HF folder of a ModernBERT masked LM, its kbert model directory, and records for it."""
    root = tmp_path_factory.mktemp("modernbert-pretrain")
    tokenizer = train_tokenizer()
    make_hf_folder(root / "hf", tokenizer, **CONFIGS["masked_lm"])
    run_kbert("convert", "from-hf", root / "hf", root / "kbert")
    return {
        "hf": root / "hf",
        "kbert": root / "kbert",
        "records": write_masked_lm_records(root / "train.tfrecord", tokenizer),
        "eval": write_masked_lm_records(root / "eval.tfrecord", tokenizer, seed=1, copies=1),
        "tokenizer": tokenizer,
    }


def test_the_masked_lm_loss_of_a_batch_is_transformers_loss(made):
    """A batch as the run reads it (kbert's record reader, masked-LM-only keys), through the
    converted model and the run's objective, gives the loss and accuracy transformers'
    ModernBertForMaskedLM gives with the masked positions as its labels."""
    import kbert
    from kbert.pretraining.pretrainers import MASKED_LM
    from kbert.pretraining.record_reader import numpy_batches

    features, labels = next(
        numpy_batches(
            [made["records"]], 16, SEQ, PREDS, training=False, keys=(MASKED_LM.input_keys, MASKED_LM.label_keys)
        )
    )
    assert sorted(features) == ["input_ids", "input_mask", "masked_lm_positions"]
    model = kbert.load(made["kbert"])
    ours = {k: float(v) for k, v in MASKED_LM.losses(model(features), labels).items()}

    theirs_model = __import__("transformers").ModernBertForMaskedLM.from_pretrained(made["hf"]).eval()
    hf_labels = np.full(features["input_ids"].shape, -100, dtype=np.int64)
    rows = np.repeat(np.arange(len(hf_labels))[:, None], PREDS, axis=1)
    real = labels["masked_lm_weights"] > 0
    hf_labels[rows[real], features["masked_lm_positions"][real]] = labels["masked_lm_ids"][real]
    with torch.no_grad():
        out = theirs_model(
            input_ids=torch.tensor(features["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(features["input_mask"], dtype=torch.long),
            labels=torch.tensor(hf_labels),
        )
    hits = (out.logits.argmax(-1).numpy() == hf_labels)[hf_labels != -100]
    assert sorted(ours) == ["loss", "mlm_accuracy", "mlm_loss"]
    assert ours["loss"] == pytest.approx(float(out.loss), abs=1e-5)
    assert ours["mlm_accuracy"] == pytest.approx(float(hits.mean()), abs=1e-5)


def test_a_converted_modernbert_continues_pretraining_resumes_and_goes_back_to_transformers(made, tmp_path):
    out = tmp_path / "out"
    first = json.loads(
        run_kbert(
            "pretrain", "--init", made["kbert"], "--data", made["records"], "--eval-data", made["eval"],
            "--eval-steps", "2", "--model-dir", out, "--steps", "6", "--save-every", "3", *FLAGS,
        ).stdout
    )  # fmt: skip
    # The masked LM alone: no next-sentence loss or accuracy anywhere.
    assert {"loss", "mlm_loss", "mlm_accuracy"} <= set(first) and not any("nsp" in k for k in first)
    assert first["loss"] == first["mlm_loss"] and set(first["eval"]) == {"loss", "mlm_loss", "mlm_accuracy"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "split" not in r] == [3, 6] and all("nsp_loss" not in r for r in rows)
    assert (out / "loss.png").stat().st_size > 0 and (out / "logs" / "train").is_dir()
    # A ModernBERT model directory: its config.json, tokenizer and weights, which moved.
    config = json.loads((out / "config.json").read_text())
    assert config["kbert_family"] == "modernbert" and config["kbert_model"] == "pretrainer"
    assert (out / "tokenizer.json").read_bytes() == (made["kbert"] / "tokenizer.json").read_bytes()

    resumed = json.loads(run_kbert("pretrain", "--model-dir", out, "--resume", "--steps", "9").stdout)
    assert resumed["step"] == 9 and resumed["resumed_from"] == 6

    # Back to transformers: its logits are those kbert computes with the trained weights.
    import kbert

    trained = kbert.load(out)
    start = kbert.load(made["kbert"])
    moved = max(float(np.abs(a - b).max()) for a, b in zip(trained.get_weights(), start.get_weights()))
    assert moved > 1e-4
    run_kbert("convert", "to-hf", out, tmp_path / "hf")
    theirs_model = __import__("transformers").ModernBertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ids = np.array([made["tokenizer"].encode("The quick brown fox jumps.").ids], dtype=np.int32)
    ours = np.asarray(trained({"input_ids": ids, "input_mask": np.ones_like(ids)})["mlm_logits"])
    with torch.no_grad():
        theirs = theirs_model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)
    # fill-mask reads the trained model as any ModernBERT masked LM.
    filled = json.loads(run_kbert("fill-mask", out, "The [MASK] of it.", "--top-k", "2").stdout)
    assert len(filled["masks"][0]["predictions"]) == 2


BACKEND_RUN = r"""
import json, sys
from kbert.pretraining.train import pretrain
model_dir, init, data, steps, resume = sys.argv[1:6]
flags = dict(max_seq_length=32, max_predictions_per_seq=10, batch_size=8, learning_rate=1e-3, save_every=3,
             steps_per_loop=3, progress=False)
if resume == "resume":
    print(json.dumps(pretrain(model_dir, resume=True, steps=int(steps))))
else:
    print(json.dumps(pretrain(model_dir, data, init=init, steps=int(steps), **flags)))
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_jax_and_pytorch_continue_a_modernbert_alike_and_resume_exactly(made, tmp_path, backend):
    """A run resumed from its step-3 checkpoint ends with the weights of the run that went on
    unbroken, bit for bit; and JAX and PyTorch (the same reader, the same order) train alike."""

    def run(model_dir, resume, on=backend):
        env = dict(os.environ, KERAS_BACKEND=on)
        args = [sys.executable, "-c", BACKEND_RUN, model_dir, made["kbert"], made["records"], "6", resume]
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    whole = run(tmp_path / "whole", "new")
    # The same run as if stopped after its step-3 checkpoint: what it wrote later taken away.
    shutil.copytree(tmp_path / "whole", tmp_path / "broken")
    shutil.rmtree(tmp_path / "broken" / "checkpoints" / "ckpt-6")
    os.remove(tmp_path / "broken" / "model.weights.h5")
    resumed = run(tmp_path / "broken", "resume")
    assert resumed["resumed_from"] == 3 and resumed["step"] == 6 and resumed["backend"] == backend
    assert largest_difference(saved_weights(tmp_path / "broken"), saved_weights(tmp_path / "whole")) == 0.0
    if backend == "torch":  # the same run on JAX: the same losses
        other = run(tmp_path / "jax", "new", on="jax")
        assert other["loss"] == pytest.approx(whole["loss"], abs=1e-5)
        assert other["mlm_accuracy"] == pytest.approx(whole["mlm_accuracy"], abs=1e-6)
        difference = largest_difference(saved_weights(tmp_path / "jax"), saved_weights(tmp_path / "whole"))
        assert difference < 1e-5


def test_pretraining_starts_from_the_hugging_face_folder_itself(made, tmp_path):
    result = json.loads(
        run_kbert(
            "pretrain", "--init", made["hf"], "--data", made["records"], "--model-dir", tmp_path / "out",
            "--steps", "2", *FLAGS,
        ).stdout
    )  # fmt: skip
    assert result["step"] == 2 and "nsp_loss" not in result
    assert json.loads((tmp_path / "out" / "config.json").read_text())["kbert_family"] == "modernbert"


def test_records_of_create_data_with_the_tokenizer_json_continue_the_model(made, tmp_path):
    """The user's path: create-data with the model's tokenizer.json (30% masking, no next
    sentence, max-predictions-per-seq from the length), then pretrain --init on its records."""
    made_data = json.loads(
        run_kbert(
            "create-data", "--input", SAMPLE, "--vocab", made["kbert"] / "tokenizer.json", "--output",
            tmp_path / "data.tfrecord", "--max-seq-length", SEQ, "--dupe-factor", "2", "--workers", "1",
        ).stdout
    )  # fmt: skip
    assert made_data["max_predictions_per_seq"] == PREDS  # round(32 * 0.3): what pretrain is told below
    result = json.loads(
        run_kbert(
            "pretrain", "--init", made["kbert"], "--data", tmp_path / "data.tfrecord", "--model-dir",
            tmp_path / "out", "--steps", "3", *FLAGS,
        ).stdout
    )  # fmt: skip
    assert result["step"] == 3 and result["loss"] == result["mlm_loss"] and "nsp_loss" not in result


def bert_records(tmp_path):
    out = tmp_path / "bert.tfrecord"
    vocab = os.path.join(os.path.dirname(SAMPLE), "vocab-uncased.txt")
    run_kbert(
        "create-data", "--input", SAMPLE, "--vocab", vocab, "--output", out, "--max-seq-length", SEQ,
        "--max-predictions-per-seq", PREDS, "--masked-lm-prob", "0.15", "--dupe-factor", "1", "--workers", "1",
    )  # fmt: skip
    return out, vocab


@pytest.mark.parametrize(
    "case", ["bert records", "records for a bert", "lowercase", "from scratch", "a classifier", "no-lowercase"]
)
def test_what_does_not_apply_to_a_modernbert_is_refused_in_one_line(made, tmp_path, case):
    out = tmp_path / "out"
    init = ["--init", made["kbert"]]
    if case == "bert records":
        data, expected = bert_records(tmp_path)[0], "a ModernBERT pretrains on masked-LM-only records"
        args = [*init, "--data", data]
    elif case == "records for a bert":
        _, vocab = bert_records(tmp_path)
        config = tmp_path / "bert_config.json"
        config.write_text(
            json.dumps(
                dict(vocab_size=sum(1 for _ in open(vocab)), hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
            )
        )  # fmt: skip
        args = ["--config", config, "--vocab", vocab, "--data", made["records"]]
        expected = "a BERT pretrains on masked-LM + next-sentence records"
    elif case in ("lowercase", "no-lowercase"):
        args = [*init, "--data", made["records"], f"--{case}"]
        expected = "a ModernBERT's casing is its tokenizer.json's"
    elif case == "from scratch":
        args = ["--config", made["kbert"] / "config.json", "--vocab", made["kbert"] / "tokenizer.json"]
        args += ["--data", made["records"]]
        expected = "pretrains a ModernBERT from a converted one"
    else:
        classifier = tmp_path / "classifier"
        make_hf_folder(tmp_path / "hf-classifier", made["tokenizer"], **CONFIGS["tagger"])
        run_kbert("convert", "from-hf", tmp_path / "hf-classifier", classifier)
        args, expected = ["--init", classifier, "--data", made["records"]], "without the masked-LM head"
    done = run_kbert("pretrain", *args, "--model-dir", out, "--steps", "2", *FLAGS, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert expected in done.stderr, done.stderr
    assert not out.exists()
