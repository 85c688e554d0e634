"""google-research/bert TF1 checkpoints in and out of kbert, strictly.

Reading: every kbert weight must be found with its exact shape; unknown `bert/` or `cls/`
variables are an error; `global_step` and Adam slots are skipped and said so. Writing:
the original names, shapes and values, loadable by the original code's
`get_assignment_map_from_checkpoint` + `init_from_checkpoint`.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
import shutil

import keras
import numpy as np
import tensorflow as tf

from kbert.config import BertConfig
from kbert.converters import loading
from kbert.converters.names import HEADS, TF1_CLASSIFIER_HEAD, tf1_to_kbert_paths
from kbert.formats.model_dir import (
    CONFIG_FILE,
    VOCAB_FILE,
    check_vocab,
    fresh_heads_of,
    lower_case_for,
    recorded_fresh_heads,
)
from kbert.formats.model_dir import HEADS as HEADS_IN_ORDER
from kbert.model.bert import BertClassifier, Vocabulary
from kbert.runtime.errors import KbertError, first_line, listing, option, os_error_or, plural
from kbert.runtime.files import atomic_output_dir, writes

log = logging.getLogger("kbert")

CKPT_PREFIX = "bert_model.ckpt"
OPTIMIZER_SLOT_SUFFIXES = ("/adam_m", "/adam_v", "/Adam", "/Adam_1", "/lamb_m", "/lamb_v")
SKIPPED_NAMES = ("global_step", "_CHECKPOINTABLE_OBJECT_GRAPH")
# Where each head's variables are in a checkpoint.
TF1_HEAD_PREFIXES = {**HEADS, "pooler": "bert/pooler/"}


@dataclasses.dataclass
class Tf1Source:
    """Where a google-research checkpoint's three parts are."""

    prefix: str
    config_file: str
    vocab_file: str


def find_checkpoint(src, config_file=None, vocab_file=None) -> Tf1Source:
    """Resolve SRC: a directory (checkpoint found via its `checkpoint` file or its single
    `*.index`) or a checkpoint prefix such as `model.ckpt-20000`."""
    src = os.fspath(src).rstrip("/") or "/"
    if os.path.isdir(src):
        folder = src
        prefix = _prefix_in_dir(src)
    elif os.path.isfile(src + ".index"):
        folder, prefix = os.path.dirname(src) or ".", src
    elif src.endswith(".index") and os.path.isfile(src):
        folder, prefix = os.path.dirname(src) or ".", src[: -len(".index")]
    else:
        raise KbertError(
            f"{src}: no such checkpoint directory or prefix; pass the folder holding "
            f"bert_config.json, vocab.txt and bert_model.ckpt.*, or a prefix like "
            f"DIR/model.ckpt-20000"
        )
    config_file = config_file or os.path.join(folder, CONFIG_FILE)
    vocab_file = vocab_file or os.path.join(folder, VOCAB_FILE)
    for path, what, argument, flag in (
        (config_file, "bert_config.json", "config_file", "--config"),
        (vocab_file, "vocab.txt", "vocab_file", "--vocab"),
    ):
        if not os.path.isfile(path):
            raise KbertError(
                f"{path}: missing; put the checkpoint's {what} there or pass "
                f"{option(argument, flag=flag, command='convert from-tf1')}"
            )
    return Tf1Source(prefix, config_file, vocab_file)


def _prefix_in_dir(folder: str) -> str:
    state = os.path.join(folder, "checkpoint")
    if os.path.isfile(state):
        prefix = tf.train.latest_checkpoint(folder)
        if prefix and os.path.isfile(prefix + ".index"):
            return prefix
    indexes = sorted(glob.glob(os.path.join(folder, "*.index")))
    if len(indexes) == 1:
        return indexes[0][: -len(".index")]
    if not indexes:
        raise KbertError(
            f"{folder}: no checkpoint (*.index) in this directory; pass the folder "
            f"that holds bert_model.ckpt.index and bert_model.ckpt.data-*"
        )
    names = ", ".join(os.path.basename(p)[: -len(".index")] for p in indexes[:5])
    raise KbertError(
        f"{folder}: {len(indexes)} checkpoints here ({names}); pass one prefix, e.g. {indexes[-1][: -len('.index')]}"
    )


