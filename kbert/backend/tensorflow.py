"""Keras' TensorFlow backend: tf.distribute, tf.data, tf.train.Checkpoint, tf.summary, the
in-graph packer, and the XLA kernels training runs through.

The one module of the backend seam that imports TensorFlow (`kbert.backend` picks it on the
TensorFlow backend; a command that needs TensorFlow on another backend, `kbert export` on JAX,
imports it for `split_cpu_if_asked` and `set_up_devices`).
"""

from __future__ import annotations

import functools
import json
import os
import socket

import keras
import numpy as np
import tensorflow as tf

from kbert.backend import tensorflow_fused as fused  # noqa: F401 (the layers train through it: `kbert.backend.fused`)
from kbert.backend.checkpoints import random_state_variables
from kbert.backend.placement import check_strategy
from kbert.backend.portable import check_filled_shape, epoch_order, text_groups
from kbert.runtime.errors import KbertError, first_line, option

# Tests (and CPU-only users who want to try mirrored training) split the CPU into N logical
# devices; this must happen before TensorFlow initialises its devices.
LOGICAL_CPUS_ENV = "KBERT_LOGICAL_CPUS"

# Keras' layers are plain Python objects here: a layer may hold others before Layer.__init__ runs.
LAYERS_ARE_MODULES = False

# Keras' steps run as graphs, not compiled whole with XLA: on a CPU whole-step XLA was slower than
# the graph with its fused kernels (`kbert.backend.tensorflow_fused`), and it skips oneDNN.
COMPILES_STEPS = False


def quiet_native_warnings():
    """Keep TensorFlow's C++ warnings off stderr in a Python session, as the CLI keeps them off its
    own: grappler's cost-model notes during `model.fit` ("Error in PredictCost() for the op ...")
    read as errors and are not. Its errors still print. TF_CPP_MIN_LOG_LEVEL=0 (show everything) or
    KBERT_DEBUG=1 leaves TensorFlow's level as it is, and so does a level of 2 or 3, which hides
    the warnings already. (`import tensorflow` sets 1, its default, where the user set nothing.)"""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") != "1" or os.environ.get("KBERT_DEBUG") == "1":
        return
    from kbert.backend.tensorflow_compat import LOG_ERRORS, set_native_log_level

    set_native_log_level(LOG_ERRORS)


quiet_native_warnings()  # when kbert first runs on TensorFlow: before any model is built or fit


# === Placement ===


def split_cpu_if_asked():
    """Honour KBERT_LOGICAL_CPUS=N: expose the CPU as N logical devices (before any TF op)."""
    n = int(os.environ.get(LOGICAL_CPUS_ENV, "0") or 0)
    if n > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError:
            pass  # already initialised by an earlier call in this process


def set_up_devices():
    """What a command that needs TensorFlow does first: register tensorflow_text's ops, split
    the CPU if asked, and set up the devices (where TensorFlow's CUDA probe prints)."""
    import tensorflow_text  # noqa: F401

    split_cpu_if_asked()  # must precede device set-up
    if not os.environ.get("TF_CONFIG"):  # multi-worker collectives must be set up first
        tf.config.list_logical_devices()


def has_gpu() -> bool:
    """Whether TensorFlow computes on a GPU."""
    return bool(tf.config.list_logical_devices("GPU"))


def gpu_compute_capability() -> float | None:
    """The first GPU's CUDA compute capability (9.0 for an H100), or None without a GPU (or where
    TensorFlow does not say)."""
    gpus = tf.config.list_physical_devices("GPU")
    capability = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability") if gpus else None
    return float("{}.{}".format(*capability)) if capability else None


