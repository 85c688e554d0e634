"""`kbert convert` and the converters: strictness, round trips and every error case."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import TINY, assert_user_error, run_kbert
from kbert.converters import load_tf1_checkpoint, save_tf1_checkpoint
from kbert.runtime.files import atomic_output_dir


def _read(prefix):
    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _write(prefix, tensors):
    names = sorted(tensors)
    tf.raw_ops.SaveV2(
        prefix=str(prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(tensors[n]) for n in names],
    )


def _checkpoint_dir(tmp_path, tensors, name="ckpt", config=None):
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(f"{TINY}/vocab.txt", folder)
    if config is None:
        shutil.copy(f"{TINY}/bert_config.json", folder)
    else:
        (folder / "bert_config.json").write_text(json.dumps(config))
    _write(folder / "bert_model.ckpt", tensors)
    return folder


ORIGINAL = _read(f"{TINY}/bert_model.ckpt")


def test_round_trip_is_bit_for_bit(tiny_model_dir, tmp_path):
    result = run_kbert("convert", "to-tf1", tiny_model_dir, tmp_path / "back")
    assert json.loads(result.stdout)["parameters"] == 99374
    back = _read(tmp_path / "back" / "bert_model.ckpt")
    assert sorted(back) == sorted(ORIGINAL)
    for name, value in ORIGINAL.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        assert np.array_equal(back[name], value), name
    # The original keys as they were, and the casing, which the original's BertConfig.from_dict takes as an extra key.
    original = json.load(open(f"{TINY}/bert_config.json"))
    assert json.load(open(tmp_path / "back" / "bert_config.json")) == dict(original, do_lower_case=True)
    assert open(tmp_path / "back" / "vocab.txt").read() == open(f"{TINY}/vocab.txt").read()


def test_from_tf1_reports_json(tiny_model_dir):
    assert sorted(os.listdir(tiny_model_dir)) == ["bert_config.json", "model.weights.h5", "vocab.txt"]
    config = json.load(open(tiny_model_dir / "bert_config.json"))
    assert config["kbert_model"] == "pretrainer" and config["do_lower_case"] is True


def test_src_may_be_a_prefix_and_checkpoint_file_picks_latest(tmp_path):
    folder = _checkpoint_dir(tmp_path, ORIGINAL, "many")
    changed = dict(ORIGINAL, **{"bert/pooler/dense/bias": ORIGINAL["bert/pooler/dense/bias"] + 1})
    _write(folder / "model.ckpt-20000", changed)
    result = run_kbert("convert", "from-tf1", folder / "model.ckpt-20000", tmp_path / "a")
    assert json.loads(result.stdout)["checkpoint"].endswith("model.ckpt-20000")
    # Two *.index and no `checkpoint` file: ambiguous, the error names them.
    assert_user_error(
        run_kbert("convert", "from-tf1", folder, tmp_path / "b", check=False), "2 checkpoints here", "pass one prefix"
    )
    (folder / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-20000"\n')
    model = load_tf1_checkpoint(folder)
    pooler_bias = [v for v in model.weights if v.path == "pooler/bias"][0]
    np.testing.assert_array_equal(pooler_bias.numpy(), changed["bert/pooler/dense/bias"])


def test_optimizer_state_is_skipped_with_one_line(tmp_path):
    tensors = dict(ORIGINAL, global_step=np.int64(20000))
    for name in list(ORIGINAL):
        tensors[name + "/adam_m"] = np.zeros_like(ORIGINAL[name])
        tensors[name + "/adam_v"] = np.zeros_like(ORIGINAL[name])
    folder = _checkpoint_dir(tmp_path, tensors)
    result = run_kbert("convert", "from-tf1", folder, tmp_path / "out")
    report = json.loads(result.stdout)
    assert report["skipped_optimizer_state"] == 93 and report["global_step"] == 20000
    assert "skipped 93 variables of optimizer state" in result.stderr
    inspected = json.loads(run_kbert("convert", "inspect", folder).stdout)
    assert inspected["optimizer_slots"] == 92 and inspected["global_step"] == 20000
    assert inspected["optimizer_slot_kinds"] == ["adam_m", "adam_v"]


def test_encoder_only_checkpoint_gets_fresh_heads(tmp_path):
    folder = _checkpoint_dir(tmp_path, {n: v for n, v in ORIGINAL.items() if n.startswith("bert/")})
    result = run_kbert("convert", "from-tf1", folder, tmp_path / "out")
    assert json.loads(result.stdout)["fresh_heads"] == ["masked_lm", "next_sentence"]
    assert "no masked_lm head" in result.stderr and "freshly initialised" in result.stderr
    assert json.loads(run_kbert("convert", "inspect", folder).stdout)["heads"] == {
        "masked_lm": "absent",
        "next_sentence": "absent",
        "pooler": "trained",
    }
    assert json.loads(run_kbert("convert", "inspect", tmp_path / "out").stdout)["heads"] == {
        "masked_lm": "fresh",
        "next_sentence": "fresh",
        "pooler": "trained",
    }


def test_unknown_variables_are_listed(tmp_path):
    tensors = dict(
        ORIGINAL,
        **{
            "bert/encoder/layer_0/attention/self/rotary/kernel": np.zeros(3, "float32"),
            "cls/squad/output_weights": np.zeros(3, "float32"),
        },
    )
    folder = _checkpoint_dir(tmp_path, tensors)
    assert_user_error(
        run_kbert("convert", "from-tf1", folder, tmp_path / "out", check=False),
        "2 unknown variables",
        "bert/encoder/layer_0/attention/self/rotary/kernel",
        "cls/squad/output_weights",
    )
    assert not (tmp_path / "out").exists()


def test_more_layers_than_config(tmp_path):
    config = json.load(open(f"{TINY}/bert_config.json"))
    folder = _checkpoint_dir(tmp_path, ORIGINAL, config=dict(config, num_hidden_layers=1))
    assert_user_error(
        run_kbert("convert", "from-tf1", folder, tmp_path / "out", check=False),
        "bert/encoder/layer_1/",
        "num_hidden_layers",
    )
    folder = _checkpoint_dir(tmp_path, ORIGINAL, "three", config=dict(config, num_hidden_layers=3))
    assert_user_error(
        run_kbert("convert", "from-tf1", folder, tmp_path / "out", check=False),
        "missing",
        "bert/encoder/layer_2/",
        "num_hidden_layers",
    )


@pytest.mark.parametrize(
    "field, value, variable",
    [
        ("hidden_size", 32, "bert/embeddings/word_embeddings"),
        ("intermediate_size", 256, "bert/encoder/layer_0/intermediate/dense/kernel"),
        ("max_position_embeddings", 128, "bert/embeddings/position_embeddings"),
        ("type_vocab_size", 3, "bert/embeddings/token_type_embeddings"),
    ],
)
def test_config_that_does_not_match_checkpoint(tmp_path, field, value, variable):
    config = dict(json.load(open(f"{TINY}/bert_config.json")), **{field: value})
    if field == "hidden_size":
        config["num_attention_heads"] = 4
    folder = _checkpoint_dir(tmp_path, ORIGINAL, config=config)
    result = run_kbert("convert", "from-tf1", folder, tmp_path / "out", check=False)
    assert_user_error(result, variable, "the checkpoint has shape", f"check {field}")


def test_vocab_length_must_match(tmp_path, tiny_copy):
    with open(tiny_copy / "vocab.txt", "a") as f:
        f.write("extra\n")
    assert_user_error(
        run_kbert("convert", "from-tf1", tiny_copy, tmp_path / "out", check=False), "has 301 entries", "vocab_size 300"
    )


def test_missing_path(tmp_path):
    assert_user_error(
        run_kbert("convert", "from-tf1", tmp_path / "nope", tmp_path / "out", check=False),
        "no such file or folder; pass a google-research checkpoint",
    )
    assert_user_error(
        run_kbert("convert", "to-tf1", tmp_path / "nope", tmp_path / "out", check=False), "no such model directory"
    )
    assert_user_error(run_kbert("convert", "inspect", tmp_path / "nope", check=False), "no such")


def test_missing_config_or_vocab(tmp_path, tiny_copy):
    os.remove(tiny_copy / "vocab.txt")
    assert_user_error(
        run_kbert("convert", "from-tf1", tiny_copy, tmp_path / "out", check=False), "vocab.txt: missing", "--vocab"
    )


def test_truncated_checkpoint(tmp_path, tiny_copy):
    data = tiny_copy / "bert_model.ckpt.data-00000-of-00001"
    size = data.stat().st_size
    data.write_bytes(data.read_bytes()[:1000])
    # One line with the file's real sizes: what is there, and what the index says should be.
    assert_user_error(
        run_kbert("convert", "from-tf1", tiny_copy, tmp_path / "out", check=False),
        f"the data file holds 1,000 bytes of the {size:,} the index lists: truncated",
    )
    assert not (tmp_path / "out").exists()


def test_a_missing_variable_is_named_as_missing_not_as_another_layer_count(tmp_path):
    tensors = {n: v for n, v in ORIGINAL.items() if n != "bert/encoder/layer_1/attention/self/key/bias"}
    result = run_kbert("convert", "from-tf1", _checkpoint_dir(tmp_path, tensors), tmp_path / "out", check=False)
    assert_user_error(result, "1 weight missing from the checkpoint (bert/encoder/layer_1/attention/self/key/bias)")
    assert "layers" not in result.stderr
    # A variable of a layer the checkpoint has, not in the table, is unknown, not a sign of more layers.
    tensors = dict(ORIGINAL, **{"bert/encoder/layer_0/attention/self/extra": np.zeros(3, "float32")})
    result = run_kbert(
        "convert", "from-tf1", _checkpoint_dir(tmp_path, tensors, "extra"), tmp_path / "out", check=False
    )
    assert_user_error(result, "1 unknown variable", "is this a BERT checkpoint?")
    assert "more layers" not in result.stderr


def test_garbage_checkpoint(tmp_path, tiny_copy):
    (tiny_copy / "bert_model.ckpt.index").write_bytes(b"this is not a checkpoint" * 10)
    assert_user_error(
        run_kbert("convert", "from-tf1", tiny_copy, tmp_path / "out", check=False), "not a readable TF checkpoint"
    )
    assert_user_error(run_kbert("convert", "inspect", tiny_copy, check=False), "not a readable TF checkpoint")


def test_invalid_json(tmp_path, tiny_copy):
    (tiny_copy / "bert_config.json").write_text('{"vocab_size": 300,,}')
    assert_user_error(run_kbert("convert", "from-tf1", tiny_copy, tmp_path / "out", check=False), "invalid JSON")


def test_output_dir_not_empty_needs_overwrite(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    assert_user_error(run_kbert("convert", "from-tf1", TINY, out, check=False), "--overwrite")
    assert (out / "keep.txt").read_text() == "user data"
    assert_user_error(run_kbert("convert", "to-tf1", tiny_model_dir, out, check=False), "--overwrite")
    run_kbert("convert", "from-tf1", TINY, out, "--overwrite")
    assert sorted(os.listdir(out)) == ["bert_config.json", "model.weights.h5", "vocab.txt"]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temp dirs left


def test_debug_shows_the_traceback(tmp_path):
    result = run_kbert("convert", "from-tf1", tmp_path / "nope", tmp_path / "out", "--debug", check=False)
    assert result.returncode != 0 and "Traceback" in result.stderr and "KbertError" in result.stderr


def test_atomic_output_dir_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output_dir(tmp_path / "model") as tmp:
            open(os.path.join(tmp, "half.bin"), "wb").write(b"x")
            raise RuntimeError("killed halfway")
    assert os.listdir(tmp_path) == []


def test_save_encoder_only_checkpoint(tmp_path, tiny_model_dir):
    model = kbert.load(tiny_model_dir)
    save_tf1_checkpoint(model.encoder, tmp_path / "enc", vocab_file=model.vocab_file)
    names = set(_read(tmp_path / "enc" / "bert_model.ckpt"))
    assert names == {n for n in ORIGINAL if n.startswith("bert/")}


def test_inspect_model_dir(tiny_model_dir):
    info = json.loads(run_kbert("convert", "inspect", tiny_model_dir).stdout)
    assert info["parameters"] == 99374
    assert info["heads"] == {"masked_lm": "trained", "next_sentence": "trained", "pooler": "trained"}
    info = json.loads(run_kbert("convert", "inspect", TINY).stdout)
    assert info["parameters"] == 99374 and info["layers_in_checkpoint"] == 2 and info["optimizer_slots"] == 0
