"""`describe(src)`: what a google-research checkpoint or a kbert model directory holds, without
building a model: config, parameter count, heads, optimizer slots, step."""

from __future__ import annotations

import os

import h5py
import numpy as np

from kbert.config import BertConfig
from kbert.errors import KbertError
from kbert.files import count_lines
from kbert.model_dir import CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE, is_model_dir
from kbert.converters.names import HEADS
from kbert.converters.tf1 import find_checkpoint, is_optimizer_state, open_reader


def describe(src) -> dict:
    """A JSON-ready summary of SRC (checkpoint dir/prefix or kbert model directory).

    Example:
    >>> describe("tests/fixtures/tf1-tiny")["parameters"]
    99374
    """
    src = os.fspath(src)
    if os.path.isdir(src) and is_model_dir(src):
        return _describe_model_dir(src)
    return _describe_checkpoint(src)


def _config_summary(path):
    if not os.path.isfile(path):
        return None
    return BertConfig.from_json_file(path).to_dict()


def _describe_checkpoint(src) -> dict:
    try:
        source = find_checkpoint(src)
        config_file, vocab_file, prefix = source.config_file, source.vocab_file, source.prefix
    except KbertError as e:
        # A bare prefix without config/vocab can still be inspected.
        if os.path.isfile(os.fspath(src) + ".index"):
            prefix, config_file, vocab_file = os.fspath(src), None, None
        else:
            raise e
    reader = open_reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    weights = {n: s for n, s in shapes.items() if n.startswith(("bert/", "cls/")) and not is_optimizer_state(n)}
    slots = sorted(n for n in shapes if is_optimizer_state(n) and n != "global_step")
    layers = {int(n.split("/")[2].split("_")[1]) for n in weights if n.startswith("bert/encoder/layer_")}
    return {
        "kind": "google-research checkpoint",
        "checkpoint": prefix,
        "config": _config_summary(config_file) if config_file else None,
        "vocab_entries": count_lines(vocab_file) if vocab_file and os.path.isfile(vocab_file) else None,
        "parameters": int(sum(np.prod(s) for s in weights.values())),
        "layers_in_checkpoint": len(layers),
        "heads": {head: any(n.startswith(p) for n in weights) for head, p in HEADS.items()},
        "optimizer_slots": len(slots),
        "optimizer_slot_kinds": sorted({n.rsplit("/", 1)[1] for n in slots}),
        "global_step": int(reader.get_tensor("global_step")) if "global_step" in shapes else None,
        "dtypes": sorted({dtypes[n].name for n in weights}),
        "other_variables": sorted(n for n in shapes if n not in weights and not is_optimizer_state(n)),
    }


def _describe_model_dir(src) -> dict:
    config = BertConfig.from_json_file(os.path.join(src, CONFIG_FILE))
    weights_path = os.path.join(src, WEIGHTS_FILE)
    total, seen = 0, set()
    try:
        with h5py.File(weights_path, "r") as f:
            def visit(name, obj):
                nonlocal total
                if isinstance(obj, h5py.Dataset) and obj.id.__hash__() not in seen:
                    seen.add(obj.id.__hash__())
                    total += int(np.prod(obj.shape))
            f.visititems(visit)
    except OSError as e:
        raise KbertError(f"{weights_path}: not a readable weights file ({e}); convert or train again") from None
    kind = config.extras.get("kbert_model", "pretrainer")
    vocab = os.path.join(src, VOCAB_FILE)
    return {
        "kind": f"kbert model directory ({kind})",
        "model_dir": src,
        "config": config.to_dict(),
        "vocab_entries": count_lines(vocab) if os.path.isfile(vocab) else None,
        "parameters": total,
        "heads": {"masked_lm": kind == "pretrainer", "next_sentence": kind == "pretrainer"},
        "do_lower_case": config.extras.get("do_lower_case"),
    }
