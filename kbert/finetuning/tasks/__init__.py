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
  (kbert.finetuning.ranking); the output is an embedding model, scored by ranking.

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

from kbert.finetuning.tasks.base import Task, finetune_option
from kbert.finetuning.tasks.choice import CHOICE
from kbert.finetuning.tasks.classify import CLASSIFY
from kbert.finetuning.tasks.embed import EMBED
from kbert.finetuning.tasks.regress import REGRESS
from kbert.finetuning.tasks.squad import SQUAD
from kbert.finetuning.tasks.tag import TAG
from kbert.runtime.errors import KbertError

TASKS = {task.name: task for task in (CLASSIFY, REGRESS, TAG, SQUAD, CHOICE, EMBED)}


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
    ('classify', 'regress')
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