def open_reader(prefix: str):
    try:
        return tf.train.load_checkpoint(prefix)
    except Exception as e:  # tf raises DataLossError, NotFoundError, ... for broken files
        raise KbertError(
            f"{prefix}: not a readable TF checkpoint ({first_line(e)}); the files are "
            f"truncated or not a checkpoint: download or export them again"
        ) from None


def data_problems(prefix: str, shapes: dict, dtypes: dict) -> list:
    """Data files missing or shorter than the tensors the index lists (a copy cut short)."""
    shards = sorted(glob.glob(glob.escape(prefix) + ".data-*-of-*"))
    wanted = int(re.search(r"-of-(\d+)$", shards[0]).group(1)) if shards else 1
    if len(shards) != wanted:
        return [
            f"{plural(wanted - len(shards), 'data file')} of {wanted} missing ({prefix}.data-NNNNN-of-{wanted:05d})"
        ]
    for shard in shards:  # an unreadable file is a permission to fix, not a checkpoint to fetch again
        try:
            open(shard, "rb").close()
        except OSError as e:
            raise os_error_or(e, f"{shard}: cannot read it ({e.strerror or e})") from None
    if any(dtypes[n].name == "string" for n in shapes):
        return []  # string tensors have no fixed size; the sum below would not hold
    # The data files are the tensors' bytes back to back, so together they are exactly this long.
    expected = sum(int(np.prod(shape)) * dtypes[name].size for name, shape in shapes.items())
    found = sum(os.path.getsize(p) for p in shards)
    if found < expected:
        return [
            f"the data file{'s hold' if len(shards) > 1 else ' holds'} {found:,} bytes of the {expected:,} "
            f"the index lists: truncated (a copy or download cut short)"
        ]
    return []


def is_optimizer_state(name: str) -> bool:
    return name in SKIPPED_NAMES or name.endswith(OPTIMIZER_SLOT_SUFFIXES)


def load_tf1_checkpoint(src, config_file=None, vocab_file=None, do_lower_case=None):
    """A `BertPretrainer` holding the weights of a google-research/bert checkpoint, declaring its
    vocabulary (`model.vocabulary`). `convert_tf1_checkpoint` also returns what was converted.

    Args:
        src: str. A checkpoint directory (with bert_config.json, vocab.txt) or a prefix.
        config_file, vocab_file: str. Override where the config and vocabulary are found.
        do_lower_case: bool. Whether the vocabulary is uncased; guessed from the directory
            name ("uncased"/"cased") when None, else True.

    Example:
    >>> model = kbert.converters.load_tf1_checkpoint("uncased_L-12_H-768_A-12/")  # doctest: +SKIP
    """
    return convert_tf1_checkpoint(src, config_file, vocab_file, do_lower_case).model


