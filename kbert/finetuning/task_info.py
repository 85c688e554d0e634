"""Task metadata: what a fine-tuned head records in its model directory (task, labels,
max_seq_length, text_pairs, long_text, doc_stride, max_query_length), checked against its head.

`kbert finetune` sets it, `kbert.save` records it in bert_config.json, and `kbert predict`,
`evaluate` and `export` read it, so none of them needs the task's flags again.
"""

from __future__ import annotations

import numbers

from kbert.errors import KbertError
from kbert.model.kinds import model_kind

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
        if kind == "encoder" and _embed_task(model, given):
            return {"task": "embed"}
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


def _embed_task(model, given: dict) -> bool:
    """Whether an encoder is what `kbert finetune --task embed` writes: its task embed (given,
    declared, or in its config), with the embedding record that says how to pool its vectors."""
    declared = (getattr(model, "task_info", None) or {}).get("task") or model.config.extras.get("task")
    if given.get("task", declared) != "embed" or set(given) - {"task"}:
        return False
    if "embedding" not in model.config.extras:
        raise KbertError(
            "task embed needs the sentence-embedding record (bert_config.json's embedding: pooling, normalize), "
            "which kbert finetune --task embed writes; save the encoder without a task"
        )
    return True


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
