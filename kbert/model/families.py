"""The model families, and what differs between them for code that reads any model: its encoder,
and the packer that turns its texts into its inputs. BERT: WordPiece from vocab.txt, with segment
ids; ModernBERT: the byte-level BPE of its tokenizer.json, without them.

>>> import kbert
>>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
...                           num_attention_heads=2, intermediate_size=16)
>>> family_of(kbert.bert_encoder(config))
'bert'
"""

from __future__ import annotations

from kbert.backend import make_preprocessor
from kbert.model import bert
from kbert.modernbert.models import FAMILY as MODERNBERT
from kbert.modernbert.models import ModernBertClassifier, ModernBertEncoder, ModernBertMaskedLM, ModernBertTagger

BERT = "bert"


def family_of(model) -> str:
    """ "bert" or "modernbert": the family a kbert model belongs to."""
    return getattr(model, "family", BERT)


def encoder_of(model):
    """The encoder of a kbert model of any family (the model itself, or the one its heads sit on),
    or None for anything else."""
    if family_of(model) == MODERNBERT:
        return model if isinstance(model, ModernBertEncoder) else getattr(model, "encoder", None)
    return bert.encoder_of(model)


def make_packer(model, sequence_length: int):
    """The packer (`kbert.text.packing.Packer`) of a model's texts into its inputs."""
    if family_of(model) == MODERNBERT:
        from kbert.modernbert.packing import BpePacker

        return BpePacker(model.tokenizer_file, model.config.pad_token_id, sequence_length)
    return make_preprocessor(model.vocab_file, model.do_lower_case, sequence_length)


def graph_packer(model, sequence_length: int):
    """The model's texts -> its inputs as TensorFlow ops, for an export: the original tokenizer on
    vocab.txt for a BERT (`BertPreprocessor`), the tokenizer.json's byte-level BPE for a
    ModernBERT (`BpeGraphPacker`)."""
    if family_of(model) == MODERNBERT:
        from kbert.modernbert.graph_tokenizer import BpeGraphPacker

        return BpeGraphPacker(model.tokenizer_file, sequence_length, model.config.pad_token_id)
    from kbert.text.graph_packer import BertPreprocessor

    return BertPreprocessor(model.vocab_file, model.do_lower_case, sequence_length)


def ids_file(model) -> str:
    """The file a model's token ids come from: a BERT's vocab.txt, a ModernBERT's tokenizer.json."""
    return model.tokenizer_file if family_of(model) == MODERNBERT else model.vocab_file


def fill_masks(model, text: str, top_k: int, mask: str) -> dict | None:
    """A masked LM's predictions at each `mask` in `text`, where the family reads text its own way
    (a ModernBERT's masked LM: its tokenizer.json); None for any other model, which
    `kbert.pretraining.fill_mask` fills (a BERT) or refuses."""
    if not isinstance(model, ModernBertMaskedLM):
        return None
    from kbert.modernbert.fill_mask import fill_mask

    return fill_mask(model, text, top_k, mask)


def classifier(base, num_classes: int, *, task_info=None):
    """A classifier (`num_classes` 1: a regressor) on a model of either family, sharing its encoder."""
    if family_of(base) == MODERNBERT:
        return _modernbert_head(ModernBertClassifier, base, num_classes, task_info)
    return bert.bert_classifier(base, num_classes, task_info=task_info)


def tagger(base, num_classes: int, *, task_info=None):
    """A tagger (logits per token) on a model of either family, sharing its encoder."""
    if family_of(base) == MODERNBERT:
        return _modernbert_head(ModernBertTagger, base, num_classes, task_info)
    return bert.bert_tagger(base, num_classes, task_info=task_info)


def _modernbert_head(cls, base, num_classes, task_info):
    encoder = encoder_of(base)
    head = cls(encoder.config, num_classes, encoder, tokenizer_file=encoder.tokenizer_file, task_info=task_info)
    head.tokenizer_folder = getattr(base, "tokenizer_folder", None)
    return head
