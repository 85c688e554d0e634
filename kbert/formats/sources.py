"""Model sources: every kind of model a kbert command reads, told apart and opened in one place.

`source_kind(path)` names what a path holds from its file names alone (nothing is read, no
TensorFlow): the command-line frame checks every model argument with it before any work, and
`kbert convert` and `kbert convert inspect` dispatch on it. `open_model(source)` opens any kind
as a kbert model with its weights and vocabulary, converting on the fly where the source is not
kbert's own; `describe_source(source)` gives its config, vocabulary and casing.

The kinds, by their names in `KINDS`:
- "kbert": a kbert model directory (bert_config.json, vocab.txt, model.weights.h5; a ModernBERT's has
  config.json, tokenizer.json and model.weights.h5);
- "keras": a `.keras` file of a kbert model (`model.save`);
- "tf1": a google-research checkpoint, its folder or a prefix such as DIR/model.ckpt-20000;
- "hf": a Hugging Face BERT folder (config.json + model.safetensors), or its .safetensors file;
- "tfhub": a TF Hub BERT encoder SavedModel (Model Garden's, or `kbert export --format tfhub`'s encoder/);
- "keras_hub": a keras-hub BertBackbone preset folder (`save_to_preset`).
A folder of an unfinished `kbert pretrain` or `kbert finetune` run is "run": no model yet, and
opening it says how to finish the run.

Example:
>>> source_kind("tests/fixtures/tf1-tiny"), source_kind("tests/fixtures/hf-tiny/model.safetensors")
('tf1', 'hf')
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable

from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import is_url

# The converters and kbert.formats.model_dir are imported where they are used: they import TensorFlow
# (keras-hub's converter adds a second more), which checking a path must not wait for.

log = logging.getLogger("kbert")


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """One kind of model source: what it is called, the command that converts it into a kbert
    model directory (None for kbert's own), and how it is opened as a kbert model.

    `open(source, do_lower_case)` returns the model with its weights and vocabulary; each imports
    its converter when called, since the converters load TensorFlow. `describe(source)`, where
    set, reads a `SourceInfo` without loading the weights; other kinds are opened to describe them."""

    description: str
    convert_command: str | None
    open: Callable
    describe: Callable | None = None


def _open_kbert(source, do_lower_case):
    model = load(source)
    return model if do_lower_case is None else with_casing(model, do_lower_case)


def _open_tf1(source, do_lower_case):
    from kbert.converters.tf1 import load_tf1_checkpoint

    return load_tf1_checkpoint(source, do_lower_case=do_lower_case)


def _open_hf(source, do_lower_case):
    from kbert.converters.hf import load_hf_model

    return load_hf_model(source, do_lower_case=do_lower_case)


def _open_tfhub(source, do_lower_case):
    from kbert.converters.tfhub import load_tfhub_encoder

    return load_tfhub_encoder(source, do_lower_case=do_lower_case)


def _open_keras_hub(source, do_lower_case):
    from kbert.converters.keras_hub import load_keras_hub_preset

    return load_keras_hub_preset(source, do_lower_case=do_lower_case)


def _describe_kbert(source) -> SourceInfo:
    from kbert.config import BertConfig
    from kbert.formats.model_dir import CONFIG_FILE, VOCAB_FILE, lower_case_for
    from kbert.runtime.files import require_path

    config = BertConfig.from_json_file(os.path.join(source, CONFIG_FILE))
    vocab = os.path.join(source, VOCAB_FILE)
    require_path(vocab, "vocab file", "the model directory needs its vocab.txt")
    return SourceInfo(config, vocab, lower_case_for(source, config.extras.get("do_lower_case", True)))


def _describe_tf1(source) -> SourceInfo:
    from kbert.config import BertConfig
    from kbert.converters.tf1 import find_checkpoint
    from kbert.formats.model_dir import lower_case_for

    checkpoint = find_checkpoint(source)
    config = BertConfig.from_json_file(checkpoint.config_file)
    recorded = config.extras.get("do_lower_case")  # what kbert's to-tf1 writes there; released ones lack it
    return SourceInfo(
        config,
        checkpoint.vocab_file,
        lower_case_for(checkpoint.prefix, recorded if isinstance(recorded, bool) else None),
    )


# Every kind `source_kind` names but an unfinished run, in the order the messages list them.
SOURCE_KINDS = {
    "kbert": SourceKind("a kbert model directory", None, _open_kbert, _describe_kbert),
    "keras": SourceKind("a .keras file", None, _open_kbert),
    "tf1": SourceKind("a google-research checkpoint", "kbert convert from-tf1", _open_tf1, _describe_tf1),
    "hf": SourceKind("a Hugging Face model", "kbert convert from-hf", _open_hf),
    "tfhub": SourceKind("a TF Hub encoder SavedModel", "kbert convert from-tfhub", _open_tfhub),
    "keras_hub": SourceKind("a keras-hub preset", "kbert convert from-keras-hub", _open_keras_hub),
}
KINDS = {name: kind.description for name, kind in SOURCE_KINDS.items()}
ACCEPTED = (
    "a kbert model directory, a .keras file, a google-research checkpoint (folder or prefix), a Hugging Face "
    "folder or model.safetensors, a TF Hub encoder SavedModel or a keras-hub preset folder"
)

# The file names that tell the kinds apart (kbert.formats.model_dir's, kbert.converters.hf's and keras-hub's;
# written out here because importing those modules loads TensorFlow).
_KBERT_CONFIG = "bert_config.json"  # kbert model directories and google-research checkpoints
_KBERT_WEIGHTS = "model.weights.h5"  # kbert model directories and keras-hub presets
_JSON_CONFIG = "config.json"  # Hugging Face models and keras-hub presets
_HF_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)
_PICKLES = (".bin", ".pt", ".pth", ".pkl")
_SAVED_MODEL = "saved_model.pb"
# What an unfinished run leaves instead of model.weights.h5: pretrain's checkpoints/, finetune's state.json.
_RUN_MARKS = ("checkpoints", "state.json")


def source_kind(path, wanted: str = ACCEPTED, missing: str | None = None) -> str:
    """Which kind of model source `path` is: a key of `KINDS`, or "run" for the folder of an
    unfinished training run. Decided from file names only; what the files hold is checked when
    the source is opened. `wanted`: what the caller takes, in words, for the messages; `missing`:
    the line for a path that is not there, where the caller has one of its own.

    Raises a one-line `KbertError` for a path that is none of them: missing, an empty folder, a
    file or folder of something else, a folder with a config but no weights.

    Example:
    >>> source_kind("tests/fixtures/model-garden-tfhub/encoder")
    'tfhub'
    >>> source_kind("tests/fixtures")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: tests/fixtures: not a model (no bert_config.json, config.json, model.weights.h5, model.safetensors, saved_model.pb or checkpoint *.index here); pass a kbert model directory, a .keras file, a google-research checkpoint (folder or prefix), a Hugging Face folder or model.safetensors, a TF Hub encoder SavedModel or a keras-hub preset folder
    """
    path = os.fspath(path)
    if is_url(path):
        raise KbertError(f"{path}: kbert reads models from this machine's files; copy the model here and pass its path")
    if os.path.isfile(path + ".index"):  # a checkpoint prefix names no file of its own
        return "tf1"
    if os.path.isfile(path):
        return _file_kind(path)
    if not os.path.isdir(path):
        raise KbertError(missing or f"{path}: no such model directory, file or checkpoint; check the path")
    names = set(os.listdir(path))
    if not names:
        raise KbertError(f"{path}: the directory is empty; pass {wanted}")
    if _KBERT_WEIGHTS in names:
        # keras-hub's save_to_preset writes config.json beside its model.weights.h5; kbert writes bert_config.json.
        if _JSON_CONFIG in names and _KBERT_CONFIG not in names and not _kbert_family(path):
            return "keras_hub"
        return "kbert"
    if _SAVED_MODEL in names:
        return "tfhub"
    if names & set(_HF_WEIGHTS):
        return "hf"  # its converter says what is missing (config.json) or refused (a pickle)
    if any(name.endswith(".index") for name in names):
        return "tf1"
    if _KBERT_CONFIG in names and names & set(_RUN_MARKS):
        return "run"
    if _KBERT_CONFIG in names:
        raise KbertError(
            f"{path}: {_KBERT_CONFIG} but no weights ({_KBERT_WEIGHTS}, or a checkpoint's *.index): the model "
            f"directory is incomplete; convert or train it again"
        )
    if "state.json" in names:
        return "run"
    if _JSON_CONFIG in names:
        raise KbertError(
            f"{path}: {_JSON_CONFIG} but no weights (model.safetensors for a Hugging Face model, "
            f"{_KBERT_WEIGHTS} for a keras-hub preset): the folder is incomplete; copy or save the model again"
        )
    raise KbertError(
        f"{path}: not a model (no {_KBERT_CONFIG}, {_JSON_CONFIG}, {_KBERT_WEIGHTS}, model.safetensors, "
        f"{_SAVED_MODEL} or checkpoint *.index here); pass {wanted}"
    )


def _kbert_family(path: str) -> bool:
    """Whether a folder's config.json is a kbert model directory's of another family than BERT
    (a ModernBERT's: `kbert_family`), not a keras-hub preset's."""
    try:
        with open(os.path.join(path, _JSON_CONFIG), encoding="utf-8") as f:
            return isinstance(json.load(f).get("kbert_family"), str)
    except (OSError, ValueError, AttributeError):
        return False


def source_family(path) -> str:
    """The model family of a source `source_kind` names: "modernbert" for a ModernBERT's kbert model
    directory or Hugging Face folder (their config.json says so), else "bert". Read from config.json
    alone; nothing is loaded.

    >>> source_family("tests/fixtures/tf1-tiny")
    'bert'
    """
    path = os.fspath(path)
    kind = source_kind(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    if kind not in ("kbert", "hf") or not os.path.isfile(os.path.join(folder, _JSON_CONFIG)):
        return "bert"
    try:
        with open(os.path.join(folder, _JSON_CONFIG), encoding="utf-8") as f:
            values = json.load(f)
        family = values.get("kbert_family") or values.get("model_type")
    except (OSError, ValueError, AttributeError):
        return "bert"  # its reader says what is wrong with it
    return "modernbert" if family == "modernbert" else "bert"


def _file_kind(path: str) -> str:
    if path.endswith(".keras"):
        return "keras"
    if path.endswith((".safetensors", ".safetensors.index.json")):
        return "hf"
    if path.endswith(".index") and os.path.isfile(path):
        return "tf1"  # DIR/bert_model.ckpt.index: the prefix, as find_checkpoint takes it
    if path.endswith(_PICKLES):
        return "hf"  # a Hugging Face model's pickle: its converter refuses it, saying how to save safetensors
    return _refuse_file(path)


def _refuse_file(path: str):
    folder = os.path.dirname(path) or "."
    if os.path.basename(path) in (_KBERT_CONFIG, _KBERT_WEIGHTS, _JSON_CONFIG, _SAVED_MODEL, "vocab.txt"):
        raise KbertError(f"{path}: is a file of a model; pass the folder that holds it ({folder})")
    raise KbertError(f"{path}: is a file, not a model; pass {ACCEPTED}")


def check_source(path, accepts=None) -> str:
    """`source_kind(path)`, refusing a kind not in `accepts` (default: every kind but "run") and
    an unfinished run, each in one line that says what to pass instead.

    Example:
    >>> check_source("tests/fixtures/tf1-tiny", accepts=("hf",))
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: tests/fixtures/tf1-tiny: a google-research checkpoint, not a Hugging Face model; use kbert convert from-tf1
    """
    accepts = tuple(accepts or KINDS)
    wanted = " or ".join(KINDS[k] for k in accepts if k in KINDS)
    path = os.fspath(path)
    missing = f"{path}: no such file or folder; pass {wanted}" if len(accepts) == 1 else None
    # Every model kind (convert inspect takes unfinished runs too): the one list every command gives.
    kind = source_kind(path, ACCEPTED if set(KINDS) <= set(accepts) else wanted, missing)
    if kind in accepts:
        return kind
    if kind == "run":
        refuse_run(path)
    command = SOURCE_KINDS[kind].convert_command
    fix = f"use {command}" if command else "it is kbert's already: pass it to any command"
    raise KbertError(f"{path}: {KINDS[kind]}, not {wanted}; {fix}")


def check_not_interrupted(path):
    """Raise a one-line `KbertError` for the folder of a training run that stopped before writing
    its model: where it stopped and how to continue it, where "no weights file" would send the
    user astray. Each trainer recognises its own runs (`kbert.formats.model_dir.UNFINISHED_RUNS`)."""
    from kbert.formats.model_dir import UNFINISHED_RUNS

    for run in UNFINISHED_RUNS:
        recorded = run.recognise(path)
        if recorded:
            raise KbertError(run.message(path, recorded))


def refuse_run(path):
    """Raise the one line for an unfinished run's folder: where it stopped and how to finish it."""
    check_not_interrupted(path)  # raises, naming the checkpoint or the unfinished fine-tuning
    raise KbertError(
        f"{os.fspath(path)}: a training run that stopped before writing its model (no model.weights.h5); "
        f"continue it with {option('resume', True)}, or pass a finished model"
    )


def load(path):
    """The model saved in a kbert model directory or `.keras` file (`kbert.formats.model_dir.load`), after
    refusing the folder of an unfinished run in one line that says how to finish it.

    Example:
    >>> model = kbert.load("out/tiny")  # doctest: +SKIP
    """
    from kbert.formats.model_dir import load as load_model_dir

    check_not_interrupted(path)
    return load_model_dir(path)


@dataclasses.dataclass
class SourceInfo:
    """What a model source says about itself.

    `model` is the opened model where the config could only be read by opening it (a .keras file, a
    converted source): it keeps alive the vocabulary file a converter may have written for it.
    """

    config: object
    vocab_file: str
    do_lower_case: bool
    model: object = None


def describe_source(source) -> SourceInfo:
    """Config, vocabulary and casing of any model source; a kbert model directory and a
    google-research checkpoint are read without loading their weights.

    Example:
    >>> describe_source("tests/fixtures/tf1-tiny").do_lower_case
    True
    """
    source = os.fspath(source)
    name = check_source(source)
    kind = SOURCE_KINDS[name]
    if kind.describe:
        with read_with_tensorflow(source, name):  # a google-research checkpoint's reader is TensorFlow's
            return kind.describe(source)
    model = open_model(source)
    return SourceInfo(model.config, model.vocab_file, model.do_lower_case, model)


def open_model(source, do_lower_case: bool | None = None):
    """The model at `source`, of any kind `source_kind` names, with its weights and its
    `vocabulary` (vocab.txt and casing) for building its tokenizer.

    A kbert model directory or .keras file is loaded (`kbert.load`); any other kind is converted
    in memory by its converter, into a pretrainer whose `fresh_heads` name the heads the source
    lacked (a sentence-transformers CrossEncoder folder: into its reranker, a classifier of one output). Where a source records no casing, `kbert.formats.model_dir.lower_case_for` decides from its
    folder name, and the log says so. `do_lower_case` overrides the casing in every case.

    Example:
    >>> model = open_model("cased_L-12_H-768_A-12/")  # doctest: +SKIP
    >>> model.do_lower_case  # doctest: +SKIP
    False
    """
    source = os.fspath(source)
    kind = check_source(source)
    if SOURCE_KINDS[kind].convert_command is None:
        return SOURCE_KINDS[kind].open(source, do_lower_case)
    log.debug("%s: %s, converted in memory", source, KINDS[kind])
    with read_with_tensorflow(source, kind):
        return SOURCE_KINDS[kind].open(source, do_lower_case)


@contextlib.contextmanager
def read_with_tensorflow(source, kind: str):
    """One line for a source whose converter needs TensorFlow where it is not installed (JAX or
    PyTorch alone): google-research checkpoints and TF Hub SavedModels are TensorFlow's files.

    `kind` is the source's kind (`KINDS`): its convert command says how to go on."""
    try:
        yield
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("tensorflow", "tensorflow_text", "tensorflow_hub", "tf_keras"):
            raise
        convert = SOURCE_KINDS[kind].convert_command
        raise KbertError(
            f"{source}: {KINDS[kind]} is read with TensorFlow, and {e.name.split('.')[0]} is not installed: pip "
            f"install tensorflow, or convert it with `{convert}` where TensorFlow is and pass the kbert model "
            "directory it writes"
        ) from None


def with_casing(model, do_lower_case: bool):
    """`model`, its vocabulary (and its encoder's) declaring `do_lower_case`; one line for a model
    whose casing is not a vocabulary's to declare (a ModernBERT's is its tokenizer.json's)."""
    from kbert.model import bert

    if not hasattr(model, "vocab_file"):
        raise KbertError(
            f"{option('do_lower_case', flag='--lowercase' if do_lower_case else '--no-lowercase')}: a ModernBERT's casing is its "
            f"tokenizer.json's; drop {option('do_lower_case', flag='--lowercase/--no-lowercase')}"
        )

    vocabulary = bert.Vocabulary(model.vocab_file, bool(do_lower_case))
    for part in {id(m): m for m in (model, bert.encoder_of(model)) if m is not None}.values():
        part.vocabulary = vocabulary
    return model
