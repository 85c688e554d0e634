"""The Example blocks in docstrings run, from the repository root, and print what they say."""

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ["kbert.config", "kbert.files", "kbert.model.bert", "kbert.text.tokenizer", "kbert.text.graph_tokenizer",
           "kbert.converters.names", "kbert.converters.inspect", "kbert.converters.hf", "kbert.errors", "kbert.model.layers", "kbert.pretraining.losses",
           "kbert.training.optimization", "kbert.finetuning.metrics", "kbert.finetuning.readers", "kbert.finetuning.squad", "kbert.text.preprocessing",
           "kbert.serving.client", "kbert.model.fused", "kbert.pretraining.create_data", "kbert.text.vocab_builder",
           "kbert.finetuning.tasks", "kbert.finetuning.predict", "kbert.finetuning.options", "kbert.finetuning.output",
           "kbert.model_dir",
           "kbert.converters.named", "kbert.locks", "kbert.outputs", "kbert.training.interruption",
           "kbert.pretraining.fill_mask", "kbert.records", "kbert.processes"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             extraglobs={"kbert": importlib.import_module("kbert")})
    assert result.failed == 0
    assert result.attempted > 0
