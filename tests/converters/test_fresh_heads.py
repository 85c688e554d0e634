"""Heads a converter creates rather than reads are recorded as fresh, reported as such, and never
written out as if they were trained; converted classifiers keep their head and labels.

References: the original checkpoint's own variables (tf1-tiny), transformers loading what to-hf
writes, and keras-hub loading what to-keras-hub writes.
"""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, TINY, run_kbert
from helpers import EXPECTED
from kbert.converters.safetensors_file import SafetensorsFile, write_safetensors

MODEL_GARDEN = os.path.join(FIXTURES, "model-garden-tfhub")
HF_TINY = os.path.join(FIXTURES, "hf-tiny")
ALL_FRESH = {"masked_lm": "fresh", "next_sentence": "fresh", "pooler": "trained"}


def _variables(prefix):
    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _inputs():
    return {k: EXPECTED[k].astype("int32") for k in ("input_ids", "input_mask", "segment_ids")}


@pytest.fixture(scope="module")
def fresh_dir(tmp_path_factory):
    """Model Garden's TF Hub encoder (no masked-LM or next-sentence head) converted by the CLI."""
    out = tmp_path_factory.mktemp("fresh") / "encoder"
    run_kbert("convert", "from-tfhub", f"{MODEL_GARDEN}/encoder", out, "--preprocessor", f"{MODEL_GARDEN}/preprocessor")
    return out


def test_the_model_directory_and_keras_file_record_fresh_heads(fresh_dir, tmp_path):
    assert json.load(open(fresh_dir / "bert_config.json"))["fresh_heads"] == ["masked_lm", "next_sentence"]
    model = kbert.load(fresh_dir)
    assert model.fresh_heads == ("masked_lm", "next_sentence")
    assert json.loads(run_kbert("convert", "inspect", fresh_dir).stdout)["heads"] == ALL_FRESH
    model.save(tmp_path / "model.keras")
    assert kbert.load(tmp_path / "model.keras").fresh_heads == ("masked_lm", "next_sentence")
    assert json.loads(run_kbert("convert", "inspect", tmp_path / "model.keras").stdout)["heads"] == ALL_FRESH
    # kbert.save of the loaded model keeps the record.
    kbert.save(model, tmp_path / "again")
    assert json.load(open(tmp_path / "again" / "bert_config.json"))["fresh_heads"] == ["masked_lm", "next_sentence"]


def test_heads_read_from_the_source_are_trained_and_old_directories_count_as_trained(
    tiny_model_dir, fresh_dir, tmp_path
):
    assert "fresh_heads" not in json.load(open(tiny_model_dir / "bert_config.json"))
    assert kbert.load(tiny_model_dir).fresh_heads == ()
    # A directory written before kbert recorded provenance has no key: its heads count as trained.
    old = tmp_path / "old"
    shutil.copytree(fresh_dir, old)
    config = json.load(open(old / "bert_config.json"))
    del config["fresh_heads"]
    (old / "bert_config.json").write_text(json.dumps(config))
    assert kbert.load(old).fresh_heads == ()
    heads = json.loads(run_kbert("convert", "inspect", old).stdout)["heads"]
    assert heads == {"masked_lm": "trained", "next_sentence": "trained", "pooler": "trained"}


def test_to_hf_writes_the_encoder_alone_as_bert_model(fresh_dir, tmp_path):
    import torch
    import transformers

    result = run_kbert("convert", "to-hf", fresh_dir, tmp_path / "hf")
    said = json.loads(result.stdout)
    assert said["architecture"] == "BertModel" and said["left_out_fresh_heads"] == ["masked_lm", "next_sentence"]
    assert "left out the masked_lm head" in result.stderr and "--include-fresh-heads" in result.stderr
    names = SafetensorsFile(str(tmp_path / "hf" / "model.safetensors")).shapes
    assert not any(n.startswith("cls.") for n in names)
    assert json.load(open(tmp_path / "hf" / "config.json"))["architectures"] == ["BertModel"]
    bert, info = transformers.BertModel.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    inputs = _inputs()
    with torch.no_grad():
        theirs = bert.eval()(
            input_ids=torch.tensor(inputs["input_ids"].astype("int64")),
            attention_mask=torch.tensor(inputs["input_mask"].astype("int64")),
            token_type_ids=torch.tensor(inputs["segment_ids"].astype("int64")),
        ).last_hidden_state.numpy()
    ours = np.asarray(
        kbert.load(fresh_dir)(dict(inputs, masked_lm_positions=EXPECTED["masked_lm_positions"].astype("int32")))[
            "sequence_output"
        ]
    )
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)

    # Forced out, the random heads are written and recorded as fresh, so reading them back keeps them fresh.
    result = run_kbert("convert", "to-hf", fresh_dir, tmp_path / "forced", "--include-fresh-heads")
    assert json.loads(result.stdout)["architecture"] == "BertForPreTraining"
    assert json.load(open(tmp_path / "forced" / "config.json"))["kbert_fresh_heads"] == ["masked_lm", "next_sentence"]
    back = json.loads(run_kbert("convert", "from-hf", tmp_path / "forced", tmp_path / "back").stdout)
    assert back["fresh_heads"] == ["masked_lm", "next_sentence"]
    assert json.loads(run_kbert("convert", "inspect", tmp_path / "forced").stdout)["heads"] == ALL_FRESH


