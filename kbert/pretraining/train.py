"""`pretrain(...)`: MLM + NSP pretraining as run_pretraining.py does it, on every Keras backend; a
ModernBERT continues its masked LM alone (`kbert.pretraining.pretrainers` says what each family trains).

The run reads as nanoGPT's train.py: setup, where the model starts, data, model and optimizer,
the loop, the finished model. The loop is written once, here; an engine runs what differs
between backends:

- `tf_engine.TensorFlowEngine` (KERAS_BACKEND=tensorflow): a custom `strategy.run` loop on any
  tf.distribute strategy, tf.data input and tf.train.CheckpointManager checkpoints;
- `keras_engine.KerasEngine` (JAX and PyTorch): Keras' own `fit`, kbert's TF-free record reader
  and `kbert.backend.checkpoints`; no TensorFlow is imported.

Per step, on every replica:

    loss = masked-LM loss (Σ w·xent / (Σ w + 1e-5), as the original) + mean next-sentence loss
           (a ModernBERT's: the masked-LM loss alone)
    gradients of loss, summed over micro-batches and replicas as the global batch's
    -> clipped to global norm 1.0 -> BertAdamW (or LAMB) with warmup + linear decay.

So the update equals the single-device update on the global batch, whatever the placement.

An engine answers, besides `kbert.pretraining.run_setup`'s questions (placement, record checks,
checkpoint kinds): `spread_over(placement)` (a context the run builds and trains in), `build(...)`
(the model and optimizer, restored for a resume: a `Training`), `start(files, eval_files, opts,
training)` (the input, open for the returned context), `train_steps(n, signals, last_saved)`
(`n` steps: their mean metrics, the steps run, and whether the run stops after them, or None to
ask the signals after the held-out scores), `learning_rate()`, `evaluate(opts, last_saved)`,
`save(step, last_saved)` and `event_log(log_dir)` (a TensorBoard writer of scalars).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import shutil
import time

import keras

from kbert.backend import writes_shared_files
from kbert.formats.model_dir import WEIGHTS_FILE
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.pretrainers import objective_of, write_model_files
from kbert.pretraining.run_record import record_run, recorded_options
from kbert.pretraining.run_setup import ModelStart, RunSetup, Training, check_one_start, has_checkpoint, set_up_run
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import claim_output
from kbert.training.interruption import StopSignals
from kbert.training.progress import Progress, keep_history_until, write_loss_plot

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
    """Pretrain a BERT with MLM + NSP, or a ModernBERT's masked LM (from `init`); returns the final
    metrics (also printed by the CLI).

    A new run records its flags in MODEL_DIR/pretrain_run.json. `resume=True` continues the
    run from its last checkpoint with those flags: the ones given (keyword arguments, and the
    fields of `options` that differ from the defaults) must agree with them, except `steps`
    (larger: extends the run) and those in `kbert.pretraining.run_record.RESUME_MAY_CHANGE`.

    Args:
        model_dir: str. Becomes a kbert model directory (bert_config.json, vocab.txt,
            model.weights.h5; a ModernBERT's: config.json, tokenizer.json, model.weights.h5) plus checkpoints/, logs/ (TensorBoard), metrics.jsonl, loss.png,
            pretrain_run.json.
        data: str. TFRecord file(s) or glob(s) made by create_pretraining_data.py or
            `kbert create-data`. With `resume`, default: the recorded files.
        config_file, vocab_file: str. Start from scratch with this bert_config.json and vocab.
        init: str. Or start from this kbert model directory (e.g. `kbert convert from-tf1`),
            for continued pretraining or phase 2 at sequence length 512; not with `config_file`
            or `vocab_file` (the model brings its own).
        options: `PretrainOptions`; keyword arguments override single fields.
        return_model: bool. Return `(metrics, model)` instead of the metrics alone.

    Example:
    >>> kbert.pretraining.train.pretrain("out/bert", "data/*.tfrecord", config_file="bert_config.json",
    ...                            vocab_file="vocab.txt", steps=1000, batch_size=32)  # doctest: +SKIP
    >>> kbert.pretraining.train.pretrain("out/bert", resume=True)  # after SIGTERM  # doctest: +SKIP
    """
    check_one_start(config_file, vocab_file, init)
    # The run's writer locks --model-dir, as the CLI does (kbert.runtime.files.claim_output); the other
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


def _engine():
    """The engine for Keras' backend: the one place pretraining asks which backend runs."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        from kbert.pretraining.tf_engine import TensorFlowEngine

        return TensorFlowEngine()
    from kbert.pretraining.keras_engine import KerasEngine

    return KerasEngine(backend)


def _pretrain(model_dir, data, config_file, vocab_file, init, do_lower_case, options, return_model, **overrides):
    """The run, in the order nanoGPT's train.py reads: setup, where the model starts, data, model
    and optimizer, the loop, the finished model."""
    model_dir = os.fspath(model_dir)
    engine = _engine()
    # First, before any TensorFlow op: multi-worker collectives must be set up at start-up.
    setup = set_up_run(engine, model_dir, data, config_file, vocab_file, init, do_lower_case, options, overrides)
    opts, start = setup.opts, setup.start

    with engine.spread_over(setup.placement):
        training = engine.build(opts, setup.placement, start, model_dir, setup.ckpt_dir)
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

        last, last_eval, speed = _train(engine, training, setup, model_dir)

        result = _finished(engine, training, opts, last, last_eval, speed, model_dir, start)
    return (result, training.model) if return_model else result


def _train(engine, training: Training, setup: RunSetup, model_dir):
    """The loop: `steps_per_loop` steps per engine call, up to the next save or eval; logs,
    held-out scores and checkpoints between calls; a stop signal saves and raises `Interrupted`.

    Returns the last call's metrics, the last held-out scores and the sequences per second."""
    opts, ckpt_dir, step = setup.opts, setup.ckpt_dir, training.step
    data = engine.start(setup.files, setup.eval_files, opts, training)

    # The files of the run: nothing was written before this point.
    created = training.chief and not os.path.exists(model_dir)
    with _removed_unless_saved(engine, model_dir, ckpt_dir, created):
        writer, eval_writer = _start_run_files(engine, opts, training, model_dir, setup.start, setup.run)
    eval_every = opts.eval_every or opts.save_every
    history_path = os.path.join(model_dir, METRICS_FILE)
    if training.chief:  # rows logged past the checkpoint resumed from come again: each step once
        keep_history_until(history_path, step)
    last, last_eval, last_saved = None, None, step
    timed_steps, timed_seconds = 0, 0.0  # throughput leaves out the first call (tracing, compiling)
    with (
        data,  # its reading ends with the run
        _removed_unless_saved(engine, model_dir, ckpt_dir, created),
        Progress(
            total=opts.steps, start=step, enabled=opts.progress and training.chief, sequences_per_step=opts.batch_size
        ) as bar,
        StopSignals() as signals,
        writer,
        eval_writer,
    ):
        while step < opts.steps:
            n = min(
                opts.steps_per_loop,
                opts.steps - step,
                _to_boundary(step, opts.save_every),
                _to_boundary(step, eval_every),
            )
            t0 = time.perf_counter()
            metrics, n, stop_requested = engine.train_steps(n, signals, last_saved)
            seconds = time.perf_counter() - t0
            _check_finite(metrics, step, n, last_saved)
            if step > training.step:
                timed_steps, timed_seconds = timed_steps + n, timed_seconds + seconds
            step += n
            metrics.update(
                step=step,
                learning_rate=engine.learning_rate(),
                sequences_per_second=n * opts.batch_size / seconds,
            )
            last = metrics
            bar.update(step, metrics)
            if training.chief:
                writer.scalars(step, _scalars(metrics))
                _append_history(history_path, metrics)
            if setup.eval_files and (step % eval_every == 0 or step == opts.steps):
                last_eval = engine.evaluate(opts, last_saved)
                bar.log(f"step {step}: held-out " + ", ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
                if training.chief:
                    eval_writer.scalars(step, _scalars(last_eval))
                    _append_history(history_path, dict(last_eval, step=step, split="eval"))
            if stop_requested is None:  # the engine leaves it to the signals, asked after the held-out scores
                stop_requested = signals.requested is not None
            if step % opts.save_every == 0 or step == opts.steps or stop_requested:
                engine.save(step, last_saved)
                last_saved = step
            if stop_requested and step < opts.steps:
                if training.chief:
                    write_loss_plot(history_path, os.path.join(model_dir, LOSS_PLOT))
                raise signals.interrupted(
                    step, "checkpoint saved", f"`kbert pretrain --model-dir {shlex.quote(model_dir)} --resume`"
                )
    speed = timed_steps * opts.batch_size / timed_seconds if timed_steps else last["sequences_per_second"]
    return last, last_eval, round(speed, 2)


def _start_run_files(engine, opts, training: Training, model_dir, start: ModelStart, run):
    """The chief writes a new run's model directory (no weights yet) and the run's record; its
    (train, eval) TensorBoard writers, or contexts that write nothing on the other workers."""
    if not training.chief:
        return contextlib.nullcontext(), contextlib.nullcontext()
    if not opts.resume:
        os.makedirs(model_dir, exist_ok=True)
        write_model_files(training.model, model_dir, start.vocab_file, start.do_lower_case, weights=False)
    record_run(model_dir, run, opts, training.warmup)
    writer = engine.event_log(os.path.join(model_dir, "logs", "train"))
    eval_writer = engine.event_log(os.path.join(model_dir, "logs", "eval"))
    return writer, eval_writer


def _finished(engine, training: Training, opts, last, last_eval, speed, model_dir, start: ModelStart) -> dict:
    """A finished run's model files (where this process writes them) and its result."""
    if training.chief:
        training.model.fresh_heads = ()  # pretraining trains every head: masked-LM, next-sentence and the pooler
        write_model_files(training.model, model_dir, start.vocab_file, start.do_lower_case, weights=True)
        write_loss_plot(os.path.join(model_dir, METRICS_FILE), os.path.join(model_dir, LOSS_PLOT))
    result = {k: last[k] for k in ("step", *objective_of(training.model).metric_names)}
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
        backend=engine.backend,
    )
    return result


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
    keys = ("step", *objective_of(model).metric_names, "learning_rate")
    result = {"step": step, **{k: logged[k] for k in keys if k in logged}, "model_dir": model_dir, "resumed_from": step}
    return (result, model) if return_model else result


@contextlib.contextmanager
def _removed_unless_saved(engine, model_dir: str, ckpt_dir: str, created: bool):
    """A new run that fails before its first checkpoint leaves no directory behind (config,
    logs and metrics of a run that cannot be resumed would only mislead)."""
    try:
        yield
    except BaseException:
        if created and not has_checkpoint(engine, ckpt_dir):
            shutil.rmtree(model_dir, ignore_errors=True)
        raise


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


def _scalars(metrics: dict) -> dict:
    """What TensorBoard draws of a metrics row: its numbers, without the step and split."""
    return {k: v for k, v in metrics.items() if k not in ("step", "split") and isinstance(v, float)}


def _to_boundary(step: int, every: int) -> int:
    return every - step % every
