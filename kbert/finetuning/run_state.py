"""An unfinished `kbert finetune` run: its OUTPUT.partial/ directory (checkpoints/, state.json,
no model) recognised, and the command that finishes it, for every command handed one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex

from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.finetuning.options import FinetuneOptions
from kbert.finetuning.tasks import TASKS
from kbert.formats.model_dir import UnfinishedRun, is_model_dir, register_unfinished_run
from kbert.runtime.files import PARTIAL_SUFFIX

# What an unfinished run (OUTPUT.partial/) holds besides its checkpoints (kbert.finetuning.train).
STATE_FILE = "state.json"


def interrupted_finetuning(path) -> dict | None:
    """The state.json of an unfinished `kbert finetune` run (its OUTPUT.partial/ directory:
    checkpoints/, state.json, no model), else None."""
    path = os.fspath(path)
    state_file = os.path.join(path, STATE_FILE)
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
    flags += recorded_flags(run)
    batches = max(1, int(run.get("train_examples", 0)) // max(1, int(run.get("batch_size", 1))))
    total = f" of {batches * int(run['epochs'])}" if "epochs" in run and "train_examples" in run else ""
    return (
        f"{path}: an unfinished kbert finetune run (stopped at step {state.get('step', '?')}{total}), not a "
        f"model; finish it with `{' '.join(flags)} --resume`, then use {output}"
    )


def recorded_flags(run: dict) -> list[str]:
    """The flags that repeat a run's recorded settings (its state.json's fingerprint) where they are
    not the defaults: --resume refuses a run started with other values.

    >>> recorded_flags({"task": "rerank", "epochs": 1, "batch_size": 8, "loss": "listwise", "negatives": None,
    ...                 "mixed_precision": "bfloat16", "group_by_length": True, "max_seq_length": 128})
    ['--epochs 1', '--batch-size 8', '--loss listwise', '--mixed-precision-dtype bfloat16', '--group-by-length']
    """
    defaults = dataclasses.asdict(FinetuneOptions())
    task = TASKS.get(run.get("task"))
    if task is not None:  # the task's own options as a run without them records them (rerank: loss bce)
        defaults.update(task.fingerprint(FinetuneOptions()))
    defaults["mixed_precision"] = False
    flags = []
    for key, value in run.items():
        if key not in defaults or key in ("max_seq_length", "mixed_precision_dtype") or value == defaults[key]:
            continue
        name = "--" + key.replace("_", "-")
        if key == "mixed_precision":  # the type it computed in: naming one turns mixed precision on
            flags.append(f"--mixed-precision-dtype {value}")
        elif isinstance(value, bool):
            flags.append(name if value else f"--no-{key.replace('_', '-')}")
        elif value is not None:
            flags.append(f"{name} {shlex.quote(str(value))}")
    default_length = task.max_seq_length if task is not None else DEFAULT_MAX_SEQ_LENGTH
    if run.get("max_seq_length") not in (None, default_length):
        flags.append(f"--max-seq-length {run['max_seq_length']}")
    return flags


# How every command that is handed an OUTPUT.partial/ tells it apart and names the command that finishes it.
UNFINISHED_FINETUNING = register_unfinished_run(
    UnfinishedRun("kbert finetune", interrupted_finetuning, interrupted_finetuning_message)
)
