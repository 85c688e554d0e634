"""`pretrain(...)` on JAX and PyTorch: the run of `train.py`, trained by Keras' own compiled step.

`kbert pretrain` with `KERAS_BACKEND=jax` or `torch` comes here (`train.pretrain` dispatches), and
imports no TensorFlow: the records are read by `record_reader` (CRC-checked, batched in a
background thread), checkpoints are `kbert.training.checkpoints`' and the TensorBoard logs
`kbert.training.event_log`'s. Everything a user sees is the TensorFlow loop's: the same options and
run record, model, losses and BertAdamW (warmup, linear decay, global-norm clip 1.0, weight decay),
checkpoints every `save_every` steps, `resume` from the last one, SIGTERM/SIGINT saving the step
reached, progress, metrics.jsonl, logs/, loss.png, held-out scores and the final model directory.

The step is Keras': `fit` over `steps_per_loop` steps at a time (between them: logs, held-out
scores, checkpoints, a stop request), which JAX compiles with XLA (`jit`) and PyTorch runs eagerly
(or through torch.compile with `jit=True`). On JAX, `strategy` "mirrored" (and "auto", on GPUs or
TPUs) spreads each batch over the local devices with `keras.distribution.DataParallel`: the loss and
its gradient are those of the global batch, as on one device.

Example:
>>> import os
>>> os.environ["KERAS_BACKEND"] = "jax"  # before Keras is imported  # doctest: +SKIP
>>> from kbert.pretraining.train import pretrain
>>> pretrain("out/bert", "data/*.tfrecord", config_file="bert_config.json", vocab_file="vocab.txt",
...          steps=1000, batch_size=32)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import time

import keras
from keras import ops

from kbert.backend import pretraining_placement, use_mixed_precision
from kbert.errors import KbertError, option
from kbert.model.bert import BertPretrainer
from kbert.model_dir import WEIGHTS_FILE, write_model_files
from kbert.pretraining.losses import pretraining_losses
from kbert.pretraining.record_reader import numpy_batches
from kbert.pretraining.run_record import record_run
from kbert.pretraining.train import (
    LOSS_PLOT,
    METRICS_FILE,
    _append_history,
    _check_finite,
    _copied_in_scope,
    _finish_trained_run,
    _finished,
    _removed_unless_saved,
    _setup,
    _Start,
    _to_boundary,
)
from kbert.training.checkpoints import latest_training_state, restore_training_state, save_training_state
from kbert.training.event_log import EventLog
from kbert.training.interruption import StopSignals
from kbert.training.optimization import make_optimizer
from kbert.training.progress import Progress, keep_history_until, write_loss_plot

log = logging.getLogger("kbert")

METRIC_NAMES = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")


class PretrainingModel(keras.Model):
    """A `BertPretrainer` with run_pretraining.py's losses, for Keras' `fit` and `evaluate`.

    `compute_loss` is the original's MLM + NSP loss (`kbert.pretraining.losses`); the parts and
    accuracies are tracked beside Keras' own `loss`, so `fit` reports their means over its steps.
    The weights are the pretrainer's: a checkpoint or `kbert.save` of `pretrainer` is the model.

    Args:
        pretrainer: BertPretrainer. The model to train.

    Example:
    >>> import numpy as np
    >>> config = kbert.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                           intermediate_size=16)
    >>> model = PretrainingModel(kbert.bert_pretrainer(config))
    >>> model.compile(optimizer="adam")
    >>> features = {"input_ids": np.ones((2, 6), "int32"), "input_mask": np.ones((2, 6), "int32"),
    ...             "segment_ids": np.zeros((2, 6), "int32"), "masked_lm_positions": np.array([[1, 2]] * 2, "int32")}
    >>> labels = {"masked_lm_ids": np.array([[3, 4]] * 2), "masked_lm_weights": np.ones((2, 2), "float32"),
    ...           "next_sentence_labels": np.array([0, 1])}
    >>> sorted(model.fit(features, labels, epochs=1, verbose=0).history)
    ['loss', 'mlm_accuracy', 'mlm_loss', 'nsp_accuracy', 'nsp_loss']
    """

    def __init__(self, pretrainer: BertPretrainer, **kwargs):
        super().__init__(**kwargs)
        self.pretrainer = pretrainer
        # Keras tracks these (a model's metric attributes) beside its own `loss`; fit resets them.
        self.trackers = {name: keras.metrics.Mean(name=name) for name in METRIC_NAMES[1:]}
        self.built = True  # the pretrainer is built; fit must not draw a batch to build it

    def call(self, features, training=False):
        outputs = self.pretrainer(features, training=training)
        return {"mlm_logits": outputs["mlm_logits"], "nsp_logits": outputs["nsp_logits"]}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        losses = pretraining_losses(y_pred, y)
        for name, tracker in self.trackers.items():
            tracker.update_state(ops.stop_gradient(losses[name]))
        return losses["loss"]


@dataclasses.dataclass
class _Training:
    """What the loop trains: the pretrainer inside its `fit` model, the optimizer, where it starts."""

    model: PretrainingModel
    optimizer: keras.optimizers.Optimizer
    step: int  # the step restored (0 for a new run)
    replicas: int
    warmup: int
    jit: bool


def pretrain(model_dir, data, config_file, vocab_file, init, do_lower_case, options, return_model, **overrides):
    """`kbert.pretraining.train.pretrain` on JAX or PyTorch (it calls this, holding the lock on
    `model_dir`); the same arguments and result."""
    model_dir = os.fspath(model_dir)
    setup = _setup(model_dir, data, config_file, vocab_file, init, do_lower_case, options, overrides, _devices)
    opts, run, devices, start, files, eval_files, ckpt_dir = setup

    with _spread_over(devices):
        return _run(opts, devices, start, files, eval_files, model_dir, ckpt_dir, run, return_model)


def _devices(opts) -> list:
    """The devices the run spreads over; the options only TensorFlow's loop takes are refused."""
    devices = pretraining_placement(opts.strategy, opts.tpu)
    if opts.grad_accum != 1:
        raise KbertError(
            f"{option('grad_accum', opts.grad_accum)} runs on TensorFlow only; on {keras.config.backend()} leave it out "
            "(a larger batch over more devices), or run with KERAS_BACKEND=tensorflow"
        )
    return devices


