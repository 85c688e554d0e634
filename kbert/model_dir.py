"""kbert model directories: `bert_config.json` + `vocab.txt` + `model.weights.h5`.

`save` writes one, `load` reads one (or a `.keras` file), and `lower_case_for` is the one rule
for a source's casing. Every other kind of model source is opened by `kbert.sources.open_model`.

`bert_config.json` keeps the original keys, plus kbert's own: `kbert_model` (which model
class the weights belong to) and `do_lower_case`. `kbert.load` rebuilds the model from the
config and loads the weights, so the directory stays readable by anything that reads
google-research/bert's config.
"""

from __future__ import annotations

import contextlib
import json
import logging
import numbers
import os
import shlex
import shutil

import tensorflow as tf

from kbert.config import BertConfig
from kbert.errors import KbertError, first_line, os_error_or
from kbert.files import PARTIAL_SUFFIX, atomic_output_dir, count_lines, require_path, save_weights
from kbert.finetuning.options import FinetuneOptions
from kbert.model import bert
from kbert.model.initializers import unfilled
from kbert.model.pooling import POOLING_MODES
from kbert.outputs import writes

log = logging.getLogger("kbert")

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
WEIGHTS_FILE = "model.weights.h5"
# Where `kbert pretrain` keeps its checkpoints inside --model-dir, and `kbert finetune` inside OUTPUT.partial/.
CHECKPOINTS_DIR = "checkpoints"
# What fine-tuning records in bert_config.json besides the original keys. long_text (classify,
# regress, tag): "truncate" (also when absent) or "windows", documents read whole in windows of
# max_seq_length tokens starting doc_stride tokens apart; doc_stride is also squad's.
TASK_KEYS = ("task", "labels", "max_seq_length", "text_pairs", "long_text", "doc_stride", "max_query_length")
# The tasks each head serves (the first is the default of a head saved without one).
HEAD_TASKS = {
    "classifier": ("classify", "regress"),
    "tagger": ("tag",),
    "span_predictor": ("squad",),
    "multiple_choice": ("choice",),
}
# The parts of a model a converter may create rather than read, in report order: a format
# without them (a TF Hub or keras-hub encoder, an HF BertForMaskedLM) gets random ones. A model
# records those in `fresh_heads` (bert_config.json, `model.fresh_heads`) until training trains them.
HEADS = ("masked_lm", "next_sentence", "pooler")
# An unfinished `kbert finetune` run (OUTPUT.partial/) holds this file (kbert.finetuning.train).
FINETUNE_STATE_FILE = "state.json"
# A Keras archive (`model.save`), which `kbert.load` and every command taking a model also read.
KERAS_SUFFIX = ".keras"
# A sentence-embedding model's record in bert_config.json (and a .keras file's config): how its
# token vectors become one vector per text, e.g. {"pooling": "mean", "normalize": true,
# "max_seq_length": 256}, as a sentence-transformers model's modules say (converters/hf.py).
EMBEDDING_KEY = "embedding"


def check_embedding(config: BertConfig, where) -> dict | None:
    """The embedding record `config` holds (`EMBEDDING_KEY`), checked; None when it has none.

    >>> config = BertConfig(vocab_size=10, extras={"embedding": {"pooling": "mean", "normalize": True}})
    >>> check_embedding(config, "bert_config.json")
    {'pooling': 'mean', 'normalize': True}
    >>> check_embedding(BertConfig(vocab_size=10, extras={"embedding": {"pooling": "sum"}}), "bert_config.json")
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: bert_config.json: embedding pooling 'sum' is not one of cls, mean, max, mean_sqrt_len; fix bert_config.json or convert the model again
    """
    record = config.extras.get(EMBEDDING_KEY)
    if record is None:
        return None
    fix = "fix bert_config.json or convert the model again"
    if not isinstance(record, dict) or set(record) - {"pooling", "normalize", "max_seq_length"}:
        raise KbertError(
            f"{where}: embedding must be an object of pooling, normalize and max_seq_length, got {record!r}; {fix}"[
                :400
            ]
        )
    if record.get("pooling") not in POOLING_MODES:
        raise KbertError(
            f"{where}: embedding pooling {record.get('pooling')!r} is not one of {', '.join(POOLING_MODES)}; {fix}"
        )
    if not isinstance(record.get("normalize", False), bool):
        raise KbertError(f"{where}: embedding normalize must be true or false, got {record['normalize']!r}; {fix}")
    length = record.get("max_seq_length")
    limit = config.max_position_embeddings
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or not 3 <= length <= limit):
        raise KbertError(
            f"{where}: embedding max_seq_length {length!r} must be a whole number from 3 to {limit} "
            f"(max_position_embeddings); {fix}"
        )
    return dict(record)


