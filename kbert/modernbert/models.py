"""ModernBERT's Keras models: the backbone (`ModernBertEncoder`) and its heads, as keras-hub splits
a backbone from its tasks.

Inputs: a dict of int32 [batch, seq] `input_ids` and `input_mask` (1 = real token); ModernBERT
has no segment ids. Outputs: `sequence_output` [batch, seq, H]; the masked LM adds `mlm_logits`
over `masked_lm_positions` [batch, P] when they are given, else over every position; the task
heads give `logits`.

Example:
>>> import numpy as np
>>> from kbert.modernbert.config import ModernBertConfig
>>> config = ModernBertConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
...                           num_hidden_layers=2, num_attention_heads=4, local_attention=4)
>>> model = ModernBertMaskedLM(config)
>>> ids = np.array([[1, 7, 9, 2]], dtype="int32")
>>> out = model({"input_ids": ids, "input_mask": np.ones_like(ids)})
>>> tuple(out["sequence_output"].shape), tuple(out["mlm_logits"].shape)
((1, 4, 32), (1, 4, 64))
"""

from __future__ import annotations

import dataclasses

import keras
from keras import layers

from kbert.backend import take_positions
from kbert.modernbert.config import FULL, SLIDING, ModernBertConfig
from kbert.modernbert.layers import (
    EncoderLayer,
    Pool,
    PredictionHead,
    PutTokens,
    RealTokens,
    RotaryAngles,
    TakeTokens,
    TiedDecoder,
    layer_norm,
)

INPUTS = ("input_ids", "input_mask")
FAMILY = "modernbert"


def _as_config(config) -> ModernBertConfig:
    if isinstance(config, ModernBertConfig):
        return config
    values = dict(config)
    return ModernBertConfig(**{**values, "layer_types": tuple(values.get("layer_types", ()))})


def _inputs(names=INPUTS):
    return {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in names}


class _ModernBertModel(keras.Model):
    """What every ModernBERT model declares besides its layers: its config, the tokenizer.json its
    ids belong to, the heads a converter created fresh, and for task models its task record."""

    family = FAMILY
    # A byte-level BPE keeps case: what code asking any model for its casing reads.
    do_lower_case = False

    def _declare(self, config, tokenizer_file, task_info=None):
        self.config = config
        self.tokenizer_file = tokenizer_file
        self.task_info = dict(task_info or {})
        self.fresh_heads = ()

    def get_config(self):
        return {
            "config": {**dataclasses.asdict(self.config), "layer_types": list(self.config.layer_types)},
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="kbert")
class ModernBertEncoder(_ModernBertModel):
    """transformers' `ModernBertModel`: the token embeddings and their norm, the layers and the final norm.

    Args:
        config: `ModernBertConfig` or its dict.
        tokenizer_file: the tokenizer.json its ids belong to.
    """

    def __init__(self, config, *, tokenizer_file=None, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "modernbert_encoder")
        tok_embeddings = layers.Embedding(config.vocab_size, config.hidden_size, name="tok_embeddings")
        embeddings_norm = layer_norm(config, "embeddings_norm")
        encoder_layers = [EncoderLayer(config, i, name=f"layer_{i}") for i in range(config.num_hidden_layers)]
        final_norm = layer_norm(config, "final_norm")

        inputs = _inputs()
        mask = inputs["input_mask"]
        # The layers run on the real tokens only (JAX: every token), [real tokens, H].
        index = RealTokens(name="real_tokens")(mask)
        hidden = embeddings_norm(tok_embeddings(TakeTokens(name="real_ids")(inputs["input_ids"], index)))
        rotary = {
            kind: RotaryAngles(config.rope_theta(kind), config.head_size, name=f"rotary_{kind}")(mask)
            for kind in (FULL, SLIDING)
            if kind in config.layer_types
        }
        for layer in encoder_layers:
            hidden = layer(hidden, mask, index, rotary)
        sequence = PutTokens(name="sequence")(final_norm(hidden), index, mask)
        super().__init__(inputs=inputs, outputs={"sequence_output": sequence}, **kwargs)
        self.tok_embeddings, self.embeddings_norm = tok_embeddings, embeddings_norm
        self.encoder_layers, self.final_norm = encoder_layers, final_norm
        self._declare(config, tokenizer_file)


class _Headed(_ModernBertModel):
    def _encoder_and_inputs(self, config, encoder, tokenizer_file, names=INPUTS):
        encoder = encoder if encoder is not None else ModernBertEncoder(config, tokenizer_file=tokenizer_file)
        inputs = _inputs(names)
        return encoder, inputs, encoder({name: inputs[name] for name in INPUTS})["sequence_output"]