def make_strategy(name: str = "auto", tpu: str | None = None):
    """The tf.distribute strategy for `name`.

    - auto: all local GPUs (mirrored) if there are several, the GPU if one, else the CPU.
    - cpu / gpu: one device.
    - mirrored: MirroredStrategy over all local GPUs, or all logical CPU devices.
    - multi-worker: MultiWorkerMirroredStrategy; needs TF_CONFIG (cluster + task).
    - tpu: TPUStrategy on the TPU named by `tpu` (or the one TPUClusterResolver finds).
    """
    check_strategy(name)
    # Multi-worker and TPU set-up must come before anything initialises TensorFlow's devices.
    if name == "multi-worker":
        if not os.environ.get("TF_CONFIG"):
            raise KbertError(
                f"{option('strategy', 'multi-worker')} needs TF_CONFIG, e.g. "
                '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                '"task": {"type": "worker", "index": 0}} on each worker'
            )
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise KbertError(f"TF_CONFIG is not valid JSON ({e}); fix the environment variable") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        return _tpu_strategy(tpu)
    split_cpu_if_asked()
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "auto":
        if len(gpus) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "cpu":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if name == "gpu":
        if not gpus:
            raise KbertError(
                f"{option('strategy', 'gpu')}: TensorFlow sees no GPU here; "
                f"install a CUDA build of TensorFlow or use {option('strategy', 'cpu')}"
            )
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    # mirrored
    if gpus:
        return tf.distribute.MirroredStrategy()
    # No NCCL on CPU: reduce through one device.
    return tf.distribute.MirroredStrategy([d.name for d in cpus], cross_device_ops=tf.distribute.ReductionToOneDevice())


def _tpu_strategy(tpu):
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        _probe(resolver.master())  # connecting to a dead address would hang, not fail
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # ValueError, URLError, OpError...: all mean "no TPU here"
        raise KbertError(
            f"{option('strategy', 'tpu')}: no TPU reachable{f' at {tpu!r}' if tpu else ''} ({first_line(e)}); "
            f"run on a Cloud TPU VM or pass {option('tpu', 'NAME')}"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def _probe(master: str, timeout: float = 10.0):
    """Raise ConnectionError unless the TPU worker at `master` (grpc://host:port) accepts a connection."""
    if not master.startswith("grpc://"):
        return  # a local TPU VM ("" or "local"): nothing to dial
    host, _, port = master[len("grpc://") :].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout):
        pass


def pretraining_placement(strategy: str, tpu: str | None = None):
    """Where pretraining runs: the tf.distribute strategy for --strategy (and --tpu)."""
    return make_strategy(strategy, tpu)


def finetuning_placement(strategy: str):
    """Where fine-tuning runs: the tf.distribute strategy for --strategy.

    One device that TensorFlow places on anyway (the CPU of a machine without a GPU, or its one
    GPU) gets the default strategy rather than OneDeviceStrategy: under that, Keras' `fit` feeds
    each batch through the strategy's distributed dataset and its step through `strategy.run`,
    which on a CPU spent a third of the step in the kernel's page faults
    (docs/performance.md, "Fine-tuning on one device").
    """
    chosen = make_strategy(strategy)  # checks the name, and that a GPU asked for is there
    on_default_device = not (strategy == "cpu" and tf.config.list_logical_devices("GPU"))
    if isinstance(chosen, tf.distribute.OneDeviceStrategy) and on_default_device:
        return tf.distribute.get_strategy()
    return chosen


# === Seeds ===


def set_random_seed(seed: int):
    """Python's, numpy's and TensorFlow's generators (`keras.utils.set_random_seed`)."""
    keras.utils.set_random_seed(seed)


def generator_states() -> dict:
    """TensorFlow's generators beyond Keras' seed generators that training draws from: none (its
    checkpoints are tf.train.Checkpoint's, which keep the seed generators)."""
    return {}


def restore_generator_states(states: dict):
    """Nothing to put back: `generator_states` has none."""


# === The batches of an epoch ===


def shuffled_order(n: int, seed: int) -> np.ndarray:
    """One epoch's order of `n` rows: tf.data's shuffle with the epoch's seed, over a buffer of
    at most 100,000 rows, the order `epoch_batches` draws."""
    order = tf.data.Dataset.range(n).shuffle(min(n, 100_000), seed=seed, reshuffle_each_iteration=False)
    return next(iter(order.batch(max(n, 1)))).numpy() if n else np.zeros(0, np.int64)


def keras_batches(batches):
    """`batches` as Keras' `fit` and `evaluate` read them: as they are."""
    return batches


# The pipeline's batches have a width unknown to the one trace of Keras' train step, so widths cost
# no retracing: a batch is cut at a multiple of 8 tokens, not 16 as on JAX.
TRIM_MULTIPLE = 8


