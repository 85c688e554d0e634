"""TensorFlow's pretraining engine: a custom `strategy.run` loop on any tf.distribute strategy.

`kbert.pretraining.train`'s loop runs it on KERAS_BACKEND=tensorflow. A custom loop rather than
`model.fit`: Keras 3.15's fit fails under MultiWorkerMirroredStrategy (tensorflow#72388), and a
compiled multi-step inner loop is what TPUs want. Per step, on every replica, the gradients of
loss / (replicas · accumulation steps) are summed over micro-batches and replicas, so the update
equals the single-device update on the global batch, whatever the strategy. The input is tf.data
(`tf_dataset`), the losses `tf_losses`', the checkpoints tf.train.CheckpointManager's and the
TensorBoard logs tf.summary's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

import keras
import tensorflow as tf

from kbert.backend import is_chief, pretraining_placement, use_mixed_precision
from kbert.backend.checkpoints import checkpoint_write_failed, random_state_variables
from kbert.pretraining.options import PretrainOptions
from kbert.pretraining.pretrainers import Objective, copied_in_scope, new_pretrainer
from kbert.pretraining.record_checks import check_records
from kbert.pretraining.run_setup import ModelStart, Training
from kbert.pretraining.tf_dataset import find_corrupt_record, pretraining_dataset
from kbert.pretraining.tf_losses import cross_entropy_and_hits
from kbert.runtime.errors import KbertError, op_error_text, option
from kbert.training.optimization import make_optimizer

log = logging.getLogger("kbert")


class TensorFlowEngine:
    """What `kbert.pretraining.train`'s loop asks of TensorFlow: a strategy, tf.data batches, a
    compiled `strategy.run` loop of N steps, held-out scores, tf.train checkpoints, tf.summary logs."""

    backend = "tensorflow"
    checkpoint_kind = "tensorflow"  # tf.train.Checkpoint's, named by its `checkpoint` state file
    other_backends = "JAX or PyTorch"
    resume_advice = "resume with the KERAS_BACKEND the run started on"
    check_records = staticmethod(check_records)

    def place(self, opts: PretrainOptions):
        """The run's tf.distribute strategy."""
        return pretraining_placement(opts.strategy, opts.tpu)

    @staticmethod
    def tensorflow_checkpoint_in(ckpt_dir: str) -> bool:
        return tf.train.latest_checkpoint(ckpt_dir) is not None

    def spread_over(self, strategy):
        return contextlib.nullcontext()  # the strategy places the work: its scope is entered where it builds

    def build(self, opts, strategy, start: ModelStart, model_dir, ckpt_dir) -> Training:
        """Precision, the model and optimizer in the strategy's scope, and their checkpoint,
        restored for a resume."""
        on_accelerator = bool(tf.config.list_logical_devices("GPU")) or opts.strategy == "tpu"
        jit = on_accelerator if opts.jit is None else opts.jit
        use_mixed_precision(opts.mixed_precision, opts.mixed_precision_dtype)
        replicas = strategy.num_replicas_in_sync
        if opts.batch_size % (replicas * opts.grad_accum):
            raise KbertError(
                f"{option('batch_size', opts.batch_size)} must divide evenly over {replicas} replicas x "
                f"{opts.grad_accum} accumulation steps; use a multiple of {replicas * opts.grad_accum}"
            )
        self.micro_batch = opts.batch_size // (replicas * opts.grad_accum)  # per replica and accumulation step
        warmup = opts.warmup_steps if opts.warmup_steps is not None else opts.steps // 10
        chief = is_chief(strategy)

        keras.utils.set_random_seed(opts.seed)  # the same initial weights for the same --seed
        with strategy.scope():
            model = (
                new_pretrainer(start.config, start.vocab_file)
                if start.initial is None
                else copied_in_scope(start.initial)
            )
            optimizer = make_optimizer(opts.optimizer, opts.learning_rate, opts.steps, warmup)
            if keras.mixed_precision.global_policy().name == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(
            weights=list(model.weights), optimizer=optimizer, seeds=random_state_variables(model)
        )
        # Non-chief workers of a multi-worker run write their (identical) checkpoints aside.
        self.manager = tf.train.CheckpointManager(
            checkpoint, ckpt_dir if chief else _worker_dir(strategy), max_to_keep=opts.keep_checkpoints
        )
        step = 0
        if opts.resume:
            # Every worker restores the chief's checkpoint (the model directory is shared storage
            # in a multi-worker run); the others' own copies are written aside and never read.
            checkpoint.restore(tf.train.latest_checkpoint(ckpt_dir)).expect_partial()
            step = int(optimizer.iterations.numpy())
            log.info("resumed from step %d", step)
        self.strategy, self.model, self.optimizer, self.objective = strategy, model, optimizer, start.objective
        return Training(model, step, replicas, warmup, jit, chief)

    def start(self, files, eval_files, opts, training: Training):
        """The training batches from the step reached on, split over the replicas, and the
        compiled train and eval loops."""
        self.files, self.eval_files = files, eval_files
        self.train_iterator = self._train_data(files, opts, training)
        self.train_loop = _make_train_loop(
            self.strategy, self.model, self.objective, self.optimizer, opts.grad_accum, training.replicas, training.jit
        )
        self.eval_loop = _make_eval_loop(self.strategy, self.model, self.objective)
        self.replicas = training.replicas
        self.multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
        return contextlib.nullcontext()

    def _train_data(self, files, opts, training: Training):
        pipelines_skip = training.step * opts.grad_accum * training.replicas  # per-replica batches consumed so far

        def train_input(context):
            per_pipeline = pipelines_skip // context.num_input_pipelines
            return pretraining_dataset(
                files,
                self.micro_batch,
                training=True,
                seed=opts.seed,
                input_context=context,
                skip_batches=per_pipeline,
                **self.objective.record_layout(opts),
            )

        return iter(self.strategy.distribute_datasets_from_function(train_input))

    def train_steps(self, n: int, signals, last_saved: int):
        """(mean metrics, n, whether every worker stops after these steps)."""
        try:
            stop = tf.constant(float(signals.requested is not None))
            metrics = {k: float(v) for k, v in self.train_loop(self.train_iterator, tf.constant(n), stop).items()}
        except tf.errors.DataLossError as e:
            raise _corrupt_records(self.files, e, last_saved) from None
        # Summed over every replica of every worker, so all workers stop after the same step.
        # That sum comes from the call after the signal; one process can stop after this one.
        stop_requested = metrics.pop("stop_requested") > 0 or (signals.requested is not None and not self.multi_worker)
        return metrics, n, stop_requested

    def learning_rate(self) -> float:
        return float(self.optimizer.learning_rate)

    def evaluate(self, opts: PretrainOptions, last_saved: int) -> dict:
        """Held-out losses and accuracies over the first `eval_steps` batches of the eval data."""
        try:
            return _evaluate(self.eval_loop, self.strategy, self.eval_files, opts, self.replicas, self.objective)
        except tf.errors.DataLossError as e:
            raise _corrupt_records(self.eval_files, e, last_saved) from None

    def save(self, step: int, last_saved: int):
        """Save; a failed write (disk full, permissions) leaves the previous checkpoint intact,
        because TensorFlow writes to a temporary name and renames only when complete."""
        try:
            self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            raise checkpoint_write_failed(step, last_saved, e) from None

    def event_log(self, log_dir: str):
        return SummaryLog(log_dir)