def check_vocab(vocab_file: str, config: BertConfig):
    """A vocab.txt must have exactly `vocab_size` lines, or ids would point at the wrong rows."""
    require_path(vocab_file, "vocab file", "pass the vocab.txt that came with the checkpoint")
    n = count_lines(vocab_file)
    if n != config.vocab_size:
        raise KbertError(
            f"{vocab_file} has {n} entries but bert_config.json says vocab_size "
            f"{config.vocab_size}; use the vocab.txt this model was trained with"
        )


def _model_classes():
    return {
        "pretrainer": bert.BertPretrainer,
        "encoder": bert.BertEncoder,
        "classifier": bert.BertClassifier,
        "tagger": bert.BertTagger,
        "span_predictor": bert.BertSpanPredictor,
        "multiple_choice": bert.BertMultipleChoice,
    }


def model_kind(model) -> str:
    for kind, cls in _model_classes().items():
        if type(model) is cls:
            return kind
    raise KbertError(
        f"cannot save a {type(model).__name__}: kbert model directories hold kbert models "
        f"(bert_encoder, bert_pretrainer, bert_classifier, bert_tagger, bert_span_predictor, "
        f"bert_multiple_choice)"
    )


def head_task_info(
    model, task: str | None = None, labels=None, max_seq_length: int | None = None, text_pairs: bool | None = None
) -> dict:
    """The task metadata `kbert predict`, `evaluate` and `export` read from a model directory
    (task, labels, max_seq_length, text_pairs), checked against the model's head: the arguments
    given, over what `model.task_info` holds (what `kbert finetune` and `kbert.load` set), over
    what the head implies. {} for an encoder or pretrainer, which have no task.

    A head saved without a task gets its kind's: classify (regress for one output), tag,
    squad, choice; labels default to the class ids "0".."N-1", which is what a head trained by
    `model.fit` on integer labels predicts; max_seq_length to the task's default (128, 384
    for squad), capped at max_position_embeddings.

    Example:
    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> head_task_info(kbert.bert_classifier(config, 2), labels=["neg", "pos"])
    {'task': 'classify', 'labels': ['neg', 'pos'], 'max_seq_length': 128}
    >>> head_task_info(kbert.bert_classifier(config, 2), task="tag")
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: task 'tag' does not fit a classifier (bert_classifier); its tasks are classify, regress
    """
    kind = model_kind(model)
    given = {
        k: v
        for k, v in (("task", task), ("labels", labels), ("max_seq_length", max_seq_length), ("text_pairs", text_pairs))
        if v is not None
    }
    if kind not in HEAD_TASKS:
        if given:
            raise KbertError(
                f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} a task head; a {kind} has "
                f"none: save it without, or put a head on it first (kbert.bert_classifier, ...)"
            )
        return {}
    info = {k: v for k, v in (getattr(model, "task_info", None) or {}).items() if k in TASK_KEYS}
    if task is not None and task != info.get("task"):
        info = {}  # another task: nothing recorded for the old one applies
    info.update(given)
    num_classes = int(model.num_classes)
    task = info.setdefault("task", "regress" if kind == "classifier" and num_classes == 1 else HEAD_TASKS[kind][0])
    if task not in HEAD_TASKS[kind]:
        known = [t for tasks in HEAD_TASKS.values() for t in tasks]
        if task not in known:
            raise KbertError(f"unknown task {task!r}; use one of {', '.join(known)}")
        raise KbertError(
            f"task {task!r} does not fit a {kind} (bert_{kind}); its tasks are {', '.join(HEAD_TASKS[kind])}"
        )
    if task in ("classify", "tag"):
        if task == "classify" and num_classes < 2:
            raise KbertError(
                f'a classifier with {num_classes} output is a regressor: save it with task="regress", '
                f"or build it with num_classes=2 or more"
            )
        names = info.get("labels")
        names = [str(i) for i in range(num_classes)] if names is None else names
        if isinstance(names, (str, bytes)) or not all(
            isinstance(n, (str, int)) and not isinstance(n, bool) for n in names
        ):
            raise KbertError(
                f"labels must be a list of label names (str), one per output, e.g. "
                f"{[str(i) for i in range(num_classes)]}; got {names!r}"[:300]
            )
        names = [str(n) for n in names]
        if len(names) != num_classes or len(set(names)) != len(names):
            raise KbertError(
                f"labels {names[:8]}{'...' if len(names) > 8 else ''}: the {kind} has {num_classes} "
                f"outputs, so give {num_classes} different label names, in output order"
            )
        info["labels"] = names
    elif info.get("labels") is not None:
        raise KbertError(f"labels apply to classify and tag; a {task} model has none: save it without labels")
    else:
        info.pop("labels", None)
    if task == "regress" and num_classes != 1:
        raise KbertError(f"task regress needs a classifier with one output (num_classes=1); this one has {num_classes}")
    limit = model.config.max_position_embeddings
    length = info.get("max_seq_length")
    if length is None:
        info["max_seq_length"] = min(384 if task == "squad" else 128, limit)
    elif isinstance(length, bool) or not isinstance(length, numbers.Integral) or not 3 <= length <= limit:
        raise KbertError(
            f"max_seq_length {length!r}: give the tokens per example the model was trained with, "
            f"3 to {limit} (max_position_embeddings)"
        )
    else:
        info["max_seq_length"] = int(length)
    if "text_pairs" in info:
        if task not in ("classify", "regress"):
            raise KbertError(f"text_pairs applies to classify and regress; a {task} model has none")
        if not isinstance(info["text_pairs"], bool):
            raise KbertError(
                f"text_pairs must be True (trained on sentence pairs) or False, got {info['text_pairs']!r}"
            )
    _check_long_text(info, task)
    return {k: info[k] for k in TASK_KEYS if k in info}


