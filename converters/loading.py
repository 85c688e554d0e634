"""One strict loader for every format: a kbert pretrainer from a source's named weights.

A format (tf1.py, hf.py, tfhub.py, keras_hub.py) says only what is its own, in a `Stored`:
which of its names are weights and their stored shapes, each name's kbert path (a column of
names.py's one table), its layout (a kernel transposed, attention split by head) and how to
read one weight in kbert's layout. `load_pretrainer` then does every check once, in order:

1. unknown names are an error (with a hint when the source has more layers than its config);
2. a head (masked-LM, next-sentence, pooler) may be absent as a whole: it is freshly
   initialised, reported, and recorded on the model (`model.fresh_heads`, which `kbert.save`
   writes to bert_config.json);
3. any other missing weight is an error;
4. every shape is checked before anything is read; a mismatch names both shapes, in the
   source's layout, and the config field that most likely set it;
5. the model is built without drawing initial values (`kbert.model.initializers.unfilled`),
   each weight is read and assigned by its public `variable.path`, a fresh head's weights get
   the original's initializer, and a weight left unassigned is a bug reported as such.

Example:
>>> import numpy as np, kbert
>>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
...                           num_attention_heads=2, intermediate_size=16)
>>> arrays = {v.path: v.numpy() for v in kbert.bert_encoder(config).weights}
>>> stored = Stored(where="arrays", shapes={n: a.shape for n, a in arrays.items()},
...                 paths={p: p for p in arrays}, read=lambda name, shape: arrays[name])
>>> model, fresh = load_pretrainer(config, stored)
>>> fresh, model.fresh_heads
(['masked_lm', 'next_sentence'], ('masked_lm', 'next_sentence'))
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kbert.backend import fill_weight
from kbert.config import BertConfig
from kbert.converters.names import suspect_field, tf1_to_kbert_paths
from kbert.formats.model_dir import check_vocab, fresh_heads_of
from kbert.model.bert import BertPretrainer, Vocabulary
from kbert.model.initializers import original_initializer, unfilled
from kbert.runtime.errors import KbertError, listing, plural

# The parts a source may lack as a whole, by their kbert path prefix. Listed in this order in
# reports. The pooler is optional only where a format says so (Hugging Face's BertModel files
# may lack it).
HEAD_PATHS = {"masked_lm": "mlm_head/", "next_sentence": "nsp_head/"}
POOLER_PATH = "pooler/"

# A name with a layer number in any format's spelling: "layer_3", "layer.3", "transformer_layer_3".
_LAYER_NAME = re.compile(r"layer[._]?(\d+)")


def _whole_layers(names, other_names) -> bool:
    """Whether `names` are whole layers that `other_names` lack: each has a layer number, and no
    layer of theirs appears among `other_names` (a weight missing from a layer that is there is
    just missing, not a sign of another layer count)."""
    layers = [_LAYER_NAME.search(n) for n in names]
    if not all(layers):
        return False
    others = {int(m.group(1)) for n in other_names for m in [_LAYER_NAME.search(n)] if m}
    return bool(others) and not {int(m.group(1)) for m in layers} & others


@dataclasses.dataclass
class Stored:
    """What a format holds, in its own names and layout.

    Args:
        where: str. The source, as error messages name it (a folder, a file, a checkpoint prefix).
        shapes: {name: stored shape} of every weight the source holds (optimizer state,
            buffers and tied copies already left out by the format).
        paths: {name: kbert path} of every name the format can have (from names.py).
        read: (name, kbert shape) -> the weight in kbert's layout (numpy array or tensor).
        stored_shape: (kbert path, kbert shape) -> the shape the format stores it in.
        optional: {part: kbert path prefix} the source may lack as a whole.
        thing: str. What the source is, in messages ("checkpoint", "file").
        config_name: str. Its config file's name, in messages.
        config_file: str. Its config file, named in a shape mismatch; None when the config
            has no file of its own.
        unknown_hint: names -> hint for unknown names that are not extra layers.
        missing_hint: names -> hint for missing names that are not missing layers.
        noun: str. What the source calls a weight in messages ("variable" in a TF1 checkpoint).
        spelled: name -> how the source spells it, in messages (Hugging Face files prefix names).
    """

    where: str
    shapes: dict
    paths: dict
    read: Callable
    stored_shape: Callable = lambda path, shape: tuple(shape)
    optional: dict = dataclasses.field(default_factory=lambda: dict(HEAD_PATHS))
    thing: str = "source"
    config_name: str = "its config"
    config_file: str | None = None
    unknown_hint: Callable = lambda names: "; is this a BERT of that format?"
    missing_hint: Callable = lambda names: "; is this a BERT of that format?"
    noun: str = "weight"
    spelled: Callable = lambda name: name


class Converted(NamedTuple):
    """A converter's result: the model, and what was loaded, skipped and freshly initialised."""

    model: object
    report: dict


