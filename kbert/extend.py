"""`kbert extend`: a model grown into a new model directory, starting from what it knows.

One growth so far: more positions (`--max-position-embeddings N`), for texts longer than the
`max_position_embeddings` the model was trained with. The position table's learned rows are
copied again and again, as Longformer grew RoBERTa's 512 positions to 4,096 (Beltagy et al.,
2020): position p of the new table starts as position p mod P of the old one. Every other
weight is copied as it is, so a text of at most P tokens gives exactly the outputs it gave; the
positions past P then learn their own values in continued pretraining at the new length
(`kbert pretrain --init OUT --max-seq-length N`).

Each growth is one function on a model (`extend_positions`); `extend` runs the ones asked for on
a model source and saves the result. A vocabulary growth joins as a function of its own and one
more option of `extend`.
"""

from __future__ import annotations

import numbers
import os

import numpy as np

from kbert.errors import KbertError
from kbert.model.bert import encoder_of
from kbert.model.initializers import unfilled
from kbert.model_dir import describe_source, model_kind, open_model, save
from kbert.outputs import writes

# The growth options, named when none is given (a vocabulary growth adds its own here).
GROWTH_OPTIONS = "--max-position-embeddings N"


def tiled_rows(table, rows: int):
    """`table`'s rows repeated in order until there are `rows` of them (the last copy cut short):
    row i of the result is row i mod len(table).

    Example:
    >>> tiled_rows(np.array([[1.0], [2.0], [3.0]]), 7)[:, 0].tolist()
    [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0]
    """
    table = np.asarray(table)
    return table[np.arange(rows) % len(table)]


def check_positions(current: int, requested) -> int:
    """`requested` as an int, if it is more positions than the model's `current`; else a one-line error.

    >>> check_positions(512, 1024)
    1024
    >>> check_positions(512, 512)
    Traceback (most recent call last):
    kbert.errors.KbertError: --max-position-embeddings 512: the model has 512 positions already; give more than 512 (extend only grows a model)
    """
    if isinstance(requested, bool) or not isinstance(requested, numbers.Integral):
        raise KbertError(
            f"--max-position-embeddings {requested!r}: give a whole number of positions, more than {current}"
        )
    if requested <= current:
        raise KbertError(
            f"--max-position-embeddings {requested}: the model has {current} positions already; give more than "
            f"{current} (extend only grows a model)"
        )
    return int(requested)


def extend_positions(model, max_position_embeddings: int):
    """A copy of `model` with `max_position_embeddings` positions, its position table the old
    one's rows copied again and again (Longformer's recipe); every other weight as it was.

    The copy is of the same class, with the same head, task, vocabulary and casing. Texts of at
    most the old number of positions give the same outputs from it; longer ones read position p
    as the old model read position p mod P, until continued pretraining teaches it more.

    Args:
        model: a kbert model (`kbert.load`, `bert_encoder`, `bert_pretrainer`, or one with a
            task head).
        max_position_embeddings: int. The new model's positions: more than `model` has.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64, max_position_embeddings=16)
    >>> longer = extend_positions(kbert.bert_pretrainer(config), 40)
    >>> type(longer).__name__, longer.config.max_position_embeddings
    ('BertPretrainer', 40)
    >>> table = longer.encoder.embeddings.position_embeddings.embeddings.numpy()
    >>> table.shape, bool((table[16:32] == table[:16]).all() and (table[32:] == table[:8]).all())
    ((40, 32), True)
    """
    try:
        model_kind(model)
    except KbertError:
        raise KbertError(
            f"cannot extend a {type(model).__name__}: pass a kbert model (kbert.load(MODEL_DIR), kbert.bert_pretrainer, ...)"
        ) from None
    positions = check_positions(model.config.max_position_embeddings, max_position_embeddings)
    described = model.get_config()  # class, head, task_info and vocabulary: everything but the weights
    described["config"] = {**described["config"], "max_position_embeddings": positions}
    with unfilled():  # every weight is assigned below
        grown = type(model).from_config(described)
    old = {variable.path: variable for variable in model.weights}
    table = encoder_of(model).embeddings.position_embeddings.embeddings.path
    for variable in grown.weights:
        if variable.path not in old:  # a guard: both models are built by the same class
            raise RuntimeError(f"kbert bug: {variable.path} of the grown model is not in the model it grew from")
        value = old[variable.path].numpy()
        variable.assign(tiled_rows(value, positions) if variable.path == table else value)
    return grown


@writes("out", inputs=("source",))
def extend(source, out, max_position_embeddings: int | None = None, *, do_lower_case=None, overwrite=False) -> dict:
    """Grow the model at `source` and save it as the kbert model directory `out`, atomically.

    Args:
        source: str. A kbert model directory, a `.keras` file, or a google-research checkpoint
            directory or prefix (as every command takes).
        out: str. The model directory to write, of the same kind as `source`'s model (encoder,
            pretrainer, or fine-tuned with its head and task), with its vocab.txt and casing.
        max_position_embeddings: int. The new number of positions, more than the model has
            (`extend_positions`).
        do_lower_case: bool. The vocabulary's casing; default: what the source records (a
            google-research checkpoint's is guessed from its folder name, `lower_case_for`).
        overwrite: bool. Replace a non-empty `out`.

    Returns: what `kbert extend` prints: {"model_dir", "kbert_model", "parameters",
        "max_position_embeddings": {"from", "to"}}.

    Example:
    >>> import tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "tiny-256")
    >>> extend("tests/fixtures/tf1-tiny", out, max_position_embeddings=256)["max_position_embeddings"]
    {'from': 64, 'to': 256}
    """
    # Both refusals read only the config: they come before the weights are loaded.
    positions = describe_source(source).config.max_position_embeddings
    if max_position_embeddings is None:
        raise KbertError(f"nothing to grow: pass {GROWTH_OPTIONS} (the model has {positions} positions)")
    check_positions(positions, max_position_embeddings)
    grown = extend_positions(open_model(source, do_lower_case), max_position_embeddings)
    save(grown, out, overwrite=overwrite)
    return {
        "model_dir": os.fspath(out),
        "kbert_model": model_kind(grown),
        "parameters": int(grown.count_params()),
        "max_position_embeddings": {"from": positions, "to": grown.config.max_position_embeddings},
    }