def trimmed(features: dict) -> dict:
    """`kbert.backend.portable.trimmed` in the tf.data pipeline: each text's inputs cut to its
    longest text in the batch, rounded up to `TRIM_MULTIPLE` tokens."""
    out = dict(features)
    for prefix, names in text_groups(features).items():
        mask = features[prefix + "input_mask"]
        longest = tf.maximum(tf.reduce_max(tf.reduce_sum(mask, axis=-1)), 1)
        width = tf.minimum(tf.shape(mask)[-1], (longest + TRIM_MULTIPLE - 1) // TRIM_MULTIPLE * TRIM_MULTIPLE)
        out.update({name: features[name][..., :width] for name in names})
    return out


def epoch_batches(train_data, opts):
    """epoch_data(epoch, skip_batches): one epoch's batches as a tf.data pipeline, from a given batch on.

    Its shuffle draws the order from `seed + epoch`; with --long-text windows or
    --group-by-length, the rows are put in `epoch_order` first (the same shuffle).
    """
    in_order = train_data.windows is not None or opts.group_by_length
    if not in_order:
        examples = tf.data.Dataset.from_tensor_slices((train_data.features, train_data.targets))

    def epoch_data(epoch: int, skip_batches: int):
        if not in_order:
            batches = examples.shuffle(
                min(train_data.size, 100_000), seed=opts.seed + epoch, reshuffle_each_iteration=False
            )
        else:
            order = epoch_order(train_data, opts, epoch, shuffle=shuffled_order)
            batches = tf.data.Dataset.from_tensor_slices(
                tuple({k: v[order] for k, v in part.items()} for part in (train_data.features, train_data.targets))
            )
        batches = batches.batch(opts.batch_size, drop_remainder=train_data.size >= opts.batch_size)
        if train_data.trim_batches:
            batches = batches.map(lambda features, targets: (trimmed(features), targets))
        return batches.skip(skip_batches).prefetch(tf.data.AUTOTUNE)

    return epoch_data


# === Checkpoints and event logs ===


class Checkpointer:
    """A run's training checkpoints (weights, optimizer, dropout seeds) as TensorFlow writes them:
    under temporary names, recorded as complete last; the newest `keep` kept. Runs on TensorFlow
    record no backend in their state file."""

    def __init__(self, ckpt_dir: str, model, keep: int):
        self.checkpoint = tf.train.Checkpoint(
            weights=list(model.weights), optimizer=model.optimizer, seeds=random_state_variables(model)
        )
        self.manager = tf.train.CheckpointManager(self.checkpoint, ckpt_dir, max_to_keep=keep)

    def save(self, step: int, model):
        """Save at `step` (the checkpoint holds `model`'s variables already)."""
        self.manager.save(checkpoint_number=step)

    def restore(self, path: str):
        self.checkpoint.restore(path).expect_partial()

    def record(self) -> dict:
        """What a run's state file says of its checkpoints' kind: nothing, on TensorFlow."""
        return {}

    def reads_run_of(self, backend: str) -> bool:
        """Whether a run started on Keras' `backend` wrote checkpoints of this kind."""
        return backend == "tensorflow"


class _SummaryWriter:
    def __init__(self, log_dir: str):
        self.writer = tf.summary.create_file_writer(log_dir)

    def scalars(self, step: int, values: dict):
        with self.writer.as_default():
            for k, v in values.items():
                tf.summary.scalar(k, v, step=step)
        self.writer.flush()


def event_writer(log_dir: str) -> _SummaryWriter:
    """A writer of TensorBoard scalars in `log_dir` (tf.summary's): `.scalars(step, {tag: value})`."""
    return _SummaryWriter(log_dir)


def epoch_logger(log_dir: str):
    """The callback that logs fit's metrics at each epoch's end: Keras' TensorBoard."""
    return keras.callbacks.TensorBoard(log_dir, update_freq="epoch")


def op_errors() -> tuple:
    """TensorFlow's op errors: a checkpoint write it could not finish raises one."""
    return (tf.errors.OpError,)


# === Text ===


def make_preprocessor(vocab_file, do_lower_case: bool, sequence_length: int):
    """The in-graph `BertPreprocessor`: the packing every export runs in its SavedModel."""
    from kbert.text.graph_packer import BertPreprocessor

    return BertPreprocessor(vocab_file, do_lower_case, sequence_length)


# === The model's ops ===

# Three ops take a faster TensorFlow form than their `keras.ops` one (kbert.backend.portable's),
# with equal results:
# - `take_positions`: tf.gather with batch_dims, whose gradient is much cheaper than
#   take_along_axis' (docs/performance.md, "Figures behind the code's comments");
# - `matmul_transposed`: transpose_b reads the [vocab, H] word-embedding table as it is stored,
#   where a transpose would copy all its rows every step, and its gradient once more;
# - `empty`: `tf.raw_ops.Empty`, memory left as it was, for weights a loader assigns next.
# Training runs through `kbert.backend.tensorflow_fused`'s XLA kernels (`fused`, imported above).


def take_positions(x, positions):
    """x[b, positions[b, p]] for every b and p: [batch, seq, H] and int [batch, P] -> [batch, P, H]."""
    return tf.gather(x, keras.ops.cast(positions, "int32"), batch_dims=1)


def real_token_index(input_mask):
    """int32 [real tokens]: where the real tokens of a [batch, seq] mask stand in its flattened
    [batch · seq] rows, for layers that skip padding."""
    return tf.cast(tf.where(tf.reshape(input_mask, [-1]) > 0)[:, 0], tf.int32)


def matmul_transposed(a, b):
    """a · bᵀ for 2-D a [n, k] and b [m, k]."""
    return tf.linalg.matmul(a, b, transpose_b=True)


def empty(shape, dtype=None):
    """A tensor of `shape` whose values are whatever the memory held."""
    return tf.raw_ops.Empty(shape=tf.constant(shape, tf.int32), dtype=tf.as_dtype(dtype or "float32"), init=False)


# === The optimizer's kernels ===


def _clip_scale(grads, clip_norm: float):
    """tf.clip_by_global_norm's factor, min(1, clip_norm / ‖grads‖); NaN if the norm is not
    finite, and 1 when `clip_norm` is 0 (no clipping)."""
    if clip_norm <= 0:
        return tf.ones([], "float32")
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))
    return clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm) + (norm - norm)


