"""`kbert finetune`: one small head on a pretrained BERT, trained with `model.fit`, as the paper did.

What differs between tasks (data, head, loss, metric) comes from the task's record in
`kbert.finetuning.tasks`; this module is the training run they share.

The optimizer is the original's (`optimization.create_optimizer`): AdamW without bias
correction, weight decay 0.01, linear warmup over `warmup_proportion` of the steps, then
linear decay to 0, global-norm clip 1.0. After each epoch the dev set is scored with the
task's metric; the best epoch's weights are what the output directory keeps.

Fine-tuning runs on one device or under MirroredStrategy, where Keras' `model.fit` works
(the multi-worker limitation that made pretraining use its own loop does not arise).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import keras
import tensorflow as tf

from kbert.config import sequence_length
from kbert.errors import KbertError
from kbert.files import atomic_output_dir, check_output_dir
from kbert.finetuning.options import FinetuneOptions
from kbert.finetuning.squad import write_predictions_json
from kbert.finetuning.tasks import (Task, TaskData, best_metric, get_task, json_floats, predict_outputs,
                                    squad_answers)
from kbert.model_dir import describe_source, open_model, save
from kbert.text.tokenizer import Tokenizer
from kbert.training.optimization import BertAdamW, WarmupLinearDecay
from kbert.training.progress import Progress
from kbert.training.strategy import make_strategy, use_mixed_precision

log = logging.getLogger("kbert")

RESULTS_FILE = "eval_results.json"


def compile_for_task(model, task: Task | str, optimizer):
    """`model.compile` with the task's losses (and loss weights)."""
    task = get_task(task) if isinstance(task, str) else task
    loss, weights = task.losses()
    model.compile(optimizer=optimizer, loss=loss, loss_weights=weights)


def make_finetune_optimizer(learning_rate, total_steps, warmup_steps):
    """The original's `optimization.create_optimizer` as a Keras optimizer."""
    return BertAdamW(WarmupLinearDecay(learning_rate, total_steps, warmup_steps), weight_decay_rate=0.01,
                     global_clipnorm=1.0)


def _warn_truncated(path, data: TaskData, max_seq_length):
    if data.truncated:
        log.warning("%s: %d of %d examples longer than --max-seq-length %d were truncated", path,
                    data.truncated, data.size, max_seq_length)


def finetune(model_dir, task, train, output, dev=None, options: FinetuneOptions | None = None, **overrides):
    """Fine-tune the model in `model_dir` on `train`; write the best epoch to `output`.

    Args:
        model_dir: str. A kbert model directory (converted or pretrained) or a google-research
            checkpoint directory (its casing decided by `kbert.model_dir.lower_case_for`).
        task: str. A name in `kbert.finetuning.tasks.TASKS`: classify | regress | tag | squad | choice.
        train, dev: str. Data files (see `kbert finetune --help` for the formats).
        output: str. The fine-tuned kbert model directory: bert_config.json (with task, labels,
            max_seq_length), vocab.txt, model.weights.h5, eval_results.json, logs/.
        options: `FinetuneOptions`; keyword arguments override single fields.

    Returns: the dev metrics of the best epoch (train metrics without --dev), with `epoch`.

    Example:
    >>> kbert.finetuning.train.finetune("uncased_L-12_H-768_A-12", "classify", "train.tsv", "out/mrpc",
    ...                                 dev="dev.tsv", epochs=3)  # doctest: +SKIP
    """
    opts = dataclasses.replace(options or FinetuneOptions(), **overrides)
    task = get_task(task)
    _check_options(opts)
    strategy = make_strategy(opts.strategy)
    check_output_dir(os.fspath(output), opts.overwrite)
    # --- data ---
    source = describe_source(model_dir)
    max_seq_length = sequence_length(opts.max_seq_length, source.config.max_position_embeddings,
                                     default=task.max_seq_length)
    tokenizer = Tokenizer(source.vocab_file, do_lower_case=source.do_lower_case)
    train_data = task.read(train, tokenizer, max_seq_length, None, opts, True, True)
    labels = train_data.labels
    if train_data.size == 0:
        raise KbertError(f"{train} has no usable rows; check the file (or --skip-bad-rows dropped them all)")
    if task.name == "classify" and len(labels) < 2:
        raise KbertError(f"{train} has only one label ({labels[0]!r}); classification needs at least two")
    _warn_truncated(train, train_data, max_seq_length)
    dev_data = None
    if dev:
        dev_data = task.read(dev, tokenizer, max_seq_length, labels, opts, True, False)
        _warn_truncated(dev, dev_data, max_seq_length)

    replicas = strategy.num_replicas_in_sync
    log.info("%s: %d training examples%s, %d replica%s", task.name, train_data.size,
             f", {len(labels)} labels" if labels else "", replicas, "s" if replicas > 1 else "")
    if opts.batch_size % replicas:
        raise KbertError(f"--batch-size {opts.batch_size} must divide evenly over {replicas} replicas; "
                         f"use a multiple of {replicas}")

    # --- model ---
    use_mixed_precision(opts.mixed_precision)
    keras.utils.set_random_seed(opts.seed)
    steps_per_epoch = max(1, train_data.size // opts.batch_size)
    total_steps = steps_per_epoch * opts.epochs
    with strategy.scope():
        model = task.build(open_model(model_dir, do_lower_case=source.do_lower_case), labels)
        task_info = {"task": task.name, "max_seq_length": max_seq_length}
        if labels is not None:
            task_info["labels"] = labels
        if task.name == "squad":
            task_info.update(doc_stride=opts.doc_stride, max_query_length=opts.max_query_length)
        if task.name in ("classify", "regress"):
            # Whether inputs are sentence pairs: the export's serving signature takes text_b only then.
            task_info["text_pairs"] = train_data.raw.texts_b is not None
        model.task_info = task_info
        compile_for_task(model, task, make_finetune_optimizer(
            opts.learning_rate, total_steps, int(total_steps * opts.warmup_proportion)))

    dataset = tf.data.Dataset.from_tensor_slices((train_data.features, train_data.targets))
    # As run_classifier.py: shuffle, and drop the last partial batch so every step has the same shape.
    dataset = dataset.shuffle(min(train_data.size, 100_000), seed=opts.seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(opts.batch_size, drop_remainder=train_data.size >= opts.batch_size)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)

    logs_dir = os.path.join(os.fspath(output) + ".partial-logs")
    tracker = _BestEpoch(task, dev_data, opts, source.do_lower_case, logs_dir, total_steps)
    callbacks = [tracker, keras.callbacks.TensorBoard(os.path.join(logs_dir, "fit"), update_freq="epoch")]
    start = time.perf_counter()
    model.fit(dataset, epochs=opts.epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=callbacks)
    elapsed = time.perf_counter() - start

    # --- keep the best epoch ---
    if tracker.best_weights is not None:
        model.set_weights(tracker.best_weights)
    result = dict(tracker.best_metrics or {})
    result["epoch"] = tracker.best_epoch
    result["train_examples_per_second"] = round(train_data.size * tracker.epochs_run / max(elapsed, 1e-9), 2)
    with atomic_output_dir(os.fspath(output), overwrite=opts.overwrite) as tmp:
        save(model, tmp, vocab_file=source.vocab_file, do_lower_case=source.do_lower_case, overwrite=True)
        with open(os.path.join(tmp, RESULTS_FILE), "w") as f:
            json.dump({"best": result, "history": tracker.history}, f, indent=2)
        if tracker.best_predictions is not None:
            write_predictions_json(tracker.best_predictions, os.path.join(tmp, "predictions.json"))
        if os.path.isdir(logs_dir):
            os.replace(logs_dir, os.path.join(tmp, "logs"))
    return json_floats(result)


def _check_options(opts: FinetuneOptions):
    for name in ("epochs", "batch_size"):
        if getattr(opts, name) < 1:
            raise KbertError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(opts, name)}")
    if not 0.0 <= opts.warmup_proportion < 1.0:
        raise KbertError(f"--warmup-proportion must be in [0, 1), got {opts.warmup_proportion}")
    if opts.learning_rate <= 0:
        raise KbertError(f"--learning-rate must be positive, got {opts.learning_rate}")
    if opts.max_seq_length is not None and opts.max_seq_length < 8:
        raise KbertError(f"--max-seq-length must be at least 8, got {opts.max_seq_length}")
    if opts.strategy not in ("auto", "cpu", "gpu", "mirrored"):
        raise KbertError(f"--strategy {opts.strategy!r}: fine-tuning runs on auto, cpu, gpu or mirrored")



