"""kbert.formats.sources: every kind of model source told apart by `source_kind` and opened by `open_model`.

The tiny checkpoint's outputs come from the original code (fixtures/tf1-tiny/expected.npz); the
sources that hold its weights must reproduce them. The TF Hub, keras-hub and .keras sources are
written from it by kbert's own writers, which are tested against their consumers elsewhere; the
keras-hub preset computes keras-hub's tanh GELU, so it is compared with keras-hub's own model.
"""

import json
import logging
import os
import re
import shutil

import numpy as np
import pytest

import kbert
from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from helpers import ENCODER_KEYS, EXPECTED, original_outputs
from kbert.formats.sources import KINDS, describe_source, open_model, source_kind
from kbert.runtime.errors import KbertError

HF_TINY = os.path.join(FIXTURES, "hf-tiny")


@pytest.fixture(scope="module")
def sources(tmp_path_factory, tiny_hub_export):
    """{case: (path, kind)} of the tiny model in every kind of source."""
    from kbert.converters.keras_hub import save_keras_hub_preset

    root = tmp_path_factory.mktemp("sources")
    base, _ = tiny_hub_export
    kbert.save(kbert.converters.load_tf1_checkpoint(TINY), root / "kbert")
    kbert.load(root / "kbert").save(root / "tiny.keras")
    save_keras_hub_preset(root / "kbert", root / "keras-hub")
    return {
        "tf1-folder": (TINY, "tf1"),
        "tf1-prefix": (os.path.join(TINY, "bert_model.ckpt"), "tf1"),
        "hf-folder": (HF_TINY, "hf"),
        "hf-safetensors": (os.path.join(HF_TINY, "model.safetensors"), "hf"),
        "kbert": (root / "kbert", "kbert"),
        "keras": (root / "tiny.keras", "keras"),
        "tfhub": (base / "hub" / "encoder", "tfhub"),
        "keras-hub": (root / "keras-hub", "keras_hub"),
    }


def test_every_kind_has_a_case():
    assert {"tf1", "hf", "kbert", "keras", "tfhub", "keras_hub"} == set(KINDS)


@pytest.mark.parametrize("case", ["tf1-folder", "tf1-prefix", "hf-folder", "hf-safetensors", "kbert", "keras", "tfhub"])
def test_open_model_reproduces_the_original_code(sources, case):
    path, kind = sources[case]
    assert source_kind(path) == kind
    model = open_model(path)
    assert model.do_lower_case is True and model.vocabulary is not None
    assert os.path.isfile(model.vocab_file)
    ours = original_outputs(model)
    # The encoder everywhere; the heads where the source holds them (a TF Hub encoder has no next-sentence head).
    names = ["embedding_output", "sequence_output", "pooled_output", "mlm_log_probs"]
    if "next_sentence" not in getattr(model, "fresh_heads", ()):
        names.append("nsp_log_probs")
    for name in names:
        np.testing.assert_allclose(np.asarray(ours[name]), EXPECTED[name], atol=1e-5, err_msg=f"{case}: {name}")


def test_open_model_reads_a_keras_hub_preset_as_keras_hub_computes_it(sources):
    import keras_hub

    path, kind = sources["keras-hub"]
    assert source_kind(path) == kind
    model = open_model(path)
    # to-keras-hub carried the trained masked-LM head (a BertMaskedLM task); keras-hub has no next-sentence head.
    assert model.config.hidden_act == "gelu_tanh" and set(model.fresh_heads) == {"next_sentence"}
    inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS}
    theirs = keras_hub.models.BertBackbone.from_preset(str(path))(
        {"token_ids": inputs["input_ids"], "segment_ids": inputs["segment_ids"], "padding_mask": inputs["input_mask"]}
    )
    ours = model.encoder(inputs)
    mask = inputs["input_mask"].astype(bool)
    np.testing.assert_allclose(
        np.asarray(ours["sequence_output"])[mask], np.asarray(theirs["sequence_output"])[mask], atol=1e-5
    )
    np.testing.assert_allclose(np.asarray(ours["pooled_output"]), np.asarray(theirs["pooled_output"]), atol=1e-5)


def test_describe_source_reads_every_kind(sources):
    config = json.load(open(os.path.join(TINY, "bert_config.json")))
    for case, (path, _) in sources.items():
        info = describe_source(path)
        assert info.config.hidden_size == config["hidden_size"], case
        assert info.config.vocab_size == config["vocab_size"] == sum(1 for _ in open(info.vocab_file)), case


