"""The answers JAX and PyTorch share: what kbert does without TensorFlow.

Each epoch's batches are numpy arrays in the order numpy's generator draws, checkpoints are
`kbert.backend.checkpoints`', TensorBoard logs `kbert.backend.event_log`'s, text is packed by
the Python tokenizer and numpy, and the model's few special ops are plain `keras.ops`.

Example:
>>> shuffled_order(5, seed=1).tolist() == shuffled_order(5, seed=1).tolist()
True
>>> sorted(shuffled_order(5, seed=1).tolist())
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

import contextlib
import os
import random

import keras
import numpy as np
from keras import ops

from kbert.backend.placement import check_strategy
from kbert.runtime.errors import KbertError, option

# The answers JAX and PyTorch take from here as they are (`from kbert.backend.portable import *`).
__all__ = [
    "Checkpointer",
    "adamw_kernels",
    "empty",
    "epoch_batches",
    "epoch_logger",
    "event_writer",
    "fill_weight",
    "finetuning_placement",
    "fused",
    "generator_states",
    "keras_batches",
    "make_preprocessor",
    "matmul_transposed",
    "op_errors",
    "real_token_index",
    "restore_generator_states",
    "set_random_seed",
    "shuffled_order",
    "take_positions",
]

# === Placement ===


def check_keras_strategy(name: str, tpu: str | None):
    """What no JAX or PyTorch run accepts: an unknown strategy, multi-worker, or a TPU named with --tpu."""
    check_strategy(name)
    backend = keras.config.backend()
    if name == "multi-worker":
        raise KbertError(
            f"{option('strategy', 'multi-worker')} (tf.distribute over several machines) runs on TensorFlow only; "
            f"run with KERAS_BACKEND=tensorflow, or train on this machine's devices with {option('strategy', 'auto')}"
        )
    if tpu:
        raise KbertError(
            f"{option('tpu', tpu)} names a TPU for TensorFlow's TPUStrategy; on {backend} leave it out "
            f"(JAX uses the TPU of the TPU VM it runs on, with {option('strategy', 'tpu')}), "
            "or run with KERAS_BACKEND=tensorflow"
        )


class DefaultDevice:
    """What fine-tuning asks of a tf.distribute strategy, on JAX and PyTorch: one device."""

    num_replicas_in_sync = 1

    def scope(self):
        return contextlib.nullcontext()


def finetuning_placement(strategy: str) -> DefaultDevice:
    """--strategy on JAX and PyTorch: auto, the backend's default device (the GPU where there is
    one). The others name tf.distribute strategies or pin a device, which kbert does on TensorFlow."""
    if strategy != "auto":
        raise KbertError(
            f"{option('strategy', strategy)} picks a TensorFlow strategy; on Keras' {keras.config.backend()} backend "
            f"fine-tuning runs on its default device (the GPU where there is one): drop {option('strategy')}, "
            "or run with KERAS_BACKEND=tensorflow"
        )
    return DefaultDevice()


# === Seeds ===


def set_random_seed(seed: int):
    """`keras.utils.set_random_seed` without its TensorFlow seed, which imports TensorFlow wherever
    it is installed: Python's and numpy's generators (Keras draws its initializers' and dropout's
    seeds from Python's)."""
    random.seed(seed)
    np.random.seed(seed)


def generator_states() -> dict:
    """The backend's own random-number states that training draws from, beyond Keras' seed
    generators (which a checkpoint keeps with the model): {name: uint8 array}. On JAX, none:
    every dropout mask comes from a seed generator."""
    return {}


def restore_generator_states(states: dict):
    """Put back what `generator_states` returned; names this backend does not have are left alone."""


# === The batches of an epoch ===


def shuffled_order(n: int, seed: int) -> np.ndarray:
    """One epoch's order of `n` rows: numpy's PCG64 generator seeded with the epoch's seed, the
    same on every machine and numpy version that keeps its stream."""
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


# --group-by-length sorts the rows of this many batches at a time by length (Hugging Face
# Trainer's `group_by_length` takes 50 too): batches of like lengths, still drawn from the shuffle.
MEGA_BATCH = 50


def length_grouped(order: np.ndarray, features: dict, batch_size: int, seed: int) -> np.ndarray:
    """`order` regrouped so that each batch holds rows of like lengths: its rows taken
    `MEGA_BATCH` batches at a time, sorted by length (longest first), cut into batches, and those
    batches shuffled (`seed`). A batch cut to its longest text (`trimmed`) then carries little
    padding; which rows meet in a batch stays random across the shuffle's runs of like lengths.
    Rows are sorted by their longest text's tokens (a group of documents counts its longest), ties
    by all their texts' tokens added: each text is cut to its own longest in the batch, and the
    widest text costs the most (an embedding pair's document, not its short query).

    >>> mask = np.array([[1] * n + [0] * (8 - n) for n in (2, 8, 3, 7)])
    >>> length_grouped(np.arange(4), {"input_mask": mask}, batch_size=2, seed=0).reshape(2, 2).tolist()
    [[1, 3], [2, 0]]
    """
    longest, total = np.zeros(len(order), np.int64), np.zeros(len(order), np.int64)
    for prefix in text_groups(features):
        mask = np.asarray(features[prefix + "input_mask"])
        tokens = mask.reshape(mask.shape[0], -1, mask.shape[-1]).sum(axis=-1).max(axis=-1)
        longest, total = np.maximum(longest, tokens), total + tokens
    grouped = []
    for start in range(0, len(order), MEGA_BATCH * batch_size):
        part = order[start : start + MEGA_BATCH * batch_size]
        grouped.append(part[np.lexsort((-total[part], -longest[part]))])
    grouped = np.concatenate(grouped) if grouped else order
    whole = len(grouped) // batch_size * batch_size  # the partial batch stays last, to be dropped
    batches = grouped[:whole].reshape(-1, batch_size)
    batches = batches[np.random.default_rng(seed).permutation(len(batches))]
    return np.concatenate([batches.reshape(-1), grouped[whole:]]).astype(np.int64)


def epoch_order(train_data, opts, epoch: int, shuffle=shuffled_order) -> np.ndarray:
    """One epoch's order of the training rows (of the windows, with --long-text windows):
    `shuffle`d with the epoch's seed, then `length_grouped` with --group-by-length."""
    rows = train_data.size if train_data.windows is None else len(train_data.windows.document)
    order = shuffle(rows, opts.seed + epoch)
    if opts.group_by_length:
        order = length_grouped(order, train_data.features, opts.batch_size, opts.seed + epoch)
    return order


# A batch cut to its longest text is cut at a multiple of this many tokens. On JAX each shape is a
# step compiled anew, so a few shapes; PyTorch and TensorFlow's tf.data pipeline (one trace, its
# width unknown) cut at a multiple of 8 (`kbert.backend.torch`, `kbert.backend.tensorflow`), where
# the matmuls keep their vector alignment.
TRIM_MULTIPLE = 16
_TEXT_INPUTS = ("input_ids", "input_mask", "segment_ids")


def text_groups(names) -> dict:
    """{prefix: its input names}: the inputs of each text a batch holds (embed's "query_input_ids",
    "query_input_mask", ... share the prefix "query_"; a single text's, "").

    >>> text_groups(["query_input_ids", "query_input_mask", "document_input_ids", "document_input_mask"])
    {'query_': ['query_input_ids', 'query_input_mask'], 'document_': ['document_input_ids', 'document_input_mask']}
    """
    groups: dict = {}
    for name in names:
        suffix = next((s for s in _TEXT_INPUTS if name.endswith(s)), None)
        if suffix is not None:
            groups.setdefault(name[: -len(suffix)], []).append(name)
    return groups


def trimmed(features: dict, multiple: int = TRIM_MULTIPLE) -> dict:
    """A batch's features, each text's inputs cut to its longest text in the batch (rounded up to
    `multiple` tokens): padding changes no output (attention and pooling skip it), and a batch
    of short texts then costs what its tokens cost, as sentence-transformers pads each batch.

    >>> mask = np.array([[1, 1, 0] + [0] * 29, [1] * 5 + [0] * 27])
    >>> trimmed({"input_ids": mask, "input_mask": mask})["input_ids"].shape
    (2, 16)
    """
    out = dict(features)
    for prefix, names in text_groups(features).items():
        mask = features[prefix + "input_mask"]
        longest = max(int(mask.sum(axis=-1).max(initial=1)), 1)
        width = min(mask.shape[-1], -(-longest // multiple) * multiple)
        out.update({name: features[name][..., :width] for name in names})
    return out


class Batches(keras.utils.PyDataset):
    """One epoch's training batches from numpy, from batch `skip` on: the rows in `epoch_order`
    (of the windows, with --long-text windows), the last partial batch dropped as tf.data's
    `drop_remainder` does (kept when it is the only one); each cut to its longest text (`trimmed`,
    at a multiple of `trim_multiple` tokens) when the task's data asks (`TaskData.trim_batches`)."""

    def __init__(self, train_data, opts, epoch: int, skip: int, trim_multiple: int = TRIM_MULTIPLE):
        super().__init__()
        self.trim_multiple = trim_multiple
        self.features, self.targets = train_data.features, train_data.targets
        self.batch_size = opts.batch_size
        self.order = epoch_order(train_data, opts, epoch)
        self.skip = skip
        self.batches = max(1, train_data.size // self.batch_size)
        self.trim = train_data.trim_batches

    def __len__(self):
        return self.batches - self.skip

    def __getitem__(self, index):
        rows = self.order[(self.skip + index) * self.batch_size :][: self.batch_size]
        take = lambda part: {k: v[rows] for k, v in part.items()} if isinstance(part, dict) else part[rows]  # noqa: E731
        features = take(self.features)
        return (trimmed(features, self.trim_multiple) if self.trim else features), take(self.targets)


def epoch_batches(train_data, opts, trim_multiple: int = TRIM_MULTIPLE):
    """epoch_data(epoch, skip_batches): one epoch's `Batches`, from a given batch on."""
    return lambda epoch, skip_batches: Batches(train_data, opts, epoch, skip_batches, trim_multiple)


def keras_batches(batches):
    """`batches` (a `keras.utils.PyDataset`, or an iterable of (features, labels) batches) as
    Keras' `fit` and `evaluate` read them: as they are, on JAX."""
    return batches


# === Checkpoints and event logs ===


class Checkpointer:
    """A run's training checkpoints (weights, optimizer, dropout seeds) as `kbert.backend.checkpoints`
    writes them: renamed into place once complete, the newest `keep` kept. Its runs record the
    backend they ran on, and resume on JAX or PyTorch, not on TensorFlow."""

    def __init__(self, ckpt_dir: str, model, keep: int):
        self.ckpt_dir, self.model, self.keep = ckpt_dir, model, keep

    def save(self, step: int, model):
        """Save at `step`; `model` is the model as a Keras callback reads it (on JAX, reading
        `Callback.model` puts the step's values back into the variables). A failed write raises
        `checkpoint_write_failed`'s line itself."""
        from kbert.backend.checkpoints import save_training_state

        save_training_state(self.ckpt_dir, step, model, model.optimizer, keep=self.keep)

    def restore(self, path: str):
        from kbert.backend.checkpoints import restore_training_state

        restore_training_state(path, self.model, self.model.optimizer)

    def record(self) -> dict:
        """What a run's state file says of its checkpoints' kind."""
        return {"backend": keras.config.backend()}

    def reads_run_of(self, backend: str) -> bool:
        """Whether a run started on Keras' `backend` wrote checkpoints of this kind."""
        return backend != "tensorflow"


def event_writer(log_dir: str):
    """A writer of TensorBoard scalars in `log_dir`: `.scalars(step, {tag: value})`."""
    from kbert.backend.event_log import EventLog

    return EventLog(log_dir)


class EpochLoss(keras.callbacks.Callback):
    """What Keras' TensorBoard callback writes at each epoch's end (fit's logs as `epoch_loss`
    and so on, in LOG_DIR/train, at step `epoch`), written without TensorFlow."""

    def __init__(self, log_dir: str):
        super().__init__()
        self.log_dir, self.log = os.path.join(log_dir, "train"), None

    def on_epoch_end(self, epoch, logs=None):
        scalars = {f"epoch_{k}": float(v) for k, v in (logs or {}).items() if np.ndim(v) == 0}
        if scalars:
            if self.log is None:
                self.log = event_writer(self.log_dir)
            self.log.scalars(epoch, scalars)


def epoch_logger(log_dir: str) -> EpochLoss:
    """The callback that logs fit's metrics at each epoch's end, as Keras' TensorBoard callback does."""
    return EpochLoss(log_dir)


def op_errors() -> tuple:
    """The errors of the backend's ops that mean a checkpoint write failed: none beyond OSError."""
    return ()


# === Text and the model's ops ===


def make_preprocessor(vocab_file, do_lower_case: bool, sequence_length: int):
    """The Python packer (`PythonPreprocessor`): the in-graph packer's ids without TensorFlow."""
    from kbert.text.packing import PythonPreprocessor

    return PythonPreprocessor(vocab_file, do_lower_case, sequence_length)


def take_positions(x, positions):
    """x[b, positions[b, p]] for every b and p: [batch, seq, H] and int [batch, P] -> [batch, P, H]."""
    return ops.take_along_axis(x, ops.expand_dims(ops.cast(positions, "int32"), -1), axis=1)


def real_token_index(input_mask):
    """int32 [real tokens]: where the real tokens of a [batch, seq] mask stand in its flattened
    [batch · seq] rows, for layers that skip padding. (JAX, whose shapes are fixed when it traces,
    gives every row: `kbert.backend.jax`.)"""
    return ops.cast(ops.nonzero(ops.reshape(input_mask, (-1,)))[0], "int32")


def matmul_transposed(a, b):
    """a · bᵀ for 2-D a [n, k] and b [m, k]."""
    return ops.matmul(a, ops.transpose(b))


def empty(shape, dtype=None):
    """A tensor of `shape` whose values are whatever the memory held (zeros where a backend has no such op)."""
    return ops.empty(shape, dtype=dtype or "float32")


# No fused training kernels: the layers train through the plain ops.
fused = None


def adamw_kernels(adamw):
    """(update_one, clip_and_update_all, dense, is_mirrored) for kbert's AdamW: Keras' clip, then
    `adamw` on each variable in Keras' own step (which JAX compiles whole)."""
    return adamw, None, ops.convert_to_tensor, lambda variable: False


def fill_weight(variable, make_value):
    """Give `variable` the value `make_value()` returns: a plain assign (JAX's and PyTorch's
    variables have no TensorFlow handle to hand a buffer to)."""
    value = keras.ops.cast(make_value(), variable.dtype)
    check_filled_shape(variable, value)
    variable.assign(value)


def check_filled_shape(variable, value):
    if tuple(value.shape) != tuple(variable.shape):  # a guard on the format's read()
        raise RuntimeError(
            f"kbert bug: {variable.path} read with shape {tuple(value.shape)}, not {tuple(variable.shape)}"
        )