def load_pretrainer(config: BertConfig, stored: Stored, vocabulary: Vocabulary | None = None) -> tuple:
    """(`BertPretrainer` holding `stored`'s weights and declaring `vocabulary`, the optional
    parts it lacked).

    Raises KbertError for unknown or missing weights and shape mismatches, before any weight
    is read.
    """
    unknown = sorted(stored.spelled(name) for name in stored.shapes if name not in stored.paths)
    if unknown:
        hint = (
            f"; the {stored.thing} has more layers than num_hidden_layers in {stored.config_name}"
            if _whole_layers(unknown, stored.paths)
            else stored.unknown_hint(unknown)
        )
        raise KbertError(f"{stored.where}: {plural(len(unknown), 'unknown ' + stored.noun)} ({listing(unknown)}){hint}")

    present_paths = {stored.paths[name] for name in stored.shapes}
    absent = [
        part for part, prefix in stored.optional.items() if not any(path.startswith(prefix) for path in present_paths)
    ]
    skipped_prefixes = tuple(stored.optional[part] for part in absent)
    missing = sorted(
        name
        for name, path in stored.paths.items()
        if name not in stored.shapes and not path.startswith(skipped_prefixes or ("\0",))
    )
    if missing:
        hint = (
            f"; {stored.config_name} has more layers (num_hidden_layers) than the {stored.thing}"
            if _whole_layers(missing, stored.shapes)
            else stored.missing_hint(missing)
        )
        raise KbertError(
            f"{stored.where}: {plural(len(missing), 'weight')} missing from the "
            f"{stored.thing} ({listing(missing)}){hint}"
        )

    with unfilled():
        model = BertPretrainer(config, vocabulary=vocabulary)
    name_of = {path: name for name, path in stored.paths.items()}
    _check_shapes(model, stored, name_of)
    assigned = set()
    for variable in _unique(model.weights):
        name = name_of.get(variable.path)
        if name in stored.shapes:
            _fill(variable, stored.read, name, tuple(variable.shape))
            assigned.add(name)
        elif variable.path.startswith(skipped_prefixes or ("\0",)):
            leaf = variable.path.rsplit("/", 1)[-1]
            _fill(variable, original_initializer(config, leaf), variable.shape, variable.dtype)
        else:  # a guard on the loader itself: an unfilled weight would hold garbage
            raise RuntimeError(f"kbert bug: {variable.path} has no value in {stored.where}")
    not_loaded = sorted(set(stored.shapes) - assigned)
    if not_loaded:
        raise RuntimeError(f"kbert bug: weights not loaded from {stored.where}: {listing(not_loaded)}")
    # Recorded on the model, so that kbert.save keeps it and nothing takes these heads for trained ones.
    model.fresh_heads = tuple(absent)
    return model, absent


def _fill(variable, value_of: Callable, *args):
    """Give a weight built unfilled the value `value_of(*args)` returns, without a second copy
    where the backend can hand a buffer over (`kbert.backend.fill_weight`)."""
    fill_weight(variable, lambda: value_of(*args))


def _check_shapes(model, stored: Stored, name_of: dict):
    """Every stored shape against the model's, in the source's layout; the first mismatch raises."""
    kbert_to_tf1 = {path: name for name, path in tf1_to_kbert_paths(model.config.num_hidden_layers).items()}
    for variable in _unique(model.weights):
        name = name_of.get(variable.path)
        if name not in stored.shapes:
            continue
        expected = tuple(stored.stored_shape(variable.path, tuple(variable.shape)))
        found = tuple(stored.shapes[name])
        if found == expected:
            continue
        # The config field is read from kbert's layout (the stored one may be transposed or split).
        field = suspect_field(
            kbert_to_tf1.get(variable.path, variable.path),
            tuple(variable.shape),
            _in_kbert_layout(found, expected, tuple(variable.shape)),
        )
        where = f" in {stored.config_file}" if stored.config_file else ""
        raise KbertError(
            f"{stored.spelled(name)}: the {stored.thing} has shape {list(found)} but {stored.config_name} "
            f"gives {list(expected)}; check {field}{where}"
        )


def _in_kbert_layout(found, expected, kbert_shape):
    """`found` in kbert's layout, where the format's layout is a transpose of kbert's."""
    transposed = len(found) == 2 and expected == kbert_shape[::-1] != kbert_shape
    return found[::-1] if transposed else found


