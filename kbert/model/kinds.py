"""The kinds of kbert model: the name `bert_config.json` records as `kbert_model`, and its class.

>>> import kbert
>>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
...                           num_attention_heads=4, intermediate_size=64)
>>> model_kind(kbert.bert_classifier(config, 2))
'classifier'
"""

from __future__ import annotations

from kbert.model import bert
from kbert.runtime.errors import KbertError


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
    raise KbertError(
        f"cannot save a {type(model).__name__}: kbert model directories hold kbert models "
        f"(bert_encoder, bert_pretrainer, bert_classifier, bert_tagger, bert_span_predictor, "
        f"bert_multiple_choice)"
    )