def convert_tf1_checkpoint(src, config_file=None, vocab_file=None, do_lower_case=None) -> loading.Converted:
    """`load_tf1_checkpoint`'s model (same arguments) and its report: what was loaded, skipped and
    freshly initialised.

    Example:
    >>> model, report = kbert.converters.tf1.convert_tf1_checkpoint("uncased_L-12_H-768_A-12/")  # doctest: +SKIP
    """
    source = find_checkpoint(src, config_file, vocab_file)
    config = BertConfig.from_json_file(source.config_file)
    check_vocab(source.vocab_file, config)
    reader = open_reader(source.prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    # Checked before any tensor is read: a cut-short file would fail in the middle of reading.
    problems = data_problems(source.prefix, shapes, dtypes)
    if problems:
        raise KbertError(f"{source.prefix}: {problems[0]}; download or copy the checkpoint again")

    skipped = sorted(n for n in shapes if is_optimizer_state(n))
    ours = {n: tuple(shapes[n]) for n in shapes if n.startswith(("bert/", "cls/")) and not is_optimizer_state(n)}
    other = sorted(n for n in shapes if n not in skipped and n not in ours)

    def read(name, shape):
        try:
            # RestoreV2 reads straight into a tensor; reader.get_tensor would add two copies
            # (to numpy, and numpy back to a tensor), which for BERT-base doubles the time.
            return tf.raw_ops.RestoreV2(
                prefix=source.prefix, tensor_names=[name], shape_and_slices=[""], dtypes=[dtypes[name]]
            )[0]
        except Exception as e:  # tf raises DataLossError, OutOfRange... for damaged data files
            raise os_error_or(
                e,
                f"{source.prefix}: cannot read {name} ({first_line(e)}); the data "
                f"file is truncated or damaged: download it again",
            ) from None

    do_lower_case, lower_origin = _casing(source.prefix, config, do_lower_case)
    model, fresh_heads = loading.load_pretrainer(
        config,
        loading.Stored(
            where=source.prefix,
            shapes=ours,
            paths=tf1_to_kbert_paths(config.num_hidden_layers),
            read=read,
            thing="checkpoint",
            config_name=CONFIG_FILE,
            config_file=source.config_file,
            optional={**loading.HEAD_PATHS, "pooler": loading.POOLER_PATH},
            noun="variable",
            unknown_hint=lambda names: "; is this a BERT checkpoint?",
            missing_hint=lambda names: "",
        ),
        Vocabulary(source.vocab_file, bool(do_lower_case)),
    )
    # Heads kbert wrote out though fresh (to-tf1 --include-fresh-heads) stay fresh.
    fresh_heads = [
        h for h in HEADS_IN_ORDER if h in fresh_heads or h in recorded_fresh_heads(config, source.config_file)
    ]
    model.fresh_heads = tuple(fresh_heads)

    _log_conversion(skipped, other, fresh_heads, ours, do_lower_case, lower_origin)
    return loading.Converted(
        model,
        {
            "checkpoint": source.prefix,
            "loaded": len(ours),
            "skipped_optimizer_state": len(skipped),
            "ignored": other,
            "fresh_heads": fresh_heads,
            "global_step": int(reader.get_tensor("global_step")) if "global_step" in shapes else None,
            "do_lower_case_from": lower_origin,
        },
    )


def _log_conversion(skipped, other, fresh_heads, ours, do_lower_case, lower_origin: str):
    """What `convert_tf1_checkpoint` left out, created fresh or decided, as info lines."""
    if skipped:
        log.info("skipped %s of optimizer state (global_step, adam_m/adam_v slots)", plural(len(skipped), "variable"))
    if other:
        log.info("ignored %s outside bert/ and cls/: %s", plural(len(other), "variable"), listing(other))
    for head in fresh_heads:
        if not any(n.startswith(TF1_HEAD_PREFIXES[head]) for n in ours):
            log.info(
                "the checkpoint has no %s (%s*): it is freshly initialised", _head_name(head), TF1_HEAD_PREFIXES[head]
            )
        else:
            log.info("%s records the %s as fresh (random weights written out by kbert)", CONFIG_FILE, _head_name(head))
    if lower_origin.startswith(("folder name", "default")):
        log.info(
            "do_lower_case=%s, from the %s; pass %s to set it",
            do_lower_case,
            lower_origin,
            option("do_lower_case", flag="--lowercase/--no-lowercase", command="convert from-tf1"),
        )


def _head_name(head: str) -> str:
    return "pooler" if head == "pooler" else f"{head} head"


def _casing(prefix: str, config: BertConfig, given) -> tuple:
    """(do_lower_case, where it came from): the argument; else what bert_config.json records
    (kbert's to-tf1 writes it there); else the folder name, if it says cased or uncased; else
    uncased, as most released models are."""
    if given is not None:
        return bool(given), option("do_lower_case", flag="--lowercase/--no-lowercase")
    recorded = config.extras.get("do_lower_case")
    if isinstance(recorded, bool):
        return recorded, CONFIG_FILE
    folder = os.path.basename(os.path.dirname(os.path.abspath(prefix))).lower()
    if "cased" in folder:
        return lower_case_for(prefix), "folder name"
    return True, "default (the folder name says neither cased nor uncased)"


@writes("out_dir")
def save_tf1_checkpoint(
    model, out_dir, vocab_file=None, overwrite: bool = False, *, do_lower_case=None, include_fresh_heads=False
):
    """Write `model` as a google-research/bert checkpoint directory, atomically.

    Writes `bert_config.json`, `vocab.txt`, `checkpoint` and
    `bert_model.ckpt.{index,data-00000-of-00001}` with the original variable names. Heads the
    model does not have (an encoder has neither) are left out, as in an encoder-only release; so
    are heads a converter created (`model.fresh_heads`: random weights) unless
    `include_fresh_heads`. A classifier's head is written as run_classifier.py names it
    (`output_weights` [num_labels, H], `output_bias`). bert_config.json holds the original keys
    plus `do_lower_case` (the original's `BertConfig.from_dict` takes extra keys; `from-tf1`
    reads it back), and `fresh_heads` when fresh heads are written.

    Args:
        model: a kbert `BertEncoder`, `BertPretrainer` or `BertClassifier`.
        out_dir: str. Output directory (must not exist or be empty unless `overwrite`).
        vocab_file: str. Defaults to `model.vocab_file` (set by `kbert.load` and the converters).
        do_lower_case: bool. Defaults to `model.do_lower_case`.
        include_fresh_heads: bool. Write fresh heads' random weights too.

    Example:
    >>> kbert.converters.save_tf1_checkpoint(kbert.load("out/tiny"), "out/tiny-tf1")  # doctest: +SKIP
    """
    vocab_file, do_lower_case, config, left_out = loading.model_to_write(
        model, "save_tf1_checkpoint", vocab_file, do_lower_case, include_fresh_heads
    )
    paths = tf1_to_kbert_paths(config.num_hidden_layers)
    if isinstance(model, BertClassifier):
        paths = {**paths, **TF1_CLASSIFIER_HEAD}
    values = loading.stored_weights(
        model,
        paths,
        format_name="a google-research checkpoint",
        left_out=left_out,
        unnamed_hint="encoders, pretrainers and classifiers (run_classifier.py's output_weights, output_bias)",
    )
    for head in left_out:
        log.info(
            "left out the %s (%s*): a converter created it, so its weights are random; pass %s to write it",
            _head_name(head),
            TF1_HEAD_PREFIXES[head],
            option("include_fresh_heads", True),
        )
    written_fresh = [h for h in fresh_heads_of(model) if h not in left_out]
    config = BertConfig.from_dict(
        {
            **config.to_dict(),
            "do_lower_case": bool(do_lower_case),
            **({"fresh_heads": written_fresh} if written_fresh else {}),
        }
    )
    # A weight of another Keras backend goes through numpy: a PyTorch one carries grad, which
    # TensorFlow's conversion refuses. TensorFlow's own tensors are written as they are (no copy).
    names = list(values)
    tensors = [tf.convert_to_tensor(v if tf.is_tensor(v) else keras.ops.convert_to_numpy(v)) for v in values.values()]
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        config.to_json_file(os.path.join(tmp, CONFIG_FILE))
        shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB_FILE))
        prefix = os.path.join(tmp, CKPT_PREFIX)
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
        with open(os.path.join(tmp, "checkpoint"), "w") as f:
            f.write(f'model_checkpoint_path: "{CKPT_PREFIX}"\nall_model_checkpoint_paths: "{CKPT_PREFIX}"\n')
    return out_dir
