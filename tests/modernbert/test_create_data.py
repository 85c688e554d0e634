"""`kbert create-data --vocab tokenizer.json`: masked-LM-only records for a ModernBERT's continued
pretraining, checked against the tokenizers library itself and read by tf.data with exactly their
five features.

The tokenizer.json is a byte-level BPE trained by the tokenizers library on the repo's sample text,
with ModernBERT's special tokens and template (tests/helpers.py `bpe_tokenizer_file`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, run_kbert
from helpers import bpe_tokenizer_file
from kbert.pretraining.record_encoder import MLM_INPUT_KEYS, MLM_LABEL_KEYS
from kbert.runtime.records import parse_example, read_frames

tokenizers = pytest.importorskip("tokenizers")

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
FIVE = set(MLM_INPUT_KEYS + MLM_LABEL_KEYS)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return str(bpe_tokenizer_file(tmp_path_factory.mktemp("tok") / "tokenizer.json", SAMPLE))


def documents_of(path):
    """The file's documents as lists of stripped, non-blank lines (blank lines between documents)."""
    documents, lines = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                lines.append(line.strip())
            elif lines:
                documents.append(lines)
                lines = []
    return documents + ([lines] if lines else [])


def expected_ids(tokenizer_json, path):
    """Each document's ids as the tokenizers library gives them: every line alone, no specials, joined."""
    tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
    return [
        [i for line in lines for i in tokenizer.encode(line, add_special_tokens=False).ids]
        for lines in documents_of(path)
    ]


def records(*paths):
    return [parse_example(data) for path in paths for _, data in read_frames(str(path))]


def create(tmp_path, tokenizer_json, *args, name="data.tfrecord", inputs=(SAMPLE,)):
    out = tmp_path / name
    flags = [a for path in inputs for a in ("--input", path)]
    result = run_kbert("create-data", *flags, "--vocab", tokenizer_json, "--output", out, *args)
    return out, json.loads(result.stdout)


def pieces_of(example, cls, sep):
    """The text ids of one record: the masked positions given their labels back, the ends checked."""
    length = int(example["input_mask"].sum())
    ids = example["input_ids"][:length].copy()
    weights = example["masked_lm_weights"] > 0
    positions = example["masked_lm_positions"][weights]
    ids[positions] = example["masked_lm_ids"][weights]
    assert ids[0] == cls and ids[-1] == sep, ids
    assert (example["input_ids"][length:] == 0).all() and (example["input_mask"][:length] == 1).all()
    return ids[1:-1].tolist()


def test_records_hold_the_five_features_and_give_back_each_documents_ids_in_order(tmp_path, tokenizer_json):
    out, summary = create(
        tmp_path, tokenizer_json, "--max-seq-length", "48", "--dupe-factor", "1", "--short-seq-prob", "0",
        "--workers", "1",
    )  # fmt: skip
    tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    found = records(out)
    assert summary["instances"] == len(found) and summary["objective"] == "mlm"
    assert (summary["max_seq_length"], summary["max_predictions_per_seq"], summary["masked_lm_prob"]) == (48, 14, 0.3)
    assert "random_next_share" not in summary
    lengths = {"input_ids": 48, "input_mask": 48, "masked_lm_positions": 14, "masked_lm_ids": 14}
    lengths["masked_lm_weights"] = 14
    for example in found:
        assert {name: len(values) for name, values in example.items()} == lengths
        positions = example["masked_lm_positions"][example["masked_lm_weights"] > 0]
        assert (np.diff(positions) > 0).all() and positions.min() >= 1
        assert positions.max() < example["input_mask"].sum() - 1  # never the template's [CLS] or [SEP]
    # Every document cut into consecutive pieces of 46 tokens, its last one shorter: the records hold
    # exactly these pieces, none across two documents.
    expected = sorted(
        tuple(ids[start : start + 46])
        for ids in expected_ids(tokenizer_json, SAMPLE)
        for start in range(0, len(ids), 46)
    )
    assert sorted(tuple(pieces_of(example, cls, sep)) for example in found) == expected
    assert len(expected) > 50


