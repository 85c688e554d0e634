"""`FinetuneOptions`: every setting of `kbert finetune / predict / evaluate` besides the model, task and files."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class FinetuneOptions:
    """The flags of `kbert finetune` (see its --help); `predict` and `evaluate` read the data
    and decoding ones (batch_size, max_seq_length, format, skip_bad_rows, the squad fields).

    Example:
    >>> FinetuneOptions(epochs=2).learning_rate
    5e-05
    """
    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 5e-5
    max_seq_length: int | None = None    # default: the task's (128, or 384 for squad)
    warmup_proportion: float = 0.1       # run_classifier.py's default
    seed: int = 12345
    mixed_precision: bool = False
    strategy: str = "auto"               # auto | cpu | gpu | mirrored
    patience: int | None = None          # stop after this many epochs without a better dev score
    skip_bad_rows: bool = False
    format: str = "auto"
    doc_stride: int = 128                # squad: run_squad.py's defaults from here on
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    overwrite: bool = False
    resume: bool = False                 # continue the unfinished run in OUTPUT.partial/
    save_every: int = 1000               # steps between checkpoints (and one at each epoch's end)
    progress: bool = True
