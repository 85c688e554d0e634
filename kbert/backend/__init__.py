"""Every question whose answer depends on Keras' backend, answered once for the backend in use.

Keras reads KERAS_BACKEND once, and so does this package: it picks `tensorflow`, `jax` or `torch`
(as Keras picks its own `src/backend/<name>/`), and generic code (fine-tuning, training, the
model, the converters, the command line) asks here instead of branching on the backend itself.
Only `kbert.backend.tensorflow` imports TensorFlow, and only on its backend: JAX and PyTorch run
where TensorFlow is not installed (their shared answers are `kbert.backend.portable`'s).

What it answers:

- placement: `finetuning_placement(strategy)` (a tf.distribute strategy, or one default
  device), `pretraining_placement(strategy, tpu)` (a strategy, or Keras devices), `has_gpu()`,
  and for multi-worker runs `is_chief(strategy)` and `writes_shared_files(strategy)`;
- seeds and precision: `set_random_seed(seed)`, `generator_states()` and
  `restore_generator_states(states)` (the backend's own random states a checkpoint keeps),
  `use_mixed_precision(enabled, dtype)` (bfloat16, or float16 with loss scaling on GPUs older
  than the A100);
- the batches of an epoch: `epoch_batches(train_data, opts)` (tf.data, or numpy batches),
  `shuffled_order(n, seed)` and `keras_batches(batches)` (what `fit` reads them through);
- a training run's files: `Checkpointer(ckpt_dir, model, keep)`, `event_writer(log_dir)` and
  `epoch_logger(log_dir)` (TensorFlow's checkpoints and summaries, or kbert's own);
- errors: `op_errors()`, the backend's op errors that a one-line message stands in for;
- text: `make_preprocessor(vocab_file, do_lower_case, sequence_length)`, the packer of
  fine-tuning's inputs (in the graph on TensorFlow, Python and numpy elsewhere);
- the model and optimizer: `take_positions`, `real_token_index` (the rows that are not
  padding), `matmul_transposed`, `empty`, `fused` (the XLA kernels training runs through, or
  None), `adamw_kernels(adamw)`, `fill_weight(variable, make_value)`, `LAYERS_ARE_MODULES`
  (PyTorch's layers are torch.nn.Modules) and `COMPILES_STEPS` (whether Keras' steps are
  compiled whole: XLA on JAX, the graph on TensorFlow, eager PyTorch).

Example:
>>> import numpy as np
>>> from kbert import backend
>>> backend.name
'tensorflow'
>>> sorted(backend.shuffled_order(4, seed=0).tolist())
[0, 1, 2, 3]
>>> x = np.arange(12, dtype="float32").reshape(1, 4, 3)
>>> keras.ops.convert_to_numpy(backend.take_positions(x, np.array([[2, 0]], "int32"))).tolist()
[[[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]]
>>> keras.ops.convert_to_numpy(backend.matmul_transposed(np.ones((1, 3), "float32"), x[0])).tolist()
[[3.0, 12.0, 21.0, 30.0]]
"""

from __future__ import annotations

import keras

from kbert.backend.placement import STRATEGIES, check_strategy, is_chief, writes_shared_files  # noqa: F401
from kbert.runtime.precision import mixed_precision_policy, resolved_mixed_precision_dtype

name = keras.config.backend()

if name == "tensorflow":
    from kbert.backend import tensorflow as _running
elif name == "jax":
    from kbert.backend import jax as _running
else:
    from kbert.backend import torch as _running

LAYERS_ARE_MODULES = _running.LAYERS_ARE_MODULES
COMPILES_STEPS = _running.COMPILES_STEPS
has_gpu = _running.has_gpu
gpu_compute_capability = _running.gpu_compute_capability
finetuning_placement = _running.finetuning_placement
pretraining_placement = _running.pretraining_placement
set_random_seed = _running.set_random_seed
generator_states = _running.generator_states
restore_generator_states = _running.restore_generator_states
epoch_batches = _running.epoch_batches
keras_batches = _running.keras_batches
shuffled_order = _running.shuffled_order
Checkpointer = _running.Checkpointer
event_writer = _running.event_writer
epoch_logger = _running.epoch_logger
op_errors = _running.op_errors
make_preprocessor = _running.make_preprocessor
take_positions = _running.take_positions
real_token_index = _running.real_token_index
matmul_transposed = _running.matmul_transposed
empty = _running.empty
fused = _running.fused
adamw_kernels = _running.adamw_kernels
fill_weight = _running.fill_weight


def mixed_precision_dtype(dtype: str) -> str:
    """The 16-bit type --mixed-precision-dtype `dtype` computes in here: "auto" resolved for this
    machine's accelerator (`resolved_mixed_precision_dtype`), so that a run can record what it used."""
    return resolved_mixed_precision_dtype(dtype, gpu_compute_capability())


def use_mixed_precision(enabled: bool, dtype: str = "auto"):
    """Turn on Keras' mixed precision if `enabled` or a `dtype` is named, computing in `dtype`
    (`mixed_precision_policy`); variables stay float32."""
    if enabled or dtype != "auto":
        keras.mixed_precision.set_global_policy(mixed_precision_policy(dtype, gpu_compute_capability()))