def test_short_pieces_are_still_consecutive_runs_of_one_document(tmp_path, tokenizer_json):
    out, _ = create(tmp_path, tokenizer_json, "--max-seq-length", "40", "--dupe-factor", "2", "--short-seq-prob", "0.5")
    tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    documents = [" ".join(map(str, ids)) for ids in expected_ids(tokenizer_json, SAMPLE)]
    pieces = [pieces_of(example, cls, sep) for example in records(out)]
    short = [piece for piece in pieces if len(piece) < 38]
    assert len(short) > len(pieces) // 4  # short targets, and each document's last piece
    for piece in pieces:
        text = " ".join(map(str, piece))
        assert sum(f" {text} " in f" {document} " for document in documents) >= 1, piece
    # Two passes over the text: every token twice.
    assert sum(map(len, pieces)) == 2 * sum(len(d.split()) for d in documents)


def test_masked_share_and_the_80_10_10_split(tmp_path, tokenizer_json):
    out, summary = create(tmp_path, tokenizer_json, "--max-seq-length", "64", "--dupe-factor", "80", "--workers", "1")
    tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
    mask = tokenizer.token_to_id("[MASK]")
    specials = {tokenizer.token_to_id(t) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    masked = shown_mask = kept = other = 0
    shares = []
    for example in records(out):
        weights = example["masked_lm_weights"] > 0
        shown = example["input_ids"][example["masked_lm_positions"][weights]]
        labels = example["masked_lm_ids"][weights]
        masked += len(labels)
        shown_mask += int((shown == mask).sum())
        kept += int((shown == labels).sum())
        replaced = shown[(shown != mask) & (shown != labels)]
        other += len(replaced)
        assert not set(replaced.tolist()) & specials  # random replacements are regular tokens
        shares.append(weights.sum() / example["input_mask"].sum())
    assert masked > 50_000, masked  # enough for the tolerances below to mean something
    assert abs(np.mean(shares) - 0.3) < 0.01, np.mean(shares)
    assert abs(shown_mask / masked - 0.8) < 0.01 and abs(kept / masked - 0.1) < 0.01, (shown_mask, kept, masked)
    assert abs(other / masked - 0.1) < 0.01
    assert summary["mask_token_share"] == pytest.approx(shown_mask / masked, abs=1e-12)
    assert summary["masked_share"] == pytest.approx(np.mean(shares), abs=1e-9)

    from kbert.pretraining.record_statistics import compute_statistics

    read_back = compute_statistics([out], tokenizer_json)
    assert "random_next_share" not in read_back
    for name, value in read_back.items():
        assert summary[name] == pytest.approx(value, abs=1e-9), name


def test_typed_options_win_over_the_tokenizer_jsons_defaults(tmp_path, tokenizer_json):
    out, summary = create(
        tmp_path, tokenizer_json, "--max-seq-length", "32", "--masked-lm-prob", "0.15", "--max-predictions-per-seq",
        "3", "--dupe-factor", "1", "--workers", "1",
    )  # fmt: skip
    assert (summary["masked_lm_prob"], summary["max_predictions_per_seq"]) == (0.15, 3)
    assert {len(example["masked_lm_ids"]) for example in records(out)} == {3}
    # Only --masked-lm-prob typed: the positions follow it, round(32 * 0.5) = 16.
    _, summary = create(
        tmp_path, tokenizer_json, "--max-seq-length", "32", "--masked-lm-prob", "0.5", "--dupe-factor", "1",
        name="half.tfrecord",
    )  # fmt: skip
    assert summary["max_predictions_per_seq"] == 16


def test_same_records_for_any_worker_count_and_on_beam(tmp_path, tokenizer_json):
    pytest.importorskip("apache_beam")
    common = ["--max-seq-length", "32", "--dupe-factor", "2", "--chunk-docs", "1"]
    one, summary = create(tmp_path, tokenizer_json, *common, "--workers", "1", name="one.tfrecord")
    two, _ = create(tmp_path, tokenizer_json, *common, "--workers", "2", name="two.tfrecord")
    beam, beam_summary = create(tmp_path, tokenizer_json, *common, "--runner", "DirectRunner", name="beam.tfrecord")
    assert summary["chunks"] == 3
    assert one.read_bytes() == two.read_bytes() == beam.read_bytes()
    for name in ("instances", "masked_share", "objective", "max_predictions_per_seq"):
        assert beam_summary[name] == summary[name], name
    assert "random_next_share" not in beam_summary
    other, _ = create(tmp_path, tokenizer_json, *common, "--workers", "1", "--seed", "7", name="seed.tfrecord")
    assert other.read_bytes() != one.read_bytes()


def test_tf_data_parses_exactly_the_five_features(tmp_path, tokenizer_json):
    tf = pytest.importorskip("tensorflow")
    out, summary = create(tmp_path, tokenizer_json, "--max-seq-length", "32", "--dupe-factor", "1", "--workers", "1")
    predictions = summary["max_predictions_per_seq"]
    spec = {
        "input_ids": tf.io.FixedLenFeature([32], tf.int64),
        "input_mask": tf.io.FixedLenFeature([32], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([predictions], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([predictions], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([predictions], tf.float32),
    }
    ours = records(out)
    parsed = list(tf.data.TFRecordDataset(str(out)).map(lambda r: tf.io.parse_single_example(r, spec)))
    assert len(parsed) == len(ours) == summary["instances"]
    for theirs, mine in zip(parsed, ours):
        assert set(mine) == FIVE == set(theirs)
        for name in FIVE:
            np.testing.assert_array_equal(theirs[name].numpy(), mine[name])
    # The raw Example holds these five and no other (no segment_ids, no next_sentence_labels).
    raw = next(iter(tf.data.TFRecordDataset(str(out)))).numpy()
    assert set(tf.train.Example.FromString(raw).features.feature) == FIVE


def test_workers_do_not_load_tensorflow(tokenizer_json):
    """A spawned worker builds the tokenizer.json's builder without TensorFlow, whose start-up each
    worker would pay again."""
    code = (
        "import sys, kbert.cli.main; from kbert.pretraining import create_data, worker_pool; "
        f"worker_pool._start_worker({tokenizer_json!r}, None, create_data.DataOptions()); "
        "print(type(worker_pool._BUILDER).__name__, 'tensorflow' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["MlmInstanceBuilder", "False"]


def test_a_roberta_style_template_and_mask_token(tmp_path):
    tokenizer_json = str(
        bpe_tokenizer_file(
            tmp_path / "roberta-tokenizer.json", SAMPLE, ("<s>", "<pad>", "</s>", "<unk>", "<mask>"), (0, 2)
        )
    )
    out, _ = create(tmp_path, tokenizer_json, "--max-seq-length", "32", "--dupe-factor", "1", "--workers", "1")
    tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
    first, last, mask = (tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<mask>"))
    found = records(out)
    pieces = [pieces_of(example, first, last) for example in found]
    assert sum(map(len, pieces)) == sum(map(len, expected_ids(tokenizer_json, SAMPLE)))
    assert sum(int((example["input_ids"] == mask).sum()) for example in found) > len(found)


def refused(tmp_path, *args):
    """Run create-data expecting one line on stderr and nothing written; that line."""
    out = tmp_path / "refused" / "data.tfrecord"
    result = run_kbert("create-data", "--input", SAMPLE, "--output", out, *args, check=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "refused").exists()
    return lines[0]


def test_what_does_not_apply_to_a_tokenizer_json_is_refused_in_one_line(tmp_path, tokenizer_json):
    assert "--whole-word-mask does not apply" in refused(tmp_path, "--vocab", tokenizer_json, "--whole-word-mask")
    for flag in ("--lowercase", "--no-lowercase"):
        line = refused(tmp_path, "--vocab", tokenizer_json, flag)
        assert "--lowercase/--no-lowercase does not apply" in line and "normalizer" in line
    no_mask = bpe_tokenizer_file(tmp_path / "no-mask.json", SAMPLE, ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))
    assert "has no mask token ([MASK] or <mask>)" in refused(tmp_path, "--vocab", no_mask)
    no_template = bpe_tokenizer_file(tmp_path / "no-template.json", SAMPLE, template=None)
    assert "adds no special tokens around a text" in refused(tmp_path, "--vocab", no_template)
    broken = tmp_path / "broken.json"
    broken.write_text(open(tokenizer_json).read()[:200])
    assert "not a tokenizer.json the tokenizers library reads" in refused(tmp_path, "--vocab", broken)
    pytest.importorskip("apache_beam")
    assert "has no mask token" in refused(tmp_path, "--vocab", no_mask, "--runner", "DirectRunner")


def test_help_says_both_defaults():
    text = " ".join(run_kbert("create-data", "--help", own_process=False).stdout.split())
    for said in ("0.15 for a vocab.txt, 0.3 for a tokenizer.json", "Default: 20 for a vocab.txt", "tokenizer.json"):
        assert said in text.replace("│ ", ""), said
