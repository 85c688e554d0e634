"""`kbert convert inspect` checks what it reports: a checkpoint or model directory cut short, or
whose bert_config.json does not match its weights, is one line saying what is wrong."""

import json
import shutil

import pytest

import kbert
from conftest import TINY, assert_user_error, run_kbert
from kbert.converters.inspect import tf1_shapes
from kbert.converters.names import tf1_to_kbert_paths

CONFIG = json.load(open(f"{TINY}/bert_config.json"))


def test_shapes_from_the_config_are_the_models():
    config = kbert.BertConfig.from_dict(dict(CONFIG, intermediate_size=96, max_position_embeddings=40))
    model = kbert.bert_pretrainer(config)
    by_path = {w.path: tuple(w.shape) for w in model.weights}
    expected = {name: by_path[path] for name, path in tf1_to_kbert_paths(config.num_hidden_layers).items()}
    assert tf1_shapes(config) == expected


def test_healthy_checkpoint_and_model_dir(tiny_model_dir):
    assert json.loads(run_kbert("convert", "inspect", TINY).stdout)["parameters"] == 99374
    assert json.loads(run_kbert("convert", "inspect", tiny_model_dir).stdout)["parameters"] == 99374


def test_truncated_data_file(tiny_copy):
    data = tiny_copy / "bert_model.ckpt.data-00000-of-00001"
    size = data.stat().st_size
    data.write_bytes(data.read_bytes()[: size - 1000])
    assert_user_error(
        run_kbert("convert", "inspect", tiny_copy, check=False),
        str(tiny_copy / "bert_model.ckpt"),
        f"the data file holds {size - 1000:,} bytes of the {size:,} the index lists: truncated",
        "download or copy the checkpoint again",
    )


def test_missing_data_shard(tiny_copy):
    (tiny_copy / "bert_model.ckpt.data-00000-of-00001").rename(tiny_copy / "bert_model.ckpt.data-00000-of-00002")
    result = run_kbert("convert", "inspect", tiny_copy, check=False)
    assert_user_error(result, "1 data file of 2 missing")


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("hidden_size", 32, "bert/embeddings/word_embeddings has shape [300, 64] but"),
        ("vocab_size", 301, "bert/embeddings/word_embeddings has shape [300, 64] but"),
        ("num_hidden_layers", 3, "the checkpoint has 2 layers but"),
        ("num_hidden_layers", 1, "the checkpoint has 2 layers but"),
        ("intermediate_size", 256, "check intermediate_size"),
    ],
)
def test_config_that_does_not_match_the_checkpoint(tiny_copy, field, value, said):
    (tiny_copy / "bert_config.json").write_text(json.dumps(dict(CONFIG, **{field: value})))
    result = run_kbert("convert", "inspect", tiny_copy, check=False)
    assert_user_error(result, said, "use the bert_config.json and vocab.txt that came with the checkpoint")


def test_vocab_that_does_not_match_the_checkpoint(tiny_copy):
    with open(tiny_copy / "vocab.txt", "a") as f:
        f.write("extra\n")
    assert_user_error(run_kbert("convert", "inspect", tiny_copy, check=False), "has 301 entries", "vocab_size 300")


def test_truncated_model_weights(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model_dir)
    weights = model_dir / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert_user_error(run_kbert("convert", "inspect", model_dir, check=False), str(weights), "truncated")


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("hidden_size", 32, "but bert_config.json gives"),
        ("vocab_size", 301, "check vocab_size"),
        ("num_hidden_layers", 3, "layers but bert_config.json says num_hidden_layers 3"),
    ],
)
def test_model_dir_config_that_does_not_match_its_weights(tiny_model_dir, tmp_path, field, value, said):
    model_dir = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.load(open(model_dir / "bert_config.json"))
    (model_dir / "bert_config.json").write_text(json.dumps(dict(config, **{field: value})))
    assert_user_error(run_kbert("convert", "inspect", model_dir, check=False), str(model_dir), said)
