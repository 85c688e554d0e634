import json

import pytest

from conftest import TINY
from kbert import BertConfig, KbertError


def test_reads_and_writes_bert_config_json_as_is(tmp_path):
    path = f"{TINY}/bert_config.json"
    config = BertConfig.from_json_file(path)
    assert config.hidden_size == 64 and config.num_attention_heads == 4 and config.head_size == 16
    config.to_json_file(tmp_path / "out.json")
    original = json.load(open(path))
    written = json.load(open(tmp_path / "out.json"))
    assert written == original
    assert list(written) == list(original)  # same keys, same order


def test_extra_keys_are_kept():
    config = BertConfig.from_dict(
        {"vocab_size": 10, "hidden_size": 8, "num_attention_heads": 2, "do_lower_case": False, "labels": ["a", "b"]}
    )
    assert config.extras == {"do_lower_case": False, "labels": ["a", "b"]}
    assert BertConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "swish"}, "hidden_act 'swish' is not supported"),
        ({"hidden_size": "768"}, "hidden_size must be a positive integer"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be a number in [0, 1)"),
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads 5"),
        ({"initializer_range": -1}, "initializer_range must be a positive number"),
    ],
)
def test_rejects_bad_values(change, message):
    values = json.load(open(f"{TINY}/bert_config.json"))
    values.update(change)
    with pytest.raises(KbertError, match=message.replace("[", r"\[").replace(")", r"\)")):
        BertConfig.from_dict(values)


def test_invalid_json_and_missing_file(tmp_path):
    bad = tmp_path / "bert_config.json"
    bad.write_text('{"vocab_size": 30522,')
    with pytest.raises(KbertError, match="invalid JSON"):
        BertConfig.from_json_file(bad)
    with pytest.raises(KbertError, match="no such config file"):
        BertConfig.from_json_file(tmp_path / "missing.json")


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "gelu_tanh", "relu", "tanh"])
def test_accepts_documented_activations(act):
    assert BertConfig(vocab_size=10, hidden_size=8, num_attention_heads=2, hidden_act=act).hidden_act == act
