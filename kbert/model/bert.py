"""BERT as functional Keras models: the encoder (`modeling.BertModel`), the pretrainer (+ MLM, NSP)
and one model per fine-tuning task.

Each model is one declared object, as keras-hub's Task is backbone + preprocessor + head: its
constructor takes, and `get_config` returns, everything needed to use it on text:
- `vocabulary`: the vocab.txt and casing its tokenizer needs (`Vocabulary`); a `.keras` file
  carries the vocab.txt inside (`save_assets`), so a model saved with `model.save` is whole;
- `task_info` (task models): the task, label names, sequence length and whether it reads text
  pairs, which `kbert predict`, `evaluate` and `export` read (`kbert.formats.model_dir.head_task_info`
  checks them and fills in defaults).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import weakref

import keras
from keras import ops

from kbert._compat import track_attribute
from kbert.backend import LAYERS_ARE_MODULES
from kbert.config import ENCODER_INPUTS, BertConfig
from kbert.model.layers import (
    BertEmbeddings,
    MaskedLMHead,
    NextSentenceHead,
    OutputProjection,
    TransformerLayer,
    attention_adder,
    dense,
)

VOCAB_ASSET = "vocab.txt"


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The tokenizer a model's ids belong to: its vocab.txt and whether text is lower-cased
    (and accents stripped) first, as google-research/bert's `FullTokenizer(vocab_file, do_lower_case)`.

    Example:
    >>> Vocabulary("vocab.txt", do_lower_case=False).to_dict()
    {'file': 'vocab.txt', 'do_lower_case': False}
    """

    file: str
    do_lower_case: bool = True

    def to_dict(self) -> dict:
        return {"file": self.file, "do_lower_case": self.do_lower_case}

    @classmethod
    def of(cls, value) -> Vocabulary | None:
        """A Vocabulary from itself, its dict, or None."""
        if value is None or isinstance(value, Vocabulary):
            return value
        return cls(str(value["file"]), bool(value.get("do_lower_case", True)))


def _as_config(config) -> BertConfig:
    return config if isinstance(config, BertConfig) else BertConfig.from_dict(config)


def _config_and_vocabulary(config, encoder, vocabulary) -> tuple:
    # A model on a given encoder reads that encoder's vocabulary unless it is given one.
    return _as_config(config), vocabulary or (encoder.vocabulary if encoder is not None else None)


def _int_inputs(names):
    # Sequence length is None: any length up to max_position_embeddings.
    return {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in names}


class _Described:
    """What every kbert model declares besides its layers: its `vocabulary`, and for task models
    its `task_info`; in get_config, and the vocab.txt itself in a `.keras` file."""

    def __setattr__(self, name, value):
        # Each model makes its layers before keras.Model.__init__ builds the graph from them, and
        # PyTorch's Module refuses a sub-module set before its own __init__ has run. Until then
        # they are plain attributes that Keras tracks as on the other backends (`track_attribute`
        # says why); Keras' own bookkeeping (`_tracker`, ...) is stored as it is.
        if "_modules" not in self.__dict__ and LAYERS_ARE_MODULES:
            return object.__setattr__(self, name, value if name.startswith("_") else track_attribute(self, value))
        return super().__setattr__(name, value)

    def _declare(self, config, vocabulary, task_info=None):
        self.config = config
        self.vocabulary = Vocabulary.of(vocabulary)
        self.task_info = dict(task_info or {})
        # The heads ("masked_lm", "next_sentence", "pooler") a converter created rather than read:
        # their weights are random. Empty: every head holds trained (or user-set) weights.
        self.fresh_heads = ()

    @property
    def vocab_file(self) -> str | None:
        """The vocab.txt of `vocabulary` (None when the model was built without one)."""
        return self.vocabulary.file if self.vocabulary else None

    @property
    def do_lower_case(self) -> bool:
        """Whether `vocabulary` lower-cases (True when the model was built without one)."""
        return self.vocabulary.do_lower_case if self.vocabulary else True

    def _described_config(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "name": self.name,
            "trainable": self.trainable,
            "vocabulary": self.vocabulary.to_dict() if self.vocabulary else None,
            **({"fresh_heads": list(self.fresh_heads)} if self.fresh_heads else {}),
        }

    def get_config(self):
        return self._described_config()

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        fresh_heads = tuple(config.pop("fresh_heads", ()))  # absent in files from before it was recorded
        model = cls(**config)
        model.fresh_heads = fresh_heads
        return model

    # Keras' `.keras` saving calls these for any object it saves; the vocab.txt travels inside.
    def save_assets(self, dir_path):
        if self.vocab_file and os.path.isfile(self.vocab_file):
            shutil.copyfile(self.vocab_file, os.path.join(dir_path, VOCAB_ASSET))

    def load_assets(self, dir_path):
        saved = os.path.join(dir_path, VOCAB_ASSET)
        if not os.path.isfile(saved):
            return
        # Keras removes dir_path once loaded: the vocab.txt is kept as long as the model lives.
        folder = tempfile.mkdtemp(prefix="kbert-vocab-")
        shutil.copyfile(saved, os.path.join(folder, VOCAB_ASSET))
        weakref.finalize(self, shutil.rmtree, folder, True)
        self.vocabulary = Vocabulary(os.path.join(folder, VOCAB_ASSET), self.do_lower_case)