class SummaryLog:
    """TensorBoard scalars through tf.summary, as `kbert.backend.event_log.EventLog` writes them
    without TensorFlow: `scalars(step, values)`, flushed each time.

    Example:
    >>> import tempfile
    >>> with SummaryLog(tempfile.mkdtemp()) as log:
    ...     log.scalars(10, {"loss": 2.5})
    """

    def __init__(self, log_dir: str):
        self.writer = tf.summary.create_file_writer(log_dir)

    def scalars(self, step: int, values: dict):
        with self.writer.as_default(step=step):
            for key, value in values.items():
                tf.summary.scalar(key, value)
        self.writer.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.writer.close()
        return False


def _corrupt_records(files, error, last_saved: int) -> KbertError:
    """The one line for a record whose checksum fails mid-run: its file (found by reading them all)."""
    where = find_corrupt_record(files) or f"a file of {', '.join(files)}: {op_error_text(error)}"
    kept = f"the last checkpoint (step {last_saved}) is kept" if last_saved else "no checkpoint was saved"
    return KbertError(
        f"{where} (a record's checksum fails); make the file again (kbert create-data) or copy it "
        f"again, then run again; {kept}"
    )


def _worker_dir(strategy):
    task = getattr(strategy.cluster_resolver, "task_id", 0)
    return os.path.join(tempfile.gettempdir(), f"kbert-worker-{task}-{os.getpid()}")


def _losses(objective: Objective, outputs, labels) -> dict:
    """The objective's losses with this engine's faster cross-entropy (`kbert.pretraining.tf_losses`)."""
    return objective.losses(outputs, labels, cross_entropy=cross_entropy_and_hits)


def _make_train_loop(strategy, model, objective: Objective, optimizer, grad_accum: int, replicas: int, jit: bool):
    """A tf.function running N optimizer steps per call (N is a tensor: one trace for all N)."""
    variables = model.trainable_variables

    def forward_backward(features, labels):
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            metrics = _losses(objective, outputs, labels)
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
        sums = {k: tf.constant(0.0) for k in objective.metric_names}
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


def _make_eval_loop(strategy, model, objective: Objective):
    def replica_eval(features, labels):
        return _losses(objective, model(features, training=False), labels)

    @tf.function
    def eval_step(batch):
        per_replica = strategy.run(replica_eval, args=batch)
        return {k: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None) for k, v in per_replica.items()}

    return eval_step


def _evaluate(eval_step, strategy, files, opts: PretrainOptions, replicas: int, objective: Objective) -> dict:
    """Held-out losses and accuracies over the first `eval_steps` batches of the eval data."""
    batch = max(1, opts.batch_size // replicas)

    def eval_input(context):
        layout = objective.record_layout(opts)
        return pretraining_dataset(files, batch, training=False, input_context=context, **layout).repeat()

    iterator = iter(strategy.distribute_datasets_from_function(eval_input))
    sums, n = {}, 0
    for _ in range(opts.eval_steps):
        result = eval_step(next(iterator))
        for k, v in result.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    return {k: round(v / n, 6) for k, v in sums.items()}
