"""What a pretraining run settles before it trains, whichever engine trains it.

`set_up_run` settles the options (a resume's recorded ones), where the run places its work (the
engine's `place`: a tf.distribute strategy, or Keras devices), where the model starts
(`ModelStart`) and the data files, each read to its end (framing only) before anything is
written: a cut-short or corrupt file fails here, not hours in, and a new run leaves no directory
behind. An engine answers `Training` once it has built the model and optimizer.

The engine is asked only what differs between backends: `place(opts)`, `check_records(...)`,
`tensorflow_checkpoint_in(ckpt_dir)`, and which checkpoints it reads (`checkpoint_kind`, with
`other_backends` and `resume_advice` for the refusal of the other kind).
"""

from __future__ import annotations

import dataclasses
import os

import keras

from kbert import backend
from kbert.backend.checkpoints import latest_training_state
from kbert.config import BertConfig
from kbert.formats.model_dir import CHECKPOINTS_DIR, check_vocab
from kbert.formats.sources import open_model
from kbert.pretraining.fill_mask import what_it_is
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.pretrainers import Objective, continued_from, is_pretrainer, objective_of, run_model_start
from kbert.pretraining.record_checks import find_files
from kbert.pretraining.run_record import (
    RUN_FILE,
    absolute,
    absolute_pattern,
    continue_run,
    given_options,
    read_run,
)
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import count_lines
from kbert.runtime.precision import check_mixed_precision_dtype


@dataclasses.dataclass
class ModelStart:
    """Where a run's model starts: its config, the file of its token ids (a BERT's vocab.txt, a
    ModernBERT's tokenizer.json) and casing, and the model --init opened."""

    config: object  # BertConfig or ModernBertConfig
    vocab_file: str
    do_lower_case: bool
    initial: keras.Model | None = None

    @property
    def objective(self) -> Objective:
        return objective_of(self.config)


@dataclasses.dataclass
class RunSetup:
    """A run settled: its options, run record, placement, model start, data files and checkpoints dir."""

    opts: PretrainOptions
    run: dict
    placement: object  # a tf.distribute strategy, or a list of Keras devices
    start: ModelStart
    files: list
    eval_files: list | None
    ckpt_dir: str


@dataclasses.dataclass
class Training:
    """What an engine built for the loop: the pretrainer it trains (the model the run writes), the
    step it starts from (0 for a new run, else the one restored), and how."""

    model: keras.Model  # a BertPretrainer or a ModernBertMaskedLM
    step: int
    replicas: int
    warmup: int
    jit: bool
    chief: bool = True  # whether this process writes the run's files (one worker of several may not)


def set_up_run(engine, model_dir, data, config_file, vocab_file, init, do_lower_case, options, overrides) -> RunSetup:
    """The options, placement, model start and checked data files of a run (see the module's docstring)."""
    starts_from = {"config": absolute(config_file), "vocab": absolute(vocab_file), "init": absolute(init)}
    opts, run, files = _resolved_options(model_dir, data, options, overrides, starts_from, do_lower_case)
    placement = engine.place(opts)
    ckpt_dir = os.path.join(model_dir, CHECKPOINTS_DIR)
    start = _model_start(engine, opts, model_dir, ckpt_dir, run, data, config_file, vocab_file, init, do_lower_case)
    if files is None:
        files = find_files(data)
        run = {"data": absolute_pattern(data), **starts_from, "lowercase": bool(start.do_lower_case)}
        run["data_files"] = [[os.path.abspath(f), os.path.getsize(f)] for f in files]
    eval_files = _checked_records(engine, files, opts, start.config)
    return RunSetup(opts, run, placement, start, files, eval_files, ckpt_dir)


