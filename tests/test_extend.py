"""`kbert extend --max-position-embeddings N`: the original tiny checkpoint (64 positions) grown to
more, checked against the original code's outputs, the checkpoint's own tables, and numpy."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from helpers import ENCODER_KEYS, EXPECTED, embedding_model, original_code_report, original_outputs, saved_weights
from kbert.extend import extend_positions

OLD, NEW = 64, 150  # 150 = 64 + 64 + 22: the last copy of the table is cut short
SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
TINY_VOCAB = os.path.join(TINY, "vocab.txt")
POSITION_TABLE = "bert/embeddings/position_embeddings"


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """The original checkpoint grown to NEW positions by the command: (model dir, its JSON)."""
    out = tmp_path_factory.mktemp("extend") / "tiny-150"
    result = run_kbert("extend", TINY, out, "--max-position-embeddings", NEW)
    return out, json.loads(result.stdout)


def checkpoint_tensor(name):
    return tf.train.load_checkpoint(os.path.join(TINY, "bert_model.ckpt")).get_tensor(name)


def long_inputs(model_vocab=TINY_VOCAB):
    """Two rows of real text past the old positions, tokenized: NEW tokens, and 100 then padding."""
    tokenizer = kbert.Tokenizer(model_vocab, do_lower_case=True)
    words = tokenizer.tokenize(open(SAMPLE, encoding="utf-8").read())
    assert len(words) > 2 * NEW
    rows = []
    for start, length in ((0, NEW), (NEW, 100)):
        ids = tokenizer.convert_tokens_to_ids(["[CLS]"] + words[start : start + length - 2] + ["[SEP]"])
        rows.append(ids + [0] * (NEW - len(ids)))
    ids = np.array(rows, dtype="int32")
    mask = (np.arange(NEW)[None, :] < np.array([[NEW], [100]])).astype("int32")
    segments = ((np.arange(NEW)[None, :] >= np.array([[80], [50]])) * mask).astype("int32")
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def test_the_command_says_what_it_grew(extended):
    out, result = extended
    # The tiny checkpoint has 99,374 parameters; each new position adds one row of H = 64.
    assert result == {
        "model_dir": str(out),
        "kbert_model": "pretrainer",
        "parameters": 99_374 + (NEW - OLD) * 64,
        "max_position_embeddings": {"from": OLD, "to": NEW},
    }
    config = json.load(open(out / "bert_config.json"))
    original = json.load(open(os.path.join(TINY, "bert_config.json")))
    assert config == {**original, "max_position_embeddings": NEW, "kbert_model": "pretrainer", "do_lower_case": True}
    assert (out / "vocab.txt").read_bytes() == open(TINY_VOCAB, "rb").read()


def test_the_position_table_is_the_old_rows_copied_again_and_again(extended, tiny_model_dir):
    out, _ = extended
    old = checkpoint_tensor(POSITION_TABLE)
    assert old.shape == (OLD, 64)
    grown, converted = saved_weights(out), saved_weights(tiny_model_dir)
    (key,) = [k for k in grown if "position_embeddings" in k]
    np.testing.assert_array_equal(grown[key], np.tile(old, (3, 1))[:NEW])
    np.testing.assert_array_equal(grown[key][128:], old[:22])
    # Every other weight as the original checkpoint's, converted without growing: bit for bit.
    assert grown.keys() == converted.keys()
    for name in grown.keys() - {key}:
        np.testing.assert_array_equal(grown[name], converted[name], err_msg=name)


@pytest.mark.parametrize(
    "name", ["embedding_output", "sequence_output", "pooled_output", "mlm_log_probs", "nsp_log_probs"]
)
def test_short_texts_give_the_original_codes_outputs(extended, name):
    """The fixture's real text (16 tokens, a padded row), through the grown model, against the
    outputs google-research/bert's own code computed from the checkpoint before it grew."""
    got = np.asarray(original_outputs(kbert.load(extended[0]))[name])
    assert got.shape == EXPECTED[name].shape
    np.testing.assert_allclose(got, EXPECTED[name], atol=1e-5, rtol=0)


