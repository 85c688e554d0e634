"""Model sources: kbert model directories, and the one opener of every model source.

A kbert model directory is `bert_config.json` + `vocab.txt` + `model.weights.h5`.
`open_model` opens any source a command takes (a kbert model directory, or a google-research
checkpoint converted on the fly), and `lower_case_for` is the one rule for a source's casing.

`bert_config.json` keeps the original keys, plus kbert's own: `kbert_model` (which model
class the weights belong to) and `do_lower_case`. `kbert.load` rebuilds the model from the
config and loads the weights, so the directory stays readable by anything that reads
google-research/bert's config.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil

import tensorflow as tf

from kbert.config import BertConfig
from kbert.errors import KbertError, first_line
from kbert.files import atomic_output_dir, count_lines, require_path
from kbert.model import bert
from kbert.model.layers import weights_from

log = logging.getLogger("kbert")

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
WEIGHTS_FILE = "model.weights.h5"
# Where `kbert pretrain` keeps its checkpoints inside --model-dir (kbert.pretraining.train).
CHECKPOINTS_DIR = "checkpoints"
# What fine-tuning records in bert_config.json besides the original keys.
TASK_KEYS = ("task", "labels", "max_seq_length", "text_pairs", "doc_stride", "max_query_length")


def check_vocab(vocab_file: str, config: BertConfig):
    """A vocab.txt must have exactly `vocab_size` lines, or ids would point at the wrong rows."""
    require_path(vocab_file, "vocab file", "pass the vocab.txt that came with the checkpoint")
    n = count_lines(vocab_file)
    if n != config.vocab_size:
        raise KbertError(f"{vocab_file} has {n} entries but bert_config.json says vocab_size "
                         f"{config.vocab_size}; use the vocab.txt this model was trained with")


def _model_classes():
    return {"pretrainer": bert.BertPretrainer, "encoder": bert.BertEncoder,
            "classifier": bert.BertClassifier, "tagger": bert.BertTagger,
            "span_predictor": bert.BertSpanPredictor, "multiple_choice": bert.BertMultipleChoice}


def model_kind(model) -> str:
    for kind, cls in _model_classes().items():
        if type(model) is cls:
            return kind
    raise KbertError(f"cannot save a {type(model).__name__}: kbert model directories hold kbert models "
                     f"(bert_encoder, bert_pretrainer, bert_classifier, bert_tagger, bert_span_predictor)")


def _describe(model, config: BertConfig, do_lower_case: bool):
    """Record in the config what rebuilds `model`: its class, head size, casing and task metadata."""
    for key in TASK_KEYS + ("num_classes",):  # a head's metadata must not outlive the head
        config.extras.pop(key, None)
    config.extras.update(kbert_model=model_kind(model), do_lower_case=bool(do_lower_case))
    if hasattr(model, "num_classes"):
        config.extras["num_classes"] = model.num_classes
    # Fine-tuning sets these (task, labels, max_seq_length) so predict/evaluate/export need no flags.
    config.extras.update(getattr(model, "task_info", None) or {})


def save(model, model_dir, vocab_file: str | None = None, do_lower_case: bool | None = None,
         overwrite: bool = False):
    """Write `model` as a kbert model directory, atomically.

    Args:
        model: a kbert model (`bert_encoder`, `bert_pretrainer`).
        model_dir: str. The directory to write; must not exist or be empty unless `overwrite`.
        vocab_file: str. The vocab.txt to copy in; defaults to `model.vocab_file`, which
            `kbert.load` and the converters set.
        do_lower_case: bool. Recorded so tokenizers built from the directory lower-case or
            not; defaults to `model.do_lower_case`, else True.
        overwrite: bool. Replace a non-empty `model_dir`.

    Example:
    >>> kbert.save(kbert.converters.load_tf1_checkpoint("tests/fixtures/tf1-tiny"), "out/tiny")  # doctest: +SKIP
    """
    vocab_file = vocab_file or getattr(model, "vocab_file", None)
    if not vocab_file:
        raise KbertError("kbert.save needs the vocabulary: pass vocab_file=PATH/vocab.txt")
    if do_lower_case is None:
        do_lower_case = getattr(model, "do_lower_case", True)
    config = BertConfig.from_dict(model.config.to_dict())
    check_vocab(vocab_file, config)
    _describe(model, config, do_lower_case)
    with atomic_output_dir(model_dir, overwrite=overwrite) as tmp:
        config.to_json_file(os.path.join(tmp, CONFIG_FILE))
        shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB_FILE))
        model.save_weights(os.path.join(tmp, WEIGHTS_FILE))
    return model_dir


def is_model_dir(path) -> bool:
    return os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def interrupted_pretraining(path) -> str | None:
    """The latest checkpoint prefix of a `kbert pretrain --model-dir` whose run stopped before
    writing model.weights.h5 (bert_config.json and checkpoints/ckpt-N, no weights), else None."""
    path = os.fspath(path)
    if not os.path.isdir(path) or is_model_dir(path) or not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return None
    # The checkpoint `--resume` would continue from: the one the `checkpoint` state file names.
    return tf.train.latest_checkpoint(os.path.join(path, CHECKPOINTS_DIR))


def check_not_interrupted(path):
    """Raise a one-line `KbertError` for an interrupted pretraining directory: which checkpoint
    it stopped at and how to continue it, where "no weights file" would send the user astray."""
    prefix = interrupted_pretraining(path)
    if prefix:
        raise KbertError(interrupted_pretraining_message(path, prefix))


def interrupted_pretraining_message(path, prefix: str) -> str:
    """'D: pretraining stopped at step N (checkpoints/ckpt-N) before writing the model; ...'

    >>> print(interrupted_pretraining_message("out/bert", "out/bert/checkpoints/ckpt-100"))
    out/bert: pretraining stopped at step 100 (checkpoints/ckpt-100) before writing the model; continue it with `kbert pretrain --model-dir out/bert --resume --data DATA --steps N` (DATA: the records it trained on; N: its total steps)
    """
    path = os.fspath(path)
    step = prefix.rsplit("-", 1)[-1]  # CheckpointManager numbers them by step: ckpt-<step>
    return (f"{path}: pretraining stopped at step {step} ({os.path.relpath(prefix, path)}) before writing "
            f"the model; continue it with `kbert pretrain --model-dir {path} --resume --data DATA --steps N` "
            f"(DATA: the records it trained on; N: its total steps)")


def load_config(model_dir) -> BertConfig:
    require_path(model_dir, "model directory", "pass a directory written by kbert (convert, pretrain, finetune)")
    return BertConfig.from_json_file(os.path.join(model_dir, CONFIG_FILE))


def load(model_dir):
    """The model saved in a kbert model directory, with its weights.

    The model carries `vocab_file` and `do_lower_case` attributes for building its tokenizer.

    Example:
    >>> model = kbert.load("out/tiny")  # doctest: +SKIP
    """
    model_dir = os.fspath(model_dir)
    check_not_interrupted(model_dir)
    config = load_config(model_dir)
    weights = os.path.join(model_dir, WEIGHTS_FILE)
    require_path(weights, "weights file", "the model directory is incomplete; convert or train it again")
    kind = config.extras.get("kbert_model", "pretrainer")
    builders = _model_classes()
    if kind not in builders:
        raise KbertError(f"{model_dir}: unknown kbert_model {kind!r} in bert_config.json; "
                         f"expected one of {', '.join(builders)}")
    head = {"num_classes": int(config.extras.get("num_classes", 2))} if kind in ("classifier", "tagger") else {}
    # Zero-filled weights, overwritten by load_weights next: drawing BERT-base's 110M random
    # initial values would take longer than reading the file.
    with weights_from(lambda path, shape: tf.zeros(shape)):
        model = builders[kind](config, **head)
    try:
        model.load_weights(weights)
    except (ValueError, OSError) as e:
        raise KbertError(f"{weights}: cannot load ({first_line(e)}); the file is damaged or "
                         f"does not match bert_config.json") from None
    model.vocab_file = os.path.join(model_dir, VOCAB_FILE)
    model.do_lower_case = bool(config.extras.get("do_lower_case", True))
    model.task_info = {k: config.extras[k] for k in TASK_KEYS if k in config.extras}
    return model


@dataclasses.dataclass
class SourceInfo:
    """What a model source says about itself, read without loading its weights."""
    config: BertConfig
    vocab_file: str
    do_lower_case: bool


def lower_case_for(source, recorded: bool | None = None) -> bool:
    """Whether a model source's vocabulary is uncased: the one place kbert decides casing.

    A kbert model directory records it (`do_lower_case` in bert_config.json). google-research's
    released checkpoints do not; their folder names do (uncased_L-12_H-768_A-12,
    cased_L-12_H-768_A-12, multi_cased_L-12_H-768_A-12), so the folder name decides, and a
    name that says neither means uncased, as most released models are.

    >>> lower_case_for("models/cased_L-12_H-768_A-12"), lower_case_for("uncased_L-2_H-128_A-2/")
    (False, True)
    >>> lower_case_for("models/cased_L-12_H-768_A-12", recorded=True)
    True
    """
    if recorded is not None:
        return bool(recorded)
    path = os.path.abspath(os.fspath(source))
    # A checkpoint prefix (bert_model.ckpt, model.ckpt-20000) is named by its folder.
    folder = os.path.dirname(path) if "ckpt" in os.path.basename(path) and not os.path.isdir(path) else path
    name = os.path.basename(folder).lower()
    return "uncased" in name or "cased" not in name


def describe_source(source) -> SourceInfo:
    """Config, vocabulary and casing of a kbert model directory or a google-research checkpoint.

    Example:
    >>> describe_source("tests/fixtures/tf1-tiny").do_lower_case  # doctest: +SKIP
    True
    """
    source = _require_source(source)
    if is_model_dir(source):
        config = load_config(source)
        vocab = os.path.join(source, VOCAB_FILE)
        require_path(vocab, "vocab file", "the model directory needs its vocab.txt")
        return SourceInfo(config, vocab, lower_case_for(source, config.extras.get("do_lower_case", True)))
    checkpoint = _tf1().find_checkpoint(source)
    return SourceInfo(BertConfig.from_json_file(checkpoint.config_file), checkpoint.vocab_file,
                      lower_case_for(checkpoint.prefix))


def open_model(source, do_lower_case: bool | None = None):
    """The model at `source`, with its weights: a kbert model directory (`load`), or a
    google-research checkpoint directory or prefix, converted on the fly.

    The model carries `vocab_file` and `do_lower_case` (decided by `lower_case_for` unless
    `do_lower_case` is given) for building its tokenizer.

    Example:
    >>> model = open_model("cased_L-12_H-768_A-12/")  # doctest: +SKIP
    >>> model.do_lower_case  # doctest: +SKIP
    False
    """
    source = _require_source(source)
    if is_model_dir(source):
        model = load(source)
        if do_lower_case is not None:
            model.do_lower_case = bool(do_lower_case)
        return model
    return _tf1().load_tf1_checkpoint(source, do_lower_case=do_lower_case)


def _require_source(source) -> str:
    source = os.fspath(source)
    check_not_interrupted(source)
    if not os.path.exists(source + ".index"):  # a checkpoint prefix names no file of its own
        require_path(source, "model directory", "pass a kbert model directory or a google-research checkpoint")
    return source


def _tf1():
    # kbert.converters imports this module (its file names, check_vocab, lower_case_for), so
    # importing it at the top would be an import cycle.
    from kbert.converters import tf1
    return tf1


def write_model_files(model, model_dir, vocab_file: str, do_lower_case: bool, weights: bool = True):
    """Write (or replace) the model-directory files inside an existing directory, each one
    atomically: used by training, whose directory also holds checkpoints and logs."""
    config = BertConfig.from_dict(model.config.to_dict())
    _describe(model, config, do_lower_case)
    os.makedirs(model_dir, exist_ok=True)

    def replace(name, write):
        tmp = os.path.join(model_dir, f".{name}.tmp")
        write(tmp)
        os.replace(tmp, os.path.join(model_dir, name))

    replace(CONFIG_FILE, config.to_json_file)
    if os.path.abspath(vocab_file) != os.path.abspath(os.path.join(model_dir, VOCAB_FILE)):
        replace(VOCAB_FILE, lambda tmp: shutil.copyfile(vocab_file, tmp))
    if weights:
        # Keras insists on the .weights.h5 suffix, so the temporary name keeps it.
        tmp = os.path.join(model_dir, ".tmp-" + WEIGHTS_FILE)
        model.save_weights(tmp)
        os.replace(tmp, os.path.join(model_dir, WEIGHTS_FILE))
