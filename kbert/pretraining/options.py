"""`PretrainOptions`: everything `kbert pretrain` takes besides where the model and data are.

Its own module, free of TensorFlow, so that the CLI reads its flags' defaults from here.

>>> PretrainOptions().steps, PretrainOptions(steps=50).learning_rate
(10000, 0.0001)
"""

from __future__ import annotations

import dataclasses

from kbert.config import DEFAULT_MAX_SEQ_LENGTH


@dataclasses.dataclass
class PretrainOptions:
    """Everything `kbert pretrain` takes besides where the model and data are (see its --help)."""

    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    max_predictions_per_seq: int = 20
    steps: int = 10000
    batch_size: int = 32
    learning_rate: float = 1e-4
    warmup_steps: int | None = None  # default: 10% of steps, as the original's 10k of 100k
    save_every: int = 1000
    keep_checkpoints: int = 3
    resume: bool = False
    eval_data: str | None = None
    eval_every: int | None = None  # default: save_every
    eval_steps: int = 20
    strategy: str = "auto"
    tpu: str | None = None
    mixed_precision: bool = False
    mixed_precision_dtype: str = "auto"  # auto | bfloat16 | float16; naming one turns mixed precision on
    jit: bool | None = None  # default: on for GPU/TPU, off on CPU (XLA:CPU skips oneDNN)
    steps_per_loop: int = 10
    grad_accum: int = 1
    optimizer: str = "adamw"
    seed: int = 12345  # initial weights, dropout and data order
    progress: bool = True
