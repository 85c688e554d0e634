"""The Example blocks in docstrings run, from the repository root, and print what they say."""

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = [
    "kbert.config",
    "kbert.files",
    "kbert.model.bert",
    "kbert.text.tokenizer",
    "kbert.text.graph_tokenizer",
    "kbert.converters.names",
    "kbert.converters.inspect",
    "kbert.converters.hf",
    "kbert.errors",
    "kbert.model.layers",
    "kbert.pretraining.losses",
    "kbert.training.optimization",
    "kbert.finetuning.metrics",
    "kbert.finetuning.readers",
    "kbert.finetuning.encoding",
    "kbert.finetuning.squad",
    "kbert.finetuning.squad_decoding",
    "kbert.text.preprocessing",
    "kbert.serving.client",
    "kbert.serving.heads",
    "kbert.serving.predict",
    "kbert.model.fused",
    "kbert.pretraining.create_data",
    "kbert.pretraining.instances",
    "kbert.pretraining.python_random",
    "kbert.pretraining.record_encoder",
    "kbert.pretraining.record_statistics",
    "kbert.text.vocab_builder",
    "kbert.finetuning.tasks",
    "kbert.finetuning.predict",
    "kbert.finetuning.options",
    "kbert.finetuning.output",
    "kbert.model_dir",
    "kbert.converters.named",
    "kbert.converters.safetensors_file",
    "kbert.locks",
    "kbert.outputs",
    "kbert.training.interruption",
    "kbert.pretraining.fill_mask",
    "kbert.records",
    "kbert.processes",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        extraglobs={"kbert": importlib.import_module("kbert")},
    )
    assert result.failed == 0
    assert result.attempted > 0
