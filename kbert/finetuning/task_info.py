"""Task metadata: what a fine-tuned head records in its model directory (task, labels,
max_seq_length, text_pairs, long_text, doc_stride, max_query_length), checked against its head.

`kbert finetune` sets it, `kbert.save` records it in bert_config.json, and `kbert predict`,
`evaluate` and `export` read it, so none of them needs the task's flags again.
"""

from __future__ import annotations

import numbers

from kbert.finetuning.tasks import TASKS, get_task, head_task, head_tasks
from kbert.model.kinds import model_kind
from kbert.runtime.errors import KbertError

# What fine-tuning records in bert_config.json besides the original keys. long_text (classify,
# regress, tag): "truncate" (also when absent) or "windows", documents read whole in windows of
# max_seq_length tokens starting doc_stride tokens apart; doc_stride is also squad's.
TASK_KEYS = ("task", "labels", "max_seq_length", "text_pairs", "long_text", "doc_stride", "max_query_length")
# The tasks each head serves (the first is the default of a head saved without one).
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
    kbert.runtime.errors.KbertError: task 'tag' does not fit a classifier (bert_classifier); its tasks are classify, regress
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