@keras.saving.register_keras_serializable(package="kbert")
class BertEncoder(_Described, keras.Model):
    """google-research/bert's `BertModel`: embeddings, L transformer layers and the pooler.

    Inputs: a dict of int32 [batch, seq] `input_ids`, `input_mask` (1 = real token), `segment_ids`.
    Outputs: a dict with `sequence_output` [batch, seq, H] and `pooled_output` [batch, H].

    Args:
        config: `BertConfig` or its dict.
        vocabulary: `Vocabulary` or its dict: the tokenizer the ids belong to.

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

    def __init__(self, config, *, vocabulary=None, **kwargs):
        config = _as_config(config)
        kwargs.setdefault("name", "bert_encoder")
        # === Layers ===
        self.embeddings = BertEmbeddings(config, name="embeddings")
        self.transformer_layers = [
            TransformerLayer(config, name=f"transformer_layer_{i}") for i in range(config.num_hidden_layers)
        ]
        self.pooler = dense(config, config.hidden_size, "pooler", "tanh")

        # === Functional Model ===
        inputs = _int_inputs(ENCODER_INPUTS)
        hidden = self.embeddings(inputs["input_ids"], inputs["segment_ids"])
        adder = attention_adder(inputs["input_mask"])
        for layer in self.transformer_layers:
            hidden = layer(hidden, adder)
        # The pooler reads the first ([CLS]) token.
        pooled = self.pooler(hidden[:, 0, :])
        super().__init__(inputs=inputs, outputs={"sequence_output": hidden, "pooled_output": pooled}, **kwargs)

        # === Config ===
        self._declare(config, vocabulary)


@keras.saving.register_keras_serializable(package="kbert")
class BertPretrainer(_Described, keras.Model):
    """The encoder plus the masked-LM and next-sentence heads of `run_pretraining.py`.

    Inputs: the encoder's three plus int32 `masked_lm_positions` [batch, P].
    Outputs: `sequence_output`, `pooled_output`, `mlm_logits` [batch, P, vocab] and
    `nsp_logits` [batch, 2] (float32; their log_softmax is the original's `log_probs`).

    Args:
        config: `BertConfig` or its dict.
        encoder: optional `BertEncoder` to put the heads on (its weights are shared).
        vocabulary: `Vocabulary` or its dict; default: the encoder's.

    Example (the heads on an encoder of its own, or on one given, whose weights they share):
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> encoder = kbert.bert_encoder(config)
    >>> model = kbert.BertPretrainer(config, encoder)
    >>> model.encoder is encoder
    True
    >>> ids = np.array([[2, 7, 9, 3]], dtype="int32")
    >>> out = model({"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
    ...              "masked_lm_positions": np.array([[1, 2]], dtype="int32")})
    >>> tuple(out["mlm_logits"].shape), tuple(out["nsp_logits"].shape)
    ((1, 2, 100), (1, 2))
    """

    def __init__(self, config, encoder: BertEncoder | None = None, *, vocabulary=None, **kwargs):
        config, vocabulary = _config_and_vocabulary(config, encoder, vocabulary)
        kwargs.setdefault("name", "bert_pretrainer")
        # === Layers ===
        self.encoder = encoder if encoder is not None else BertEncoder(config, vocabulary=vocabulary)
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
        self._declare(config, vocabulary)


class _TaskModel(_Described, keras.Model):
    """A head on a `BertEncoder`, built from (config, size of the head) and an optional encoder."""

    def _encoder_and_inputs(self, config, encoder, vocabulary):
        self.encoder = encoder if encoder is not None else BertEncoder(config, vocabulary=vocabulary)
        inputs = _int_inputs(ENCODER_INPUTS)
        return inputs, self.encoder({name: inputs[name] for name in ENCODER_INPUTS})

    def get_config(self):
        return {
            **self._described_config(),
            "num_classes": self.num_classes,
            "dropout": self.dropout_rate,
            "task_info": self.task_info,
        }


class _LabelHead(_TaskModel):
    """Dropout, then [num_classes, H] logits, on one of the encoder's outputs: `ENCODER_OUTPUT`
    (the pooled output for a classifier, every token's for a tagger)."""

    ENCODER_OUTPUT: str
    HEAD_NAME: str
    DEFAULT_NAME: str

    def __init__(
        self,
        config,
        num_classes: int,
        encoder: BertEncoder | None = None,
        dropout: float = 0.1,
        *,
        vocabulary=None,
        task_info=None,
        **kwargs,
    ):
        config, vocabulary = _config_and_vocabulary(config, encoder, vocabulary)
        kwargs.setdefault("name", self.DEFAULT_NAME)
        # === Layers ===
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = OutputProjection(config, num_classes, name=self.HEAD_NAME)

        # === Functional Model ===
        inputs, encoded = self._encoder_and_inputs(config, encoder, vocabulary)
        logits = self.head(self.dropout(encoded[self.ENCODER_OUTPUT]))
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        # === Config ===
        self._declare(config, vocabulary, task_info)
        self.num_classes, self.dropout_rate = int(num_classes), float(dropout)


@keras.saving.register_keras_serializable(package="kbert")
class BertClassifier(_LabelHead):
    """`run_classifier.py`'s model: dropout on the pooled output, then `output_weights` [classes, H].

    Inputs: the encoder's three. Outputs: {"logits": float32 [batch, num_classes]}.
    With num_classes=1 it is a regressor (the logit is the prediction).

    Args:
        config: `BertConfig` or its dict.
        num_classes: int. Number of labels (1 for regression).
        encoder: optional `BertEncoder` to put the head on (its weights are shared).
        dropout: float. Dropout on the pooled output; 0.1 in run_classifier.py.
        vocabulary: `Vocabulary` or its dict; default: the encoder's.
        task_info: dict. task ("classify" or "regress"), labels, max_seq_length, text_pairs:
            what predict, evaluate and export read (see `kbert.formats.model_dir.head_task_info`).

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

    ENCODER_OUTPUT, HEAD_NAME, DEFAULT_NAME = "pooled_output", "classifier_head", "bert_classifier"


@keras.saving.register_keras_serializable(package="kbert")
class BertTagger(_LabelHead):
    """Token classification (NER, POS): dropout on every token's output, then [labels, H] logits.

    Inputs: the encoder's three. Outputs: {"logits": float32 [batch, seq, num_classes]}.

    Args:
        config: `BertConfig` or its dict.
        num_classes: int. Number of tags.
        encoder: optional `BertEncoder` to put the head on.
        dropout: float. 0.1, as the classifier.
    """

    ENCODER_OUTPUT, HEAD_NAME, DEFAULT_NAME = "sequence_output", "tagger_head", "bert_tagger"


@keras.saving.register_keras_serializable(package="kbert")
class BertSpanPredictor(_TaskModel):
    """`run_squad.py`'s model: `cls/squad/output_weights` [2, H] on every token, no extra dropout.

    Inputs: the encoder's three. Outputs: {"start_logits", "end_logits"}: float32 [batch, seq].

    Args:
        config: `BertConfig` or its dict.
        encoder: optional `BertEncoder` to put the head on.
    """

    def __init__(self, config, encoder: BertEncoder | None = None, *, vocabulary=None, task_info=None, **kwargs):
        config, vocabulary = _config_and_vocabulary(config, encoder, vocabulary)
        kwargs.setdefault("name", "bert_span_predictor")
        # === Layers ===
        self.head = OutputProjection(config, 2, name="squad_head")

        # === Functional Model ===
        inputs, encoded = self._encoder_and_inputs(config, encoder, vocabulary)
        logits = self.head(encoded["sequence_output"])
        outputs = {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        # === Config ===
        self._declare(config, vocabulary, task_info)
        self.num_classes = 2

    def get_config(self):
        return {**self._described_config(), "task_info": self.task_info}


class FoldChoices(keras.layers.Layer):
    """[batch, choices, seq] -> [batch·choices, seq]; the sizes are read when called."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_spec(self, x):
        return keras.KerasTensor((None, x.shape[-1]), dtype=x.dtype)


class UnfoldChoices(keras.layers.Layer):
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

    def __init__(
        self,
        config,
        encoder: BertEncoder | None = None,
        dropout: float = 0.1,
        *,
        vocabulary=None,
        task_info=None,
        **kwargs,
    ):
        config, vocabulary = _config_and_vocabulary(config, encoder, vocabulary)
        kwargs.setdefault("name", "bert_multiple_choice")
        # === Layers ===
        self.encoder = encoder if encoder is not None else BertEncoder(config, vocabulary=vocabulary)
        self.dropout = keras.layers.Dropout(dropout, name="dropout")
        self.head = OutputProjection(config, 1, name="choice_head")

        # === Functional Model ===
        inputs = {name: keras.Input(shape=(None, None), dtype="int32", name=name) for name in ENCODER_INPUTS}
        # Every choice is one sequence to the encoder: [batch·choices, seq].
        flat = {name: FoldChoices(name=f"fold_{name}")(tensor) for name, tensor in inputs.items()}
        scores = self.head(self.dropout(self.encoder(flat)["pooled_output"]))
        logits = UnfoldChoices(name="unfold_choices")(scores, inputs["input_ids"])
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        # === Config ===
        self._declare(config, vocabulary, task_info)
        self.num_classes, self.dropout_rate = 1, float(dropout)

    def get_config(self):
        return {**self._described_config(), "dropout": self.dropout_rate, "task_info": self.task_info}


def encoder_of(model) -> BertEncoder | None:
    """The `BertEncoder` of a kbert model: the model itself, or the one a pretrainer or task
    model holds; None for anything else.

    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...                           num_attention_heads=2, intermediate_size=16)
    >>> classifier = kbert.bert_classifier(config, 2)
    >>> encoder_of(classifier) is classifier.encoder, encoder_of(classifier.encoder) is classifier.encoder
    (True, True)
    """
    if isinstance(model, BertEncoder):
        return model
    encoder = getattr(model, "encoder", None)
    return encoder if isinstance(encoder, BertEncoder) else None


def _config_and_encoder(config_or_model):
    """(BertConfig, encoder or None) from a config, a config dict, or a kbert model to build on."""
    if isinstance(config_or_model, keras.Model):
        encoder = encoder_of(config_or_model)
        if encoder is None:
            raise TypeError(
                f"cannot put a head on a {type(config_or_model).__name__}; pass a BertConfig or "
                f"a kbert model (kbert.load, kbert.converters.load_tf1_checkpoint)"
            )
        return encoder.config, encoder
    return _as_config(config_or_model), None


def _vocabulary_of(config_or_model, vocabulary):
    # A head put on a loaded model reads text with that model's tokenizer.
    return Vocabulary.of(vocabulary) or getattr(config_or_model, "vocabulary", None)


def _head_on(model_class, config_or_model, vocabulary, task_info, **head_args):
    """`model_class` untrained from a config, or on the encoder (and vocabulary) of a loaded model."""
    config, encoder = _config_and_encoder(config_or_model)
    vocabulary = _vocabulary_of(config_or_model, vocabulary)
    return model_class(config, encoder=encoder, vocabulary=vocabulary, task_info=task_info, **head_args)


def bert_classifier(
    config_or_model, num_classes: int, dropout: float = 0.1, *, vocabulary=None, task_info=None
) -> BertClassifier:
    """A `BertClassifier`: untrained from a config, or sharing the encoder (and vocabulary) of a loaded model.

    Example:
    >>> pretrained = kbert.converters.load_tf1_checkpoint("tests/fixtures/tf1-tiny")  # doctest: +SKIP
    >>> classifier = kbert.bert_classifier(pretrained, num_classes=2)  # doctest: +SKIP
    """
    return _head_on(BertClassifier, config_or_model, vocabulary, task_info, num_classes=num_classes, dropout=dropout)


def bert_tagger(
    config_or_model, num_classes: int, dropout: float = 0.1, *, vocabulary=None, task_info=None
) -> BertTagger:
    """A `BertTagger`: untrained from a config, or sharing the encoder of a loaded model."""
    return _head_on(BertTagger, config_or_model, vocabulary, task_info, num_classes=num_classes, dropout=dropout)


def bert_span_predictor(config_or_model, *, vocabulary=None, task_info=None) -> BertSpanPredictor:
    """A `BertSpanPredictor` (SQuAD): untrained from a config, or sharing a loaded model's encoder."""
    return _head_on(BertSpanPredictor, config_or_model, vocabulary, task_info)


def bert_multiple_choice(
    config_or_model, dropout: float = 0.1, *, vocabulary=None, task_info=None
) -> BertMultipleChoice:
    """A `BertMultipleChoice` (SWAG): untrained from a config, or sharing a loaded model's encoder."""
    return _head_on(BertMultipleChoice, config_or_model, vocabulary, task_info, dropout=dropout)


def bert_encoder(config, *, vocabulary=None) -> BertEncoder:
    """An untrained `BertEncoder` for `config` (a `BertConfig` or its dict)."""
    return BertEncoder(config, vocabulary=vocabulary)


def bert_pretrainer(config, *, vocabulary=None) -> BertPretrainer:
    """An untrained `BertPretrainer` (encoder + MLM + NSP) for `config`."""
    return BertPretrainer(config, vocabulary=vocabulary)
