"""`kbert extend --words`: every format and every command carries the grown vocabulary.

The original tiny checkpoint (300 tokens, 3 `[unusedN]` slots) is given five words of
sample_text.txt that its vocabulary splits into pieces: three take the slots (ids 1-3), two are
appended (ids 300 and 301, vocab_size 302). Real text with those words then goes through each
tokenizer (Python, in-graph, Hugging Face, keras-hub), each command that reads a vocabulary
(create-data, pretrain, finetune, predict, export) and each format kbert writes (TF Serving, TF
Hub, google-research, Hugging Face, keras-hub), checked against the model itself or, for the
google-research checkpoint, against the original code.
"""

import json
import os

import keras_hub
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the TF Hub preprocessor's ops, as its users import them)

import kbert
from conftest import TINY, run_kbert
from helpers import original_code_report, original_outputs, saved_weights, write_tsv
from kbert.text.graph_packer import BertPreprocessor
from kbert.text.graph_tokenizer import GraphTokenizer
from test_create_data import read_examples

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

# The [unusedN] slots in id order, then past the last id.
NEW_IDS = {"philammon": 1, "indeed": 2, "line": 3, "monk": 300, "sand": 301}
# Fragments of sample_text.txt (each at most 31 tokens with [CLS] and [SEP]); the last has none of
# the new words and must tokenize as before.
TEXTS = [
    "Text should be one-sentence-per-line, with empty lines between documents.",
    "Indeed, it was recorded in Blazing Star",
    "more terrible than any dead wilderness of sand which he had left behind.",
    "and looked askance at the young monk, to watch the effect",
    "and there burst on Philammon's astonished eyes a vast semicircle of blue sea",
    "The rain had only ceased with the gray streaks of morning at Blazing Star",
]
LENGTH = 32
CLS, SEP = 5, 6  # tf1-tiny's ids, unchanged by the growth


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """tf1-tiny given the five words by `kbert extend --words`: the model directory."""
    work = tmp_path_factory.mktemp("extend-words")
    (work / "words.txt").write_text("\n".join(NEW_IDS) + "\n")
    result = json.loads(run_kbert("extend", TINY, work / "tiny-302", "--words", work / "words.txt").stdout)
    assert result["new_words"] == {"added": 5, "slots": 3, "appended": 2, "words": list(NEW_IDS)}
    assert result["vocab_size"] == {"from": 300, "to": 302} and result["kbert_model"] == "pretrainer"
    return work / "tiny-302"


@pytest.fixture(scope="module")
def model(extended):
    return kbert.load(extended)


@pytest.fixture(scope="module")
def local(model):
    """TEXTS packed by the model's own BertPreprocessor at LENGTH, every position an MLM
    position, and the model's outputs on them: (inputs, outputs) as numpy."""
    features = BertPreprocessor.for_model(model, LENGTH)(tf.constant(TEXTS))
    inputs = {k: v.numpy() for k, v in features.items()}
    inputs["masked_lm_positions"] = np.tile(np.arange(LENGTH, dtype="int32"), (len(TEXTS), 1))
    return inputs, {k: np.asarray(v) for k, v in model(inputs, training=False).items()}


def python_ids(model_dir):
    """TEXTS' ids by the Python tokenizer of `model_dir`, with [CLS] and [SEP]."""
    tokenizer = kbert.Tokenizer.from_model_dir(model_dir)
    return [[CLS] + tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text)) + [SEP] for text in TEXTS]


def padded(ids):
    return [row + [0] * (LENGTH - len(row)) for row in ids]


def same_vocab(path, extended):
    return open(path, "rb").read() == (extended / "vocab.txt").read_bytes()


