"""`kbert finetune`: one small head on a pretrained BERT, trained with `model.fit`, as the paper did.

What differs between tasks (data, head, loss, metric) comes from the task's record in
`kbert.finetuning.tasks`; this module is the training run they share.

The optimizer is the original's (`optimization.create_optimizer`): AdamW without bias
correction, weight decay 0.01, linear warmup over `warmup_proportion` of the steps, then
linear decay to 0, global-norm clip 1.0. After each epoch the dev set is scored with the
task's metric; the best epoch's weights are what the output directory keeps.

An unfinished run lives in OUTPUT.partial/: a checkpoint every `save_every` steps and at each
epoch's end (weights, optimizer, dropout seeds), and state.json with the best epoch so far, its
weights and the dev history. SIGTERM or SIGINT saves after the batch in flight and exits;
`--resume` goes on from that very step (each epoch's data order comes from `seed + epoch`,
so the rest of an epoch can be replayed exactly), and the run ends as an uninterrupted one
would. Keras' BackupAndRestore was the natural piece, but it resumes at the start of an
epoch, writes its files in place (a kill during a save loses both) and knows nothing of the
best epoch.

Fine-tuning runs on one device or under MirroredStrategy, where Keras' `model.fit` works
(the multi-worker limitation that made pretraining use its own loop does not arise).

On Keras' JAX and PyTorch backends the run needs no TensorFlow: the Python tokenizer and numpy
pack the data (`kbert.text.packing.PythonPreprocessor`, the same ids), each epoch's batches
are numpy arrays in the order numpy's generator draws from `seed + epoch`, checkpoints are
`kbert.backend.checkpoints`' and the TensorBoard logs `kbert.backend.event_log`'s. It runs on the
backend's default device (the GPU where there is one).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import os
import shutil
import time

import keras
import numpy as np

from kbert import backend
from kbert.backend.checkpoints import checkpoint_write_failed
from kbert.config import sequence_length
from kbert.finetuning.encoding import log_truncated
from kbert.finetuning.options import FinetuneOptions, resolve_options, window_stride
from kbert.finetuning.run_state import STATE_FILE, interrupted_finetuning
from kbert.finetuning.squad_decoding import write_predictions_json
from kbert.finetuning.tasks import Task, best_metric, get_task
from kbert.finetuning.tasks.base import TaskData, json_floats
from kbert.formats.model_dir import CHECKPOINTS_DIR, save
from kbert.formats.sources import open_model
from kbert.model.families import make_packer
from kbert.runtime.errors import KbertError, on_command_line, op_error_text, option
from kbert.runtime.files import PARTIAL_SUFFIX, atomic_output_dir, atomic_write_text, check_output_dir, writes
from kbert.training.interruption import FinishingSignals, StopSignals
from kbert.training.optimization import BertAdamW, WarmupLinearDecay
from kbert.training.progress import Progress

log = logging.getLogger("kbert")

RESULTS_FILE = "eval_results.json"

# A run's settings that state.json holds only since a later release: an older run's resume does not compare them.
NOT_RECORDED_BEFORE = ("warmup_proportion", "mixed_precision", "format", "skip_bad_rows")
# How --group-by-length sorts rows (`kbert.backend.portable.length_grouped`); runs of the release
# that sorted by all texts' tokens added record none, and cannot resume in this order.
LENGTH_ORDER = "longest text"


def compile_for_task(model, task: Task | str, optimizer, options: FinetuneOptions | None = None):
    """`model.compile` with the task's losses (and loss weights)."""
    task = get_task(task) if isinstance(task, str) else task
    loss, weights = task.losses(options)
    model.compile(optimizer=optimizer, loss=loss, loss_weights=weights, jit_compile=backend.COMPILES_STEPS)


def make_finetune_optimizer(learning_rate, total_steps, warmup_steps):
    """The original's `optimization.create_optimizer` as a Keras optimizer."""
    return BertAdamW(
        WarmupLinearDecay(learning_rate, total_steps, warmup_steps), weight_decay_rate=0.01, global_clipnorm=1.0
    )


