"""kbert: BERT for Keras 3, numerically google-research/bert.

>>> import kbert
>>> config = kbert.BertConfig.from_json_file("bert_config.json")    # doctest: +SKIP
>>> model = kbert.converters.load_tf1_checkpoint("uncased_L-12_H-768_A-12/")  # doctest: +SKIP

The models, their optimizer and losses run on the Keras backend Keras picks: `KERAS_BACKEND`
(tensorflow, jax or torch), else the one ~/.keras/keras.json names, else TensorFlow. google-research
checkpoints, TF Serving and TF Hub exports and the in-graph tokenizer are TensorFlow's (docs/model.md,
"Backends").

Names are imported on first use, so `kbert --help` does not wait for TensorFlow.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "kbert.config",
    "KbertError": "kbert.runtime.errors",
    "BertEncoder": "kbert.model.bert",
    "BertPretrainer": "kbert.model.bert",
    "bert_encoder": "kbert.model.bert",
    "bert_pretrainer": "kbert.model.bert",
    "BertClassifier": "kbert.model.bert",
    "BertTagger": "kbert.model.bert",
    "BertSpanPredictor": "kbert.model.bert",
    "bert_classifier": "kbert.model.bert",
    "bert_tagger": "kbert.model.bert",
    "bert_span_predictor": "kbert.model.bert",
    "BertMultipleChoice": "kbert.model.bert",
    "bert_multiple_choice": "kbert.model.bert",
    "Vocabulary": "kbert.model.bert",
    "BertPreprocessor": "kbert.text.graph_packer",
    "load": "kbert.formats.sources",
    "embed": "kbert.finetuning.embedding",
    "rerank": "kbert.finetuning.predict",
    "save": "kbert.formats.model_dir",
    "Tokenizer": "kbert.text.tokenizer",
    "pack_texts": "kbert.text.packing",
    "GraphTokenizer": "kbert.text.graph_tokenizer",
}

__all__ = sorted(_EXPORTS) + ["converters"]


def __getattr__(name):
    if name == "load":  # refuses an unfinished run's folder as its trainer describes it
        importlib.import_module("kbert.pretraining.run_record")
        importlib.import_module("kbert.finetuning.run_state")
    if name in ("load", "save"):  # a task model's record, checked and completed by its task
        importlib.import_module("kbert.finetuning.tasks")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in ("converters", "serving", "cli"):
        return importlib.import_module(f"kbert.{name}")
    raise AttributeError(f"module 'kbert' has no attribute {name!r}")
