"""The fine-tuning tasks, one file each: everything `finetune`, `predict`, `evaluate`, `kbert.save`
and `export` need to know about a task, in that task's file.

A task (`base.Task`) reads a data file into model inputs, builds the head to put on the
encoder, names its losses and the dev metric that picks the best epoch, scores and prints its
predictions, says what its model records and checks, and what its export serves. Adding a task
means one new file with its `Task` and an entry in `TASKS`, plus its tests.

The tasks:
- classify: run_classifier.py's model (dropout + [classes, H] on the pooled output);
- regress: the same with one output and squared error (STS-B);
- tag: one label per word on its first WordPiece (NER, POS);
- squad: run_squad.py's start/end span head, SQuAD v1.1 and v2.0;
- choice: multiple choice as the BERT paper ran SWAG (one score per [CLS], softmax over N endings);
- embed: sentence embeddings on (query, document) pairs, with in-batch negatives
  (kbert.finetuning.ranking); the output is an embedding model, scored by ranking;
- rerank: a cross-encoder, one score per (query, document) pair (kbert.finetuning.reranking),
  scored by how it reorders each query's candidates.

classify, regress and tag also read documents longer than the window (`--long-text windows`):
the model runs on overlapping windows (`TaskData.windows` says whose each is), trains on each
window with its document's label (its words' tags), and `score` and `rows` answer once per
document.

Example:
>>> TASKS["choice"].metric, TASKS["squad"].max_seq_length
('accuracy', 384)
>>> best_metric("classify", {"accuracy": 0.75, "macro_f1": 0.73, "mcc": 0.58})
('accuracy', 0.75)
"""

from __future__ import annotations

import numbers

from kbert.finetuning.tasks.base import Task, finetune_option
from kbert.finetuning.tasks.choice import CHOICE
from kbert.finetuning.tasks.classify import CLASSIFY
from kbert.finetuning.tasks.embed import EMBED
from kbert.finetuning.tasks.regress import REGRESS
from kbert.finetuning.tasks.rerank import RERANK
from kbert.finetuning.tasks.squad import SQUAD
from kbert.finetuning.tasks.tag import TAG
from kbert.formats.model_dir import register_head_describer
from kbert.model.kinds import TASK_KEYS, model_kind
from kbert.runtime.errors import KbertError

TASKS = {task.name: task for task in (CLASSIFY, REGRESS, TAG, SQUAD, CHOICE, EMBED, RERANK)}


def get_task(name: str) -> Task:
    """The task called `name`, or a one-line error listing them.

    >>> get_task("tag").name
    'tag'
    """
    if name not in TASKS:
        raise KbertError(f"unknown {finetune_option('task', name)}; use one of {', '.join(TASKS)}")
    return TASKS[name]


def best_metric(task: str, scores: dict) -> tuple[str, float]:
    """The name and value of the score that picks the best epoch; higher is better.

    Args:
        task: str. A name in `TASKS`.
        scores: dict. What the task's `score` returned.

    Raises:
        KbertError: an unknown task, or `scores` lacks that task's metric.
    """
    name = get_task(task).metric
    if name not in scores:
        raise KbertError(
            f"the {task} metrics have no {name!r} to pick the best epoch by; "
            f"they have {', '.join(sorted(scores)) or 'nothing'}"
        )
    return name, float(scores[name])


def head_tasks() -> dict:
    """{model kind: the names of the tasks its head serves}, the first being the default of a
    head saved without one.

    >>> head_tasks()["classifier"]
    ('classify', 'regress', 'rerank')
    """
    kinds = {}
    for task in TASKS.values():
        if task.head is not None:
            kinds[task.head] = (*kinds.get(task.head, ()), task.name)
    return kinds


def head_task(kind: str, num_classes: int) -> Task:
    """The task of a head of `kind` with `num_classes` outputs saved without one: the first of
    its kind's whose outputs it has (a classifier of one output: regress).

    >>> head_task("classifier", 1).name, head_task("classifier", 3).name
    ('regress', 'classify')
    """
    tasks = [TASKS[name] for name in head_tasks()[kind]]
    return next((task for task in tasks if task.head_outputs == num_classes), tasks[0])


# === What a task model records (its task_info, in bert_config.json) ===

# The tasks each head serves (the first is the default of a head saved without one); its kinds
# are kbert.model.kinds.HEAD_KINDS.
HEAD_TASKS = head_tasks()


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
    kbert.runtime.errors.KbertError: task 'tag' does not fit a classifier (bert_classifier); its tasks are classify, regress, rerank
    """
    kind = model_kind(model)
    given = {
        k: v
        for k, v in (("task", task), ("labels", labels), ("max_seq_length", max_seq_length), ("text_pairs", text_pairs))
        if v is not None
    }
    if kind not in HEAD_TASKS:
        record = _encoder_record(model, given) if kind == "encoder" else None
        if record is not None:
            return record
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
    name = info.setdefault("task", head_task(kind, num_classes).name)
    if name not in HEAD_TASKS[kind]:
        known = [t for tasks in HEAD_TASKS.values() for t in tasks]
        if name not in known:
            raise KbertError(f"unknown task {name!r}; use one of {', '.join(known)}")
        raise KbertError(
            f"task {name!r} does not fit a {kind} (bert_{kind}); its tasks are {', '.join(HEAD_TASKS[kind])}"
        )
    task = get_task(name)
    task.check_head(info, num_classes, kind)
    limit = model.config.max_position_embeddings
    length = info.get("max_seq_length")
    if length is None:
        info["max_seq_length"] = min(task.max_seq_length, limit)
    elif isinstance(length, bool) or not isinstance(length, numbers.Integral) or not 3 <= length <= limit:
        raise KbertError(
            f"max_seq_length {length!r}: give the tokens per example the model was trained with, "
            f"3 to {limit} (max_position_embeddings)"
        )
    else:
        info["max_seq_length"] = int(length)
    if "text_pairs" in info:
        if not task.text_pairs:
            raise KbertError(f"text_pairs applies to classify and regress; a {task.name} model has none")
        if not isinstance(info["text_pairs"], bool):
            raise KbertError(
                f"text_pairs must be True (trained on sentence pairs) or False, got {info['text_pairs']!r}"
            )
    _check_long_text(info, task)
    return {k: info[k] for k in TASK_KEYS if k in info}


def _encoder_record(model, given: dict) -> dict | None:
    """The task metadata of an encoder that is a task's model (embed's), or None."""
    for task in TASKS.values():
        record = task.encoder_record(model, given)
        if record is not None:
            return record
    return None


def _check_long_text(info: dict, task):
    """long_text and its doc_stride, as kbert.finetuning.options.window_stride takes them."""
    if "long_text" not in info:
        return
    if not task.windows:
        raise KbertError(f"long_text applies to classify, regress and tag; a {task.name} model has none")
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


# The directory format asks this, through its hook, when it saves or loads a model: it knows no
# task. Registered here, where the tasks are listed, so that whatever imports a task has it.
register_head_describer(head_task_info)
