"""kbert model directories: `bert_config.json` + `vocab.txt` + `model.weights.h5`.

`save` writes one, `load` reads one (or a `.keras` file; a ModernBERT's directory is its family's,
`kbert.modernbert.directory`), and `lower_case_for` is the one rule
for a source's casing. Every other kind of model source is opened by `kbert.formats.sources.open_model`.

`bert_config.json` keeps the original keys, plus kbert's own: `kbert_model` (which model
class the weights belong to) and `do_lower_case`. `kbert.load` rebuilds the model from the
config and loads the weights, so the directory stays readable by anything that reads
google-research/bert's config.

What a task head records (task, labels, ...) is checked and completed by its task, which the
fine-tuning tasks register here (`register_head_describer`); the folder of a run that stopped
before writing its model is named by its trainer's module (`kbert.pretraining.run_record`,
`kbert.finetuning.run_state`), which registers it likewise. The format knows no trainer and no task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Callable

from kbert.config import CONFIG_FILE, VOCAB_FILE, BertConfig, load_config
from kbert.model import bert
from kbert.model.embedding_record import EMBEDDING_KEY, check_embedding
from kbert.model.initializers import unfilled
from kbert.model.kinds import HEAD_KINDS, TASK_KEYS, model_classes, model_kind
from kbert.modernbert import directory as modernbert_directory
from kbert.runtime.errors import KbertError, first_line
from kbert.runtime.files import (
    atomic_output_dir,
    count_lines,
    load_weights,
    replace_file,
    require_path,
    save_weights,
    writes,
)

log = logging.getLogger("kbert")

WEIGHTS_FILE = "model.weights.h5"
# Where `kbert pretrain` keeps its checkpoints inside --model-dir, and `kbert finetune` inside OUTPUT.partial/.
CHECKPOINTS_DIR = "checkpoints"
# The parts of a model a converter may create rather than read, in report order: a format
# without them (a TF Hub or keras-hub encoder, an HF BertForMaskedLM) gets random ones. A model
# records those in `fresh_heads` (bert_config.json, `model.fresh_heads`) until training trains them.
HEADS = ("masked_lm", "next_sentence", "pooler")
# A Keras archive (`model.save`), which `kbert.load` and every command taking a model also read.
KERAS_SUFFIX = ".keras"


def check_vocab(vocab_file: str, config: BertConfig):
    """A vocab.txt must have exactly `vocab_size` lines, or ids would point at the wrong rows."""
    require_path(vocab_file, "vocab file", "pass the vocab.txt that came with the checkpoint")
    n = count_lines(vocab_file)
    if n != config.vocab_size:
        raise KbertError(
            f"{vocab_file} has {n} entries but bert_config.json says vocab_size "
            f"{config.vocab_size}; use the vocab.txt this model was trained with"
        )


def heads_of(kind: str) -> tuple:
    """The heads of `HEADS` a model of this kind has: a pretrainer all three, any other the pooler.

    >>> heads_of("pretrainer"), heads_of("classifier")
    (('masked_lm', 'next_sentence', 'pooler'), ('pooler',))
    """
    return HEADS if kind == "pretrainer" else ("pooler",)


def fresh_heads_of(model) -> tuple:
    """`model.fresh_heads`, checked and in `HEADS` order, keeping only heads the model has."""
    fresh = getattr(model, "fresh_heads", None) or ()
    if isinstance(fresh, str) or not all(isinstance(h, str) for h in fresh) or set(fresh) - set(HEADS):
        raise KbertError(f"fresh_heads must list heads among {', '.join(HEADS)}; got {fresh!r}"[:300])
    return tuple(h for h in heads_of(model_kind(model)) if h in fresh)


def head_provenance(kind: str, fresh_heads) -> dict:
    """{head: "trained", "fresh" (created by a converter, random) or "absent"} for a model of `kind`.

    >>> head_provenance("pretrainer", ["next_sentence"])
    {'masked_lm': 'trained', 'next_sentence': 'fresh', 'pooler': 'trained'}
    >>> head_provenance("encoder", ())
    {'masked_lm': 'absent', 'next_sentence': 'absent', 'pooler': 'trained'}
    """
    has = heads_of(kind)
    return {h: ("fresh" if h in fresh_heads else "trained") if h in has else "absent" for h in HEADS}


def stored_head_provenance(present: dict, recorded=()) -> dict:
    """{head: "trained", "fresh" or "absent"} for a file format: a head it holds is trained unless
    the file records it as fresh (kbert writes fresh heads out only when asked, and says so).

    >>> stored_head_provenance({"masked_lm": True, "next_sentence": False, "pooler": True}, ["pooler"])
    {'masked_lm': 'trained', 'next_sentence': 'absent', 'pooler': 'fresh'}
    """
    return {h: ("fresh" if h in recorded else "trained") if present.get(h) else "absent" for h in HEADS}


def recorded_fresh_heads(config: BertConfig, where) -> tuple:
    """The `fresh_heads` a bert_config.json records (none in files from before kbert recorded
    them: those heads count as trained, as they were taken to be)."""
    fresh = config.extras.get("fresh_heads", [])
    if not isinstance(fresh, list) or not all(isinstance(h, str) for h in fresh) or set(fresh) - set(HEADS):
        raise KbertError(
            f"{where}: fresh_heads must be a list of heads among {', '.join(HEADS)}, got {fresh!r}; "
            f"fix bert_config.json or convert the model again"[:400]
        )
    return tuple(h for h in HEADS if h in fresh)


def _describe(model, config: BertConfig, do_lower_case: bool, task_info: dict):
    """Record in the config what rebuilds `model`: its class, head size, casing, task metadata and
    which heads a converter created (`fresh_heads`, left out when every head was read or trained)."""
    for key in TASK_KEYS + ("num_classes", "fresh_heads"):  # a head's metadata must not outlive the head
        config.extras.pop(key, None)
    if model_kind(model) in HEAD_KINDS:  # a task head's encoder no longer makes the sentence vectors
        config.extras.pop(EMBEDDING_KEY, None)
    config.extras.update(kbert_model=model_kind(model), do_lower_case=bool(do_lower_case))
    fresh = fresh_heads_of(model)
    if fresh:
        config.extras["fresh_heads"] = list(fresh)
    if hasattr(model, "num_classes"):
        config.extras["num_classes"] = model.num_classes
    # So that predict/evaluate/export need no flags: task, labels, max_seq_length (head_record).
    config.extras.update(task_info)


@writes("model_dir")
def save(
    model,
    model_dir,
    vocab_file: str | None = None,
    do_lower_case: bool | None = None,
    overwrite: bool = False,
    *,
    task: str | None = None,
    labels=None,
    max_seq_length: int | None = None,
    text_pairs: bool | None = None,
):
    """Write `model` as a kbert model directory, atomically.

    A model with a task head (`bert_classifier`, `bert_tagger`, `bert_span_predictor`,
    `bert_multiple_choice`) is saved with the task metadata `kbert predict`, `kbert evaluate`
    and `kbert export` read (see `kbert.finetuning.tasks.head_task_info` for the defaults):
    pass `labels` to name a classifier's or tagger's outputs, as `kbert finetune` does.

    Args:
        model: a kbert model (`bert_encoder`, `bert_pretrainer`, or one with a task head).
        model_dir: str. The directory to write; must not exist or be empty unless `overwrite`.
        vocab_file: str. The vocab.txt to copy in; defaults to `model.vocab_file`, which
            `kbert.load` and the converters set.
        do_lower_case: bool. Recorded so tokenizers built from the directory lower-case or
            not; defaults to `model.do_lower_case`, else True.
        overwrite: bool. Replace a non-empty `model_dir`.
        task: str. Heads only: classify | regress (classifier), tag, squad, choice.
        labels: list of str. classify and tag: the name of each output, in order (default
            "0".."N-1", the class ids a head trained on integer labels predicts).
        max_seq_length: int. Heads only: the tokens per example it was trained with (default
            128, 384 for squad): what predict and export pack texts to.
        text_pairs: bool. classify and regress: whether it was trained on sentence pairs (an
            export's signature then takes `text_b`).

    Example:
    >>> kbert.save(kbert.converters.load_tf1_checkpoint("tests/fixtures/tf1-tiny"), "out/tiny")  # doctest: +SKIP
    >>> classifier = kbert.bert_classifier(kbert.load("out/tiny"), num_classes=2)  # doctest: +SKIP
    >>> kbert.save(classifier, "out/clf", task="classify", labels=["neg", "pos"])  # doctest: +SKIP
    """
    if getattr(model, "family", None) == modernbert_directory.FAMILY:
        record = head_record(model, task, labels, max_seq_length, text_pairs)
        return modernbert_directory.save(model, model_dir, overwrite, record)
    vocab_file = vocab_file or getattr(model, "vocab_file", None)
    if not vocab_file:
        raise KbertError("kbert.save needs the vocabulary: pass vocab_file=PATH/vocab.txt")
    if do_lower_case is None:
        do_lower_case = getattr(model, "do_lower_case", True)
    task_info = head_record(model, task, labels, max_seq_length, text_pairs)
    config = BertConfig.from_dict(model.config.to_dict())
    check_vocab(vocab_file, config)
    _describe(model, config, do_lower_case, task_info)
    with atomic_output_dir(model_dir, overwrite=overwrite) as tmp:
        config.to_json_file(os.path.join(tmp, CONFIG_FILE))
        shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB_FILE))
        save_weights(model, os.path.join(tmp, WEIGHTS_FILE))
    return model_dir


def is_model_dir(path) -> bool:
    return os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def is_keras_file(path) -> bool:
    """A `.keras` file: what `model.save("NAME.keras")` writes (a zip of config, weights and assets)."""
    return os.fspath(path).endswith(KERAS_SUFFIX) and os.path.isfile(path)


def load_keras_file(path):
    """The kbert model a `.keras` file holds, whole: its head, task, vocabulary and casing."""
    import keras

    try:
        model = keras.saving.load_model(os.fspath(path))
    except Exception as e:  # keras raises ValueError, zipfile and h5py errors, ...
        raise KbertError(
            f"{path}: Keras cannot load it ({first_line(e)}); pass a .keras file saved from a "
            f"kbert model (model.save), or a kbert model directory"
        ) from None
    model_kind(model)  # a kbert model, or a one-line error
    check_embedding(model.config, path)
    if model.vocabulary is None:
        raise KbertError(
            f"{path}: the model declares no vocabulary, so its text cannot be tokenized; build it on a "
            f"loaded model (kbert.bert_classifier(kbert.load(DIR), ...)) or pass vocabulary="
        )
    if model_kind(model) in HEAD_KINDS:  # what it declares, checked, with its head's defaults filled in
        try:
            model.task_info = head_record(model)
        except KbertError as e:
            raise KbertError(f"{path}: {e}") from None
    return model


@dataclasses.dataclass(frozen=True)
class UnfinishedRun:
    """How a trainer's unfinished run is told apart from a model: the folder a training command
    leaves before it writes model.weights.h5. Each trainer defines one beside its run format
    (`kbert.pretraining.run_record`, `kbert.finetuning.run_state`) and registers it here.

    `recognise(path)` returns what the run recorded (a checkpoint, a state), or None when `path`
    is not such a run; `message(path, recorded)` is the one line that says how to finish it."""

    command: str
    recognise: Callable
    message: Callable


# Each trainer's UnfinishedRun, registered when its run format's module is imported
# (kbert.pretraining.run_record, kbert.finetuning.run_state): the format knows no trainer.
UNFINISHED_RUNS: list[UnfinishedRun] = []


def register_unfinished_run(run: UnfinishedRun) -> UnfinishedRun:
    """Add a trainer's way of telling its unfinished runs apart to `UNFINISHED_RUNS`."""
    UNFINISHED_RUNS.append(run)
    return run


# How a model's task record is checked and completed: its task's answer
# (`kbert.finetuning.tasks.head_task_info`), registered when the fine-tuning tasks are imported,
# as whatever trains, predicts with or serves a task model does, and `kbert.save` and `kbert.load`.
HEAD_DESCRIBERS: list[Callable] = []


def register_head_describer(describe: Callable) -> Callable:
    """Set how `head_record` checks and completes a model's task record:
    `describe(model, task, labels, max_seq_length, text_pairs) -> dict`."""
    HEAD_DESCRIBERS[:] = [describe]
    return describe


def head_record(model, task=None, labels=None, max_seq_length=None, text_pairs=None) -> dict:
    """The task record bert_config.json keeps for `model`: the arguments given over what
    `model.task_info` declares, checked and completed by its task (`register_head_describer`).
    Where no task was ever imported (pretraining, fill-mask), a task model keeps what it declares
    and any other has none."""
    if HEAD_DESCRIBERS:
        return HEAD_DESCRIBERS[0](model, task, labels, max_seq_length, text_pairs)
    if model_kind(model) not in HEAD_KINDS:
        return {}
    given = {"task": task, "labels": labels, "max_seq_length": max_seq_length, "text_pairs": text_pairs}
    declared = getattr(model, "task_info", None) or {}
    merged = {**declared, **{k: v for k, v in given.items() if v is not None}}
    return {k: merged[k] for k in TASK_KEYS if k in merged}


def load(model_dir):
    """The model saved in a kbert model directory, with its weights, its `vocabulary` (vocab.txt
    and casing) and, for a task model, its `task_info`.

    Example:
    >>> model = kbert.load("out/tiny")  # doctest: +SKIP
    """
    model_dir = os.fspath(model_dir)
    if is_keras_file(model_dir):
        return load_keras_file(model_dir)
    if modernbert_directory.is_modernbert_dir(model_dir):
        model = modernbert_directory.load(model_dir)
        if model_kind(model) in HEAD_KINDS and "task" not in model.task_info:
            # A head converted without its task: its kind's (classify, regress, tag), as BERT's.
            with contextlib.suppress(KbertError):
                model.task_info = head_record(model)
        return model
    config = load_config(model_dir)
    weights = os.path.join(model_dir, WEIGHTS_FILE)
    require_path(weights, "weights file", "the model directory is incomplete; convert or train it again")
    kind = config.extras.get("kbert_model", "pretrainer")
    builders = model_classes()
    if kind not in builders:
        raise KbertError(
            f"{model_dir}: unknown kbert_model {kind!r} in bert_config.json; expected one of {', '.join(builders)}"
        )
    head = {"num_classes": int(config.extras.get("num_classes", 2))} if kind in ("classifier", "tagger") else {}
    if kind in HEAD_KINDS:
        head["task_info"] = {k: config.extras[k] for k in TASK_KEYS if k in config.extras}
    vocabulary = bert.Vocabulary(os.path.join(model_dir, VOCAB_FILE), bool(config.extras.get("do_lower_case", True)))
    fresh_heads = recorded_fresh_heads(config, os.path.join(model_dir, CONFIG_FILE))
    check_embedding(config, os.path.join(model_dir, CONFIG_FILE))
    # Unfilled weights, every one assigned by load_weights next (it fails on any it lacks).
    with unfilled():
        model = builders[kind](config, **head, vocabulary=vocabulary)
    model.fresh_heads = tuple(h for h in heads_of(kind) if h in fresh_heads)
    load_weights(model, weights, CONFIG_FILE)
    if kind in HEAD_KINDS and "task" not in model.task_info:
        # A head saved without its task (before kbert.save recorded one): its kind's, as saved now.
        with contextlib.suppress(KbertError):
            model.task_info = head_record(model)
    return model


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


def write_model_files(model, model_dir, vocab_file: str, do_lower_case: bool, weights: bool = True):
    """Write (or replace) the model-directory files inside an existing directory, each one
    atomically: used by training, whose directory also holds checkpoints and logs."""
    config = BertConfig.from_dict(model.config.to_dict())
    _describe(model, config, do_lower_case, head_record(model))
    os.makedirs(model_dir, exist_ok=True)
    replace_file(os.path.join(model_dir, CONFIG_FILE), config.to_json_file)
    if os.path.abspath(vocab_file) != os.path.abspath(os.path.join(model_dir, VOCAB_FILE)):
        replace_file(os.path.join(model_dir, VOCAB_FILE), lambda tmp: shutil.copyfile(vocab_file, tmp))
    if weights:
        # Keras insists on the .weights.h5 suffix, so the temporary name keeps it.
        replace_file(
            os.path.join(model_dir, WEIGHTS_FILE),
            lambda tmp: save_weights(model, tmp),
            tmp_name=os.path.join(model_dir, ".tmp-" + WEIGHTS_FILE),
        )
