"""`kbert fill-mask` on the tiny checkpoint, whose vocabulary repeats tokens ("4", "a", "i")."""

import json
import os

import pytest

from conftest import TINY, run_kbert
from kbert.pretraining.fill_mask import fill_mask
from kbert.runtime.errors import KbertError, command_line_names


def test_top_k_over_the_whole_vocabulary_names_every_id(tiny_model_dir):
    result = run_kbert("fill-mask", tiny_model_dir, "the [MASK].", "--top-k", "300")
    (mask,) = json.loads(result.stdout)["masks"]
    predictions = mask["predictions"]
    with open(os.path.join(TINY, "vocab.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    # Every id once, each with its own line's token: the earlier copy of a repeated token too.
    assert sorted(p["id"] for p in predictions) == list(range(300))
    assert all(p["token"] == lines[p["id"]] for p in predictions)
    assert {lines.index(t) for t in ("4", "a", "i")} <= {p["id"] for p in predictions}
    probabilities = [p["probability"] for p in predictions]
    assert probabilities == sorted(probabilities, reverse=True) and abs(sum(probabilities) - 1) < 1e-3


def test_a_fresh_masked_lm_head_is_refused_until_pretrained(tmp_path):
    """A TF Hub encoder has no masked-LM head: fill-mask refuses its random one, and after
    `kbert pretrain --init` (which trains it) the head is recorded as trained and answers."""
    from conftest import FIXTURES, assert_user_error
    from kbert.pretraining.create_data import create_pretraining_data

    hub = os.path.join(FIXTURES, "model-garden-tfhub")
    run_kbert("convert", "from-tfhub", f"{hub}/encoder", tmp_path / "enc", "--preprocessor", f"{hub}/preprocessor")
    result = run_kbert("fill-mask", tmp_path / "enc", "the [MASK].", check=False)
    assert_user_error(result, "masked-LM head was created by a converter", "kbert pretrain", "--init")

    records = tmp_path / "records.tfrecord"  # any records in the encoder's vocabulary, made in this process
    create_pretraining_data(
        [os.path.join(os.path.dirname(TINY), "sample_text.txt")], f"{hub}/vocab.txt", str(records),
        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, seed=7, workers=1,
    )  # fmt: skip
    run_kbert(
        "pretrain", "--model-dir", tmp_path / "bert", "--data", records, "--init", tmp_path / "enc",
        "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--batch-size", "8", "--steps", "2",
    )  # fmt: skip
    assert "fresh_heads" not in json.load(open(tmp_path / "bert" / "bert_config.json"))
    heads = json.loads(run_kbert("convert", "inspect", tmp_path / "bert").stdout)["heads"]
    assert heads == {"masked_lm": "trained", "next_sentence": "trained", "pooler": "trained"}
    assert json.loads(run_kbert("fill-mask", tmp_path / "bert", "the [MASK].").stdout)["masks"]


def test_a_bad_top_k_is_named_as_the_caller_gave_it(tiny_model_dir):
    with pytest.raises(KbertError, match=r"^top_k must be at least 1, got 0$"):
        fill_mask(tiny_model_dir, "the [MASK].", top_k=0)
    with command_line_names({"--top-k"}), pytest.raises(KbertError, match=r"^--top-k must be at least 1, got 0$"):
        fill_mask(tiny_model_dir, "the [MASK].", top_k=0)