def _check_long_text(info: dict, task: str):
    """long_text and its doc_stride, as kbert.finetuning.options.window_stride takes them."""
    if "long_text" not in info:
        return
    if task not in ("classify", "regress", "tag"):
        raise KbertError(f"long_text applies to classify, regress and tag; a {task} model has none")
    if info["long_text"] not in ("truncate", "windows"):
        raise KbertError(f"long_text {info['long_text']!r}: give 'truncate' or 'windows'")
    if info["long_text"] == "windows":
        stride, room = info.get("doc_stride"), info["max_seq_length"] - 2
        if isinstance(stride, bool) or not isinstance(stride, numbers.Integral) or not 1 <= stride < room:
            raise KbertError(
                f"doc_stride {stride!r}: a model that reads long texts in windows needs the stride between "
                f"them, 1 to {room - 1} (less than max_seq_length - 2)"
            )
        if info.get("text_pairs"):
            raise KbertError("text_pairs: a model that reads long texts in windows reads single texts")


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
    if model_kind(model) in HEAD_TASKS:  # a task head's encoder no longer makes the sentence vectors
        config.extras.pop(EMBEDDING_KEY, None)
    config.extras.update(kbert_model=model_kind(model), do_lower_case=bool(do_lower_case))
    fresh = fresh_heads_of(model)
    if fresh:
        config.extras["fresh_heads"] = list(fresh)
    if hasattr(model, "num_classes"):
        config.extras["num_classes"] = model.num_classes
    # So that predict/evaluate/export need no flags: task, labels, max_seq_length (head_task_info).
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
    and `kbert export` read (see `head_task_info` for the defaults): pass `labels` to name a
    classifier's or tagger's outputs, as `kbert finetune` does.

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
    vocab_file = vocab_file or getattr(model, "vocab_file", None)
    if not vocab_file:
        raise KbertError("kbert.save needs the vocabulary: pass vocab_file=PATH/vocab.txt")
    if do_lower_case is None:
        do_lower_case = getattr(model, "do_lower_case", True)
    task_info = head_task_info(model, task, labels, max_seq_length, text_pairs)
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
    if model_kind(model) in HEAD_TASKS:  # what it declares, checked, with its head's defaults filled in
        try:
            model.task_info = head_task_info(model)
        except KbertError as e:
            raise KbertError(f"{path}: {e}") from None
    return model


