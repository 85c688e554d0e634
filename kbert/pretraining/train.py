"""`pretrain(...)`: MLM + NSP pretraining as run_pretraining.py does it, on any tf.distribute strategy.

A custom `strategy.run` loop rather than `model.fit`: Keras 3.15's fit fails under
MultiWorkerMirroredStrategy (tensorflow#72388), and a compiled multi-step inner loop is what
TPUs want. Per step, on every replica:

    loss = masked-LM loss (Σ w·xent / (Σ w + 1e-5), as the original) + mean next-sentence loss
    gradients of loss / (replicas · accumulation steps), summed over micro-batches and replicas
    -> clipped to global norm 1.0 -> BertAdamW (or LAMB) with warmup + linear decay.

So the update equals the single-device update on the global batch, whatever the strategy.

On JAX and PyTorch, `pretrain` runs `keras_loop`'s loop instead (no TensorFlow imported there), with
the same options, files and behaviour; the helpers below that both loops share use no TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shlex
import shutil
import tempfile
import time

import keras

from kbert.backend import is_chief, pretraining_placement, use_mixed_precision, writes_shared_files
from kbert.config import BertConfig
from kbert.errors import KbertError, option
from kbert.model.bert import BertPretrainer
from kbert.model.initializers import unfilled
from kbert.model_dir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    VOCAB_FILE,
    WEIGHTS_FILE,
    check_vocab,
    write_model_files,
)
from kbert.outputs import claim_output
from kbert.pretraining.dataset import check_records, find_corrupt_record, find_files, op_error_text, pretraining_dataset
from kbert.pretraining.fill_mask import what_it_is
from kbert.pretraining.losses import pretraining_losses
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.run_record import (
    RUN_FILE,
    absolute,
    absolute_pattern,
    continue_run,
    given_options,
    read_run,
    record_run,
    recorded_options,
)
from kbert.sources import open_model
from kbert.training.checkpoints import latest_training_state
from kbert.training.interruption import StopSignals, checkpoint_write_failed, random_state_variables
from kbert.training.optimization import make_optimizer
from kbert.training.progress import Progress, keep_history_until, write_loss_plot

if keras.config.backend() == "tensorflow":  # the loop of this module; JAX and PyTorch run keras_loop's
    import tensorflow as tf

log = logging.getLogger("kbert")

METRICS_FILE = "metrics.jsonl"
LOSS_PLOT = "loss.png"


def pretrain(
    model_dir,
    data=None,
    config_file=None,
    vocab_file=None,
    init=None,
    do_lower_case=None,
    options: PretrainOptions | None = None,
    return_model: bool = False,
    **overrides,
):
    """Pretrain a BERT with MLM + NSP; returns the final metrics (also printed by the CLI).

    A new run records its flags in MODEL_DIR/pretrain_run.json. `resume=True` continues the
    run from its last checkpoint with those flags: the ones given (keyword arguments, and the
    fields of `options` that differ from the defaults) must agree with them, except `steps`
    (larger: extends the run) and those in `kbert.pretraining.run_record.RESUME_MAY_CHANGE`.

    Args:
        model_dir: str. Becomes a kbert model directory (bert_config.json, vocab.txt,
            model.weights.h5) plus checkpoints/, logs/ (TensorBoard), metrics.jsonl, loss.png,
            pretrain_run.json.
        data: str. TFRecord file(s) or glob(s) made by create_pretraining_data.py or
            `kbert create-data`. With `resume`, default: the recorded files.
        config_file, vocab_file: str. Start from scratch with this bert_config.json and vocab.
        init: str. Or start from this kbert model directory (e.g. `kbert convert from-tf1`),
            for continued pretraining or phase 2 at sequence length 512.
        options: `PretrainOptions`; keyword arguments override single fields.
        return_model: bool. Return `(metrics, model)` instead of the metrics alone.

    Example:
    >>> kbert.pretraining.train.pretrain("out/bert", "data/*.tfrecord", config_file="bert_config.json",
    ...                            vocab_file="vocab.txt", steps=1000, batch_size=32)  # doctest: +SKIP
    >>> kbert.pretraining.train.pretrain("out/bert", resume=True)  # after SIGTERM  # doctest: +SKIP
    """
    # The run's writer locks --model-dir, as the CLI does (kbert.outputs.claim_output); the other
    # workers of a multi-worker run write theirs aside and do not. A bare resume runs on the
    # recorded strategy.
    strategy = overrides.get("strategy", (options or PretrainOptions()).strategy)
    if overrides.get("resume", options is not None and options.resume) and "strategy" not in overrides:
        strategy = recorded_options(os.fspath(model_dir)).get("strategy", strategy)
    claim = (
        claim_output(model_dir, inputs=[init], in_place=True)
        if writes_shared_files(strategy)
        else contextlib.nullcontext()
    )
    with claim:
        return _pretrain(
            model_dir, data, config_file, vocab_file, init, do_lower_case, options, return_model, **overrides
        )


def _pretrain(model_dir, data, config_file, vocab_file, init, do_lower_case, options, return_model, **overrides):
    """The run, in the order nanoGPT's train.py reads: setup, where the model starts, data, model
    and optimizer, the loop, the finished model."""
    if keras.config.backend() != "tensorflow":
        from kbert.pretraining import keras_loop

        return keras_loop.pretrain(
            model_dir, data, config_file, vocab_file, init, do_lower_case, options, return_model, **overrides
        )
    model_dir = os.fspath(model_dir)
    # First, before any TensorFlow op: multi-worker collectives must be set up at start-up.
    setup = _setup(model_dir, data, config_file, vocab_file, init, do_lower_case, options, overrides,
                   place=lambda opts: pretraining_placement(opts.strategy, opts.tpu))  # fmt: skip
    opts, run, strategy, start, files, eval_files, ckpt_dir = setup

    training = _model_and_optimizer(opts, strategy, start, model_dir, ckpt_dir)
    if training.step >= opts.steps:
        if training.chief and not os.path.exists(os.path.join(model_dir, WEIGHTS_FILE)):
            # Trained to the end, then the model files failed (a full disk): write them now.
            return _finish_trained_run(
                training.model, model_dir, start.vocab_file, start.do_lower_case, training.step, return_model
            )
        raise KbertError(
            f"the run in {model_dir} is already at step {training.step} of {option('steps', opts.steps)}; "
            f"raise {option('steps')} to train further"
        )

    last, last_eval, speed = _train(opts, strategy, training, files, eval_files, model_dir, ckpt_dir, start, run)

    model = training.model
    result = _finished(model, training, opts, last, last_eval, speed, model_dir, start, writes=training.chief)
    return (result, model) if return_model else result


def _setup(model_dir, data, config_file, vocab_file, init, do_lower_case, options, overrides, place):
    """What both loops settle before training: the options (a resume's recorded ones), where the
    run places its work (`place(opts)`: a strategy, or devices), where the model starts, and the
    data files, each read to its end (framing only) before anything is written: a cut-short or
    corrupt file fails here, not hours in, and a new run leaves no directory behind.

    Returns (opts, run record, placement, start, files, eval_files, checkpoints dir)."""
    starts_from = {"config": absolute(config_file), "vocab": absolute(vocab_file), "init": absolute(init)}
    opts, run, files = _resolved_options(model_dir, data, options, overrides, starts_from, do_lower_case)
    placement = place(opts)
    ckpt_dir = os.path.join(model_dir, CHECKPOINTS_DIR)
    start = _model_start(opts, model_dir, ckpt_dir, run, data, config_file, vocab_file, init, do_lower_case)
    if files is None:
        files = find_files(data)
        run = {"data": absolute_pattern(data), **starts_from, "lowercase": bool(start.do_lower_case)}
        run["data_files"] = [[os.path.abspath(f), os.path.getsize(f)] for f in files]
    eval_files = _checked_records(files, opts, start.config)
    return opts, run, placement, start, files, eval_files, ckpt_dir


def _finished(model, training, opts, last, last_eval, speed, model_dir, start: _Start, writes: bool = True) -> dict:
    """A finished run's model files (where this process `writes` them) and its result, on every
    backend's loop."""
    if writes:
        model.fresh_heads = ()  # pretraining trains every head: masked-LM, next-sentence and the pooler
        write_model_files(model, model_dir, start.vocab_file, start.do_lower_case, weights=True)
        write_loss_plot(os.path.join(model_dir, METRICS_FILE), os.path.join(model_dir, LOSS_PLOT))
    result = {k: last[k] for k in ("step", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")}
    result["sequences_per_second"] = speed
    result["learning_rate"] = last["learning_rate"]
    if last_eval:
        result["eval"] = last_eval
    result.update(
        replicas=training.replicas,
        strategy=opts.strategy,
        resumed_from=training.step if opts.resume else None,
        model_dir=model_dir,
        mixed_precision=keras.mixed_precision.global_policy().name,
        jit=training.jit,
        backend=keras.config.backend(),
    )
    return result


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
    return opts, run, files


@dataclasses.dataclass
class _Start:
    """Where a run's model starts: its config, vocabulary and casing, and the model --init opened."""

    config: BertConfig
    vocab_file: str
    do_lower_case: bool
    initial: BertPretrainer | None = None


def _model_start(opts, model_dir, ckpt_dir, run, data, config_file, vocab_file, init, do_lower_case) -> _Start:
    """The run's own model (a resume), --init's, or a new one from --config and --vocab."""
    has_checkpoints = _has_checkpoint(ckpt_dir)
    initial = None
    if opts.resume:
        _check_checkpoint_backend(ckpt_dir)
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
        config = BertConfig.from_json_file(os.path.join(model_dir, CONFIG_FILE))
        vocab_file = os.path.join(model_dir, VOCAB_FILE)
    else:
        if has_checkpoints:
            raise KbertError(
                f"{model_dir} already has checkpoints; pass {option('resume', True)} to continue that run "
                f"or choose a new {option('model_dir')}"
            )
        if init:
            # Any model source (kbert.sources.open_model), opened outside the strategy's scope: a
            # converter assigns its variables directly, which mirrored variables do not allow.
            initial = open_model(init, do_lower_case)
            if not isinstance(initial, BertPretrainer):
                raise KbertError(
                    f"{option('init', init)}: {what_it_is(initial)}, without the masked-LM and next-sentence heads "
                    f"pretraining trains; pass a pretrained or converted model (the one it came from)"
                )
            config = BertConfig.from_dict(initial.config.to_dict())
            vocab_file, do_lower_case = initial.vocab_file, initial.do_lower_case
        elif config_file and vocab_file:
            config = BertConfig.from_json_file(config_file)
        else:
            raise KbertError(
                f"say where the model starts: {option('config_file', 'bert_config.json', flag='--config')} "
                f"{option('vocab_file', 'vocab.txt', flag='--vocab')} "
                f"(from scratch), {option('init', 'MODEL_DIR')} (continue), or {option('resume', True)}"
            )
    check_vocab(vocab_file, config)
    if do_lower_case is None or opts.resume:
        do_lower_case = config.extras.get("do_lower_case", True)
    if opts.max_seq_length > config.max_position_embeddings:
        raise KbertError(
            f"{option('max_seq_length', opts.max_seq_length)} exceeds max_position_embeddings "
            f"{config.max_position_embeddings} of the model; lower it"
        )
    return _Start(config, vocab_file, do_lower_case, initial)


def _checked_records(files, opts, config) -> list | None:
    """Check the training records (and --eval-data's) against the model; the eval files."""
    check_records(files, opts.max_seq_length, opts.max_predictions_per_seq, vocab_size=config.vocab_size)
    eval_files = find_files(opts.eval_data, "--eval-data") if opts.eval_data else None
    if eval_files:
        check_records(
            eval_files, opts.max_seq_length, opts.max_predictions_per_seq, "--eval-data", vocab_size=config.vocab_size
        )
    return eval_files


@dataclasses.dataclass
class _Training:
    """What the loop trains with: the model, its optimizer and checkpoints, and where it starts."""

    model: BertPretrainer
    optimizer: keras.optimizers.Optimizer
    manager: tf.train.CheckpointManager
    step: int  # the step restored (0 for a new run)
    replicas: int
    micro_batch: int  # per replica and accumulation step
    warmup: int
    jit: bool
    chief: bool


def _model_and_optimizer(opts, strategy, start: _Start, model_dir, ckpt_dir) -> _Training:
    """Precision, the model and optimizer in the strategy's scope, and their checkpoint, restored
    for a resume."""
    on_accelerator = bool(tf.config.list_logical_devices("GPU")) or opts.strategy == "tpu"
    jit = on_accelerator if opts.jit is None else opts.jit
    use_mixed_precision(opts.mixed_precision)
    replicas = strategy.num_replicas_in_sync
    if opts.batch_size % (replicas * opts.grad_accum):
        raise KbertError(
            f"{option('batch_size', opts.batch_size)} must divide evenly over {replicas} replicas x "
            f"{opts.grad_accum} accumulation steps; use a multiple of {replicas * opts.grad_accum}"
        )
    micro_batch = opts.batch_size // (replicas * opts.grad_accum)
    warmup = opts.warmup_steps if opts.warmup_steps is not None else opts.steps // 10
    chief = is_chief(strategy)

    keras.utils.set_random_seed(opts.seed)  # the same initial weights for the same --seed
    with strategy.scope():
        model = BertPretrainer(start.config) if start.initial is None else _copied_in_scope(start.initial, start.config)
        optimizer = make_optimizer(opts.optimizer, opts.learning_rate, opts.steps, warmup)
        if keras.mixed_precision.global_policy().name == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(
        weights=list(model.weights), optimizer=optimizer, seeds=random_state_variables(model)
    )
    # Non-chief workers of a multi-worker run write their (identical) checkpoints aside.
    manager = tf.train.CheckpointManager(
        checkpoint, ckpt_dir if chief else _worker_dir(model_dir, strategy), max_to_keep=opts.keep_checkpoints
    )
    step = 0
    if opts.resume:
        # Every worker restores the chief's checkpoint (the model directory is shared storage
        # in a multi-worker run); the others' own copies are written aside and never read.
        checkpoint.restore(tf.train.latest_checkpoint(ckpt_dir)).expect_partial()
        step = int(optimizer.iterations.numpy())
        log.info("resumed from step %d", step)
    return _Training(model, optimizer, manager, step, replicas, micro_batch, warmup, jit, chief)


def _train_data(strategy, files, opts, training: _Training):
    """The training batches from the step reached on, split over the replicas."""
    pipelines_skip = training.step * opts.grad_accum * training.replicas  # per-replica batches consumed so far

    def train_input(context):
        per_pipeline = pipelines_skip // context.num_input_pipelines
        return pretraining_dataset(
            files,
            training.micro_batch,
            opts.max_seq_length,
            opts.max_predictions_per_seq,
            training=True,
            seed=opts.seed,
            input_context=context,
            skip_batches=per_pipeline,
        )

    return iter(strategy.distribute_datasets_from_function(train_input))


def _train(opts, strategy, training: _Training, files, eval_files, model_dir, ckpt_dir, start: _Start, run):
    """The loop: `steps_per_loop` steps per compiled call, up to the next save or eval; logs,
    held-out scores and checkpoints between calls; a stop signal saves and raises `Interrupted`.

    Returns the last call's metrics, the last held-out scores and the sequences per second."""
    model, optimizer, step = training.model, training.optimizer, training.step
    train_iterator = _train_data(strategy, files, opts, training)
    train_loop = _make_train_loop(strategy, model, optimizer, opts.grad_accum, training.replicas, training.jit)
    eval_loop = _make_eval_loop(strategy, model)

    # The files of the run: nothing was written before this point.
    created = training.chief and not os.path.exists(model_dir)
    with _removed_unless_saved(model_dir, ckpt_dir, created):
        writer, eval_writer = _start_run_files(opts, training, model_dir, start, run)
    eval_every = opts.eval_every or opts.save_every
    history_path = os.path.join(model_dir, METRICS_FILE)
    if training.chief:  # rows logged past the checkpoint resumed from come again: each step once
        keep_history_until(history_path, step)
    last, last_eval, last_saved = None, None, step
    timed_steps, timed_seconds = 0, 0.0  # throughput leaves out the first call (tracing)
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    with (
        _removed_unless_saved(model_dir, ckpt_dir, created),
        Progress(
            total=opts.steps, start=step, enabled=opts.progress and training.chief, sequences_per_step=opts.batch_size
        ) as bar,
        StopSignals() as signals,
    ):
        while step < opts.steps:
            n = min(
                opts.steps_per_loop,
                opts.steps - step,
                _to_boundary(step, opts.save_every),
                _to_boundary(step, eval_every),
            )
            t0 = time.perf_counter()
            try:
                stop = tf.constant(float(signals.requested is not None))
                metrics = {k: float(v) for k, v in train_loop(train_iterator, tf.constant(n), stop).items()}
            except tf.errors.DataLossError as e:
                raise _corrupt_records(files, e, last_saved) from None
            # Summed over every replica of every worker, so all workers stop after the same step.
            # That sum comes from the call after the signal; one process can stop after this one.
            stop_requested = metrics.pop("stop_requested") > 0 or (signals.requested is not None and not multi_worker)
            seconds = time.perf_counter() - t0
            _check_finite(metrics, step, n, last_saved)
            if step > training.step:
                timed_steps, timed_seconds = timed_steps + n, timed_seconds + seconds
            step += n
            metrics.update(
                step=step,
                learning_rate=float(optimizer.learning_rate),
                sequences_per_second=n * opts.batch_size / seconds,
            )
            last = metrics
            bar.update(step, metrics)
            if training.chief:
                _log_scalars(writer, metrics, step)
                _append_history(history_path, metrics)
            if eval_files and (step % eval_every == 0 or step == opts.steps):
                try:
                    last_eval = _evaluate(eval_loop, strategy, eval_files, opts, training.replicas)
                except tf.errors.DataLossError as e:
                    raise _corrupt_records(eval_files, e, last_saved) from None
                bar.log(f"step {step}: held-out " + ", ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
                if training.chief:
                    _log_scalars(eval_writer, last_eval, step)
                    _append_history(history_path, dict(last_eval, step=step, split="eval"))
            if step % opts.save_every == 0 or step == opts.steps or stop_requested:
                _save_checkpoint(training.manager, step, last_saved)
                last_saved = step
            if stop_requested and step < opts.steps:
                if training.chief:
                    write_loss_plot(history_path, os.path.join(model_dir, LOSS_PLOT))
                raise signals.interrupted(
                    step, "checkpoint saved", f"`kbert pretrain --model-dir {shlex.quote(model_dir)} --resume`"
                )
    speed = timed_steps * opts.batch_size / timed_seconds if timed_steps else last["sequences_per_second"]
    return last, last_eval, round(speed, 2)


def _start_run_files(opts, training: _Training, model_dir, start: _Start, run):
    """The chief writes a new run's model directory (no weights yet) and the run's record; its
    (train, eval) TensorBoard writers, or None, None on the other workers."""
    if not training.chief:
        return None, None
    if not opts.resume:
        os.makedirs(model_dir, exist_ok=True)
        write_model_files(training.model, model_dir, start.vocab_file, start.do_lower_case, weights=False)
    record_run(model_dir, run, opts, training.warmup)
    writer = tf.summary.create_file_writer(os.path.join(model_dir, "logs", "train"))
    eval_writer = tf.summary.create_file_writer(os.path.join(model_dir, "logs", "eval"))
    return writer, eval_writer


def _has_checkpoint(ckpt_dir: str) -> bool:
    """Whether `ckpt_dir` holds a complete checkpoint of either loop."""
    return bool(_checkpoint_kinds(ckpt_dir))


def _checkpoint_kinds(ckpt_dir: str) -> set:
    """Which loops wrote the checkpoints in `ckpt_dir`: "tensorflow" (tf.train.Checkpoint's, named
    by its `checkpoint` state file) and "keras" (kbert.training.checkpoints' ckpt-N folders, JAX's
    and PyTorch's); without TensorFlow, told from the files alone."""
    found = set()
    if keras.config.backend() == "tensorflow":
        if tf.train.latest_checkpoint(ckpt_dir) is not None:
            found.add("tensorflow")
    elif os.path.isfile(os.path.join(ckpt_dir, "checkpoint")):
        found.add("tensorflow")
    if latest_training_state(ckpt_dir) is not None:
        found.add("keras")
    return found


def _check_checkpoint_backend(ckpt_dir: str):
    """Refuse, in one line, to resume a run whose checkpoints only the other loop reads."""
    kinds = _checkpoint_kinds(ckpt_dir)
    if keras.config.backend() == "tensorflow" and kinds == {"keras"}:
        raise KbertError(
            f"{option('resume', True)}: the checkpoints in {ckpt_dir} were written on JAX or PyTorch; "
            "resume with the KERAS_BACKEND the run started on"
        )
    if keras.config.backend() != "tensorflow" and kinds == {"tensorflow"}:
        raise KbertError(
            f"{option('resume', True)}: the checkpoints in {ckpt_dir} were written on TensorFlow; "
            "resume with KERAS_BACKEND=tensorflow"
        )


def _check_finite(metrics: dict, step: int, n: int, last_saved: int):
    if not all(math.isfinite(v) for v in metrics.values()):
        kept = f"the last good checkpoint (step {last_saved}) is kept" if last_saved else "no checkpoint was saved"
        raise KbertError(
            f"the loss became {metrics['loss']} between steps {step} and {step + n}; stopped, {kept}: "
            f"start a new run with a lower {option('learning_rate')} or more {option('warmup_steps')} "
            f"({option('resume', True)} keeps "
            f"the run's own)"
        )


def _append_history(history_path: str, row: dict):
    with open(history_path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _finish_trained_run(model, model_dir, vocab_file, do_lower_case, step, return_model):
    """Write the model files of a run whose last checkpoint is its last step but whose model
    directory was never completed; the result is the metrics it logged at that step."""
    model.fresh_heads = ()
    write_model_files(model, model_dir, vocab_file, do_lower_case, weights=True)
    history_path = os.path.join(model_dir, METRICS_FILE)
    write_loss_plot(history_path, os.path.join(model_dir, LOSS_PLOT))
    logged = {}
    with contextlib.suppress(OSError):
        with open(history_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        logged = next((row for row in reversed(rows) if row.get("step") == step and "split" not in row), {})
    log.info("%s: trained to step %d; wrote the model files it lacked", model_dir, step)
    keys = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate")
    result = {"step": step, **{k: logged[k] for k in keys if k in logged}, "model_dir": model_dir, "resumed_from": step}
    return (result, model) if return_model else result


@contextlib.contextmanager
def _removed_unless_saved(model_dir: str, ckpt_dir: str, created: bool):
    """A new run that fails before its first checkpoint leaves no directory behind (config,
    logs and metrics of a run that cannot be resumed would only mislead)."""
    try:
        yield
    except BaseException:
        if created and not _has_checkpoint(ckpt_dir):
            shutil.rmtree(model_dir, ignore_errors=True)
        raise


def _corrupt_records(files, error, last_saved: int) -> KbertError:
    """The one line for a record whose checksum fails mid-run: its file (found by reading them all)."""
    where = find_corrupt_record(files) or f"a file of {', '.join(files)}: {op_error_text(error)}"
    kept = f"the last checkpoint (step {last_saved}) is kept" if last_saved else "no checkpoint was saved"
    return KbertError(
        f"{where} (a record's checksum fails); make the file again (kbert create-data) or copy it "
        f"again, then run again; {kept}"
    )


def _copied_in_scope(initial, config):
    """A `BertPretrainer` built in the current strategy scope (its variables mirrored where the
    strategy mirrors them) holding `initial`'s weights."""
    with unfilled():  # every weight is assigned next
        model = BertPretrainer(config)
    for target, value in zip(model.weights, initial.weights, strict=True):
        target.assign(value)
    # `initial` stays referenced by the caller: a converter's vocab.txt (one made from an HF
    # tokenizer.json) lives as long as the model it was made for.
    return model


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


def _save_checkpoint(manager, step: int, last_saved: int):
    """Save; a failed write (disk full, permissions) leaves the previous checkpoint intact,
    because TensorFlow writes to a temporary name and renames only when complete."""
    try:
        manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as e:
        raise checkpoint_write_failed(step, last_saved, e) from None


def _to_boundary(step: int, every: int) -> int:
    return every - step % every


def _worker_dir(model_dir, strategy):
    task = getattr(strategy.cluster_resolver, "task_id", 0)
    return os.path.join(tempfile.gettempdir(), f"kbert-worker-{task}-{os.getpid()}")


def _log_scalars(writer, metrics, step):
    with writer.as_default(step=step):
        for key, value in metrics.items():
            if key not in ("step", "split") and isinstance(value, float):
                tf.summary.scalar(key, value)
    writer.flush()


def _make_train_loop(strategy, model, optimizer, grad_accum: int, replicas: int, jit: bool):
    """A tf.function running N optimizer steps per call (N is a tensor: one trace for all N)."""
    variables = model.trainable_variables

    def forward_backward(features, labels):
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            metrics = pretraining_losses(outputs, labels)
            # Mean over replicas and micro-batches: the summed gradient is the global batch's.
            loss = metrics["loss"] / (replicas * grad_accum)
            if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                loss = optimizer.scale_loss(loss)
        grads = tape.gradient(loss, variables)
        return [tf.convert_to_tensor(g) for g in grads], metrics

    if jit:
        forward_backward = tf.function(forward_backward, jit_compile=True)

    def replica_step(micro_batches):
        total, metric_sums = None, None
        for features, labels in micro_batches:
            grads, metrics = forward_backward(features, labels)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
            metric_sums = metrics if metric_sums is None else {k: metric_sums[k] + v for k, v in metrics.items()}
        context = tf.distribute.get_replica_context()
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, total)
        # The optimizer clips (global norm 1.0) and applies; it does not reduce again.
        optimizer.apply_gradients(zip(total, variables))
        return {k: v / grad_accum for k, v in metric_sums.items()}

    @tf.function
    def train_loop(iterator, num_steps, stop_requested):
        """Mean metrics of `num_steps` steps, and `stop_requested` summed over all workers: a
        signal one worker got reaches every worker at the same step (what Model Garden's
        PreemptionCheckpointHandler does through the coordination service)."""
        sums = {k: tf.constant(0.0) for k in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")}
        for _ in tf.range(num_steps):
            micro_batches = [next(iterator) for _ in range(grad_accum)]
            per_replica = strategy.run(replica_step, args=(micro_batches,))
            sums = {k: sums[k] + strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica[k], axis=None) for k in sums}
        means = {k: v / tf.cast(num_steps, tf.float32) for k, v in sums.items()}
        means["stop_requested"] = strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(stop_requested,)), axis=None
        )
        return means

    return train_loop


def _make_eval_loop(strategy, model):
    def replica_eval(features, labels):
        return pretraining_losses(model(features, training=False), labels)

    @tf.function
    def eval_step(batch):
        per_replica = strategy.run(replica_eval, args=batch)
        return {k: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None) for k, v in per_replica.items()}

    return eval_step


def _evaluate(eval_step, strategy, files, opts: PretrainOptions, replicas: int) -> dict:
    """Held-out losses and accuracies over the first `eval_steps` batches of the eval data."""
    batch = max(1, opts.batch_size // replicas)

    def eval_input(context):
        return pretraining_dataset(
            files, batch, opts.max_seq_length, opts.max_predictions_per_seq, training=False, input_context=context
        ).repeat()

    iterator = iter(strategy.distribute_datasets_from_function(eval_input))
    sums, n = {}, 0
    for _ in range(opts.eval_steps):
        result = eval_step(next(iterator))
        for k, v in result.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    return {k: round(v / n, 6) for k, v in sums.items()}
