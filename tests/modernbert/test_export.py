"""A ModernBERT exported for TF Serving: its tokenizer.json as TensorFlow ops, giving the ids of
Hugging Face's `tokenizers` on hard text and on every kind of tokenizer.json the graph takes, and
the export's outputs, served by the stand-in TF Serving, equal to transformers'."""

import copy
import json
import random

import numpy as np
import pytest
import tensorflow as tf
from test_modernbert import CONFIGS, HARD_TEXTS, TEXTS, batch_of, make_hf_folder, reference, train_tokenizer

from conftest import assert_user_error, run_kbert
from helpers import start_standin_server

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Characters where a byte-level split goes wrong: whitespace of every kind and in runs, quotes
# after punctuation and emoji, letters and digits newer than RE2's tables, combining marks.
PIECES = [
    *"ab Z9'sdtlmrev.,!?-_", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0", "\u2009", "\u202f", "\u3000",
    "\u2028", "\u0085", "\u1680", "\u200b", "६", "é", "日", "🙂", "'s", "'ll", "1", "٣", "Ⅻ", "\u0301", "ǅ",
    "[MASK]", "[SEP]", "\U00010d4a", "\U00010d40", "\x1c",
]  # fmt: skip


def random_texts(n, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14))) for _ in range(n)]


def with_changes(spec, change) -> dict:
    spec = copy.deepcopy(spec)
    change(spec)
    return spec


def _added_tokens(spec):
    """[MASK] taking the whitespace before it, [SEP] after it, and tokens that are not special:
    whitespace runs (as ModernBERT's own tokenizer.json has) and a placeholder."""
    for token in spec["added_tokens"]:
        token["lstrip"] = token["content"] == "[MASK]"
        token["rstrip"] = token["content"] == "[SEP]"
    first = max(spec["model"]["vocab"].values()) + 1
    for i, content in enumerate(["  ", "   ", "\t\t", "|||IP_ADDRESS|||"]):
        spec["added_tokens"].append(
            dict(id=first + i, content=content, single_word=False, lstrip=False, rstrip=False, normalized=False)
            | {"special": False}
        )


VARIANTS = {
    "as trained": lambda spec: None,
    "added tokens": _added_tokens,
    "prefix space": lambda spec: spec["pre_tokenizer"].update(add_prefix_space=True),
    "NFC": lambda spec: spec.update(normalizer={"type": "NFC"}),
    "ignore merges": lambda spec: spec["model"].update(ignore_merges=True),
    "RoBERTa's pairs": lambda spec: spec.update(
        post_processor={
            "type": "RobertaProcessing",
            "sep": ["[SEP]", 2],
            "cls": ["[CLS]", 1],
            "trim_offsets": True,
            "add_prefix_space": False,
        }
    ),
}


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer().save(str(path))
    return path


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_graph_gives_the_ids_of_tokenizers(tokenizer_file, tmp_path, variant):
    from tokenizers import Tokenizer

    from kbert.modernbert.graph_tokenizer import BpeGraphPacker
    from kbert.modernbert.packing import BpePacker

    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(with_changes(json.loads(tokenizer_file.read_text()), VARIANTS[variant])))
    texts = HARD_TEXTS + TEXTS + random_texts(1500)
    theirs = Tokenizer.from_file(str(path))
    graph = BpeGraphPacker(path, 16, pad_token_id=3)
    got = graph.token_ids(tf.constant(texts)).to_list()
    wrong = [(t, g) for t, g in zip(texts, got) if g != theirs.encode(t, add_special_tokens=False).ids]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, first: {wrong[0]}"

    # Rows as the Python packer makes them: the template, pairs cut longest first, "" as no pair.
    packer = BpePacker(path, 3, 16)
    a, b = texts[:600], texts[600:1200]
    for inputs in ((a,), (a, b)):
        expected, _ = packer.encode(*inputs)
        ours = graph(tuple(tf.constant(x) for x in inputs) if len(inputs) == 2 else tf.constant(a))
        for name in expected:
            np.testing.assert_array_equal(ours[name].numpy(), expected[name], err_msg=f"{name}, {len(inputs)} texts")
    sentences = [t.split() for t in texts[:400]] + [[], ["a", "", "b"]]
    expected, positions, truncated = packer.encode_words(sentences)
    ours, our_positions, our_truncated = graph.pack_words(tf.ragged.constant(sentences, tf.string, ragged_rank=1))
    np.testing.assert_array_equal(ours["input_ids"].numpy(), expected["input_ids"])
    assert our_positions.to_list() == positions.to_list()
    assert our_truncated.numpy().tolist() == truncated.tolist()