def interrupted_finetuning(path) -> dict | None:
    """The state.json of an unfinished `kbert finetune` run (its OUTPUT.partial/ directory:
    checkpoints/, state.json, no model), else None."""
    path = os.fspath(path)
    state_file = os.path.join(path, FINETUNE_STATE_FILE)
    if not os.path.isdir(path) or is_model_dir(path) or not os.path.isfile(state_file):
        return None
    try:
        with open(state_file) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("fingerprint"), dict) else None


def interrupted_finetuning_message(path, state: dict) -> str:
    """'D: an unfinished kbert finetune run (step N of M), not a model; ...': the command that
    finishes it (the flags its state.json recorded, since --resume must repeat them).

    >>> state = {"step": 40, "fingerprint": {"model_dir": "/m/base", "task": "classify", "train": "/d/train.tsv",
    ...          "dev": None, "epochs": 5, "batch_size": 16, "learning_rate": 5e-05, "seed": 12345,
    ...          "max_seq_length": 128, "train_examples": 256}}
    >>> print(interrupted_finetuning_message("ft/x.partial", state))
    ft/x.partial: an unfinished kbert finetune run (stopped at step 40 of 80), not a model; finish it with `kbert finetune /m/base --task classify --train /d/train.tsv --output ft/x --epochs 5 --batch-size 16 --resume`, then use ft/x
    """
    path = os.fspath(path).rstrip(os.sep)
    output = path[: -len(PARTIAL_SUFFIX)] if path.endswith(PARTIAL_SUFFIX) else "OUTPUT"
    run = state.get("fingerprint", {})
    quote = shlex.quote  # a command to paste into a shell
    flags = [
        f"kbert finetune {quote(run.get('model_dir', 'MODEL_DIR'))} --task {run.get('task', 'TASK')} "
        f"--train {quote(run.get('train', 'TRAIN'))}"
    ]
    if run.get("dev"):
        flags.append(f"--dev {quote(run['dev'])}")
    flags.append(f"--output {quote(output)}")
    # Flags away from their defaults: --resume refuses a run started with other values.
    defaults = FinetuneOptions()
    flags += [
        f"--{k.replace('_', '-')} {run[k]}"
        for k in ("epochs", "batch_size", "learning_rate", "seed")
        if k in run and run[k] != getattr(defaults, k)
    ]
    default_length = 384 if run.get("task") == "squad" else 128
    if run.get("max_seq_length") not in (None, default_length):
        flags.append(f"--max-seq-length {run['max_seq_length']}")
    batches = max(1, int(run.get("train_examples", 0)) // max(1, int(run.get("batch_size", 1))))
    total = f" of {batches * int(run['epochs'])}" if "epochs" in run and "train_examples" in run else ""
    return (
        f"{path}: an unfinished kbert finetune run (stopped at step {state.get('step', '?')}{total}), not a "
        f"model; finish it with `{' '.join(flags)} --resume`, then use {output}"
    )


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
    state = interrupted_finetuning(path)
    if state:
        raise KbertError(interrupted_finetuning_message(path, state))


# Where `kbert pretrain` records a run's flags, for a bare `--resume` (kbert.pretraining.train).
PRETRAIN_RUN_FILE = "pretrain_run.json"


def interrupted_pretraining_message(path, prefix: str) -> str:
    """'D: pretraining stopped at step N (checkpoints/ckpt-N) before writing the model; ...'

    >>> print(interrupted_pretraining_message("out/bert", "out/bert/checkpoints/ckpt-100"))
    out/bert: pretraining stopped at step 100 (checkpoints/ckpt-100) before writing the model; continue it with `kbert pretrain --model-dir out/bert --resume`
    """
    path = os.fspath(path)
    step = prefix.rsplit("-", 1)[-1]  # CheckpointManager numbers them by step: ckpt-<step>
    said = (
        f"{path}: pretraining stopped at step {step} ({os.path.relpath(prefix, path)}) before writing "
        f"the model; continue it with `kbert pretrain --model-dir {shlex.quote(path)} --resume"
    )
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, PRETRAIN_RUN_FILE)):
        # A run from before kbert recorded its flags: they must be given again.
        return said + " --data DATA` and the other flags it was started with"
    return said + "`"


