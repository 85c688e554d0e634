"""The model a pretraining run trains, by its family, and what it trains it on.

A BERT trains run_pretraining.py's objective: masked LM + next-sentence prediction, from records
with segments and next-sentence labels. A ModernBERT trains its own recipe's: the masked LM alone,
from masked-LM-only records (no segment ids, no next-sentence labels). `Objective` names the
records' features each reads, the model outputs its losses read and the metrics it reports; the
functions here build, copy, read and write the model of either family, so that the run
(`kbert.pretraining.train`) and its engines never ask which family they train.

Example:
>>> import kbert
>>> config = kbert.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
...                           intermediate_size=16)
>>> objective_of(kbert.bert_pretrainer(config)).metric_names
('loss', 'mlm_loss', 'nsp_loss', 'mlm_accuracy', 'nsp_accuracy')
"""

from __future__ import annotations

import dataclasses
import json
import os

from kbert.config import BertConfig
from kbert.formats import model_dir as bert_directory
from kbert.model.bert import BertPretrainer
from kbert.model.families import MODERNBERT, family_of
from kbert.model.initializers import unfilled
from kbert.modernbert import directory as modernbert_directory
from kbert.modernbert.config import ModernBertConfig
from kbert.modernbert.models import ModernBertMaskedLM
from kbert.modernbert.tokenizer import TOKENIZER_FILE
from kbert.pretraining.losses import masked_lm_losses, pretraining_losses
from kbert.pretraining.record_encoder import INPUT_KEYS, LABEL_KEYS, MLM_INPUT_KEYS, MLM_LABEL_KEYS


@dataclasses.dataclass(frozen=True)
class Objective:
    """What a pretraining run trains: the records' features it reads, the model's outputs its
    losses read, and the metrics it reports (`loss` first)."""

    name: str
    input_keys: tuple
    label_keys: tuple
    outputs: tuple
    metric_names: tuple
    describes: str  # the records it reads, for messages
    heads: str  # the heads it trains, for messages

    def record_layout(self, opts) -> dict:
        """What a record reader (`record_reader.numpy_batches`, `tf_dataset.pretraining_dataset`)
        takes besides the files and the batching: the records' lengths and the features read."""
        return {
            "max_seq_length": opts.max_seq_length,
            "max_predictions_per_seq": opts.max_predictions_per_seq,
            "keys": (self.input_keys, self.label_keys),
        }

    def losses(self, outputs, labels, cross_entropy=None) -> dict:
        """Its losses and accuracies (`kbert.pretraining.losses`), one float32 scalar each."""
        losses = pretraining_losses if "nsp_logits" in self.outputs else masked_lm_losses
        return losses(outputs, labels, cross_entropy)


MASKED_LM_AND_NEXT_SENTENCE = Objective(
    "mlm+nsp",
    INPUT_KEYS,
    LABEL_KEYS,
    ("mlm_logits", "nsp_logits"),
    ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"),
    "masked-LM + next-sentence records, made from a vocab.txt for a BERT",
    "masked-LM and next-sentence heads",
)
MASKED_LM = Objective(
    "mlm",
    MLM_INPUT_KEYS,
    MLM_LABEL_KEYS,
    ("mlm_logits",),
    ("loss", "mlm_loss", "mlm_accuracy"),
    "masked-LM-only records, made from a tokenizer.json for a ModernBERT",
    "masked-LM head",
)
OBJECTIVES = (MASKED_LM_AND_NEXT_SENTENCE, MASKED_LM)


def objective_of(model_or_config) -> Objective:
    """The objective a model (or a model's config) pretrains with."""
    modernbert = isinstance(model_or_config, ModernBertConfig) or family_of(model_or_config) == MODERNBERT
    return MASKED_LM if modernbert else MASKED_LM_AND_NEXT_SENTENCE


def is_pretrainer(model) -> bool:
    """Whether `model` has the heads pretraining trains (a BERT's MLM and NSP, a ModernBERT's MLM)."""
    return isinstance(model, (BertPretrainer, ModernBertMaskedLM))


def continued_from(initial) -> tuple:
    """(config, ids file, casing) of a run continuing `initial`'s pretraining: its own, with a
    BERT's casing as `do_lower_case` set it (`kbert.formats.sources.open_model`); a ModernBERT's
    is its tokenizer.json's."""
    if family_of(initial) == MODERNBERT:
        return initial.config, initial.tokenizer_file, False
    return BertConfig.from_dict(initial.config.to_dict()), initial.vocab_file, initial.do_lower_case


def new_pretrainer(config, ids_file: str):
    """An untrained pretrainer of `config`'s family, its ids from `ids_file` (a ModernBERT's
    tokenizer.json; a BERT's vocabulary is recorded apart)."""
    if isinstance(config, ModernBertConfig):
        return ModernBertMaskedLM(config, tokenizer_file=ids_file)
    return BertPretrainer(config)


def copied_in_scope(initial):
    """A pretrainer like `initial`, built in the current strategy scope (its variables mirrored
    where the strategy mirrors them), holding `initial`'s weights."""
    with unfilled():  # every weight is assigned next
        if family_of(initial) == MODERNBERT:
            model = ModernBertMaskedLM(initial.config, tokenizer_file=initial.tokenizer_file)
            model.tokenizer_folder = getattr(initial, "tokenizer_folder", None)
        else:
            model = BertPretrainer(BertConfig.from_dict(initial.config.to_dict()))
    for target, value in zip(model.weights, initial.weights, strict=True):
        target.assign(value)
    # `initial` stays referenced by the caller: a converter's vocab.txt (one made from an HF
    # tokenizer.json) lives as long as the model it was made for.
    return model


def run_model_start(model_dir: str) -> tuple:
    """(config, ids file) of the model a run in `model_dir` trains, from the files it wrote there."""
    if modernbert_directory.is_modernbert_dir(model_dir):
        config_file = os.path.join(model_dir, modernbert_directory.CONFIG_FILE)
        with open(config_file, encoding="utf-8") as f:
            values = json.load(f)
        for key in (modernbert_directory.FAMILY_KEY, "kbert_model"):
            values.pop(key, None)
        return ModernBertConfig.from_hf(values, config_file), os.path.join(model_dir, TOKENIZER_FILE)
    config = BertConfig.from_json_file(os.path.join(model_dir, bert_directory.CONFIG_FILE))
    return config, os.path.join(model_dir, bert_directory.VOCAB_FILE)


def write_model_files(model, model_dir: str, ids_file: str, do_lower_case: bool, weights: bool = True):
    """The model-directory files of a run's model, each replaced atomically in `model_dir`
    (which also holds the run's checkpoints and logs)."""
    if family_of(model) == MODERNBERT:
        modernbert_directory.write_in_place(model, model_dir, weights=weights)
    else:
        bert_directory.write_model_files(model, model_dir, ids_file, do_lower_case, weights=weights)