def _warn_truncated(path, data: TaskData, max_seq_length):
    total, what = data.packed()
    log_truncated(path, data.truncated, total, max_seq_length, what=what)


@writes("output", inputs=("model_dir", "train", "dev"))
def finetune(model_dir, task, train, output, dev=None, options: FinetuneOptions | None = None, **overrides):
    """Fine-tune the model in `model_dir` on `train`; write the best epoch to `output`.

    Args:
        model_dir: str. A kbert model directory (converted or pretrained) or a google-research
            checkpoint directory (its casing decided by `kbert.formats.model_dir.lower_case_for`).
        task: str. A name in `kbert.finetuning.tasks.TASKS`: classify | regress | tag | squad | choice | embed | rerank.
        train, dev: str. Data files (see `kbert finetune --help` for the formats).
        output: str. The fine-tuned kbert model directory: bert_config.json (with task, labels,
            max_seq_length), vocab.txt, model.weights.h5, eval_results.json, logs/.
        options: `FinetuneOptions`; keyword arguments override single fields.

    Returns: the dev metrics of the best epoch (train metrics without --dev), with `epoch`.

    Example:
    >>> kbert.finetuning.train.finetune("uncased_L-12_H-768_A-12", "classify", "train.tsv", "out/mrpc",
    ...                                 dev="dev.tsv", epochs=3)  # doctest: +SKIP
    """
    # --- setup ---
    opts = resolve_options(options, overrides)  # checks every number: one line each
    task = get_task(task)
    task.check_options(opts)
    strategy = backend.finetuning_placement(opts.strategy)  # a tf.distribute strategy, or one device
    check_output_dir(os.fspath(output), opts.overwrite)
    opts = _settled_mixed_precision(opts, os.fspath(output) + PARTIAL_SUFFIX)
    backend.use_mixed_precision(opts.mixed_precision, opts.mixed_precision_dtype)
    # rerank: the file with the negatives it mined; before the seed, so that a run on that file
    # repeats this one (mining draws from the random generators).
    train = task.training_file(train, output, opts)
    backend.set_random_seed(opts.seed)
    # The pretrained model, opened once: its config, vocabulary and casing say how to read the data.
    with strategy.scope():
        base = open_model(model_dir)
    opts = task.settle(base, opts, where=os.fspath(model_dir))  # embed: the pooling the base records

    # --- data ---
    max_seq_length = sequence_length(
        opts.max_seq_length, base.config.max_position_embeddings, default=task.max_seq_length
    )
    if opts.long_text == "windows":  # the stride, now that the window's length is known (the default's half of it)
        opts = dataclasses.replace(opts, doc_stride=window_stride(opts.doc_stride, max_seq_length))
    train_data, dev_data = _read_data(task, base, train, dev, opts, max_seq_length, strategy.num_replicas_in_sync)

    # --- model and optimizer: the task's head on the base, declaring what predict, evaluate and export read ---
    steps_per_epoch = max(1, train_data.size // opts.batch_size)
    total_steps = steps_per_epoch * opts.epochs
    with strategy.scope():
        model = task.build(base, labels=train_data.labels, task_info=_task_info(task, opts, max_seq_length, train_data))
        compile_for_task(
            model,
            task,
            make_finetune_optimizer(opts.learning_rate, total_steps, int(total_steps * opts.warmup_proportion)),
            opts,
        )
        model.optimizer.build(model.trainable_variables)  # its slots must exist to be restored

    # --- the loop: one fit per epoch, checkpoints in OUTPUT.partial/ ---
    run_dir = os.fspath(output) + PARTIAL_SUFFIX  # an unfinished run: checkpoints/, state.json, logs/
    fingerprint = _fingerprint(model_dir, task, train, dev, opts, max_seq_length, train_data)
    tracker = _BestEpoch(task, dev_data, opts, model.do_lower_case, os.path.join(run_dir, "logs"))
    saver = _RunCheckpoints(run_dir, model, tracker, fingerprint, steps_per_epoch, opts.save_every)
    step = saver.resume() if opts.resume else saver.start(opts.overwrite)
    start, start_step = time.perf_counter(), step
    _fit_epochs(model, task, opts, train_data, tracker, saver, step, total_steps, steps_per_epoch)
    elapsed = time.perf_counter() - start

    # --- finish: keep the best epoch; training is over, so a signal now waits for the output ---
    with FinishingSignals(os.fspath(output)):
        if tracker.best_weights is not None:
            model.set_weights(tracker.best_weights)
        result = dict(tracker.best_metrics or {})
        result["epoch"] = tracker.best_epoch
        steps = saver.step - start_step
        result["train_examples_per_second"] = round(steps * opts.batch_size / max(elapsed, 1e-9), 2)
        # The length the saved model records: predict, evaluate, embed and export read texts at it unless told.
        result["max_seq_length"] = max_seq_length
        if opts.resume:
            result["resumed_from_step"] = start_step
        # A head on the pooled output trains the pooler; the others leave it as the base had it, a
        # converter's fresh one included.
        model.fresh_heads = (
            () if task.trains_pooler else tuple(h for h in getattr(base, "fresh_heads", ()) if h == "pooler")
        )
        _write_output(task.saved(model), output, run_dir, result, tracker, opts.overwrite)
        return json_floats(result)


def _settled_mixed_precision(opts: FinetuneOptions, run_dir: str) -> FinetuneOptions:
    """`opts` with --mixed-precision's 16-bit type made concrete, so that the run records what it
    computed in: "auto" is the type a run being resumed recorded (a run started on an A100 in
    bfloat16 stays in bfloat16 on an older GPU, its optimizer without a loss scale), else this
    machine's (`kbert.backend.mixed_precision_dtype`)."""
    if not (opts.mixed_precision or opts.mixed_precision_dtype != "auto"):
        return opts
    dtype = opts.mixed_precision_dtype
    if dtype == "auto" and opts.resume:
        state = interrupted_finetuning(run_dir) or {"fingerprint": {}}
        dtype = state["fingerprint"].get("mixed_precision") or dtype  # False: started without; refused on resume
    return dataclasses.replace(opts, mixed_precision=True, mixed_precision_dtype=backend.mixed_precision_dtype(dtype))


def _read_data(task: Task, base, train, dev, opts, max_seq_length: int, replicas: int):
    """(train, dev) `TaskData` (dev None without a file), read with the packing every export runs
    in its SavedModel, and checked: usable rows, two labels to classify, a batch the replicas split."""
    preprocessor = make_packer(base, max_seq_length)
    read = functools.partial(task.read, preprocessor=preprocessor, options=opts, require_labels=True)
    train_data = read(train, labels=None, training=True)
    labels = train_data.labels
    if train_data.size == 0:
        raise KbertError(
            f"{train} has no usable rows; check the file (or {option('skip_bad_rows', True)} dropped them all)"
        )
    task.check_training_data(train, train_data)
    _warn_truncated(train, train_data, max_seq_length)
    dev_data = None
    if dev:
        dev_data = read(dev, labels=labels, training=False)  # scored against the training file's labels
        _warn_truncated(dev, dev_data, max_seq_length)
    log.info(
        "%s: %d training examples%s%s, %d replica%s",
        task.name,
        train_data.size,
        "" if train_data.windows is None else f" (windows of {train_data.documents} documents)",
        f", {len(labels)} labels" if labels else "",
        replicas,
        "s" if replicas > 1 else "",
    )
    if opts.batch_size % replicas:
        raise KbertError(
            f"{option('batch_size', opts.batch_size)} must divide evenly over {replicas} replicas; use a multiple of "
            f"{replicas}"
        )
    return train_data, dev_data


def _task_info(task: Task, opts, max_seq_length: int, train_data) -> dict:
    """What the fine-tuned model records for predict, evaluate and export (`kbert.finetuning.tasks.head_task_info`)."""
    task_info = {"task": task.name, "max_seq_length": max_seq_length}
    if train_data.labels is not None:
        task_info["labels"] = train_data.labels
    if task.windows:
        # What predict, evaluate and export do with a text longer than max_seq_length: truncate
        # it, or read it whole in windows that start doc_stride tokens apart (absent: truncate).
        task_info["long_text"] = opts.long_text
        if opts.long_text == "windows":
            task_info["doc_stride"] = opts.doc_stride
    task_info.update(task.record(opts, max_seq_length, train_data))
    return task_info


def _fingerprint(model_dir, task: Task, train, dev, opts, max_seq_length: int, train_data) -> dict:
    """What a run was started with, recorded in its state.json: a --resume must match it."""
    fingerprint = {
        "model_dir": os.path.abspath(os.fspath(model_dir)),
        "task": task.name,
        "train": os.path.abspath(train),
        "train_examples": train_data.size,
        "dev": dev and os.path.abspath(dev),
        "epochs": opts.epochs,
        "batch_size": opts.batch_size,
        "learning_rate": opts.learning_rate,
        "warmup_proportion": opts.warmup_proportion,
        "seed": opts.seed,
        # The 16-bit type it computed in (`_settled_mixed_precision`), or False: float16 adds a loss scale to
        # the optimizer's checkpoint.
        "mixed_precision": opts.mixed_precision and opts.mixed_precision_dtype,
        "max_seq_length": max_seq_length,
        "format": opts.format,
        "skip_bad_rows": opts.skip_bad_rows,
        "long_text": opts.long_text,  # a run started before --long-text existed truncated (_RunCheckpoints.resume)
    }
    fingerprint.update(task.fingerprint(opts))
    if opts.long_text == "windows":
        fingerprint["doc_stride"] = opts.doc_stride
    fingerprint["group_by_length"] = opts.group_by_length  # another order of batches
    if opts.group_by_length:
        fingerprint["length_order"] = LENGTH_ORDER
    return fingerprint


def _fit_epochs(model, task: Task, opts, train_data, tracker, saver, step: int, total_steps: int, steps_per_epoch: int):
    """`model.fit` once per epoch from `step` on (Keras has no way to start an epoch at a given
    batch), until the last epoch, an early stop, or a stop signal (saved, then `Interrupted`)."""
    # As run_classifier.py: shuffle, and drop the last partial batch so every step has the same shape.
    # Each epoch's order is its own seed's (seed + epoch), so a resumed run replays the rest of an
    # epoch exactly. With --long-text windows, the windows of all documents are shuffled together.
    epoch_data = backend.epoch_batches(train_data, opts)
    callbacks = [tracker, saver, backend.epoch_logger(os.path.join(saver.run_dir, "logs", "fit"))]
    with (
        Progress(
            total_steps,
            start=step,
            enabled=opts.progress,
            sequences_per_step=opts.batch_size,
            description=f"finetune {task.name}",
            rate_unit="examples/s",  # a task's examples (a reranker's: whole groups), as the result's rate
        ) as bar,
        StopSignals() as signals,
    ):
        tracker.progress, saver.signals = bar, signals
        for epoch in range(step // steps_per_epoch, opts.epochs):
            skip = step - epoch * steps_per_epoch
            model.fit(
                epoch_data(epoch, skip),
                initial_epoch=epoch,
                epochs=epoch + 1,
                steps_per_epoch=steps_per_epoch - skip,
                shuffle=False,  # the batches come in the epoch's order (Keras would reorder a PyDataset's)
                verbose=0,
                callbacks=callbacks,
            )
            step = saver.step
            if saver.interrupted:
                again = "the same kbert finetune command" if on_command_line() else "the same finetune() call"
                raise signals.interrupted(
                    step, f"checkpoint saved in {saver.run_dir}", f"{again} and {option('resume', True)}"
                )
            if tracker.stopped_early:
                break


def _write_output(model, output, run_dir: str, result: dict, tracker, overwrite: bool):
    """The output directory, atomically: the model (its vocabulary, casing and task), eval_results.json,
    squad's predictions.json and the run's logs; then the unfinished run's directory goes."""
    with atomic_output_dir(os.fspath(output), overwrite=overwrite) as tmp:
        save(model, tmp, overwrite=True)
        with open(os.path.join(tmp, RESULTS_FILE), "w") as f:
            json.dump({"best": result, "history": tracker.history}, f, indent=2)
        if tracker.best_predictions is not None:
            write_predictions_json(tracker.best_predictions, os.path.join(tmp, "predictions.json"))
        if os.path.isdir(os.path.join(run_dir, "logs")):
            os.replace(os.path.join(run_dir, "logs"), os.path.join(tmp, "logs"))
    shutil.rmtree(run_dir, ignore_errors=True)


def window_order(windows, seed: int) -> np.ndarray:
    """One epoch's order of the training windows: every window of every document shuffled
    together, as run_squad.py shuffles its doc spans.

    Windows of one document share a label: kept together, a long document fills whole batches
    with one label and training stalls (docs/real-data.md measured it). They are shuffled
    exactly as truncation shuffles its examples (tf.data's shuffle, with the same buffer and
    seed), so a file whose documents all fit in one window trains in the same order, bit for
    bit, with either --long-text.

    Args:
        windows: kbert.finetuning.windows.Windows.
        seed: int. The epoch's seed (--seed + epoch).

    Returns:
        int64 [windows]: the windows' indexes in training order.

    Example:
    >>> from kbert.finetuning.windows import Windows
    >>> windows = Windows.from_starts([[0, 2], [0], [0, 2, 4]], num_tokens=[5, 2, 7], room=3)
    >>> sorted(window_order(windows, seed=1).tolist())
    [0, 1, 2, 3, 4, 5]
    """
    return backend.shuffled_order(len(windows.document), seed)


class _BestEpoch(keras.callbacks.Callback):
    """After each epoch: score dev with the task's metric, keep the best weights, stop early,
    drive the progress bar and write the dev metrics to TensorBoard. Its state (`state()`)
    goes into every checkpoint of the run, so a resumed run keeps the best epoch."""

    def __init__(self, task: Task, dev_data, opts, do_lower_case, logs_dir):
        super().__init__()
        self.task, self.dev_data, self.opts = task, dev_data, opts
        self.do_lower_case, self.logs_dir = do_lower_case, logs_dir
        self.best_value, self.best_epoch, self.best_weights = -float("inf"), 0, None
        self.best_metrics, self.best_predictions, self.history = None, None, []
        self.epochs_run, self.stale, self.stopped_early = 0, 0, False
        self.interrupted = False  # set by _RunCheckpoints: the epoch did not finish
        self.progress, self.step, self.started, self.rate_from = None, 0, None, 0
        self.writer = None
        # The epoch's mean loss, across the fits of an interrupted epoch: Keras' running mean
        # covers only the batches of one fit.
        self.loss_sum, self.loss_batches, self.fit_mean, self.fit_batches = 0.0, 0, 0.0, 0

    def state(self) -> dict:
        loss_sum, loss_batches = self._epoch_loss_so_far()
        return {
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "best_metrics": self.best_metrics,
            "best_predictions": self.best_predictions,
            "history": self.history,
            "epochs_run": self.epochs_run,
            "stale": self.stale,
            "stopped_early": self.stopped_early,
            "loss_sum": loss_sum,
            "loss_batches": loss_batches,
        }

    def _epoch_loss_so_far(self):
        return self.loss_sum + self.fit_mean * self.fit_batches, self.loss_batches + self.fit_batches

    def restore(self, state: dict, best_weights):
        for key, value in state.items():
            setattr(self, key, value)
        self.best_weights = best_weights

    def on_train_begin(self, logs=None):
        if self.started is None:
            self.started, self.rate_from = time.perf_counter(), self.step
        self.fit_mean, self.fit_batches = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self.fit_mean, self.fit_batches = float((logs or {}).get("loss", float("nan"))), self.fit_batches + 1
        rate = (self.step - self.rate_from) * self.opts.batch_size / max(time.perf_counter() - self.started, 1e-9)
        self.progress.update(
            self.step, {"loss": float((logs or {}).get("loss", float("nan"))), "sequences_per_second": rate}
        )

    def on_epoch_end(self, epoch, logs=None):
        if self.interrupted:
            return
        self.epochs_run = epoch + 1
        loss_sum, loss_batches = self._epoch_loss_so_far()
        self.loss_sum, self.loss_batches, self.fit_mean, self.fit_batches = 0.0, 0, 0.0, 0
        row = {"epoch": epoch + 1, "loss": loss_sum / max(loss_batches, 1)}
        if self.dev_data is not None:
            outputs = self.task.outputs(self.model, self.dev_data, self.opts.batch_size)
            metrics = self.task.score(self.dev_data, outputs, options=self.opts, do_lower_case=self.do_lower_case)
            name, value = best_metric(self.task.name, metrics)
            row.update({f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
        else:
            metrics, name, value = {"loss": row["loss"]}, "loss", -row["loss"]
        self.history.append(json_floats(row))
        self.progress.log(
            f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if isinstance(v, float))
        )
        scalars = {k: v for k, v in row.items() if k != "epoch" and isinstance(v, float)}
        if self.writer is None:
            self.writer = backend.event_writer(os.path.join(self.logs_dir, "dev"))
        self.writer.scalars(epoch + 1, scalars)
        if value > self.best_value:
            self.best_value, self.best_epoch, self.stale = value, epoch + 1, 0
            self.best_weights = self.model.get_weights()
            self.best_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            if self.dev_data is not None:  # squad: its predictions.json
                self.best_predictions = self.task.best_predictions(
                    self.dev_data, outputs, options=self.opts, do_lower_case=self.do_lower_case
                )
        else:
            self.stale += 1
            if self.opts.patience is not None and self.stale >= self.opts.patience:
                self.progress.log(
                    f"early stop: no better dev {name} for {self.stale} epochs "
                    f"(best {self.best_value:.4f} at epoch {self.best_epoch})"
                )
                self.stopped_early = True


class _RunCheckpoints(keras.callbacks.Callback):
    """Saves the run in RUN_DIR every `save_every` steps and at each epoch's end (after
    `_BestEpoch` has scored it), and after the batch in flight when a stop signal came.

    A save is a TensorFlow checkpoint (weights, optimizer, dropout seeds: TensorFlow writes it
    under temporary names and records it as complete last), then the best epoch's weights, then
    state.json (written atomically) naming both. A resume reads state.json, so a crash between
    the steps resumes from the previous save, which is kept until the next one is complete. On
    JAX and PyTorch the checkpoint is `kbert.backend.checkpoints`' (the same contents, renamed
    into place once complete), and state.json says so: a run resumes on the kind it was started on.
    """

    def __init__(self, run_dir, model, tracker: _BestEpoch, fingerprint: dict, steps_per_epoch: int, save_every: int):
        super().__init__()
        self.run_dir, self.tracker, self.fingerprint = run_dir, tracker, fingerprint
        self.steps_per_epoch, self.save_every = steps_per_epoch, save_every
        self.checkpointer = backend.Checkpointer(os.path.join(run_dir, CHECKPOINTS_DIR), model, keep=2)
        self.step, self.saved_step, self.signals, self.interrupted = 0, None, None, False

    def start(self, overwrite: bool) -> int:
        state = self._read_state()
        if state and not overwrite:
            raise KbertError(
                f"{self.run_dir} holds an unfinished run (step {state['step']} of "
                f"{self.steps_per_epoch * self.fingerprint['epochs']}); pass {option('resume', True)} to continue it, "
                f"or {option('overwrite', True)} to start over"
            )
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.makedirs(self.run_dir)
        return 0

    def resume(self) -> int:
        state = self._read_state()
        if state is None:
            resume = option("resume", True)
            raise KbertError(f"{resume}: no unfinished run at {self.run_dir} to continue; drop {resume} to start one")
        # Runs from before --long-text truncated; from before --group-by-length, shuffled. What older runs did
        # not record is taken as given.
        before = {"long_text": "truncate", "group_by_length": False, **state["fingerprint"]}
        for key in NOT_RECORDED_BEFORE:
            before.setdefault(key, self.fingerprint.get(key))
        if before["group_by_length"] and self.fingerprint["group_by_length"] and "length_order" not in before:
            raise KbertError(
                f"{option('resume', True)}: the run in {self.run_dir} was started by an earlier kbert, whose "
                f"{option('group_by_length', True)} batched the rows in another order; finish it with that release, "
                f"or {option('overwrite', True)} to start over"
            )
        changed = [k for k, v in self.fingerprint.items() if before.get(k) != v]
        if changed:
            k = changed[0]
            raise KbertError(
                f"{option('resume', True)}: the run in {self.run_dir} was started with {k} {before.get(k)!r}, "
                f"not {self.fingerprint[k]!r}; resume with the same "
                f"{'command' if on_command_line() else 'arguments'}, or {option('overwrite', True)} to start over"
            )
        started_on = state.get("backend", "tensorflow")  # runs on TensorFlow record none
        if not self.checkpointer.reads_run_of(started_on):
            raise KbertError(
                f"{option('resume', True)}: the run in {self.run_dir} was started on Keras' {started_on} backend, and "
                f"its checkpoints are that backend's kind; resume it with KERAS_BACKEND={started_on}, or "
                f"{option('overwrite', True)} to start over"
            )
        path = os.path.join(self.run_dir, CHECKPOINTS_DIR, f"ckpt-{state['step']}")
        self.checkpointer.restore(path)
        best_weights = None
        if state["best_weights"]:
            with np.load(os.path.join(self.run_dir, state["best_weights"])) as arrays:
                best_weights = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        self.tracker.restore(state["tracker"], best_weights)
        self.step = self.saved_step = self.tracker.step = state["step"]
        log.info("resumed from step %d (epoch %d, batch %d)", self.step, *divmod(self.step, self.steps_per_epoch))
        return self.step

    def _read_state(self):
        path = os.path.join(self.run_dir, STATE_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        at_epoch_end = self.step % self.steps_per_epoch == 0  # on_epoch_end saves those, after scoring
        if self.signals.requested is not None and not at_epoch_end:
            self._stop()
        elif self.step % self.save_every == 0 and not at_epoch_end:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        if self.interrupted:
            return
        self.save()
        if self.signals.requested is not None and epoch + 1 < self.fingerprint["epochs"]:
            self._stop()

    def _stop(self):
        if self.saved_step != self.step:
            self.save()
        self.interrupted = self.tracker.interrupted = True
        self.model.stop_training = True

    def save(self):
        try:
            # self.model: on JAX, reading it puts the step's values back into the variables.
            self.checkpointer.save(self.step, self.model)
            best = None
            if self.tracker.best_weights is not None:
                best = f"best-epoch-{self.tracker.best_epoch}.npz"
                if not os.path.exists(os.path.join(self.run_dir, best)):
                    with open(os.path.join(self.run_dir, best + ".tmp"), "wb") as f:
                        np.savez(f, *self.tracker.best_weights)
                    os.replace(os.path.join(self.run_dir, best + ".tmp"), os.path.join(self.run_dir, best))
            state = {
                "step": self.step,
                "fingerprint": self.fingerprint,
                "best_weights": best,
                "tracker": self.tracker.state(),
                **self.checkpointer.record(),  # the backend, where its checkpoints are not TensorFlow's
            }
            atomic_write_text(os.path.join(self.run_dir, STATE_FILE), json.dumps(state))
        except backend.op_errors() as e:  # its words without tf.function's {{function_node ...}} wrapping
            raise checkpoint_write_failed(self.step, self.saved_step, RuntimeError(op_error_text(e))) from None
        except OSError as e:
            raise checkpoint_write_failed(self.step, self.saved_step, e) from None
        for stale in glob.glob(os.path.join(self.run_dir, "best-epoch-*.npz")):
            if os.path.basename(stale) != best:
                os.remove(stale)
        self.saved_step = self.step