def load_config(model_dir) -> BertConfig:
    require_path(model_dir, "model directory", "pass a directory written by kbert (convert, pretrain, finetune)")
    return BertConfig.from_json_file(os.path.join(model_dir, CONFIG_FILE))


def load(model_dir):
    """The model saved in a kbert model directory, with its weights, its `vocabulary` (vocab.txt
    and casing) and, for a task model, its `task_info`.

    Example:
    >>> model = kbert.load("out/tiny")  # doctest: +SKIP
    """
    model_dir = os.fspath(model_dir)
    if is_keras_file(model_dir):
        return load_keras_file(model_dir)
    check_not_interrupted(model_dir)
    config = load_config(model_dir)
    weights = os.path.join(model_dir, WEIGHTS_FILE)
    require_path(weights, "weights file", "the model directory is incomplete; convert or train it again")
    kind = config.extras.get("kbert_model", "pretrainer")
    builders = _model_classes()
    if kind not in builders:
        raise KbertError(
            f"{model_dir}: unknown kbert_model {kind!r} in bert_config.json; expected one of {', '.join(builders)}"
        )
    head = {"num_classes": int(config.extras.get("num_classes", 2))} if kind in ("classifier", "tagger") else {}
    if kind in HEAD_TASKS:
        head["task_info"] = {k: config.extras[k] for k in TASK_KEYS if k in config.extras}
    vocabulary = bert.Vocabulary(os.path.join(model_dir, VOCAB_FILE), bool(config.extras.get("do_lower_case", True)))
    fresh_heads = recorded_fresh_heads(config, os.path.join(model_dir, CONFIG_FILE))
    check_embedding(config, os.path.join(model_dir, CONFIG_FILE))
    # Unfilled weights, every one assigned by load_weights next (it fails on any it lacks).
    with unfilled():
        model = builders[kind](config, **head, vocabulary=vocabulary)
    model.fresh_heads = tuple(h for h in heads_of(kind) if h in fresh_heads)
    try:
        model.load_weights(weights)
    except (ValueError, OSError) as e:
        raise os_error_or(
            e, f"{weights}: cannot load ({first_line(e)}); the file is damaged or does not match bert_config.json"
        ) from None
    if kind in HEAD_TASKS and "task" not in model.task_info:
        # A head saved without its task (before kbert.save recorded one): its kind's, as saved now.
        with contextlib.suppress(KbertError):
            model.task_info = head_task_info(model)
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
    _describe(model, config, do_lower_case, head_task_info(model))
    os.makedirs(model_dir, exist_ok=True)

    def replace(name, write, tmp_name=None):
        tmp = os.path.join(model_dir, tmp_name or f".{name}.tmp")
        try:
            write(tmp)
            os.replace(tmp, os.path.join(model_dir, name))
        except BaseException:  # a full disk: no half-written file beside the good one
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    replace(CONFIG_FILE, config.to_json_file)
    if os.path.abspath(vocab_file) != os.path.abspath(os.path.join(model_dir, VOCAB_FILE)):
        replace(VOCAB_FILE, lambda tmp: shutil.copyfile(vocab_file, tmp))
    if weights:
        # Keras insists on the .weights.h5 suffix, so the temporary name keeps it.
        replace(WEIGHTS_FILE, lambda tmp: save_weights(model, tmp), tmp_name=".tmp-" + WEIGHTS_FILE)