def test_the_graph_knows_the_letters_and_numbers_of_tokenizers():
    """Every code point is a letter, a number, whitespace or else to the graph's regex classes
    exactly as to the installed `tokenizers` (whose Unicode is newer than RE2's)."""
    from kbert.modernbert.onig_classes import LETTER, NUMBER, WHITESPACE, probe_classes

    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    chars = tf.constant([chr(cp).encode() for cp in code_points])
    kinds = np.full(len(code_points), "O")
    for kind, pattern in (("S", f"[{WHITESPACE}]"), ("N", f"[{NUMBER}]"), ("L", f"[{LETTER}]")):
        kinds[tf.strings.regex_full_match(chars, pattern).numpy()] = kind
    expected = np.full(len(code_points), "O")
    index = {cp: i for i, cp in enumerate(code_points)}
    for kind, ranges in probe_classes().items():
        for first, last in ranges:
            expected[[index[cp] for cp in range(first, last + 1)]] = kind
    differ = np.flatnonzero(kinds != expected)
    assert differ.size == 0, [(hex(code_points[i]), kinds[i], expected[i]) for i in differ[:10]]


def test_a_tokenizer_json_the_graph_cannot_run_is_refused_in_one_line(tokenizer_file, tmp_path):
    from kbert.modernbert.graph_tokenizer import graph_problem

    spec = json.loads(tokenizer_file.read_text())
    assert graph_problem(tokenizer_file) is None
    for change, said in (
        (lambda s: s["model"].update(dropout=0.1), "BPE dropout"),
        (lambda s: s.update(normalizer={"type": "Lowercase"}), "normalizer Lowercase"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer Whitespace"),
        (lambda s: s["added_tokens"][0].update(single_word=True), "single_word"),
        (lambda s: s.update(model={"type": "WordPiece", "vocab": {}}), "model WordPiece"),
    ):
        path = tmp_path / "tokenizer.json"
        path.write_text(json.dumps(with_changes(spec, change)))
        line = graph_problem(path)
        assert said in line and "kbert predict" in line and "\n" not in line


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A classifier, an encoder and a tagger of random weights in transformers, converted and
    exported in float32 (the classifier in bfloat16 and int8 too, the encoder with its weights as
    graph constants), served by the stand-in."""
    tokenizer = train_tokenizer()
    root = tmp_path_factory.mktemp("exports")
    made = {}
    for name in ("classifier_mean", "masked_lm", "tagger"):
        model = make_hf_folder(root / name / "hf", tokenizer, seed=7, **CONFIGS[name])
        run_kbert("convert", "from-hf", root / name / "hf", root / name / "kbert")
        precisions = ("float32", "bfloat16", "int8") if name == "classifier_mean" else ("float32",)
        # The encoder's weights as graph constants (--constant-weights), the others' as variables.
        constants = ["--constant-weights"] if name == "masked_lm" else []
        for precision in precisions:
            run_kbert(
                "export", root / name / "kbert", root / "serving" / f"{name}-{precision}",
                "--precision", precision, "--max-seq-length", "64", *constants,
            )  # fmt: skip
        made[name] = (root / name / "hf", model, root / name / "kbert")
    configs = sorted((root / "serving").glob("*/models.config"))
    process, ready = start_standin_server(configs, root / "server.log")
    try:
        yield {"root": root, "models": made, "rest": f"http://127.0.0.1:{ready['rest_port']}"}
    finally:
        process.terminate()
        process.wait(timeout=30)


def served_rows(exported, name, path):
    out = run_kbert("predict", "--server", exported["rest"], "--model", name, "--input", path).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_served_probabilities_are_those_of_transformers(exported, tmp_path):
    hf_folder, model, kbert_dir = exported["models"]["classifier_mean"]
    (tmp_path / "in.tsv").write_text("text\n" + "".join(f"{t}\n" for t in TEXTS))
    with torch.no_grad():
        expected = torch.softmax(torch.tensor(reference(model, batch_of(hf_folder, TEXTS))["logits"]), -1).numpy()
    labels = [model.config.id2label[i] for i in range(expected.shape[1])]
    local = [
        json.loads(line) for line in run_kbert("predict", kbert_dir, "--input", tmp_path / "in.tsv").stdout.splitlines()
    ]
    for precision, tolerance in (("float32", 1e-4), ("bfloat16", 5e-2), ("int8", 5e-2)):
        rows = served_rows(exported, f"classifier_mean-{precision}", tmp_path / "in.tsv")
        ours = np.array([[row["probabilities"][label] for label in labels] for row in rows])
        gap = float(np.max(np.abs(ours - expected)))
        assert gap < tolerance, f"{precision}: {gap:.2e} from transformers"
        if precision == "float32":
            cli = np.array([[row["probabilities"][label] for label in labels] for row in local])
            np.testing.assert_allclose(cli, expected, atol=1e-4)


def test_the_served_encoder_gives_the_last_hidden_states_and_serve_ids_takes_two_inputs(exported):
    from kbert.serving.signatures import holds_no_variables

    assert holds_no_variables(str(exported["root"] / "serving" / "masked_lm-float32" / "1"))
    hf_folder, model, _ = exported["models"]["masked_lm"]
    saved = tf.saved_model.load(str(exported["root"] / "serving" / "masked_lm-float32" / "1"))
    batch = batch_of(hf_folder, TEXTS)
    expected = reference(model, batch)["sequence_output"]
    mask = batch["input_mask"].astype(bool)
    by_text = saved.signatures["serving_default"](text=tf.constant(TEXTS))
    by_ids = saved.signatures["serve_ids"](**{k: tf.constant(v) for k, v in batch.items()})
    assert sorted(saved.signatures["serve_ids"].structured_input_signature[1]) == ["input_ids", "input_mask"]
    assert sorted(by_text) == ["input_mask", "sequence_output"]  # a ModernBERT has no pooler
    for out in (by_text, by_ids):
        ours = out["sequence_output"].numpy()[:, : mask.shape[1]]
        assert float(np.max(np.abs(ours[mask] - expected[mask]))) < 1e-4
    assert (exported["root"] / "serving" / "masked_lm-float32" / "1" / "assets" / "tokenizer.json").is_file()


def test_the_served_tagger_tags_each_word_as_kbert_predict_does(exported, tmp_path):
    hf_folder, model, kbert_dir = exported["models"]["tagger"]
    conll = tmp_path / "in.conll"
    conll.write_text("EU\tO\nrejects\tO\nGerman\tO\ncall\tO\n\n" + "".join(f"w{i}\tO\n" for i in range(80)) + "\n")
    local = [
        json.loads(line)
        for line in run_kbert("predict", kbert_dir, "--input", conll, "--max-seq-length", "64").stdout.splitlines()
    ]
    served = served_rows(exported, "tagger-float32", conll)
    assert [row["tags"] for row in served] == [row["tags"] for row in local]
    assert len(served[1]["tags"]) == 80  # words past the length still get a tag
    batch = batch_of(hf_folder, TEXTS)
    saved = tf.saved_model.load(str(exported["root"] / "serving" / "tagger-float32" / "1"))
    label_id = saved.signatures["serve_ids"](**{k: tf.constant(v) for k, v in batch.items()})["label_id"].numpy()
    mask = batch["input_mask"].astype(bool)
    expected = reference(model, batch)["logits"].argmax(-1)
    assert (label_id[:, : mask.shape[1]][mask] == expected[mask]).all()


def test_what_an_export_cannot_build_for_a_modernbert_is_said_in_one_line(exported, tmp_path):
    _, _, kbert_dir = exported["models"]["masked_lm"]
    done = run_kbert("export", kbert_dir, tmp_path / "hub", "--format", "tfhub", check=False)
    assert_user_error(done, "TF Hub's BERT format", "exports for TF Serving")
    assert not (tmp_path / "hub").exists()
    # Calibrated int8 ranges are measured on a BERT's dense layers; a ModernBERT's int8 is per row.
    texts = tmp_path / "texts.txt"
    texts.write_text("A first text to calibrate on.\nAnd a second one.\n")
    calibrated = ("--precision", "int8", "--int8-ranges", "calibrated", "--calibration", texts)
    done = run_kbert("export", kbert_dir, tmp_path / "served", *calibrated, check=False)
    assert_user_error(done, "--int8-ranges calibrated", "quantizes per row")
    assert not (tmp_path / "served").exists()
    # A tokenizer.json the graph cannot run: the export says so, and writes nothing.
    other = tmp_path / "model"
    run_kbert("convert", "from-hf", exported["models"]["masked_lm"][0], other)
    spec = json.loads((other / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    (other / "tokenizer.json").write_text(json.dumps(spec))
    done = run_kbert("export", other, tmp_path / "served", check=False)
    assert_user_error(done, "normalizer Lowercase", "kbert predict")
    assert not (tmp_path / "served").exists()
    # A classifier that reads long documents in windows: served by kbert predict, not in a graph yet.
    windows = tmp_path / "windows"
    run_kbert("convert", "from-hf", exported["models"]["classifier_mean"][0], windows)
    config = json.loads((windows / "config.json").read_text())
    config.update(task="classify", long_text="windows", doc_stride=8, max_seq_length=32)
    (windows / "config.json").write_text(json.dumps(config))
    done = run_kbert("export", windows, tmp_path / "served", check=False)
    assert_user_error(done, "long_text windows", "kbert predict")
    assert not (tmp_path / "served").exists()