def _unique(weights):
    """The model's weights, each once (the MLM head shares the word embeddings)."""
    seen = set()
    for variable in weights:
        if id(variable) not in seen:
            seen.add(id(variable))
            yield variable


# Each head's weights, by kbert path prefix (what a writer leaves out of a fresh head).
HEAD_PREFIXES = {**HEAD_PATHS, "pooler": POOLER_PATH}


def heads_left_out(model, include_fresh_heads: bool = False) -> tuple:
    """The heads a writer leaves out of `model`: its fresh ones (random weights a converter made,
    `model.fresh_heads`), unless `include_fresh_heads`. What is written is then only what was
    read from a trained model or trained by kbert.

    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...                           num_attention_heads=2, intermediate_size=16)
    >>> model = kbert.bert_pretrainer(config)
    >>> model.fresh_heads = ("next_sentence", "masked_lm")
    >>> heads_left_out(model), heads_left_out(model, include_fresh_heads=True)
    (('masked_lm', 'next_sentence'), ())
    """
    return () if include_fresh_heads else fresh_heads_of(model)


def parameters_of(model, left_out=()) -> int:
    """How many numbers `model` holds, less the heads in `left_out` (what a writer writes)."""
    skipped = tuple(HEAD_PREFIXES[head] for head in left_out) or ("\0",)
    return int(sum(int(np.prod(v.shape)) for v in _unique(model.weights) if not v.path.startswith(skipped)))


def stored_weights(
    model,
    paths: dict,
    *,
    format_name: str,
    to_stored=None,
    unnamed: str = "error",
    left_out=(),
    unnamed_hint: str = "encoders and pretrainers",
) -> dict:
    """{name: value} of `model`'s weights for writing, the inverse of `load_pretrainer`.

    Args:
        model: a kbert model.
        paths: {name in the format: kbert path}, from names.py.
        format_name: str. The format, in the error for a weight it has no name for.
        to_stored: (kbert path, tensor) -> the value in the format's layout; default: the
            variable's tensor as it is (no copy).
        unnamed: "error" (a task head cannot be written in an encoder format) or "skip"
            (keras-hub has no next-sentence head).
        left_out: heads (of "masked_lm", "next_sentence", "pooler") not to write.
        unnamed_hint: str. The kbert models the format holds, for the error on a weight it cannot name.

    A weight shared by two layers (the tied word embeddings) appears once.

    Example:
    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...                           num_attention_heads=2, intermediate_size=16)
    >>> values = stored_weights(kbert.bert_pretrainer(config), tf1_to_kbert_paths(1), format_name="a TF1 checkpoint")
    >>> len(values), tuple(values["cls/seq_relationship/output_weights"].shape)
    (30, (2, 8))
    """
    name_of = {path: name for name, path in paths.items()}
    skipped = tuple(HEAD_PREFIXES[head] for head in left_out)
    out = {}
    for variable in _unique(model.weights):
        if skipped and variable.path.startswith(skipped):
            continue
        name = name_of.get(variable.path)
        if name is None:
            if unnamed == "skip":
                continue
            raise KbertError(
                f"weight {variable.path} has no name in {format_name}; {format_name} holds kbert {unnamed_hint}"
            )
        # .value, not the keras.Variable: TF savers otherwise see Keras' own names.
        value = variable.value
        out[name] = to_stored(variable.path, value) if to_stored else value
    return out


class ModelToWrite(NamedTuple):
    """What a writer of another format takes from a kbert model: its vocabulary, casing, the
    original config keys (kbert's own left out), and the heads it leaves out."""

    vocab_file: str
    do_lower_case: bool
    config: BertConfig
    left_out: tuple


def model_to_write(model, writer: str, vocab_file=None, do_lower_case=None, include_fresh_heads=False) -> ModelToWrite:
    """A model's vocabulary (`vocab_file`, else the model's), casing and original config, checked
    against each other, and the fresh heads `writer` leaves out (`heads_left_out`)."""
    vocab_file = vocab_file or getattr(model, "vocab_file", None)
    if not vocab_file:
        raise KbertError(f"{writer} needs the vocabulary: pass vocab_file=PATH/vocab.txt")
    if do_lower_case is None:
        do_lower_case = getattr(model, "do_lower_case", True)
    config = BertConfig.from_dict({k: v for k, v in model.config.to_dict().items() if k in BertConfig.field_names()})
    check_vocab(vocab_file, config)
    return ModelToWrite(vocab_file, do_lower_case, config, heads_left_out(model, include_fresh_heads))