def test_to_tf1_writes_no_cls_variables_unless_asked(fresh_dir, tmp_path):
    result = run_kbert("convert", "to-tf1", fresh_dir, tmp_path / "tf1")
    said = json.loads(result.stdout)
    assert said["left_out_fresh_heads"] == ["masked_lm", "next_sentence"] and "left out" in result.stderr
    written = _variables(tmp_path / "tf1" / "bert_model.ckpt")
    assert written and all(n.startswith("bert/") for n in written)
    assert said["parameters"] == sum(v.size for v in written.values())
    heads = json.loads(run_kbert("convert", "inspect", tmp_path / "tf1").stdout)["heads"]
    assert heads == {"masked_lm": "absent", "next_sentence": "absent", "pooler": "trained"}
    assert json.loads(run_kbert("convert", "from-tf1", tmp_path / "tf1", tmp_path / "a").stdout)["fresh_heads"] == [
        "masked_lm",
        "next_sentence",
    ]
    run_kbert("convert", "to-tf1", fresh_dir, tmp_path / "forced", "--include-fresh-heads")
    assert any(n.startswith("cls/predictions/") for n in _variables(tmp_path / "forced" / "bert_model.ckpt"))
    assert json.load(open(tmp_path / "forced" / "bert_config.json"))["fresh_heads"] == ["masked_lm", "next_sentence"]
    assert json.loads(run_kbert("convert", "inspect", tmp_path / "forced").stdout)["heads"] == ALL_FRESH
    report = json.loads(run_kbert("convert", "from-tf1", tmp_path / "forced", tmp_path / "b").stdout)
    assert report["fresh_heads"] == ["masked_lm", "next_sentence"]


def test_a_masked_lm_file_keeps_its_trained_head_and_loses_the_fresh_ones(tmp_path):
    """hf-tiny as BertForMaskedLM saves it (no next-sentence head, no pooler) -> kbert -> to-hf."""
    import torch
    import transformers

    f = SafetensorsFile(f"{HF_TINY}/model.safetensors")
    folder = tmp_path / "mlm"
    shutil.copytree(HF_TINY, folder)
    keep = {n: f.read(n) for n in f.shapes if not n.startswith(("cls.seq_relationship.", "bert.pooler."))}
    write_safetensors(str(folder / "model.safetensors"), keep)
    report = json.loads(run_kbert("convert", "from-hf", folder, tmp_path / "kbert").stdout)
    assert report["fresh_heads"] == ["next_sentence", "pooler"]
    heads = json.loads(run_kbert("convert", "inspect", tmp_path / "kbert").stdout)["heads"]
    assert heads == {"masked_lm": "trained", "next_sentence": "fresh", "pooler": "fresh"}
    said = json.loads(run_kbert("convert", "to-hf", tmp_path / "kbert", tmp_path / "out").stdout)
    assert said["architecture"] == "BertForMaskedLM" and said["left_out_fresh_heads"] == ["next_sentence", "pooler"]
    ids = torch.tensor(EXPECTED["input_ids"].astype("int64"))
    kwargs = {
        "attention_mask": torch.tensor(EXPECTED["input_mask"].astype("int64")),
        "token_type_ids": torch.tensor(EXPECTED["segment_ids"].astype("int64")),
    }
    ours, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    reference = transformers.BertForMaskedLM.from_pretrained(folder)  # the file as it came
    with torch.no_grad():
        np.testing.assert_allclose(
            ours.eval()(ids, **kwargs).logits.numpy(), reference.eval()(ids, **kwargs).logits.numpy(), atol=1e-4, rtol=0
        )


