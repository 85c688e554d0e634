"""A kbert model from a {name: array} of weights named in one column of the names table, strictly.

The TF Hub and keras-hub converters read their format's weights into a dict, then hand it
here: every weight the column names must be present (a head may be absent as a whole, and is
then freshly initialised and said so), no unknown name is allowed, and every shape is
checked against the config before the model is built from the arrays.
"""

from __future__ import annotations

import logging

import numpy as np

from kbert.config import BertConfig
from kbert.errors import KbertError, listing, plural
from kbert.model.bert import BertPretrainer
from kbert.model.layers import weights_from
from kbert.converters.names import names_to_kbert_paths, split_heads_shape

log = logging.getLogger("kbert")

# kbert weight-path prefix of each optional head.
HEAD_PATHS = {"masked_lm": "mlm_head/", "next_sentence": "nsp_head/"}


def pretrainer_from_named(config: BertConfig, arrays: dict, column: str, where: str):
    """A `BertPretrainer` whose weights are `arrays` ({name in `column`: numpy array}).

    Args:
        config: the model's `BertConfig`.
        arrays: weights by their name in the `column` of `WEIGHT_NAMES`, in that format's layout
            (attention weights split by head for "model_garden" and "keras_hub").
        column: "kbert", "model_garden" or "keras_hub".
        where: the source, for error messages.

    Returns (model, fresh_heads): the heads (of "masked_lm", "next_sentence") the source lacks.

    Example:
    >>> config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                     intermediate_size=16, max_position_embeddings=16)
    >>> pretrainer_from_named(config, {}, "keras_hub", "empty")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: empty: 23 weights missing (...); is this a BERT of that format?
    """
    wanted = names_to_kbert_paths(column, config.num_hidden_layers)  # {source name: kbert path}
    unknown = sorted(name for name in arrays if name not in wanted)
    if unknown:
        hint = ("; it has more layers than its config says" if any("layer" in n for n in unknown)
                else "; is this a BERT encoder?")
        raise KbertError(f"{where}: {plural(len(unknown), 'unknown weight')} ({listing(unknown)}){hint}")
    fresh_heads = [head for head, prefix in HEAD_PATHS.items()
                   if not any(wanted[name].startswith(prefix) for name in arrays)]
    missing = sorted(name for name, path in wanted.items() if name not in arrays
                     and not any(path.startswith(HEAD_PATHS[head]) for head in fresh_heads))
    if missing:
        raise KbertError(f"{where}: {plural(len(missing), 'weight')} missing ({listing(missing)}); "
                         f"is this a BERT of that format?")

    source_name = {path: name for name, path in wanted.items()}
    split = column in ("model_garden", "keras_hub")
    loaded, mismatches = set(), []

    def value_for(path, shape):
        name = source_name.get(path)
        if name not in arrays:
            return None
        expected = split_heads_shape(path, shape, config.num_attention_heads) if split else tuple(shape)
        value = np.asarray(arrays[name])
        if tuple(value.shape) != expected:
            mismatches.append((name, expected, tuple(value.shape)))
            return None
        loaded.add(name)
        return np.ascontiguousarray(value.reshape(shape), dtype="float32")

    with weights_from(value_for):
        model = BertPretrainer(config)
    if mismatches:
        name, expected, found = mismatches[0]
        raise KbertError(f"{where}: {name} has shape {list(found)} but its config gives {list(expected)}; "
                         f"the weights and the config do not belong together")
    not_loaded = sorted(set(arrays) - loaded)
    if not_loaded:  # a guard on the path-based loading itself
        raise RuntimeError(f"kbert bug: weights not loaded: {listing(not_loaded)}")
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
    encoder = getattr(model, "encoder", model)
    paths = {path: name for name, path in names_to_kbert_paths(column, encoder.config.num_hidden_layers).items()}
    split = column in ("model_garden", "keras_hub")
    out = {}
    for variable in model.weights:
        name = paths.get(variable.path)
        if name is None:
            continue
        value = np.asarray(variable.numpy(), dtype="float32")
        shape = split_heads_shape(variable.path, value.shape, encoder.config.num_attention_heads) if split else value.shape
        out[name] = value.reshape(shape)
    return out
