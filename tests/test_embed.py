"""Sentence embeddings: `kbert.model.pooling` against sentence-transformers' own Pooling code,
`kbert.embed` and `kbert embed` against `SentenceTransformer.encode` on models sentence-transformers
itself saved (tf1-tiny's Hugging Face copy with each pooling mode), the command's outputs
(jsonl, npy, stdout) against each other and the Python API, a killed run resumed, long texts in
windows, and the bad inputs. The real all-MiniLM-L6-v2 round trips are in
tests/converters/test_sentence_transformers.py.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import FIXTURES, assert_user_error, kbert_command, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers reads local folders only

HF_TINY = os.path.join(FIXTURES, "hf-tiny")
SAMPLE_TEXT = os.path.join(FIXTURES, "sample_text.txt")
# sentence-transformers' names of the four modes, by kbert's.
ST_MODES = {"cls": "cls", "mean": "mean", "max": "max", "mean_sqrt_len": "mean_sqrt_len_tokens"}
WORDS = FILLER + POSITIVE + NEGATIVE


def texts_of(n, seed=0):
    """n distinct texts of the tiny vocabulary's words, 1 to 40 words long, so that batches of
    one length and of many lengths both occur."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        digits = [WORDS[(i // len(WORDS) ** k) % len(WORDS)] for k in range(3)]
        texts.append(" ".join(digits + list(rng.choice(WORDS, size=int(rng.integers(0, 38))))) + ".")
    return texts