def check_one_start(config_file, vocab_file, init):
    """One line unless the run starts one way: from scratch (`config_file`, `vocab_file`) or from
    `init`'s model, whose config and vocabulary it keeps.

    >>> check_one_start("bert_config.json", None, "uncased_L-12_H-768_A-12")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: config_file='bert_config.json' and init='uncased_L-12_H-768_A-12': a run starts from scratch (config_file, vocab_file) or continues from a model (init), which brings its own config and vocabulary; drop one
    """
    if init and (config_file or vocab_file):
        given = [
            option(name, value, flag=flag)
            for name, value, flag in (("config_file", config_file, "--config"), ("vocab_file", vocab_file, "--vocab"))
            if value
        ]
        raise KbertError(
            f"{' and '.join([*given, option('init', init)])}: a run starts from scratch "
            f"({option('config_file', flag='--config')}, {option('vocab_file', flag='--vocab')}) or continues from "
            f"a model ({option('init')}), which brings its own config and vocabulary; drop one"
        )


def has_checkpoint(engine, ckpt_dir: str) -> bool:
    """Whether `ckpt_dir` holds a complete checkpoint of either engine."""
    return bool(_checkpoint_kinds(engine, ckpt_dir))


def _resolved_options(model_dir, data, options, overrides, starts_from, do_lower_case):
    """(options, run record, data files), checked: for a resume, its pretrain_run.json's with
    the ones given; for a new run, the ones given (and None, None)."""
    opts = dataclasses.replace(options or PretrainOptions(), **overrides)
    run = read_run(model_dir) if opts.resume else None
    files = None
    if run:
        opts, files = continue_run(
            model_dir, run, opts, given_options(options, overrides), data, starts_from, do_lower_case
        )
    elif data is None and not opts.resume:
        raise KbertError(
            f"{option('data')} is required: the TFRecords to train on (made by kbert create-data), as a file, "
            "a glob or a comma-separated list"
        )
    _check_options(opts)
    if opts.mixed_precision or opts.mixed_precision_dtype != "auto":
        # "auto" resolved here and recorded so: a resume on another kind of GPU (float16 where the run
        # was bfloat16) computes as the run did, and its checkpoint matches its optimizer.
        opts = dataclasses.replace(
            opts, mixed_precision=True, mixed_precision_dtype=backend.mixed_precision_dtype(opts.mixed_precision_dtype)
        )
    return opts, run, files


def _model_start(
    engine, opts, model_dir, ckpt_dir, run, data, config_file, vocab_file, init, do_lower_case
) -> ModelStart:
    """The run's own model (a resume), --init's, or a new one from --config and --vocab."""
    has_checkpoints = has_checkpoint(engine, ckpt_dir)
    initial = None
    if opts.resume:
        _check_checkpoint_kind(engine, ckpt_dir)
        if not has_checkpoints:
            raise KbertError(
                f"{option('resume', True)}: {ckpt_dir} has no checkpoint to resume from; "
                f"drop {option('resume', True)} to start a new run"
            )
        if run is None and data is None:
            raise KbertError(
                f"{option('resume', True)}: {model_dir} has no {RUN_FILE} (its run began before kbert recorded "
                f"a run's flags); give {option('data')} and the other flags it was started with"
            )
        config, vocab_file = run_model_start(model_dir)
    else:
        if has_checkpoints:
            raise KbertError(
                f"{model_dir} already has checkpoints; pass {option('resume', True)} to continue that run "
                f"or choose a new {option('model_dir')}"
            )
        if init:
            # Any model source (kbert.formats.sources.open_model), opened outside the strategy's scope: a
            # converter assigns its variables directly, which mirrored variables do not allow.
            initial = open_model(init, do_lower_case)
            if not is_pretrainer(initial):
                raise KbertError(
                    f"{option('init', init)}: {what_it_is(initial)}, without the {objective_of(initial).heads} "
                    f"pretraining trains; pass a pretrained or converted model (the one it came from)"
                )
            config, vocab_file, do_lower_case = continued_from(initial)
        elif config_file and vocab_file:
            if os.fspath(vocab_file).endswith(".json"):
                raise KbertError(
                    f"{option('vocab_file', vocab_file, flag='--vocab')}: a tokenizer.json (a ModernBERT's); kbert "
                    f"pretrains a ModernBERT from a converted one: pass {option('init', 'MODEL_DIR')} instead of "
                    f"{option('config_file', flag='--config')} and {option('vocab_file', flag='--vocab')}"
                )
            config = BertConfig.from_json_file(config_file)
            entries = count_lines(vocab_file)
            if entries != config.vocab_size:  # a new model: its config is the user's to match to the vocabulary
                raise KbertError(
                    f"{vocab_file} has {entries} entries but {config_file} says vocab_size {config.vocab_size}; "
                    f"a new model's vocab_size is its vocab.txt's: set it to {entries} in {config_file}"
                )
        else:
            raise KbertError(
                f"say where the model starts: {option('config_file', 'bert_config.json', flag='--config')} "
                f"{option('vocab_file', 'vocab.txt', flag='--vocab')} "
                f"(from scratch), {option('init', 'MODEL_DIR')} (continue), or {option('resume', True)}"
            )
    if isinstance(config, BertConfig):  # a ModernBERT's ids are its tokenizer.json's, read whole
        check_vocab(vocab_file, config)
        if do_lower_case is None or opts.resume:
            do_lower_case = config.extras.get("do_lower_case", True)
    else:
        do_lower_case = False  # a byte-level BPE keeps case
    if opts.max_seq_length > config.max_position_embeddings:
        raise KbertError(
            f"{option('max_seq_length', opts.max_seq_length)} exceeds max_position_embeddings "
            f"{config.max_position_embeddings} of the model; lower it"
        )
    return ModelStart(config, vocab_file, do_lower_case, initial)