@contextlib.contextmanager
def _spread_over(devices: list):
    """Keras' distribution for the run: DataParallel over several devices; the caller's after it."""
    previous = keras.distribution.distribution()
    if len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def _run(opts, devices, start: _Start, files, eval_files, model_dir, ckpt_dir, run, return_model):
    """The model and optimizer, the loop, the finished model and the result."""
    training = _model_and_optimizer(opts, devices, start, ckpt_dir)
    pretrainer = training.model.pretrainer
    if training.step >= opts.steps:
        if not os.path.exists(os.path.join(model_dir, WEIGHTS_FILE)):
            # Trained to the end, then the model files failed (a full disk): write them now.
            return _finish_trained_run(
                pretrainer, model_dir, start.vocab_file, start.do_lower_case, training.step, return_model
            )
        raise KbertError(
            f"the run in {model_dir} is already at step {training.step} of {option('steps', opts.steps)}; "
            f"raise {option('steps')} to train further"
        )

    last, last_eval, speed = _train(opts, training, files, eval_files, model_dir, ckpt_dir, start, run)

    result = _finished(pretrainer, training, opts, last, last_eval, speed, model_dir, start)
    return (result, pretrainer) if return_model else result


def _model_and_optimizer(opts, devices: list, start: _Start, ckpt_dir: str) -> _Training:
    """Precision, the model over `devices`, its optimizer and compiled step; restored for a resume."""
    use_mixed_precision(opts.mixed_precision)
    replicas = len(devices)
    if opts.batch_size % replicas:
        raise KbertError(
            f"{option('batch_size', opts.batch_size)} must divide evenly over {replicas} devices; "
            f"use a multiple of {replicas}"
        )
    warmup = opts.warmup_steps if opts.warmup_steps is not None else opts.steps // 10
    # Keras' default: XLA on JAX; PyTorch runs eagerly unless asked (torch.compile).
    jit = (keras.config.backend() == "jax") if opts.jit is None else opts.jit
    keras.utils.set_random_seed(opts.seed)  # the same initial weights for the same --seed
    pretrainer = (
        BertPretrainer(start.config) if start.initial is None else _copied_in_scope(start.initial, start.config)
    )
    model = PretrainingModel(pretrainer)
    # A float16 policy makes compile wrap the optimizer in a LossScaleOptimizer.
    model.compile(optimizer=make_optimizer(opts.optimizer, opts.learning_rate, opts.steps, warmup), jit_compile=jit)
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    step = 0
    if opts.resume:
        restore_training_state(latest_training_state(ckpt_dir), pretrainer, optimizer)
        step = int(ops.convert_to_numpy(optimizer.iterations))
        log.info("resumed from step %d", step)
    return _Training(model, optimizer, step, replicas, warmup, jit)


class _StepsRun(keras.callbacks.Callback):
    """Counts the steps `fit` ran, and ends it a step or so after a stop is requested.

    Keras runs it off the training thread (`async_safe`), so that no step waits for the last one's
    logs to reach the host; it has counted every step when `fit` returns.
    """

    async_safe = True

    def __init__(self, signals: StopSignals, model: keras.Model):
        super().__init__()
        # The model itself, not `self.model`: on JAX that property first copies the step's state
        # into the variables, which from this thread would race the next step (it donates them).
        self.signals, self.steps, self.fitted = signals, 0, model

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.signals.requested is not None:
            self.fitted.stop_training = True