def test_python_and_in_graph_tokenizers_give_the_new_words_their_new_ids(extended, model):
    vocab = (extended / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == model.config.vocab_size == 302
    assert {word: vocab.index(word) for word in NEW_IDS} == NEW_IDS
    assert os.path.samefile(model.vocab_file, extended / "vocab.txt")
    tokenizer = kbert.Tokenizer.from_model_dir(extended)
    # "lines" now begins with a new word: l ##i ##n ##e ##s became line ##s.
    assert tokenizer.tokenize("empty lines")[1:] == ["line", "##s"]
    expected = python_ids(extended)
    assert set(NEW_IDS.values()) <= {i for row in expected for i in row} and max(map(max, expected)) == 301
    assert expected[-1] == python_ids(TINY)[-1]  # no new word: the old ids
    assert all(len(row) <= LENGTH for row in expected)  # nothing truncated below

    graph = GraphTokenizer(model.vocab_file, model.do_lower_case)
    assert graph(tf.constant(TEXTS)).to_list() == [row[1:-1] for row in expected]
    # The preprocessor as serving/export.py builds it from the loaded model.
    packed = BertPreprocessor(model.vocab_file, model.do_lower_case, LENGTH)(tf.constant(TEXTS))
    assert packed["input_ids"].numpy().tolist() == padded(expected)


# Three documents of two TEXTS each. At 64 tokens a record holds a document or most of two, so
# create-data's truncation leaves each new word in some record (at 32 it cut "philammon" from all).
DOCUMENTS = [TEXTS[0:2], TEXTS[2:4], TEXTS[4:6]]
RECORD_SHAPE = ["--max-seq-length", 64, "--max-predictions-per-seq", 5]


@pytest.fixture(scope="module")
def records(extended, tmp_path_factory):
    work = tmp_path_factory.mktemp("records")
    corpus = work / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(document) for document in DOCUMENTS) + "\n", encoding="utf-8")
    out = work / "extended.tfrecord"
    vocab = extended / "vocab.txt"
    run_kbert(
        "create-data",
        "--input",
        corpus,
        "--vocab",
        vocab,
        "--output",
        out,
        *RECORD_SHAPE,
        "--dupe-factor",
        2,
        "--workers",
        1,
    )
    return out


def test_create_data_writes_the_new_ids(extended, records):
    tokenizer = kbert.Tokenizer.from_model_dir(extended)
    streams = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(" ".join(doc))) for doc in DOCUMENTS]
    examples = read_examples(records)
    assert len(examples) >= 6
    seen = set()
    for example in examples:
        ids = list(example["input_ids"][: sum(example["input_mask"])])
        for position, label, weight in zip(
            example["masked_lm_positions"], example["masked_lm_ids"], example["masked_lm_weights"]
        ):
            if weight:
                ids[position] = label  # the text before masking
        assert ids[0] == CLS and ids[-1] == SEP and ids.count(SEP) == 2
        first_sep = ids.index(SEP)
        # Each segment is a run of one document's tokens under the new vocabulary ("monk" one
        # token, not the four pieces the old vocabulary made of it).
        for segment in (ids[1:first_sep], ids[first_sep + 1 : -1]):
            assert any(stream[i : i + len(segment)] == segment for stream in streams for i in range(len(stream))), (
                tokenizer.convert_ids_to_tokens(segment)
            )
        seen.update(ids)
    assert set(NEW_IDS.values()) <= seen and max(seen) == 301


def test_pretrain_init_trains_the_grown_model_and_keeps_its_vocabulary(extended, records, tmp_path):
    result = run_kbert(
        "pretrain",
        "--model-dir",
        tmp_path / "run",
        "--init",
        extended,
        "--data",
        records,
        *RECORD_SHAPE,
        "--steps",
        2,
        "--batch-size",
        4,
    )
    metrics = json.loads(result.stdout)
    assert metrics["step"] == 2 and np.isfinite(metrics["loss"]) and np.isfinite(metrics["mlm_loss"])
    trained = kbert.load(tmp_path / "run")
    assert trained.config.vocab_size == 302
    assert tuple(trained.encoder.embeddings.word_embeddings.embeddings.shape) == (302, 64)
    assert tuple(trained.mlm_head.output_bias.shape) == (302,)
    assert same_vocab(tmp_path / "run" / "vocab.txt", extended)


