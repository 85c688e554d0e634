"""A ModernBERT's kbert model directory: `config.json` (transformers' keys, plus kbert's
`kbert_family`, `kbert_model` and a task head's record), the tokenizer's files (`tokenizer.json`
and what transformers reads beside it) and `model.weights.h5`.

The config keeps transformers' name and keys, so a ModernBERT user finds the folder they know;
`kbert_family` is what tells kbert which family reads it.
"""

from __future__ import annotations

import json
import os
import shutil

from kbert.model.initializers import unfilled
from kbert.model.kinds import TASK_KEYS
from kbert.modernbert.config import ModernBertConfig
from kbert.modernbert.models import FAMILY, MODEL_CLASSES
from kbert.modernbert.tokenizer import TOKENIZER_FILE, TOKENIZER_FILES, copy_tokenizer_files
from kbert.runtime.errors import KbertError, first_line, os_error_or
from kbert.runtime.files import atomic_output_dir, load_weights, replace_file, require_path, save_weights

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
FAMILY_KEY = "kbert_family"


def is_modernbert_dir(path) -> bool:
    """Whether `path` is a kbert model directory of the ModernBERT family (read from its config.json)."""
    config_file = os.path.join(os.fspath(path), CONFIG_FILE)
    if not os.path.isfile(config_file) or os.path.isfile(os.path.join(os.fspath(path), "bert_config.json")):
        return False
    try:
        with open(config_file, encoding="utf-8") as f:
            return json.load(f).get(FAMILY_KEY) == FAMILY
    except (OSError, ValueError, AttributeError):
        return False


def kind_of(model) -> str:
    for kind, cls in MODEL_CLASSES.items():
        if type(model) is cls:
            return kind
    raise KbertError(f"cannot save a {type(model).__name__} as a ModernBERT model directory")


def save(model, model_dir, overwrite: bool = False, task_info: dict | None = None):
    """Write a kbert ModernBERT as a model directory, atomically."""
    with atomic_output_dir(model_dir, overwrite=overwrite) as tmp:
        with open(os.path.join(tmp, CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(_config_text(model, task_info))
        copy_tokenizer_files(model, tmp)
        save_weights(model, os.path.join(tmp, WEIGHTS_FILE))
    return model_dir


def write_in_place(model, model_dir, weights: bool = True):
    """Write (or replace) a ModernBERT's model-directory files inside an existing directory, each
    one atomically: what pretraining writes, whose directory also holds checkpoints and logs.

    Example:
    >>> import tempfile
    >>> from kbert.modernbert.config import ModernBertConfig
    >>> from kbert.modernbert.models import ModernBertMaskedLM
    >>> config = ModernBertConfig(vocab_size=64, hidden_size=16, intermediate_size=24,
    ...                           num_hidden_layers=1, num_attention_heads=2)
    >>> source = tempfile.mkdtemp()  # where the model's tokenizer.json lies
    >>> _ = open(os.path.join(source, "tokenizer.json"), "w").write("{}")
    >>> model = ModernBertMaskedLM(config, tokenizer_file=os.path.join(source, "tokenizer.json"))
    >>> folder = tempfile.mkdtemp()
    >>> write_in_place(model, folder, weights=False)
    >>> sorted(os.listdir(folder)), is_modernbert_dir(folder)
    (['config.json', 'tokenizer.json'], True)
    """
    model_dir = os.fspath(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    replace_file(os.path.join(model_dir, CONFIG_FILE), lambda tmp: _write_text(tmp, _config_text(model, None)))
    source = getattr(model, "tokenizer_folder", None) or os.path.dirname(model.tokenizer_file or "")
    if os.path.abspath(source) != os.path.abspath(model_dir):
        for name in TOKENIZER_FILES:
            path = os.path.join(source, name)
            if os.path.isfile(path):
                replace_file(os.path.join(model_dir, name), lambda tmp, path=path: shutil.copyfile(path, tmp))
    if weights:
        # Keras insists on the .weights.h5 suffix, so the temporary name keeps it.
        replace_file(
            os.path.join(model_dir, WEIGHTS_FILE),
            lambda tmp: save_weights(model, tmp),
            tmp_name=os.path.join(model_dir, ".tmp-" + WEIGHTS_FILE),
        )


def _config_text(model, task_info) -> str:
    values = model.config.to_hf()
    values.update({FAMILY_KEY: FAMILY, "kbert_model": kind_of(model)})
    if hasattr(model, "num_classes"):
        values["num_classes"] = model.num_classes
    values.update(task_info if task_info is not None else model.task_info)
    return json.dumps(values, indent=2) + "\n"


def _write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def load(model_dir):
    """The ModernBERT saved in a kbert model directory, with its weights, its tokenizer.json and,
    for a task model, its task record."""
    model_dir = os.fspath(model_dir)
    config_file = os.path.join(model_dir, CONFIG_FILE)
    try:
        with open(config_file, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as e:
        raise os_error_or(e, f"{config_file}: not readable JSON ({first_line(e)}); convert the model again") from None
    extras = {k: values.pop(k) for k in (FAMILY_KEY, "kbert_model", "num_classes") if k in values}
    kind = extras.get("kbert_model", "encoder")
    if kind not in MODEL_CLASSES:
        raise KbertError(f"{config_file}: unknown kbert_model {kind!r}; expected one of {', '.join(MODEL_CLASSES)}")
    config = ModernBertConfig.from_hf(values, config_file)
    task_info = {k: config.extras.pop(k) for k in TASK_KEYS if k in config.extras}
    weights = os.path.join(model_dir, WEIGHTS_FILE)
    require_path(weights, "weights file", "the model directory is incomplete; convert or train it again")
    tokenizer_file = os.path.join(model_dir, TOKENIZER_FILE)
    require_path(tokenizer_file, "tokenizer file", f"copy the model's {TOKENIZER_FILE} into {model_dir}")
    head = {}
    if "num_classes" in extras:
        head = {"num_classes": int(extras["num_classes"]), "task_info": task_info}
    with unfilled():
        model = MODEL_CLASSES[kind](config, tokenizer_file=tokenizer_file, **head)
    load_weights(model, weights, CONFIG_FILE)
    model.tokenizer_folder = model_dir
    return model


__all__ = ["FAMILY", "TOKENIZER_FILES", "is_modernbert_dir", "load", "save", "write_in_place"]