def test_keras_hub_round_trip_keeps_a_trained_masked_lm_head(tiny_model_dir, tmp_path):
    import keras_hub

    result = json.loads(run_kbert("convert", "to-keras-hub", tiny_model_dir, tmp_path / "preset").stdout)
    assert result["task"] == "BertMaskedLM" and result["left_out"] == ["next_sentence"]
    # keras-hub itself loads the head, with the original checkpoint's values.
    task = keras_hub.models.BertMaskedLM.from_preset(str(tmp_path / "preset"), preprocessor=None)
    original = _variables(f"{TINY}/bert_model.ckpt")
    head = {w.path: w.numpy() for w in task.masked_lm_head.weights}
    np.testing.assert_array_equal(
        head["mlm_head/intermediate_dense/kernel"], original["cls/predictions/transform/dense/kernel"]
    )
    np.testing.assert_array_equal(head["mlm_head/output_bias"], original["cls/predictions/output_bias"])
    # keras-hub's logits against the original code's, on the original's inputs: the difference
    # to-keras-hub reports is of that size (tanh GELU, LayerNorm epsilon 1e-5 in the head).
    logits = task(
        {
            "token_ids": EXPECTED["input_ids"].astype("int32"),
            "segment_ids": EXPECTED["segment_ids"].astype("int32"),
            "padding_mask": EXPECTED["input_mask"].astype("int32"),
            "mask_positions": EXPECTED["masked_lm_positions"].astype("int32"),
        }
    )
    log_probs = np.asarray(tf.nn.log_softmax(logits))
    assert np.abs(log_probs - EXPECTED["mlm_log_probs"]).max() < 0.05
    report = json.loads(run_kbert("convert", "from-keras-hub", tmp_path / "preset", tmp_path / "back").stdout)
    assert report["fresh_heads"] == ["next_sentence"] and report["mlm_max_abs_difference"] < 0.05
    back = kbert.load(tmp_path / "back")
    assert back.fresh_heads == ("next_sentence",)
    by_path = {w.path: w.numpy() for w in back.weights}
    np.testing.assert_array_equal(
        by_path["mlm_head/transform/kernel"], original["cls/predictions/transform/dense/kernel"]
    )
    np.testing.assert_array_equal(
        by_path["mlm_head/layer_norm/gamma"], original["cls/predictions/transform/LayerNorm/gamma"]
    )


def test_keras_hub_leaves_a_fresh_masked_lm_head_out(fresh_dir, tmp_path):
    result = json.loads(run_kbert("convert", "to-keras-hub", fresh_dir, tmp_path / "preset").stdout)
    assert result["task"] is None and result["left_out"] == ["next_sentence", "masked_lm"]
    assert not (tmp_path / "preset" / "task.json").exists()
    report = json.loads(run_kbert("convert", "from-keras-hub", tmp_path / "preset", tmp_path / "back").stdout)
    assert report["fresh_heads"] == ["masked_lm", "next_sentence"]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tiny_model_dir):
    """A three-class classifier on the tiny checkpoint, its head set to known values."""
    out = tmp_path_factory.mktemp("classifier") / "clf"
    classifier = kbert.bert_classifier(kbert.load(tiny_model_dir), 3)
    rng = np.random.default_rng(7)
    for w in classifier.weights:
        if w.path.startswith("classifier_head/"):
            w.assign(rng.normal(0, 0.5, w.shape).astype("float32"))
    kbert.save(classifier, out, labels=["neg", "neutral", "pos"])
    return out


def test_a_classifier_to_tf1_has_run_classifiers_names(classifier_dir, tmp_path):
    run_kbert("convert", "to-tf1", classifier_dir, tmp_path / "tf1")
    written = _variables(tmp_path / "tf1" / "bert_model.ckpt")
    model = kbert.load(classifier_dir)
    head = {w.path: w.numpy() for w in model.weights}
    assert written["output_weights"].shape == (3, 64)
    np.testing.assert_array_equal(written["output_weights"], head["classifier_head/output_weights"])
    np.testing.assert_array_equal(written["output_bias"], head["classifier_head/output_bias"])
    assert not any(n.startswith("cls/") for n in written)
    original = _variables(f"{TINY}/bert_model.ckpt")
    for name in (n for n in original if n.startswith("bert/")):
        np.testing.assert_array_equal(written[name], original[name])