def adamw_kernels(adamw):
    """(update_one, clip_and_update_all, dense, is_mirrored) for kbert's AdamW step `adamw`.

    Written as separate TensorFlow ops, the clip and the update are a dozen passes over every
    weight, each reading and writing memory. Compiled by XLA, they read g, m, v and w once (g
    twice with the clip) and write m, v and w once. `clip_and_update_all` runs the global-norm
    clip, then AdamW on every variable, in one launch rather than one per variable: each launch
    has a fixed cost, and BERT-base has about 200 variables (the cost is measured in
    docs/performance.md, "What makes kbert's step faster").
    """

    @tf.function(jit_compile=True, reduce_retracing=True)
    def clip_and_update_all(grads, ms, vs, ws, lr, clip_norm, hyper, decays):
        scale = _clip_scale(grads, clip_norm)
        return [adamw(g * scale, m, v, w, lr, hyper, decay) for g, m, v, w, decay in zip(grads, ms, vs, ws, decays)]

    def dense(value):
        # Keras' convert_to_tensor passes a Keras variable through (a tf.function would take it
        # as a variable to capture), and an embedding's IndexedSlices gradient too; Adam's
        # moments are dense anyway.
        return tf.convert_to_tensor(value)

    def is_mirrored(variable) -> bool:
        return isinstance(variable.value, tf.distribute.DistributedValues)

    update_one = tf.function(adamw, jit_compile=True, reduce_retracing=True)
    return update_one, clip_and_update_all, dense, is_mirrored


# === Loading weights ===


def fill_weight(variable, make_value):
    """Give a weight built unfilled the value `make_value()` returns, without a second copy.

    The placeholder goes back to TensorFlow's allocator *before* the value is made, so the
    value's buffer can take its place, and the variable then adopts that buffer (TensorFlow's
    assign takes over a tensor nothing else holds). Made first, the value would need memory
    beside every placeholder: the allocator would grow by the largest weight and keep the
    growth's bookkeeping resident (measured in `benchmarks/convert_bench.py`).
    """
    # variable.value is the backend's tf.Variable; Keras' own assign checks the shape against
    # what the variable holds, which is the empty placeholder in between.
    handle, dtype = variable.value.handle, variable.value.dtype
    tf.raw_ops.AssignVariableOp(resource=handle, value=_nothing(dtype), validate_shape=False)
    value = tf.cast(make_value(), dtype)
    check_filled_shape(variable, value)
    tf.raw_ops.AssignVariableOp(resource=handle, value=value, validate_shape=False)


@functools.cache
def _nothing(dtype):
    """An empty tensor of `dtype`, made once."""
    return tf.zeros([0], dtype)