def tiny_sentence_transformer(folder, mode: str, normalize: bool = True, max_seq_length: int = 32):
    """A sentence-transformers model that sentence-transformers itself builds and saves: tf1-tiny's
    Hugging Face copy (hf-tiny), then Pooling in `mode` (kbert's name), then Normalize."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(HF_TINY, max_seq_length=max_seq_length)
    modules = [transformer, models.Pooling(64, pooling_mode=ST_MODES[mode])]
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    # hf-tiny's tokenizer.json lacks the ids of vocab.txt's repeated tokens, so kbert reads vocab.txt.
    shutil.copy(os.path.join(HF_TINY, "vocab.txt"), folder)
    return folder


def st_vectors(folder, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=16, convert_to_numpy=True)


def assert_same_vectors(ours, theirs, atol=1e-5):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= atol
    cosine = (ours * theirs).sum(1) / np.maximum(np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1), 1e-30)
    assert cosine.min() >= 0.99999


# === Pooling: kbert.model.pooling against sentence_transformers' Pooling and Normalize ===


@pytest.mark.parametrize("mode", list(ST_MODES))
def test_pooling_is_sentence_transformers_pooling(mode):
    import torch
    from sentence_transformers import models

    from kbert.model.pooling import l2_normalize, pool

    rng = np.random.default_rng(7)
    tokens = rng.normal(size=(4, 9, 16)).astype(np.float32) * 3
    mask = np.zeros((4, 9), np.int32)
    for row, length in enumerate([9, 5, 1, 3]):  # a full row, padded rows, a row of one token
        mask[row, :length] = 1
    features = {"token_embeddings": torch.tensor(tokens), "attention_mask": torch.tensor(mask)}
    theirs = models.Pooling(16, pooling_mode=ST_MODES[mode])(features)["sentence_embedding"]
    ours = np.asarray(pool(tokens, mask, mode))
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-6)
    normalized = models.Normalize()({"sentence_embedding": theirs})["sentence_embedding"]
    np.testing.assert_allclose(np.asarray(l2_normalize(ours)), normalized.numpy(), rtol=0, atol=1e-6)


# === kbert.embed against SentenceTransformer.encode ===

TEXTS = texts_of(40) + ["", "gold", " ".join(["glittering"] * 50) + "."]  # "", one word, one past 32 tokens


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """{mode: a saved sentence-transformers folder}; mean pools without Normalize."""
    base = tmp_path_factory.mktemp("st")
    return {mode: tiny_sentence_transformer(base / mode, mode, normalize=mode != "mean") for mode in ST_MODES}


@pytest.fixture(scope="module")
def tiny_kbert_model(tiny_models, tmp_path_factory):
    """The cls model converted to a kbert model directory (which opens without log lines)."""
    out = tmp_path_factory.mktemp("kbert") / "cls"
    run_kbert("convert", "from-hf", tiny_models["cls"], out)
    return out


@pytest.mark.parametrize("mode", list(ST_MODES))
def test_embed_gives_sentence_transformers_vectors(tiny_models, mode):
    import kbert

    ours = kbert.embed(tiny_models[mode], TEXTS, batch_size=8)
    assert ours.dtype == np.float32
    assert_same_vectors(ours, st_vectors(tiny_models[mode], TEXTS))


def test_a_plain_bert_embeds_with_the_pooling_given(tiny_models, tmp_path):
    """hf-tiny has no modules.json: --pooling and --no-normalize say what the sentence-transformers
    model built on it does."""
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS[:-3]) + "\n")
    flags = ("--pooling", "mean", "--no-normalize", "--max-seq-length", "32")  # what the tiny model records
    result = run_kbert("embed", HF_TINY, "--input", source, *flags)
    ours = [json.loads(line)["embedding"] for line in result.stdout.splitlines()]
    assert_same_vectors(ours, st_vectors(tiny_models["mean"], TEXTS[:-3]))


def test_the_command_outputs_agree_with_each_other_and_the_python_api(tiny_models, tmp_path):
    import kbert

    model = tmp_path / "model"
    converted = json.loads(run_kbert("convert", "from-hf", tiny_models["max"], model).stdout)
    assert converted["embedding"] == {"pooling": "max", "normalize": True, "max_seq_length": 32}
    source = tmp_path / "texts.txt"
    source.write_text("\n\n".join(TEXTS[:-3]) + "\n")  # blank lines are skipped, not embedded
    stdout = run_kbert("embed", model, "--input", source, "--batch-size", "8").stdout
    from_stdout = np.array([json.loads(line)["embedding"] for line in stdout.splitlines()], np.float32)
    summary = run_kbert("embed", model, "--input", source, "--output", tmp_path / "v.jsonl", "--batch-size", "8")
    assert json.loads(summary.stdout) == {"output": str(tmp_path / "v.jsonl"), "rows": 40, "rows_kept": 0}
    from_file = np.array([json.loads(line)["embedding"] for line in open(tmp_path / "v.jsonl")], np.float32)
    summary = run_kbert(
        "embed", model, "--input", source, "--output", tmp_path / "v.npy", "--format", "npy", "--batch-size", "8"
    )
    assert json.loads(summary.stdout) == {"output": str(tmp_path / "v.npy"), "rows": 40, "dimensions": 64}
    from_npy = np.load(tmp_path / "v.npy")
    assert from_npy.dtype == np.float32 and from_npy.shape == (40, 64)
    # The JSON numbers read back to the very float32 values of the array.
    np.testing.assert_array_equal(from_stdout, from_npy)
    np.testing.assert_array_equal(from_file, from_npy)
    np.testing.assert_allclose(kbert.embed(model, TEXTS[:-3], batch_size=8), from_npy, rtol=0, atol=1e-6)
    assert_same_vectors(from_npy, st_vectors(tiny_models["max"], TEXTS[:-3]))
    # A .keras file keeps the record, and embeds the same.
    kbert.load(model).save(tmp_path / "model.keras")
    assert kbert.load(tmp_path / "model.keras").config.extras["embedding"] == converted["embedding"]
    np.testing.assert_allclose(kbert.embed(tmp_path / "model.keras", TEXTS[:-3]), from_npy, rtol=0, atol=1e-6)
    inspected = json.loads(run_kbert("convert", "inspect", tmp_path / "model.keras").stdout)
    assert inspected["embedding"] == converted["embedding"]


def test_a_table_embeds_its_text_column_and_an_empty_cell_as_sentence_transformers_does(tiny_models, tmp_path):
    source = tmp_path / "texts.jsonl"
    rows = [{"text": "gold dust.", "label": "x"}, {"text": ""}, {"text": "young and fresh."}]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_kbert("embed", tiny_models["cls"], "--input", source)
    ours = [json.loads(line)["embedding"] for line in result.stdout.splitlines()]
    assert_same_vectors(ours, st_vectors(tiny_models["cls"], [row["text"] for row in rows]))


def test_long_texts_in_windows_are_the_mean_of_their_windows(tiny_models, tmp_path):
    """Each window pooled as sentence-transformers pools a text of its tokens (transformers'
    BertModel, Pooling), the windows' mean, then normalised."""
    import torch
    from sentence_transformers import models
    from transformers import BertModel

    import kbert
    from kbert.finetuning.encoding import encode_text_windows
    from kbert.text.graph_packer import BertPreprocessor

    texts = [" ".join(texts_of(6, seed=3)), "gold dust.", " ".join(texts_of(6, seed=4))]
    ours = kbert.embed(tiny_models["max"], texts, long_text="windows", doc_stride=10, batch_size=4)
    features, windows = encode_text_windows(BertPreprocessor(os.path.join(HF_TINY, "vocab.txt"), True, 32), texts, 10)
    assert windows.counts.tolist()[1] == 1 and min(windows.counts[[0, 2]]) > 1
    bert = BertModel.from_pretrained(str(tiny_models["max"])).eval()
    with torch.no_grad():
        ids, mask = torch.tensor(features["input_ids"]).long(), torch.tensor(features["input_mask"]).long()
        tokens = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
        pooled = models.Pooling(64, pooling_mode="max")({"token_embeddings": tokens, "attention_mask": mask})
    pooled = pooled["sentence_embedding"].numpy()
    means = np.stack([pooled[windows.document == d].mean(0) for d in range(3)])
    expected = means / np.linalg.norm(means, axis=1, keepdims=True)
    assert_same_vectors(ours, expected)
    # A text that fits in one window gets its truncate vector.
    np.testing.assert_allclose(ours[1], kbert.embed(tiny_models["max"], ["gold dust."])[0], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_rows(tiny_models, tmp_path):
    from kbert.finetuning.output import partial_path

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts_of(6_000, seed=1)) + "\n")
    model, full, out = tiny_models["mean"], tmp_path / "full.jsonl", tmp_path / "out.jsonl"
    run_kbert("embed", model, "--input", source, "--output", full, "--max-seq-length", "16")
    env = {k: v for k, v in os.environ.items() if k != "KBERT_DEBUG"}
    args = ["embed", str(model), "--input", str(source), "--output", str(out), "--max-seq-length", "16"]
    job = subprocess.Popen(kbert_command() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    partial, deadline = partial_path(out), time.monotonic() + 300
    while not os.path.exists(partial) or open(partial, "rb").read().count(b"\n") < 256:
        assert job.poll() is None, job.stderr.read()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    job.send_signal(signal.SIGKILL)
    job.communicate(timeout=120)
    kept = open(partial, "rb").read().count(b"\n")
    assert 256 <= kept < 6_000 and not out.exists()
    rows = open(partial, "rb").read()
    # Vectors of another pooling or normalisation, or of another model, would follow these: refused.
    for other, said in [
        (["--pooling", "cls", "--no-normalize"], "made with the default --pooling and the default --normalize, "
         "and this run has --pooling cls and no --normalize"),
        (["--max-seq-length", "32"], "made with --max-seq-length 16, and this run has --max-seq-length 32"),
    ]:  # fmt: skip
        flags = args[:-2] + other if other[0] == "--max-seq-length" else args + other
        assert_user_error(
            run_kbert(*flags, "--resume", check=False), said, "or pass --overwrite to start again", alone=False
        )
    another = ["embed", str(tiny_models["max"]), *args[2:]]
    assert_user_error(run_kbert(*another, "--resume", check=False), f"holds the rows of {model}, not of", alone=False)
    assert open(partial, "rb").read() == rows
    result = run_kbert(*args, "--resume")
    assert json.loads(result.stdout) == {"output": str(out), "rows": 6_000, "rows_kept": kept}
    resumed = np.array([json.loads(line)["embedding"] for line in open(out)])
    uninterrupted = np.array([json.loads(line)["embedding"] for line in open(full)])
    assert resumed.shape == uninterrupted.shape == (6_000, 64)
    assert np.abs(resumed - uninterrupted).max() <= 1e-6


# === Bad inputs ===


def test_a_model_with_no_pooling_recorded_is_one_line_naming_pooling(tmp_path):
    import kbert

    source = tmp_path / "texts.txt"
    source.write_text("gold dust.\n")
    result = run_kbert("embed", HF_TINY, "--input", source, check=False)
    assert_user_error(result, "records no sentence-embedding pooling", "--pooling cls|mean|max|mean_sqrt_len")
    with pytest.raises(kbert.KbertError, match="pooling='cls', 'mean', 'max' or 'mean_sqrt_len'"):
        kbert.embed(HF_TINY, ["gold dust."])


def test_blank_lines_are_said_in_every_output_format(tiny_kbert_model, tmp_path):
    """Row N is not line N after a blank line: said on stderr, whatever the output (a vector per text)."""
    source = tmp_path / "texts.txt"
    source.write_text("gold dust.\n\nthe camp.\n")
    for flags in (
        [],
        ["--output", str(tmp_path / "v.jsonl")],
        ["--output", str(tmp_path / "v.npy"), "--format", "npy"],
    ):
        result = run_kbert("embed", tiny_kbert_model, "--input", source, "--pooling", "mean", *flags)
        said = f"{source}: skipped 1 blank line (line 2); the rows follow the other lines, in order"
        assert said in result.stderr, (flags, result.stderr)
    assert np.load(tmp_path / "v.npy").shape[0] == 2


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--format", "npy"], "--format npy writes one array to a file: give --output FILE.npy"),
        (["--format", "csv"], "--format csv: give jsonl or npy"),
        (["--pooling", "sum"], "--pooling sum: use one of cls, mean, max, mean_sqrt_len"),
        (["--doc-stride", "4"], "--doc-stride 4 applies to --long-text windows"),
        (["--long-text", "windows", "--doc-stride", "30"], "--doc-stride 30 must be less than the 30 tokens"),
        (["--output", "OUT.npy", "--format", "npy", "--resume"], "--resume applies to --format jsonl"),
    ],
)
def test_bad_options_are_one_line(tiny_kbert_model, tmp_path, flags, said):
    source = tmp_path / "texts.txt"
    source.write_text("gold dust.\n")
    flags = [str(tmp_path / f) if f == "OUT.npy" else f for f in flags]
    result = run_kbert("embed", tiny_kbert_model, "--input", source, *flags, check=False)
    assert_user_error(result, said)
    assert os.listdir(tmp_path) == ["texts.txt"]


