"""The kinds of kbert model: the name `bert_config.json` records as `kbert_model`, and its class.

>>> import kbert
>>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
...                           num_attention_heads=4, intermediate_size=64)
>>> model_kind(kbert.bert_classifier(config, 2))
'classifier'
"""

from __future__ import annotations

from kbert.model import bert
from kbert.modernbert.models import MODEL_CLASSES as MODERNBERT_CLASSES
from kbert.runtime.errors import KbertError

# The kinds whose model carries a task head, and with it a task record (`task_info`).
HEAD_KINDS = ("classifier", "tagger", "span_predictor", "multiple_choice")
# A task model's record in bert_config.json, besides the original keys: what `kbert predict`,
# `evaluate` and `export` read, so that none of them needs the task's flags again. long_text
# (classify, regress, tag): "truncate" (also when absent) or "windows", documents read whole in
# windows of max_seq_length tokens starting doc_stride tokens apart; doc_stride is also squad's.
# activation (rerank): sigmoid or identity, what turns the logit into the score it prints.
# Each task checks and completes its own (`kbert.finetuning.tasks.head_task_info`).
TASK_KEYS = (
    "task",
    "labels",
    "max_seq_length",
    "text_pairs",
    "long_text",
    "doc_stride",
    "max_query_length",
    "activation",
)


def model_classes() -> dict:
    """{kind: class} for every kbert model, as `bert_config.json`'s `kbert_model` names them."""
    return {
        "pretrainer": bert.BertPretrainer,
        "encoder": bert.BertEncoder,
        "classifier": bert.BertClassifier,
        "tagger": bert.BertTagger,
        "span_predictor": bert.BertSpanPredictor,
        "multiple_choice": bert.BertMultipleChoice,
    }


def model_kind(model) -> str:
    """The kind of a kbert model (`model_classes`), or a one-line error for any other model."""
    for kind, cls in model_classes().items():
        if type(model) is cls:
            return kind
    for kind, cls in MODERNBERT_CLASSES.items():
        if type(model) is cls:
            return kind
    raise KbertError(
        f"cannot save a {type(model).__name__}: kbert model directories hold kbert models "
        f"(bert_encoder, bert_pretrainer, bert_classifier, bert_tagger, bert_span_predictor, "
        f"bert_multiple_choice)"
    )