def _checked_records(engine, files, opts, config) -> list | None:
    """Check the training records (and --eval-data's) against the model; the eval files."""
    objective = objective_of(config)
    engine.check_records(
        files, opts.max_seq_length, opts.max_predictions_per_seq, vocab_size=config.vocab_size, objective=objective
    )
    eval_files = find_files(opts.eval_data, "--eval-data") if opts.eval_data else None
    if eval_files:
        engine.check_records(
            eval_files,
            opts.max_seq_length,
            opts.max_predictions_per_seq,
            "--eval-data",
            vocab_size=config.vocab_size,
            objective=objective,
        )
    return eval_files


def _checkpoint_kinds(engine, ckpt_dir: str) -> set:
    """Which engines wrote the checkpoints in `ckpt_dir`: "tensorflow" (tf.train.Checkpoint's, named
    by its `checkpoint` state file) and "keras" (kbert.backend.checkpoints' ckpt-N folders, JAX's
    and PyTorch's)."""
    found = set()
    if engine.tensorflow_checkpoint_in(ckpt_dir):
        found.add("tensorflow")
    if latest_training_state(ckpt_dir) is not None:
        found.add("keras")
    return found


def _check_checkpoint_kind(engine, ckpt_dir: str):
    """Refuse, in one line, to resume a run whose checkpoints only the other engine reads."""
    kinds = _checkpoint_kinds(engine, ckpt_dir)
    if kinds and engine.checkpoint_kind not in kinds:
        raise KbertError(
            f"{option('resume', True)}: the checkpoints in {ckpt_dir} were written on {engine.other_backends}; "
            f"{engine.resume_advice}"
        )


def _check_options(opts: PretrainOptions):
    for name in (
        "steps",
        "batch_size",
        "save_every",
        "steps_per_loop",
        "grad_accum",
        "max_seq_length",
        "max_predictions_per_seq",
        "keep_checkpoints",
        "eval_steps",
    ):
        value = getattr(opts, name)
        if not isinstance(value, int) or value < 1:
            raise KbertError(f"{option(name)} must be a positive integer, got {value!r}")
    if not opts.learning_rate > 0:
        raise KbertError(f"{option('learning_rate')} must be positive, got {opts.learning_rate}")
    check_mixed_precision_dtype(opts.mixed_precision_dtype)
    # Options that would go unread are a mistake: refused, as every command refuses them.
    if opts.tpu is not None and opts.strategy != "tpu":
        raise KbertError(
            f"{option('tpu', opts.tpu)} names the TPU of {option('strategy', 'tpu')}, and the strategy is "
            f"{opts.strategy}: add {option('strategy', 'tpu')}, or drop {option('tpu')}"
        )
    if opts.eval_every is not None and not opts.eval_data:
        raise KbertError(
            f"{option('eval_every')} applies to a run with {option('eval_data')}: add the held-out records, "
            f"or drop {option('eval_every')}"
        )