def test_a_table_of_text_pairs_is_refused_and_a_line_with_the_pair_marker_is_one_text(tiny_kbert_model, tmp_path):
    import kbert
    from kbert.finetuning.embedding import read_texts

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("text\ttext_b\ngold.\tdust.\n")
    result = run_kbert("embed", tiny_kbert_model, "--input", pairs, "--output", tmp_path / "v.jsonl", check=False)
    assert_user_error(result, "has a second text column (text_b), but kbert embed embeds one text per row")
    assert sorted(os.listdir(tmp_path)) == ["pairs.tsv"]
    lines = tmp_path / "lines.txt"
    lines.write_text("gold. ||| dust.\n")
    assert read_texts(lines) == ["gold. ||| dust."]
    with pytest.raises(kbert.KbertError, match="texts must be a list of texts"):
        kbert.embed(tiny_kbert_model, "gold dust.")


def test_an_existing_npy_output_needs_overwrite(tiny_kbert_model, tmp_path):
    source, out = tmp_path / "texts.txt", tmp_path / "v.npy"
    source.write_text("gold dust.\n")
    out.write_bytes(b"keep")
    args = ("embed", tiny_kbert_model, "--input", source, "--output", out, "--format", "npy")
    assert_user_error(run_kbert(*args, check=False), f"{out} exists; pass --overwrite")
    assert out.read_bytes() == b"keep"
    run_kbert(*args, "--overwrite")
    assert np.load(out).shape == (1, 64)