def test_finetune_and_predict_read_the_new_words(extended, tmp_path):
    rows = [(text, "pos" if i % 2 else "neg") for i, text in enumerate(TEXTS * 3)]
    run_kbert(
        "finetune",
        extended,
        "--task",
        "classify",
        "--train",
        write_tsv(tmp_path / "train.tsv", rows),
        "--output",
        tmp_path / "model",
        "--epochs",
        1,
        "--batch-size",
        8,
        "--max-seq-length",
        LENGTH,
    )
    classifier = kbert.load(tmp_path / "model")
    assert classifier.config.vocab_size == 302 and same_vocab(tmp_path / "model" / "vocab.txt", extended)
    texts = write_tsv(tmp_path / "texts.tsv", [(text,) for text in TEXTS], header=("text",))
    predicted = [
        json.loads(line) for line in run_kbert("predict", tmp_path / "model", "--input", texts).stdout.splitlines()
    ]
    assert len(predicted) == len(TEXTS)
    # As the fine-tuned model computes them on the new ids (test above).
    pack = BertPreprocessor.for_model(classifier)
    assert pack.sequence_length == LENGTH
    features = pack(tf.constant(TEXTS))
    assert features["input_ids"].numpy().tolist() == padded(python_ids(extended))
    expected = tf.nn.softmax(classifier(features, training=False)["logits"]).numpy()
    labels = classifier.task_info["labels"]
    got = np.array([[p["probabilities"][label] for label in labels] for p in predicted])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_serving_export_serves_the_new_words_as_the_model_computes_them(extended, local, tmp_path):
    run_kbert("export", extended, tmp_path / "base", "--max-seq-length", LENGTH)
    version = tmp_path / "base" / "1"
    assert same_vocab(version / "assets" / "vocab.txt", extended)
    inputs, outputs = local
    out = tf.saved_model.load(str(version)).signatures["serving_default"](text=tf.constant(TEXTS))
    np.testing.assert_array_equal(out["input_mask"].numpy(), inputs["input_mask"])
    real = inputs["input_mask"].astype(bool)  # the export runs the batch cut to its longest text
    np.testing.assert_allclose(
        out["sequence_output"].numpy()[real], outputs["sequence_output"][real], atol=1e-5, rtol=0
    )
    np.testing.assert_allclose(out["pooled_output"].numpy(), outputs["pooled_output"], atol=1e-5, rtol=0)


def test_tfhub_export_packs_the_new_ids_and_encodes_them_as_the_model(extended, local, tmp_path):
    summary = json.loads(
        run_kbert("export", extended, tmp_path / "hub", "--format", "tfhub", "--max-seq-length", LENGTH).stdout
    )
    assert summary["seq_length"] == LENGTH and summary["mlm"] is True
    for part in ("encoder", "preprocessor"):
        assert same_vocab(tmp_path / "hub" / part / "assets" / "vocab.txt", extended)
    inputs, outputs = local
    packed = tf.saved_model.load(str(tmp_path / "hub" / "preprocessor"))(tf.constant(TEXTS))
    for hub, ours in (("input_word_ids", "input_ids"), ("input_mask", "input_mask"), ("input_type_ids", "segment_ids")):
        np.testing.assert_array_equal(packed[hub].numpy(), inputs[ours])
    encoder = tf.saved_model.load(str(tmp_path / "hub" / "encoder"))
    out = encoder(packed, training=False)
    for name in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(out[name].numpy(), outputs[name], atol=1e-5, rtol=0)
    mlm = encoder.mlm({**packed, "masked_lm_positions": tf.constant(inputs["masked_lm_positions"])})
    assert mlm["mlm_logits"].shape == (len(TEXTS), LENGTH, 302)
    np.testing.assert_allclose(mlm["mlm_logits"].numpy(), outputs["mlm_logits"], atol=1e-5, rtol=0)