class _BestEpoch(keras.callbacks.Callback):
    """After each epoch: score dev with the task's metric, keep the best weights, stop early,
    drive the progress bar and write the dev metrics to TensorBoard."""

    def __init__(self, task: Task, dev_data, opts, do_lower_case, logs_dir, total_steps):
        super().__init__()
        self.task, self.dev_data, self.opts = task, dev_data, opts
        self.do_lower_case, self.logs_dir = do_lower_case, logs_dir
        self.best_value, self.best_epoch, self.best_weights = -float("inf"), 0, None
        self.best_metrics, self.best_predictions, self.history = None, None, []
        self.epochs_run, self.stale = 0, 0
        self.progress = Progress(total_steps, enabled=opts.progress, sequences_per_step=opts.batch_size,
                                 description=f"finetune {task.name}")
        self.step, self.started, self.batch_size = 0, None, opts.batch_size
        self.writer = None

    def on_train_begin(self, logs=None):
        self.progress.__enter__()
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        rate = self.step * self.batch_size / max(time.perf_counter() - self.started, 1e-9)
        self.progress.update(self.step, {"loss": float((logs or {}).get("loss", float("nan"))),
                                         "sequences_per_second": rate})

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_run = epoch + 1
        row = {"epoch": epoch + 1, "loss": float((logs or {}).get("loss", float("nan")))}
        if self.dev_data is not None:
            outputs = predict_outputs(self.model, self.dev_data, self.opts.batch_size)
            metrics = self.task.score(self.dev_data, outputs, self.opts, self.do_lower_case)
            name, value = best_metric(self.task.name, metrics)
            row.update({f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
        else:
            metrics, name, value = {"loss": row["loss"]}, "loss", -row["loss"]
        self.history.append(json_floats(row))
        self.progress.log(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()
                                                             if isinstance(v, float)))
        if self.writer is None:
            self.writer = tf.summary.create_file_writer(os.path.join(self.logs_dir, "dev"))
        with self.writer.as_default():
            for k, v in row.items():
                if k != "epoch" and isinstance(v, float):
                    tf.summary.scalar(k, v, step=epoch + 1)
        self.writer.flush()
        if value > self.best_value:
            self.best_value, self.best_epoch, self.stale = value, epoch + 1, 0
            self.best_weights = self.model.get_weights()
            self.best_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            if self.task.name == "squad" and self.dev_data is not None:
                self.best_predictions, _ = squad_answers(self.dev_data, outputs, self.opts, self.do_lower_case)
        else:
            self.stale += 1
            if self.opts.patience is not None and self.stale >= self.opts.patience:
                self.progress.log(f"early stop: no better dev {name} for {self.stale} epochs "
                                  f"(best {self.best_value:.4f} at epoch {self.best_epoch})")
                self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.progress.__exit__(None, None, None)