def test_texts_past_the_old_positions_read_position_p_as_p_mod_64(extended):
    """The embeddings of 150 tokens of real text, against modeling.py's embedding_postprocessor
    computed in numpy from the checkpoint's own tables, position p reading row p mod 64."""
    model = kbert.load(extended[0])
    inputs = long_inputs()
    got = np.asarray(embedding_model(model.encoder)(inputs))
    table = {n: checkpoint_tensor(f"bert/embeddings/{n}") for n in ("word_embeddings", "token_type_embeddings")}
    positions = checkpoint_tensor(POSITION_TABLE)[np.arange(NEW) % OLD]
    x = table["word_embeddings"][inputs["input_ids"]] + table["token_type_embeddings"][inputs["segment_ids"]]
    x = x.astype(np.float64) + positions
    mean, variance = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(variance + 1e-12) * checkpoint_tensor(
        "bert/embeddings/LayerNorm/gamma"
    ) + checkpoint_tensor("bert/embeddings/LayerNorm/beta")
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    out = model({**inputs, "masked_lm_positions": np.array([[5, 70, 140], [3, 66, 99]], "int32")}, training=False)
    assert tuple(out["sequence_output"].shape) == (2, NEW, 64) and tuple(out["mlm_logits"].shape) == (2, 3, 300)
    assert all(np.isfinite(np.asarray(v)).all() for v in out.values())


HEADS = {
    "encoder": lambda encoder: encoder,
    "classifier": lambda encoder: kbert.bert_classifier(encoder, 3, task_info={"labels": ["a", "b", "c"]}),
    "tagger": lambda encoder: kbert.bert_tagger(encoder, 4),
    "span_predictor": kbert.bert_span_predictor,
    "multiple_choice": kbert.bert_multiple_choice,
}


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_every_kind_of_model_keeps_its_short_text_outputs(tiny_model_dir, kind):
    model = HEADS[kind](kbert.load(tiny_model_dir).encoder)
    inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS}
    if kind == "multiple_choice":  # the fixture's two rows as two choices of one example
        inputs = {k: v[None] for k, v in inputs.items()}
    before = model(inputs, training=False)
    grown = extend_positions(model, 100)
    assert type(grown) is type(model) and grown.config.max_position_embeddings == 100
    assert model.config.max_position_embeddings != 100  # a new model: the one given is left as it was
    assert grown.vocabulary == model.vocabulary and grown.task_info == model.task_info
    assert grown.get_config()["config"] == {**model.get_config()["config"], "max_position_embeddings": 100}
    after = grown(inputs, training=False)
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_allclose(np.asarray(after[name]), np.asarray(before[name]), atol=1e-5, rtol=0, err_msg=name)


def test_a_fine_tuned_model_directory_and_a_keras_file_keep_their_head_and_task(tiny_model_dir, tmp_path):
    task = {"labels": ["neg", "pos"], "max_seq_length": 48}
    classifier = kbert.bert_classifier(kbert.load(tiny_model_dir), 2, task_info=task)
    kbert.save(classifier, tmp_path / "clf")
    classifier.save(tmp_path / "clf.keras")
    inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS}
    expected = np.asarray(classifier(inputs, training=False)["logits"])
    for source in (tmp_path / "clf", tmp_path / "clf.keras"):
        out = tmp_path / f"{source.name}-128"
        result = json.loads(run_kbert("extend", source, out, "--max-position-embeddings", 128).stdout)
        assert result["kbert_model"] == "classifier"
        grown = kbert.load(out)
        assert type(grown) is kbert.BertClassifier and grown.config.max_position_embeddings == 128
        assert grown.task_info == {"task": "classify", **task}
        np.testing.assert_allclose(np.asarray(grown(inputs, training=False)["logits"]), expected, atol=1e-5, rtol=0)
        assert (out / "vocab.txt").read_bytes() == open(TINY_VOCAB, "rb").read()


def test_casing_travels_and_can_be_set(tmp_path):
    run_kbert("extend", TINY, tmp_path / "cased", "--max-position-embeddings", 65, "--no-lowercase")
    assert json.load(open(tmp_path / "cased" / "bert_config.json"))["do_lower_case"] is False
    run_kbert("extend", tmp_path / "cased", tmp_path / "cased-66", "--max-position-embeddings", 66)
    assert kbert.load(tmp_path / "cased-66").do_lower_case is False


@pytest.mark.parametrize(
    "flags,fragments",
    [
        ([], ["nothing to grow", "--max-position-embeddings N", "64 positions"]),
        (["--max-position-embeddings", "64"], ["64 positions already", "more than 64"]),
        (["--max-position-embeddings", "32"], ["--max-position-embeddings 32", "more than 64"]),
    ],
)
def test_a_growth_that_does_not_grow_is_one_line_and_writes_nothing(tmp_path, flags, fragments):
    result = run_kbert("extend", TINY, tmp_path / "out", *flags, check=False)
    assert_user_error(result, *fragments)
    assert os.listdir(tmp_path) == []