def test_to_tf1_runs_in_the_original_code_and_converts_back_bit_for_bit(extended, model, local, tmp_path):
    tf1 = tmp_path / "tf1"
    run_kbert("convert", "to-tf1", extended, tf1)
    shapes = tf.train.load_checkpoint(str(tf1 / "bert_model.ckpt")).get_variable_to_shape_map()
    assert shapes["bert/embeddings/word_embeddings"] == [302, 64] and shapes["cls/predictions/output_bias"] == [302]
    assert json.load(open(tf1 / "bert_config.json"))["vocab_size"] == 302 and same_vocab(tf1 / "vocab.txt", extended)

    # google-research/bert's code, loading the checkpoint its own way, on the new ids.
    inputs, _ = local
    expected = {k: np.asarray(v) for k, v in original_outputs(model, inputs).items()}
    assert expected["mlm_log_probs"].shape == (len(TEXTS), LENGTH, 302)
    np.savez(tmp_path / "case.npz", **inputs, **expected)
    report = original_code_report(tf1, tmp_path / "case.npz")
    assert report["not_initialized"] == []
    assert report["initialized_from_checkpoint"] == report["trainable_variables"] == 46
    for name, diff in report["max_abs_diff"].items():
        assert diff <= 1e-5, (name, diff)

    run_kbert("convert", "from-tf1", tf1, tmp_path / "back")
    before, after = saved_weights(extended), saved_weights(tmp_path / "back")
    assert before.keys() == after.keys() and len(before) >= 46
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name
    assert same_vocab(tmp_path / "back" / "vocab.txt", extended)
    assert json.load(open(tmp_path / "back" / "bert_config.json")) == json.load(open(extended / "bert_config.json"))


def test_transformers_loads_to_hf_output_with_the_new_vocabulary(extended, local, tmp_path):
    import torch  # the test extra's: the consumers of to-hf's output
    import transformers

    run_kbert("convert", "to-hf", extended, tmp_path / "hf")
    hf, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert hf.config.vocab_size == 302
    inputs, outputs = local
    tokenizer = transformers.BertTokenizer.from_pretrained(tmp_path / "hf")
    encoded = tokenizer(TEXTS, padding="max_length", max_length=LENGTH)
    assert encoded["input_ids"] == inputs["input_ids"].tolist()
    assert encoded["attention_mask"] == inputs["input_mask"].tolist()
    with torch.no_grad():
        out = hf.eval()(
            input_ids=torch.tensor(inputs["input_ids"].astype("int64")),
            attention_mask=torch.tensor(inputs["input_mask"].astype("int64")),
            token_type_ids=torch.tensor(inputs["segment_ids"].astype("int64")),
            output_hidden_states=True,
        )
    real = inputs["input_mask"].astype(bool)
    assert out.prediction_logits.shape == (len(TEXTS), LENGTH, 302)
    for theirs, ours in (
        (out.hidden_states[-1], "sequence_output"),
        (out.prediction_logits, "mlm_logits"),  # every position is an MLM position in `local`
    ):
        np.testing.assert_allclose(theirs.numpy()[real], outputs[ours][real], atol=1e-4, rtol=0, err_msg=ours)
    np.testing.assert_allclose(out.seq_relationship_logits.numpy(), outputs["nsp_logits"], atol=1e-4, rtol=0)


def test_keras_hub_loads_to_keras_hub_output_with_the_new_vocabulary(extended, model, local, tmp_path):
    run_kbert("convert", "to-keras-hub", extended, tmp_path / "preset")
    tokenizer = keras_hub.models.BertTokenizer.from_preset(str(tmp_path / "preset"))
    assert tokenizer.vocabulary_size() == 302
    inputs, _ = local
    for text, ids, mask in zip(TEXTS, inputs["input_ids"], inputs["input_mask"]):
        assert np.asarray(tokenizer(text)).tolist() == ids[mask == 1][1:-1].tolist(), text
    backbone = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "preset"))
    assert backbone.vocabulary_size == 302
    table = np.asarray(backbone.token_embedding.embeddings)
    assert table.shape == (302, 64)
    np.testing.assert_array_equal(table, model.encoder.embeddings.word_embeddings.embeddings.numpy())