def test_a_converted_source_keeps_the_heads_its_converter_made_fresh():
    # Model Garden's TF Hub encoder (without its `mlm` sub-object) has neither pretraining head.
    encoder = os.path.join(FIXTURES, "model-garden-tfhub", "encoder")
    assert open_model(encoder).fresh_heads == ("masked_lm", "next_sentence")
    assert open_model(TINY).fresh_heads == ()


def test_a_source_that_records_no_casing_takes_its_folder_names(tmp_path, caplog):
    cased = tmp_path / "tiny-cased"
    shutil.copytree(HF_TINY, cased)
    for name in ("tokenizer_config.json", "tokenizer.json"):
        (cased / name).unlink()
    with caplog.at_level(logging.INFO, logger="kbert"):
        model = open_model(cased)
    assert model.do_lower_case is False
    assert "do_lower_case=False, from the folder name" in caplog.text
    assert open_model(cased, do_lower_case=True).do_lower_case is True


def test_what_is_not_a_model_is_one_line_saying_what_to_pass(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("text\n")
    (tmp_path / "config-only").mkdir()
    shutil.copy(os.path.join(TINY, "bert_config.json"), tmp_path / "config-only")
    cases = {
        tmp_path / "nowhere": "no such model directory, file or checkpoint",
        tmp_path / "empty": "the directory is empty",
        tmp_path / "notes": "not a model (no bert_config.json",
        tmp_path / "notes" / "a.txt": "is a file, not a model",
        tmp_path / "config-only": "the model directory is incomplete",
        os.path.join(TINY, "bert_config.json"): "is a file of a model; pass the folder that holds it",
    }
    for path, fragment in cases.items():
        with pytest.raises(KbertError, match=re.escape(fragment)):
            source_kind(path)


# === The commands ===


def _records(path, count=4, length=16, predictions=3):
    """Pretraining records with create_pretraining_data.py's features, over the tiny vocabulary's first ids."""
    import tensorflow as tf

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(count):
            ids = [2] + list(rng.integers(5, 300, length - 2)) + [3]
            features = {
                "input_ids": ints(ids),
                "input_mask": ints([1] * length),
                "segment_ids": ints([0] * (length // 2) + [1] * (length - length // 2)),
                "masked_lm_positions": ints([1, 2, 3]),
                "masked_lm_ids": ints(ids[1:4]),
                "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * predictions)),
                "next_sentence_labels": ints([i % 2]),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


def test_pretrain_continues_from_a_google_research_checkpoint_folder(tmp_path):
    data = _records(tmp_path / "data.tfrecord")
    out = tmp_path / "continued"
    result = run_kbert(
        "pretrain", "--model-dir", out, "--data", data, "--init", TINY, "--steps", "2", "--batch-size", "2",
        "--max-seq-length", "16", "--max-predictions-per-seq", "3",
    )  # fmt: skip
    assert json.loads(result.stdout)["step"] == 2
    model = kbert.load(out)
    assert model.do_lower_case is True and model.config.hidden_size == 64
    # Trained from the checkpoint's weights: two small steps leave them near, not at, where they were.
    start = kbert.converters.load_tf1_checkpoint(TINY)
    moved = [float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), start.get_weights(), strict=True)]
    assert 0 < max(moved) < 0.1


def test_fill_mask_reads_a_google_research_checkpoint_folder():
    result = run_kbert("fill-mask", TINY, "the man went to the [MASK].", "--top-k", "3")
    predictions = json.loads(result.stdout)["masks"][0]["predictions"]
    assert len(predictions) == 3


def test_a_converter_names_the_command_for_a_source_of_another_kind(tmp_path):
    assert_user_error(
        run_kbert("convert", "from-hf", TINY, tmp_path / "out", check=False),
        "a google-research checkpoint, not a Hugging Face model; use kbert convert from-tf1",
    )
    assert not (tmp_path / "out").exists()


def test_inspect_reads_every_kind(sources):
    for case, (path, _) in sources.items():
        described = json.loads(run_kbert("convert", "inspect", path).stdout)
        assert described["config"]["hidden_size"] == 64, case
        assert described["parameters"] > 0, case