def _train(opts, training: _Training, files, eval_files, model_dir, ckpt_dir, start: _Start, run):
    """The loop of `train._train`: `fit` over up to `steps_per_loop` steps, then logs, held-out
    scores and checkpoints; a stop signal saves and raises `Interrupted`.

    Returns the last call's metrics, the last held-out scores and the sequences per second."""
    model, optimizer, step = training.model, training.optimizer, training.step
    batches = numpy_batches(
        files,
        opts.batch_size,
        opts.max_seq_length,
        opts.max_predictions_per_seq,
        training=True,
        seed=opts.seed,
        skip_batches=step,
    )
    created = not os.path.exists(model_dir)
    with _removed_unless_saved(model_dir, ckpt_dir, created):
        if not opts.resume:
            os.makedirs(model_dir, exist_ok=True)
            write_model_files(model.pretrainer, model_dir, start.vocab_file, start.do_lower_case, weights=False)
        record_run(model_dir, run, opts, training.warmup)
        writer = EventLog(os.path.join(model_dir, "logs", "train"))
        eval_writer = EventLog(os.path.join(model_dir, "logs", "eval"))
    eval_every = opts.eval_every or opts.save_every
    history_path = os.path.join(model_dir, METRICS_FILE)
    keep_history_until(history_path, step)  # rows logged past the checkpoint resumed from come again
    last, last_eval, last_saved = None, None, step
    timed_steps, timed_seconds = 0, 0.0  # throughput leaves out the first call (compiling)
    with (
        contextlib.closing(batches),  # its reading thread ends with the run
        _removed_unless_saved(model_dir, ckpt_dir, created),
        Progress(total=opts.steps, start=step, enabled=opts.progress, sequences_per_step=opts.batch_size) as bar,
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
            steps_run = _StepsRun(signals, model)
            t0 = time.perf_counter()
            model.fit(_take(batches, n), steps_per_epoch=n, epochs=1, verbose=0, shuffle=False, callbacks=[steps_run])
            metrics = {k: float(v) for k, v in model.get_metrics_result().items() if k in METRIC_NAMES}
            seconds = time.perf_counter() - t0
            n = steps_run.steps
            _check_finite(metrics, step, n, last_saved)
            if step > training.step:
                timed_steps, timed_seconds = timed_steps + n, timed_seconds + seconds
            step += n
            metrics.update(
                step=step,
                learning_rate=float(ops.convert_to_numpy(optimizer.learning_rate)),
                sequences_per_second=n * opts.batch_size / seconds,
            )
            last = metrics
            bar.update(step, metrics)
            writer.scalars(step, _scalars(metrics))
            _append_history(history_path, metrics)
            if eval_files and (step % eval_every == 0 or step == opts.steps):
                last_eval = _evaluate(model, eval_files, opts)
                bar.log(f"step {step}: held-out " + ", ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
                eval_writer.scalars(step, _scalars(last_eval))
                _append_history(history_path, dict(last_eval, step=step, split="eval"))
            stop_requested = signals.requested is not None
            if step % opts.save_every == 0 or step == opts.steps or stop_requested:
                save_training_state(
                    ckpt_dir, step, model.pretrainer, optimizer, extra={"step": step}, keep=opts.keep_checkpoints
                )
                last_saved = step
            if stop_requested and step < opts.steps:
                write_loss_plot(history_path, os.path.join(model_dir, LOSS_PLOT))
                raise signals.interrupted(
                    step, "checkpoint saved", f"`kbert pretrain --model-dir {shlex.quote(model_dir)} --resume`"
                )
    speed = timed_steps * opts.batch_size / timed_seconds if timed_steps else last["sequences_per_second"]
    return last, last_eval, round(speed, 2)


def _scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("step", "split") and isinstance(v, float)}


def _take(batches, n: int):
    """The next `n` batches, as a generator (what `fit` and `evaluate` take)."""
    for _ in range(n):
        yield next(batches)


def _eval_batches(files, opts):
    """Held-out batches of `batch_size`, the eval files read again and again. A last partial batch
    is left out (it would split unevenly over devices), unless the files hold no full one."""
    while True:
        full = False
        for features, labels in numpy_batches(
            files, opts.batch_size, opts.max_seq_length, opts.max_predictions_per_seq, training=False
        ):
            if len(labels["next_sentence_labels"]) == opts.batch_size:
                full = True
                yield features, labels
            elif not full:
                yield features, labels


def _evaluate(model: PretrainingModel, files, opts) -> dict:
    """Held-out losses and accuracies: their means over the first `eval_steps` batches of the eval data."""
    scores = model.evaluate(
        _take(_eval_batches(files, opts), opts.eval_steps),
        steps=opts.eval_steps,
        verbose=0,
        return_dict=True,
    )
    return {k: round(float(scores[k]), 6) for k in METRIC_NAMES}