def test_a_classifier_to_hf_is_bert_for_sequence_classification(classifier_dir, tmp_path):
    import torch
    import transformers

    said = json.loads(run_kbert("convert", "to-hf", classifier_dir, tmp_path / "hf").stdout)
    assert said["architecture"] == "BertForSequenceClassification"
    hf, info = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert hf.config.id2label == {0: "neg", 1: "neutral", 2: "pos"} and hf.config.label2id["pos"] == 2
    inputs = _inputs()
    with torch.no_grad():
        theirs = hf.eval()(
            input_ids=torch.tensor(inputs["input_ids"].astype("int64")),
            attention_mask=torch.tensor(inputs["input_mask"].astype("int64")),
            token_type_ids=torch.tensor(inputs["segment_ids"].astype("int64")),
        ).logits.numpy()
    ours = np.asarray(kbert.load(classifier_dir)(inputs, training=False)["logits"])
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_tfhub_export_of_a_classifier_says_it_leaves_the_head_out(classifier_dir, tmp_path):
    result = run_kbert("export", classifier_dir, tmp_path / "hub", "--format", "tfhub")
    said = json.loads(result.stdout)
    assert said["mlm"] is False and any("task head (classify)" in part for part in said["left_out"])
    assert "leaves out the BertClassifier's task head (classify)" in result.stderr


def test_casing_survives_to_tf1_and_back(tiny_model_dir, tmp_path):
    cased = tmp_path / "cased"
    run_kbert("convert", "from-tf1", TINY, cased, "--no-lowercase")
    run_kbert("convert", "to-tf1", cased, tmp_path / "tf1")
    assert json.load(open(tmp_path / "tf1" / "bert_config.json"))["do_lower_case"] is False
    report = json.loads(run_kbert("convert", "from-tf1", tmp_path / "tf1", tmp_path / "back").stdout)
    assert report["do_lower_case"] is False and report["do_lower_case_from"] == "bert_config.json"
    from kbert.formats.sources import describe_source, open_model

    assert describe_source(tmp_path / "tf1").do_lower_case is False  # what every other command reads
    assert open_model(tmp_path / "tf1").do_lower_case is False
    # Where nothing records it: the folder name, else the default, and the report says which.
    folder = tmp_path / "cased_L-2_H-64"
    shutil.copytree(TINY, folder)
    report = json.loads(run_kbert("convert", "from-tf1", folder, tmp_path / "c").stdout)
    assert report["do_lower_case"] is False and report["do_lower_case_from"] == "folder name"
    report = json.loads(run_kbert("convert", "from-tf1", TINY, tmp_path / "d").stdout)
    assert report["do_lower_case"] is True and report["do_lower_case_from"].startswith("default")
    report = json.loads(run_kbert("convert", "from-tf1", folder, tmp_path / "e", "--lowercase").stdout)
    assert report["do_lower_case"] is True and report["do_lower_case_from"] == "--lowercase/--no-lowercase"


def test_fine_tuning_trains_the_pooler_only_where_its_head_reads_it(fresh_dir, tmp_path):
    from helpers import write_conll
    from kbert.finetuning.train import finetune

    base = tmp_path / "base"  # the converted encoder, its pooler recorded as fresh as well
    shutil.copytree(fresh_dir, base)
    config = json.loads((base / "bert_config.json").read_text())
    (base / "bert_config.json").write_text(json.dumps(dict(config, fresh_heads=["pooler"])))
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "gold fresh.\tpos\ndead dust.\tneg\n" * 4)
    conll = write_conll(tmp_path / "train.conll", [(["Paris", "is"], ["B-LOC", "O"]), (["Rome"], ["B-LOC"])] * 4)
    small = dict(epochs=1, batch_size=4, max_seq_length=16)
    finetune(base, "classify", train, tmp_path / "classifier", **small)
    finetune(base, "tag", conll, tmp_path / "tagger", **small)
    heads = {
        name: json.loads(run_kbert("convert", "inspect", tmp_path / name).stdout)["heads"]
        for name in ("classifier", "tagger")
    }
    assert heads["classifier"] == {"masked_lm": "absent", "next_sentence": "absent", "pooler": "trained"}
    assert heads["tagger"] == {"masked_lm": "absent", "next_sentence": "absent", "pooler": "fresh"}


def test_tfhub_export_names_a_trained_next_sentence_head_it_cannot_carry(tiny_model_dir):
    from kbert.serving.tfhub import _left_out

    model = kbert.load(tiny_model_dir)
    model.fresh_heads = ("masked_lm",)
    assert _left_out(model) == [
        "the masked-LM head (mlm): a converter created it, so its weights are random",
        "the next-sentence head (nsp): the export carries it only beside the masked-LM head",
    ]
    model.fresh_heads = ()
    assert _left_out(model) == []