@keras.saving.register_keras_serializable(package="kbert")
class ModernBertMaskedLM(_Headed):
    """transformers' `ModernBertForMaskedLM`: the encoder, then dense, activation and norm, and
    logits against the tied token embeddings plus the decoder's bias.

    `masked_lm_positions` [batch, P] is optional: given, `mlm_logits` is [batch, P, vocab]
    (what pretraining and fill-mask read); left out, it is every position's [batch, seq, vocab].
    """

    def __init__(self, config, encoder: ModernBertEncoder | None = None, *, tokenizer_file=None, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "modernbert_masked_lm")
        tokenizer_file = tokenizer_file or getattr(encoder, "tokenizer_file", None)
        encoder, inputs, sequence = self._encoder_and_inputs(config, encoder, tokenizer_file)
        positions = keras.Input(shape=(None,), dtype="int32", name="masked_lm_positions", optional=True)
        head = PredictionHead(config, name="head")
        decoder = TiedDecoder(encoder.tok_embeddings, config.decoder_bias, name="decoder")
        logits = decoder(head(_Gather(name="masked_positions")(sequence, positions)))
        outputs = {"sequence_output": sequence, "mlm_logits": logits}
        super().__init__(inputs={**inputs, "masked_lm_positions": positions}, outputs=outputs, **kwargs)
        self.encoder, self.head, self.decoder = encoder, head, decoder
        self._declare(config, tokenizer_file)

    def __call__(self, inputs, *args, **kwargs):
        if isinstance(inputs, dict) and "masked_lm_positions" not in inputs:  # every position's logits
            inputs = {**inputs, "masked_lm_positions": None}
        return super().__call__(inputs, *args, **kwargs)


class _Gather(layers.Layer):
    """The sequence's vectors at `positions`, or all of them when positions are not given."""

    def call(self, sequence, positions=None):
        return sequence if positions is None else take_positions(sequence, positions)

    def compute_output_spec(self, sequence, positions=None):
        from keras import KerasTensor

        if positions is None:
            return KerasTensor(sequence.shape, dtype=sequence.dtype)
        return KerasTensor((sequence.shape[0], positions.shape[1], sequence.shape[2]), dtype=sequence.dtype)


class _LabelHead(_Headed):
    """transformers' classifier heads: (pooling,) dense, activation, norm, dropout, then a biased
    dense to `num_classes` logits."""

    def _build_head(self, config, encoder, num_classes, dropout, tokenizer_file, task_info, per_token, **kwargs):
        tokenizer_file = tokenizer_file or getattr(encoder, "tokenizer_file", None)
        encoder, inputs, sequence = self._encoder_and_inputs(config, encoder, tokenizer_file)
        head = PredictionHead(config, name="head")
        classifier = layers.Dense(num_classes, name="classifier")
        features = (
            sequence if per_token else Pool(config.classifier_pooling, name="pool")(sequence, inputs["input_mask"])
        )
        logits = classifier(layers.Dropout(dropout, name="drop")(head(features)))
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)
        self.encoder, self.head, self.classifier = encoder, head, classifier
        self.num_classes, self.dropout_rate = int(num_classes), float(dropout)
        self._declare(config, tokenizer_file, task_info)

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "dropout": self.dropout_rate,
            "task_info": self.task_info,
        }


@keras.saving.register_keras_serializable(package="kbert")
class ModernBertClassifier(_LabelHead):
    """transformers' `ModernBertForSequenceClassification`: `logits` [batch, num_classes] from the
    `cls` token or the mean of the real tokens (`config.classifier_pooling`)."""

    def __init__(
        self, config, num_classes=2, encoder=None, *, dropout=0.0, tokenizer_file=None, task_info=None, **kwargs
    ):
        kwargs.setdefault("name", "modernbert_classifier")
        self._build_head(_as_config(config), encoder, num_classes, dropout, tokenizer_file, task_info, False, **kwargs)


@keras.saving.register_keras_serializable(package="kbert")
class ModernBertTagger(_LabelHead):
    """transformers' `ModernBertForTokenClassification`: `logits` [batch, seq, num_classes]."""

    def __init__(
        self, config, num_classes=2, encoder=None, *, dropout=0.0, tokenizer_file=None, task_info=None, **kwargs
    ):
        kwargs.setdefault("name", "modernbert_tagger")
        self._build_head(_as_config(config), encoder, num_classes, dropout, tokenizer_file, task_info, True, **kwargs)


# {kind: class}, the kinds a model directory's config.json records as `kbert_model`, as BERT's do.
MODEL_CLASSES = {
    "encoder": ModernBertEncoder,
    "pretrainer": ModernBertMaskedLM,
    "classifier": ModernBertClassifier,
    "tagger": ModernBertTagger,
}