def test_a_model_directory_with_damaged_weights_is_one_line_and_writes_nothing(tiny_model_dir, tmp_path):
    shutil.copytree(tiny_model_dir, tmp_path / "damaged")
    weights = tmp_path / "damaged" / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:5000])
    result = run_kbert("extend", tmp_path / "damaged", tmp_path / "out", "--max-position-embeddings", 128, check=False)
    assert_user_error(result, "model.weights.h5: cannot load")
    assert sorted(os.listdir(tmp_path)) == ["damaged"]


def test_python_callers_get_the_same_refusals(tiny_model_dir):
    model = kbert.load(tiny_model_dir)
    for bad in (64, 10, 0, -5, 100.0, "100", True):
        with pytest.raises(kbert.KbertError, match=r"^max_position_embeddings="):
            extend_positions(model, bad)
    with pytest.raises(kbert.KbertError, match="pass a kbert model"):
        extend_positions(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), 100)


@pytest.mark.slow
def test_the_original_code_loads_to_tf1_output_and_reads_past_64(extended, tmp_path):
    """`convert to-tf1` of the grown model, loaded by google-research/bert's own code: every
    variable initialised from it, the fixture's outputs on short text, and kbert's outputs on
    150 tokens of real text."""
    out, _ = extended
    run_kbert("convert", "to-tf1", out, tmp_path / "tf1")
    shapes = tf.train.load_checkpoint(str(tmp_path / "tf1" / "bert_model.ckpt")).get_variable_to_shape_map()
    assert shapes[POSITION_TABLE] == [NEW, 64]
    assert json.load(open(tmp_path / "tf1" / "bert_config.json"))["max_position_embeddings"] == NEW

    model = kbert.load(out)
    inputs = {**long_inputs(), "masked_lm_positions": np.array([[5, 70, 140], [3, 66, 99]], "int32")}
    outputs = model(inputs, training=False)
    long_case = {
        **inputs,
        "embedding_output": np.asarray(embedding_model(model.encoder)({k: inputs[k] for k in ENCODER_KEYS})),
        "sequence_output": np.asarray(outputs["sequence_output"]),
        "pooled_output": np.asarray(outputs["pooled_output"]),
        "mlm_log_probs": np.asarray(keras.ops.log_softmax(outputs["mlm_logits"], axis=-1)),
        "nsp_log_probs": np.asarray(keras.ops.log_softmax(outputs["nsp_logits"], axis=-1)),
    }
    np.savez(tmp_path / "long.npz", **long_case)
    for case in (os.path.join(TINY, "expected.npz"), str(tmp_path / "long.npz")):
        report = original_code_report(tmp_path / "tf1", case)
        assert report["not_initialized"] == []
        assert report["initialized_from_checkpoint"] == report["trainable_variables"] == 46
        for name, diff in report["max_abs_diff"].items():
            assert diff <= 1e-5, (case, name, diff)


@pytest.mark.slow
def test_pretraining_continues_at_the_new_length(tmp_path):
    """create-data at 128 tokens, then `pretrain --init` on the model grown from 64 to 128."""
    run_kbert("extend", TINY, tmp_path / "tiny-128", "--max-position-embeddings", 128)
    data = tmp_path / "data128.tfrecord"
    run_kbert(
        "create-data",
        "--input",
        SAMPLE,
        "--vocab",
        TINY_VOCAB,
        "--output",
        data,
        "--max-seq-length",
        128,
        "--max-predictions-per-seq",
        20,
        "--dupe-factor",
        2,
        "--workers",
        1,
    )
    features = {"input_mask": tf.io.FixedLenFeature([128], tf.int64)}
    lengths = [
        int(tf.reduce_sum(tf.io.parse_single_example(record, features)["input_mask"]))
        for record in tf.data.TFRecordDataset(str(data))
    ]
    assert max(lengths) > OLD and sum(n > OLD for n in lengths) > len(lengths) // 2  # mostly past the old 64
    result = run_kbert(
        "pretrain",
        "--model-dir",
        tmp_path / "run",
        "--init",
        tmp_path / "tiny-128",
        "--data",
        data,
        "--max-seq-length",
        128,
        "--max-predictions-per-seq",
        20,
        "--steps",
        3,
        "--batch-size",
        4,
    )
    metrics = json.loads(result.stdout)
    assert metrics["step"] == 3 and np.isfinite(metrics["loss"])
    trained = kbert.load(tmp_path / "run")
    assert trained.config.max_position_embeddings == 128
    assert tuple(trained.encoder.embeddings.position_embeddings.embeddings.shape) == (128, 64)
