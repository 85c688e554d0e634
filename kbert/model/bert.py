"""BERT as functional Keras models: the encoder (`modeling.BertModel`) and the pretrainer (+ MLM, NSP)."""

from __future__ import annotations

import keras
from keras import ops

from kbert.config import BertConfig
from kbert.model.layers import (BertEmbeddings, MaskedLMHead, NextSentenceHead, OutputProjection,
                          TransformerLayer, attention_adder, dense)

ENCODER_INPUTS = ("input_ids", "input_mask", "segment_ids")


def _as_config(config) -> BertConfig:
    return config if isinstance(config, BertConfig) else BertConfig.from_dict(config)


def _int_inputs(names):
    # Sequence length is None: any length up to max_position_embeddings.
    return {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in names}


class _ConfiguredByBertConfig:
    """get_config/from_config for models whose only argument is the BertConfig."""

    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="kbert")
class BertEncoder(_ConfiguredByBertConfig, keras.Model):
    """google-research/bert's `BertModel`: embeddings, L transformer layers and the pooler.

    Inputs: a dict of int32 [batch, seq] `input_ids`, `input_mask` (1 = real token), `segment_ids`.
    Outputs: a dict with `sequence_output` [batch, seq, H] and `pooled_output` [batch, H].

    Args:
        config: `BertConfig` or its dict.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> encoder = kbert.bert_encoder(config)
    >>> ids = np.array([[2, 7, 9, 3]], dtype="int32")
    >>> out = encoder({"input_ids": ids, "input_mask": np.ones_like(ids),
    ...                "segment_ids": np.zeros_like(ids)})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 4, 32), (1, 32))
    """

    def __init__(self, config, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_encoder")
        # === Layers ===
        self.embeddings = BertEmbeddings(config, name="embeddings")
        self.transformer_layers = [TransformerLayer(config, name=f"transformer_layer_{i}")
                                   for i in range(config.num_hidden_layers)]
        self.pooler = dense(config, config.hidden_size, "pooler", "tanh")

        # === Functional Model ===
        inputs = _int_inputs(ENCODER_INPUTS)
        hidden = self.embeddings(inputs["input_ids"], inputs["segment_ids"])
        adder = attention_adder(inputs["input_mask"])
        for layer in self.transformer_layers:
            hidden = layer(hidden, adder)
        # The pooler reads the first ([CLS]) token.
        pooled = self.pooler(hidden[:, 0, :])
        super().__init__(inputs=inputs,
                         outputs={"sequence_output": hidden, "pooled_output": pooled}, **kwargs)

        # === Config ===
        self.config = config


@keras.saving.register_keras_serializable(package="kbert")
class BertPretrainer(_ConfiguredByBertConfig, keras.Model):
    """The encoder plus the masked-LM and next-sentence heads of `run_pretraining.py`.

    Inputs: the encoder's three plus int32 `masked_lm_positions` [batch, P].
    Outputs: `sequence_output`, `pooled_output`, `mlm_logits` [batch, P, vocab] and
    `nsp_logits` [batch, 2] (float32; their log_softmax is the original's `log_probs`).

    Args:
        config: `BertConfig` or its dict.
        encoder: optional `BertEncoder` to put the heads on (its weights are shared).

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> model = kbert.bert_pretrainer(config)
    >>> ids = np.array([[2, 7, 9, 3]], dtype="int32")
    >>> out = model({"input_ids": ids, "input_mask": np.ones_like(ids),
    ...              "segment_ids": np.zeros_like(ids),
    ...              "masked_lm_positions": np.array([[1, 2]], dtype="int32")})
    >>> tuple(out["mlm_logits"].shape), tuple(out["nsp_logits"].shape)
    ((1, 2, 100), (1, 2))
    """

    def __init__(self, config, encoder: BertEncoder | None = None, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_pretrainer")
        # === Layers ===
        self.encoder = encoder if encoder is not None else BertEncoder(config)
        self.mlm_head = MaskedLMHead(config, self.encoder.embeddings.word_embeddings, name="mlm_head")
        self.nsp_head = NextSentenceHead(config, name="nsp_head")

        # === Functional Model ===
        inputs = _int_inputs(ENCODER_INPUTS + ("masked_lm_positions",))
        encoded = self.encoder({name: inputs[name] for name in ENCODER_INPUTS})
        outputs = {
            "sequence_output": encoded["sequence_output"],
            "pooled_output": encoded["pooled_output"],
            "mlm_logits": self.mlm_head(encoded["sequence_output"], inputs["masked_lm_positions"]),
            "nsp_logits": self.nsp_head(encoded["pooled_output"]),
        }
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        # === Config ===
        self.config = config


class _TaskModel(keras.Model):
    """A head on a `BertEncoder`, built from (config, size of the head) and an optional encoder."""

    def _encoder_and_inputs(self, config, encoder):
        self.encoder = encoder if encoder is not None else BertEncoder(config)
        inputs = _int_inputs(ENCODER_INPUTS)
        return inputs, self.encoder({name: inputs[name] for name in ENCODER_INPUTS})

    def get_config(self):
        return {"config": self.config.to_dict(), "num_classes": self.num_classes, "dropout": self.dropout_rate,
                "name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="kbert")
class BertClassifier(_TaskModel):
    """`run_classifier.py`'s model: dropout on the pooled output, then `output_weights` [classes, H].

    Inputs: the encoder's three. Outputs: {"logits": float32 [batch, num_classes]}.
    With num_classes=1 it is a regressor (the logit is the prediction).

    Args:
        config: `BertConfig` or its dict.
        num_classes: int. Number of labels (1 for regression).
        encoder: optional `BertEncoder` to put the head on (its weights are shared).
        dropout: float. Dropout on the pooled output; 0.1 in run_classifier.py.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> model = kbert.bert_classifier(config, num_classes=3)
    >>> ids = np.array([[2, 7, 9, 3]], dtype="int32")
    >>> out = model({"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    >>> tuple(out["logits"].shape)
    (1, 3)
    """

    def __init__(self, config, num_classes: int, encoder: BertEncoder | None = None, dropout: float = 0.1,
                 **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_classifier")
        # === Layers ===
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = OutputProjection(config, num_classes, name="classifier_head")

        # === Functional Model ===
        inputs, encoded = self._encoder_and_inputs(config, encoder)
        logits = self.head(self.dropout(encoded["pooled_output"]))
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        # === Config ===
        self.config, self.num_classes, self.dropout_rate = config, int(num_classes), float(dropout)


@keras.saving.register_keras_serializable(package="kbert")
class BertTagger(_TaskModel):
    """Token classification (NER, POS): dropout on every token's output, then [labels, H] logits.

    Inputs: the encoder's three. Outputs: {"logits": float32 [batch, seq, num_classes]}.

    Args:
        config: `BertConfig` or its dict.
        num_classes: int. Number of tags.
        encoder: optional `BertEncoder` to put the head on.
        dropout: float. 0.1, as the classifier.
    """

    def __init__(self, config, num_classes: int, encoder: BertEncoder | None = None, dropout: float = 0.1,
                 **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_tagger")
        # === Layers ===
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = OutputProjection(config, num_classes, name="tagger_head")

        # === Functional Model ===
        inputs, encoded = self._encoder_and_inputs(config, encoder)
        logits = self.head(self.dropout(encoded["sequence_output"]))
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        # === Config ===
        self.config, self.num_classes, self.dropout_rate = config, int(num_classes), float(dropout)


@keras.saving.register_keras_serializable(package="kbert")
class BertSpanPredictor(_TaskModel):
    """`run_squad.py`'s model: `cls/squad/output_weights` [2, H] on every token, no extra dropout.

    Inputs: the encoder's three. Outputs: {"start_logits", "end_logits"}: float32 [batch, seq].

    Args:
        config: `BertConfig` or its dict.
        encoder: optional `BertEncoder` to put the head on.
    """

    def __init__(self, config, encoder: BertEncoder | None = None, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_span_predictor")
        # === Layers ===
        self.head = OutputProjection(config, 2, name="squad_head")

        # === Functional Model ===
        inputs, encoded = self._encoder_and_inputs(config, encoder)
        logits = self.head(encoded["sequence_output"])
        outputs = {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        # === Config ===
        self.config, self.num_classes = config, 2

    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name, "trainable": self.trainable}


class _FoldChoices(keras.layers.Layer):
    """[batch, choices, seq] -> [batch·choices, seq]; the sizes are read when called."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_spec(self, x):
        return keras.KerasTensor((None, x.shape[-1]), dtype=x.dtype)


class _UnfoldChoices(keras.layers.Layer):
    """Scores [batch·choices, 1] -> [batch, choices], the choices counted in `like` [batch, choices, seq]."""

    def call(self, scores, like):
        return ops.reshape(scores, (-1, ops.shape(like)[1]))

    def compute_output_spec(self, scores, like):
        return keras.KerasTensor((like.shape[0], like.shape[1]), dtype=scores.dtype)


@keras.saving.register_keras_serializable(package="kbert")
class BertMultipleChoice(_TaskModel):
    """Multiple choice, as the BERT paper fine-tuned SWAG: each (context, ending) pair is encoded
    on its own, a [1, H] `output_weights` scores its pooled [CLS] output, and a softmax over the
    N scores picks the ending.

    Inputs: the encoder's three, each int32 [batch, choices, seq]. Outputs: {"logits": float32
    [batch, choices]}. The number of choices may differ from call to call.

    Args:
        config: `BertConfig` or its dict.
        encoder: optional `BertEncoder` to put the head on (its weights are shared).
        dropout: float. Dropout on the pooled output; 0.1, as the classifier.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> model = kbert.bert_multiple_choice(config)
    >>> ids = np.array([[[2, 7, 3], [2, 9, 3], [2, 5, 3], [2, 6, 3]]], dtype="int32")
    >>> out = model({"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    >>> tuple(out["logits"].shape)
    (1, 4)
    """

    def __init__(self, config, encoder: BertEncoder | None = None, dropout: float = 0.1, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_multiple_choice")
        # === Layers ===
        self.encoder = encoder if encoder is not None else BertEncoder(config)
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = OutputProjection(config, 1, name="choice_head")

        # === Functional Model ===
        inputs = {name: keras.Input(shape=(None, None), dtype="int32", name=name) for name in ENCODER_INPUTS}
        # Every choice is one sequence to the encoder: [batch·choices, seq].
        flat = {name: _FoldChoices(name=f"fold_{name}")(tensor) for name, tensor in inputs.items()}
        scores = self.head(self.dropout(self.encoder(flat)["pooled_output"]))
        logits = _UnfoldChoices(name="unfold_choices")(scores, inputs["input_ids"])
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        # === Config ===
        self.config, self.num_classes, self.dropout_rate = config, 1, float(dropout)

    def get_config(self):
        return {"config": self.config.to_dict(), "dropout": self.dropout_rate, "name": self.name,
                "trainable": self.trainable}


def _config_and_encoder(config_or_model):
    """(BertConfig, encoder or None) from a config, a config dict, or a kbert model to build on."""
    if isinstance(config_or_model, keras.Model):
        encoder = config_or_model if isinstance(config_or_model, BertEncoder) else getattr(
            config_or_model, "encoder", None)
        if not isinstance(encoder, BertEncoder):
            raise TypeError(f"cannot put a head on a {type(config_or_model).__name__}; pass a BertConfig or "
                            f"a kbert model (kbert.load, kbert.converters.load_tf1_checkpoint)")
        return encoder.config, encoder
    return _as_config(config_or_model), None


def _carry_tokenizer_settings(source, model):
    for name in ("vocab_file", "do_lower_case"):
        if hasattr(source, name):
            setattr(model, name, getattr(source, name))
    return model


def bert_classifier(config_or_model, num_classes: int, dropout: float = 0.1) -> BertClassifier:
    """A `BertClassifier`: untrained from a config, or sharing the encoder of a loaded model.

    Example:
    >>> pretrained = kbert.converters.load_tf1_checkpoint("tests/fixtures/tf1-tiny")  # doctest: +SKIP
    >>> classifier = kbert.bert_classifier(pretrained, num_classes=2)  # doctest: +SKIP
    """
    config, encoder = _config_and_encoder(config_or_model)
    return _carry_tokenizer_settings(config_or_model, BertClassifier(config, num_classes, encoder, dropout))


def bert_tagger(config_or_model, num_classes: int, dropout: float = 0.1) -> BertTagger:
    """A `BertTagger`: untrained from a config, or sharing the encoder of a loaded model."""
    config, encoder = _config_and_encoder(config_or_model)
    return _carry_tokenizer_settings(config_or_model, BertTagger(config, num_classes, encoder, dropout))


def bert_span_predictor(config_or_model) -> BertSpanPredictor:
    """A `BertSpanPredictor` (SQuAD): untrained from a config, or sharing a loaded model's encoder."""
    config, encoder = _config_and_encoder(config_or_model)
    return _carry_tokenizer_settings(config_or_model, BertSpanPredictor(config, encoder=encoder))


def bert_multiple_choice(config_or_model, dropout: float = 0.1) -> BertMultipleChoice:
    """A `BertMultipleChoice` (SWAG): untrained from a config, or sharing a loaded model's encoder."""
    config, encoder = _config_and_encoder(config_or_model)
    return _carry_tokenizer_settings(config_or_model, BertMultipleChoice(config, encoder, dropout))


def bert_encoder(config) -> BertEncoder:
    """An untrained `BertEncoder` for `config` (a `BertConfig` or its dict)."""
    return BertEncoder(config)


def bert_pretrainer(config) -> BertPretrainer:
    """An untrained `BertPretrainer` (encoder + MLM + NSP) for `config`."""
    return BertPretrainer(config)


def embedding_model(encoder: BertEncoder) -> keras.Model:
    """A model from the encoder's inputs to `embedding_output` (after embeddings + LayerNorm)."""
    return keras.Model(encoder.input, encoder.embeddings.output)
