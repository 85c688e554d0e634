"""A kbert model from a {name: array} of weights named in one column of the names table, strictly.

The TF Hub and keras-hub converters read their format's weights into a dict, then hand it
here: every weight the column names must be present (a head may be absent as a whole, and is
then freshly initialised and said so), no unknown name is allowed, and every shape is
checked against the config before the model is built from the arrays.
"""

from __future__ import annotations

import logging

import keras
import numpy as np

from kbert.config import BertConfig
from kbert.converters.loading import Stored, load_pretrainer, stored_weights
from kbert.converters.names import names_to_kbert_paths, split_heads_shape
from kbert.model.bert import encoder_of

log = logging.getLogger("kbert")


def pretrainer_from_named(config: BertConfig, arrays: dict, column: str, where: str, vocabulary=None):
    """A `BertPretrainer` whose weights are `arrays` ({name in `column`: numpy array}).

    Args:
        config: the model's `BertConfig`.
        arrays: weights by their name in the `column` of `WEIGHT_NAMES`, in that format's layout
            (attention weights split by head for "model_garden" and "keras_hub").
        column: "kbert", "model_garden" or "keras_hub".
        where: the source, for error messages.
        vocabulary: the `Vocabulary` the model declares.

    Returns (model, fresh_heads): the heads (of "masked_lm", "next_sentence") the source lacks.

    Example:
    >>> config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                     intermediate_size=16, max_position_embeddings=16)
    >>> pretrainer_from_named(config, {}, "keras_hub", "empty")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: empty: 23 weights missing from the source (...); is this a BERT of that format?
    """
    split = column in ("model_garden", "keras_hub")
    paths = names_to_kbert_paths(column, config.num_hidden_layers)  # {source name: kbert path}

    def stored_shape(path, shape):
        return split_heads_shape(path, shape, config.num_attention_heads) if split else tuple(shape)

    def read(name, shape):  # a split weight holds the same numbers in row-major order: a reshape
        return np.ascontiguousarray(np.reshape(arrays[name], shape), dtype="float32")

    model, fresh_heads = load_pretrainer(
        config,
        Stored(
            where=where,
            shapes={name: tuple(np.shape(value)) for name, value in arrays.items()},
            paths=paths,
            read=read,
            stored_shape=stored_shape,
            unknown_hint=lambda names: "; is this a BERT encoder?",
        ),
        vocabulary,
    )
    for head in fresh_heads:
        log.info("%s has no %s head: it is freshly initialised", where, head)
    return model, fresh_heads


def named_arrays(model, column: str) -> dict:
    """{name in `column`: float32 array in that format's layout} of a kbert encoder or pretrainer;
    weights the format has no name for (the next-sentence head in keras-hub) are left out.

    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...                           num_attention_heads=2, intermediate_size=16)
    >>> named_arrays(kbert.bert_encoder(config), "keras_hub")["transformer_layer_0/self_attention_layer/query/kernel"].shape
    (8, 2, 4)
    """
    config = encoder_of(model).config
    split = column in ("model_garden", "keras_hub")

    def to_stored(path, value):
        # convert_to_numpy, not np.asarray: a PyTorch weight carries grad, and refuses numpy().
        value = keras.ops.convert_to_numpy(value).astype("float32", copy=False)
        return value.reshape(split_heads_shape(path, value.shape, config.num_attention_heads)) if split else value

    return stored_weights(
        model,
        names_to_kbert_paths(column, config.num_hidden_layers),
        format_name=column,
        to_stored=to_stored,
        unnamed="skip",
    )
