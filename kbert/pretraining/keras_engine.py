"""The pretraining engine of JAX and PyTorch: Keras' own compiled step, without TensorFlow.

`kbert.pretraining.train`'s loop runs it with `KERAS_BACKEND=jax` or `torch`, and no TensorFlow is
imported: the records are read by `record_reader` (CRC-checked, batched in a background thread),
checkpoints are `kbert.backend.checkpoints`' and the TensorBoard logs `kbert.backend.event_log`'s.
Everything a user sees is the TensorFlow engine's: the same options and run record, model, losses
and BertAdamW (warmup, linear decay, global-norm clip 1.0, weight decay), checkpoints every
`save_every` steps, `resume` from the last one, SIGTERM/SIGINT saving the step reached, progress,
metrics.jsonl, logs/, loss.png, held-out scores and the final model directory.

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
import logging
import os

import keras
from keras import ops

from kbert.backend import COMPILES_STEPS, keras_batches, pretraining_placement, use_mixed_precision
from kbert.backend.checkpoints import latest_training_state, restore_training_state, save_training_state
from kbert.backend.event_log import EventLog
from kbert.pretraining import record_checks
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.pretrainers import MASKED_LM_AND_NEXT_SENTENCE, Objective, copied_in_scope, new_pretrainer
from kbert.pretraining.record_reader import numpy_batches
from kbert.pretraining.run_setup import ModelStart, Training
from kbert.runtime.errors import KbertError, option
from kbert.training.interruption import StopSignals
from kbert.training.optimization import make_optimizer

log = logging.getLogger("kbert")


class PretrainingModel(keras.Model):
    """A pretrainer with its objective's losses, for Keras' `fit` and `evaluate`.

    `compute_loss` is the objective's loss (`kbert.pretraining.pretrainers.Objective`: a BERT's
    MLM + NSP, as the original's, or a ModernBERT's MLM alone); the parts and accuracies are
    tracked beside Keras' own `loss`, so `fit` reports their means over its steps. The weights
    are the pretrainer's: a checkpoint or `kbert.save` of `pretrainer` is the model.

    Args:
        pretrainer: a BertPretrainer or ModernBertMaskedLM. The model to train.
        objective: `Objective`. What it trains (default: a BERT's masked LM + next sentence).

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

    def __init__(self, pretrainer, objective: Objective = MASKED_LM_AND_NEXT_SENTENCE, **kwargs):
        super().__init__(**kwargs)
        self.pretrainer, self.objective = pretrainer, objective
        # Keras tracks these (a model's metric attributes) beside its own `loss`; fit resets them.
        self.trackers = {name: keras.metrics.Mean(name=name) for name in objective.metric_names[1:]}
        self.built = True  # the pretrainer is built; fit must not draw a batch to build it

    def call(self, features, training=False):
        outputs = self.pretrainer(features, training=training)
        return {name: outputs[name] for name in self.objective.outputs}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        losses = self.objective.losses(y_pred, y)
        for name, tracker in self.trackers.items():
            tracker.update_state(ops.stop_gradient(losses[name]))
        return losses["loss"]


class KerasEngine:
    """What `kbert.pretraining.train`'s loop asks of JAX or PyTorch: Keras devices, the TF-free
    record reader, `fit` over N steps, `evaluate`, kbert.backend.checkpoints, EventLog logs.

    Args:
        backend: str. Keras' backend, "jax" or "torch".
    """

    checkpoint_kind = "keras"  # kbert.backend.checkpoints' ckpt-N folders
    other_backends = "TensorFlow"
    resume_advice = "resume with KERAS_BACKEND=tensorflow"
    check_records = staticmethod(record_checks.check_records)

    def __init__(self, backend: str):
        self.backend = backend

    def place(self, opts: PretrainOptions) -> list:
        """The devices the run spreads over; the options only TensorFlow's engine takes are refused."""
        devices = pretraining_placement(opts.strategy, opts.tpu)
        if opts.grad_accum != 1:
            raise KbertError(
                f"{option('grad_accum', opts.grad_accum)} runs on TensorFlow only; on {self.backend} leave it out "
                "(a larger batch over more devices), or run with KERAS_BACKEND=tensorflow"
            )
        return devices

    @staticmethod
    def tensorflow_checkpoint_in(ckpt_dir: str) -> bool:
        """Told from the files alone, without TensorFlow: its `checkpoint` state file."""
        return os.path.isfile(os.path.join(ckpt_dir, "checkpoint"))

    @contextlib.contextmanager
    def spread_over(self, devices: list):
        """Keras' distribution for the run: DataParallel over several devices; the caller's after it."""
        previous = keras.distribution.distribution()
        if len(devices) > 1:
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        try:
            yield
        finally:
            keras.distribution.set_distribution(previous)

    def build(self, opts, devices: list, start: ModelStart, model_dir, ckpt_dir) -> Training:
        """Precision, the model over `devices`, its optimizer and compiled step; restored for a resume."""
        use_mixed_precision(opts.mixed_precision, opts.mixed_precision_dtype)
        replicas = len(devices)
        if opts.batch_size % replicas:
            raise KbertError(
                f"{option('batch_size', opts.batch_size)} must divide evenly over {replicas} devices; "
                f"use a multiple of {replicas}"
            )
        warmup = opts.warmup_steps if opts.warmup_steps is not None else opts.steps // 10
        # XLA on JAX; PyTorch runs eagerly unless asked (torch.compile).
        jit = COMPILES_STEPS if opts.jit is None else opts.jit
        keras.utils.set_random_seed(opts.seed)  # the same initial weights for the same --seed
        pretrainer = (
            new_pretrainer(start.config, start.vocab_file) if start.initial is None else copied_in_scope(start.initial)
        )
        model = PretrainingModel(pretrainer, start.objective)
        # A float16 policy makes compile wrap the optimizer in a LossScaleOptimizer.
        model.compile(optimizer=make_optimizer(opts.optimizer, opts.learning_rate, opts.steps, warmup), jit_compile=jit)
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)
        step = 0
        if opts.resume:
            restore_training_state(latest_training_state(ckpt_dir), pretrainer, optimizer)
            step = int(ops.convert_to_numpy(optimizer.iterations))
            log.info("resumed from step %d", step)
        self.model, self.optimizer, self.ckpt_dir, self.keep = model, optimizer, ckpt_dir, opts.keep_checkpoints
        self.objective = start.objective
        return Training(pretrainer, step, replicas, warmup, jit)

    def start(self, files, eval_files, opts, training: Training):
        """The training batches from the step reached on; closing the returned context ends their
        reading thread."""
        self.eval_files = eval_files
        layout = self.objective.record_layout(opts)
        self.batches = numpy_batches(
            files, opts.batch_size, training=True, seed=opts.seed, skip_batches=training.step, **layout
        )
        return contextlib.closing(self.batches)

    def train_steps(self, n: int, signals: StopSignals, last_saved: int):
        """`fit` over up to `n` steps (fewer once a stop is requested): (mean metrics, steps run,
        None: the loop asks the signals itself, after the held-out scores)."""
        steps_run = _StepsRun(signals, self.model)
        self.model.fit(
            keras_batches(_take(self.batches, n)),
            steps_per_epoch=n,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[steps_run],
        )
        metrics = {k: float(v) for k, v in self.model.get_metrics_result().items() if k in self.objective.metric_names}
        return metrics, steps_run.steps, None

    def learning_rate(self) -> float:
        return float(ops.convert_to_numpy(self.optimizer.learning_rate))

    def evaluate(self, opts: PretrainOptions, last_saved: int) -> dict:
        """Held-out losses and accuracies: their means over the first `eval_steps` batches of the eval data."""
        scores = self.model.evaluate(
            keras_batches(_take(_eval_batches(self.eval_files, opts, self.objective), opts.eval_steps)),
            steps=opts.eval_steps,
            verbose=0,
            return_dict=True,
        )
        return {k: round(float(scores[k]), 6) for k in self.objective.metric_names}

    def save(self, step: int, last_saved: int):
        save_training_state(
            self.ckpt_dir, step, self.model.pretrainer, self.optimizer, extra={"step": step}, keep=self.keep
        )

    def event_log(self, log_dir: str) -> EventLog:
        return EventLog(log_dir)


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


def _take(batches, n: int):
    """The next `n` batches, as a generator (what `fit` and `evaluate` take)."""
    for _ in range(n):
        yield next(batches)


def _eval_batches(files, opts, objective: Objective):
    """Held-out batches of `batch_size`, the eval files read again and again. A last partial batch
    is left out (it would split unevenly over devices), unless the files hold no full one."""
    while True:
        full = False
        for features, labels in numpy_batches(files, opts.batch_size, training=False, **objective.record_layout(opts)):
            if len(labels["masked_lm_ids"]) == opts.batch_size:
                full = True
                yield features, labels
            elif not full:
                yield features, labels
