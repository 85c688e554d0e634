"""pretrain_run.json: the flags a `kbert pretrain` run started with, and what `--resume` may change.

A run records its flags when it starts (and again when a resume extends it), so that a bare
`kbert pretrain --model-dir DIR --resume` continues it as it was; a flag given to --resume with
another value is refused, naming both, unless it only says where and how fast the run goes on
(`RESUME_MAY_CHANGE`).

A run that stopped before writing its model is named, with the command that continues it, by
`interrupted_pretraining_message`, for every command handed its directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shlex

from kbert.backend.checkpoints import latest_training_state
from kbert.formats.model_dir import CHECKPOINTS_DIR, CONFIG_FILE, UnfinishedRun, is_model_dir, register_unfinished_run
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.record_checks import find_files
from kbert.runtime.errors import KbertError, on_command_line, option, plural
from kbert.runtime.files import atomic_write_text

log = logging.getLogger("kbert")

# The run's flags, written when it starts: what a bare `--resume` continues with.
RUN_FILE = "pretrain_run.json"
RUN_KEYS = {"data", "data_files", "config", "vocab", "init", "lowercase", "options"}  # what every record holds
# The flags a --resume may change: where the run goes on (a preempted TPU job on GPUs), how fast
# and how often it saves and evaluates. Each step still trains on the same global batch of the
# same records (the data position comes from the step); a new strategy or --grad-accum
# normalizes the masked-LM loss per replica and micro-batch as the original does per TPU core,
# so the weights then differ slightly from an unchanged run's. --steps may only grow.
RESUME_MAY_CHANGE = (
    "save_every",
    "keep_checkpoints",
    "steps_per_loop",
    "eval_data",
    "eval_every",
    "eval_steps",
    "strategy",
    "tpu",
    "jit",
    "grad_accum",
)


def given_options(options: PretrainOptions | None, overrides: dict) -> set[str]:
    """The fields a caller set: keyword arguments, and `options` fields that differ from the
    defaults (what the CLI passes are the flags typed on the command line)."""
    defaults = PretrainOptions()
    given = set(overrides)
    if options is not None:
        given |= {f.name for f in dataclasses.fields(options) if getattr(options, f.name) != getattr(defaults, f.name)}
    return given - {"resume", "progress"}


def recorded_options(model_dir: str) -> dict:
    """The options recorded for the run in `model_dir` (what a bare --resume continues with), or {}."""
    try:
        with open(os.path.join(model_dir, RUN_FILE)) as f:
            options = json.load(f).get("options")
    except (OSError, ValueError, AttributeError):
        return {}
    return options if isinstance(options, dict) else {}


def read_run(model_dir: str) -> dict | None:
    """The recorded flags of the run in `model_dir` (pretrain_run.json), or None if it has none."""
    path = os.path.join(model_dir, RUN_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            run = json.load(f)
    except ValueError:
        run = None
    if not isinstance(run, dict) or not RUN_KEYS <= run.keys():
        raise KbertError(
            f"{path}: not the record of a kbert pretrain run; remove it, and give {option('resume', True)} the "
            f"{'flags' if on_command_line() else 'arguments'} the run was started with"
        )
    return run


def continue_run(
    model_dir: str, run: dict, opts: PretrainOptions, given: set[str], data, starts_from: dict, do_lower_case
) -> tuple[PretrainOptions, list[str]]:
    """The recorded options with the given ones that may change, and the data files; a flag
    given with another value than the recorded one is refused, naming both."""
    fields = [f.name for f in dataclasses.fields(PretrainOptions)]
    # A field the record lacks (kbert added it later) takes its default.
    recorded = dataclasses.replace(PretrainOptions(), **{k: v for k, v in run["options"].items() if k in fields})
    if opts.mixed_precision_dtype == "auto":  # "suits this machine": the run's own type suits its checkpoint
        given = given - {"mixed_precision_dtype"}
    for name in fields:  # in --help's order
        if name not in given:
            continue
        then, now = getattr(recorded, name), getattr(opts, name)
        if name == "steps":
            if now < then:
                raise KbertError(
                    f"{option('resume', True)}: the run in {model_dir} was started with {option('steps', then)}, "
                    f"not {now}; {option('resume', True)} continues or extends a run: leave {option('steps')} out, "
                    f"or give more than {then}"
                )
        elif name not in RESUME_MAY_CHANGE and now != then:
            refuse_change(model_dir, name, then, now)
    for key, path in starts_from.items():
        if path is not None and path != run[key]:
            refuse_change(model_dir, _STARTS_FROM_ARGUMENTS[key], run[key], path, flag=f"--{key}")
    if do_lower_case is not None and bool(do_lower_case) != run["lowercase"]:
        refuse_change(model_dir, "do_lower_case", run["lowercase"], do_lower_case, flag="--lowercase")
    opts = dataclasses.replace(
        recorded, resume=True, progress=opts.progress, **{name: getattr(opts, name) for name in given if name in fields}
    )
    return opts, resumed_files(model_dir, run, data)


def resumed_files(model_dir: str, run: dict, data) -> list[str]:
    """The recorded data files, or those `data` names if they are the same files (names and
    sizes) moved elsewhere; then the record follows them."""
    recorded = [(path, size) for path, size in run["data_files"]]
    if data is None:
        for path, size in recorded:
            if not os.path.isfile(path):
                raise KbertError(
                    f"{path}: no such file, and the run in {model_dir} trains on it (see {RUN_FILE}); "
                    f"put it back, or give {option('data')} where those files are now"
                )
            if os.path.getsize(path) != size:
                raise KbertError(
                    f"{path}: {os.path.getsize(path)} bytes, but {size} when the run in {model_dir} "
                    f"started: the data changed; put the run's files back, or start a new run"
                )
        return [path for path, _ in recorded]
    files = find_files(data)
    if [(os.path.basename(f), os.path.getsize(f)) for f in files] != [(os.path.basename(p), n) for p, n in recorded]:
        refuse_change(
            model_dir,
            "data",
            f"{run['data']} ({plural(len(recorded), 'file')})",
            f"{data} ({plural(len(files), 'file')}, other names or sizes)",
        )
    run["data"], run["data_files"] = (
        absolute_pattern(data),
        [[os.path.abspath(f), n] for f, (_, n) in zip(files, recorded)],
    )
    return files


def record_run(model_dir: str, run: dict, opts: PretrainOptions, warmup: int):
    """Write pretrain_run.json (atomically): on every start, as a resume may extend --steps, move
    the data or change where the run goes on."""
    if opts.resume and "options" not in run:  # a run from before kbert recorded them, resumed with flags
        log.info(
            "%s has no %s (its run began before kbert recorded a run's flags): continuing with the flags "
            "given, recorded there now",
            model_dir,
            RUN_FILE,
        )
    elif opts.resume and opts.steps > run["options"]["steps"]:
        log.info(
            "%s extends the run from %d steps: the learning rate now decays to 0 at step %d",
            option("steps", opts.steps),
            run["options"]["steps"],
            opts.steps,
        )
    run["options"] = {
        field.name: getattr(opts, field.name)
        for field in dataclasses.fields(opts)
        if field.name not in ("resume", "progress")
    }
    run["options"]["warmup_steps"] = warmup  # a number: a longer --steps must not move the warmup
    atomic_write_text(os.path.join(model_dir, RUN_FILE), json.dumps(run, indent=1) + "\n")


# The arguments of `pretrain` that a record's "config", "vocab" and "init" came from (--config, --vocab, --init).
_STARTS_FROM_ARGUMENTS = {"config": "config_file", "vocab": "vocab_file", "init": "init"}


def refuse_change(model_dir: str, name: str, then, now, flag: str | None = None):
    """Refuse a resumed run's `name` (a `pretrain` argument; `flag` where the command line's differs) changed."""

    def shown(value):
        return {True: "on", False: "off", None: "unset"}[value] if value is None or isinstance(value, bool) else value

    raise KbertError(
        f"{option('resume', True)}: the run in {model_dir} was started with {option(name, flag=flag)} {shown(then)}, "
        f"not {shown(now)}; leave {option(name, flag=flag)} out to continue it as it was, "
        f"or start another run in a new {option('model_dir')}"
    )


def absolute(path) -> str | None:
    return os.path.abspath(os.fspath(path)) if path else None


def absolute_pattern(pattern: str) -> str:
    """A --data value with each comma-separated path or glob made absolute: the record works from any directory."""
    return ",".join(part if "://" in part else os.path.abspath(part) for part in pattern.split(",") if part)


def interrupted_pretraining(path) -> str | None:
    """The latest checkpoint prefix of a `kbert pretrain --model-dir` whose run stopped before
    writing model.weights.h5 (bert_config.json and checkpoints/ckpt-N, no weights), else None."""
    path = os.fspath(path)
    if not os.path.isdir(path) or is_model_dir(path) or not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return None
    # The checkpoint `--resume` would continue from: a JAX or PyTorch run's newest ckpt-N folder, or
    # the one TensorFlow's `checkpoint` state file names.
    ckpt_dir = os.path.join(path, CHECKPOINTS_DIR)
    return latest_training_state(ckpt_dir) or _latest_tensorflow_checkpoint(ckpt_dir)


def _latest_tensorflow_checkpoint(ckpt_dir: str) -> str | None:
    """The checkpoint prefix TensorFlow's `checkpoint` state file names, if its index is there: what
    tf.train.latest_checkpoint returns, read without TensorFlow (the file is a text proto)."""
    try:
        with open(os.path.join(ckpt_dir, "checkpoint"), encoding="utf-8") as f:
            found = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', f.read(), re.MULTILINE)
    except (OSError, UnicodeDecodeError):
        return None
    if not found:
        return None
    prefix = os.path.join(ckpt_dir, found.group(1))  # relative to the folder, unless written absolute
    return prefix if os.path.isfile(prefix + ".index") else None


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
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, RUN_FILE)):
        # A run from before kbert recorded its flags: they must be given again.
        return said + " --data DATA` and the other flags it was started with"
    return said + "`"


# How every command that is handed a stopped run's --model-dir tells it apart and names its resume.
UNFINISHED_PRETRAINING = register_unfinished_run(
    UnfinishedRun("kbert pretrain", interrupted_pretraining, interrupted_pretraining_message)
)
