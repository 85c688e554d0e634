"""`FinetuneOptions`: every setting of `kbert finetune / predict / evaluate` besides the model, task and files."""

from __future__ import annotations

import dataclasses
import math
import numbers

from kbert.errors import KbertError

STRATEGIES = ("auto", "cpu", "gpu", "mirrored")


@dataclasses.dataclass
class FinetuneOptions:
    """The flags of `kbert finetune` (see its --help); `predict` and `evaluate` read the data
    and decoding ones (batch_size, max_seq_length, format, skip_bad_rows, the squad fields).

    Every number is checked when the options are made (and again by `dataclasses.replace`):
    a value out of range is a one-line `KbertError` naming the flag.

    Example:
    >>> FinetuneOptions(epochs=2).learning_rate
    5e-05
    >>> FinetuneOptions(batch_size=0)
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: --batch-size must be at least 1, got 0
    """

    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 5e-5
    max_seq_length: int | None = None  # default: the task's (128, or 384 for squad)
    warmup_proportion: float = 0.1  # run_classifier.py's default
    seed: int = 12345
    mixed_precision: bool = False
    strategy: str = "auto"  # auto | cpu | gpu | mirrored
    patience: int | None = None  # stop after this many epochs without a better dev score
    skip_bad_rows: bool = False
    format: str = "auto"
    doc_stride: int = 128  # squad: run_squad.py's defaults from here on
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    overwrite: bool = False
    resume: bool = False  # continue the unfinished run in OUTPUT.partial/
    save_every: int = 1000  # steps between checkpoints (and one at each epoch's end)
    progress: bool = True

    def __post_init__(self):
        for name in (
            "epochs",
            "batch_size",
            "save_every",
            "doc_stride",
            "max_query_length",
            "n_best_size",
            "max_answer_length",
        ):
            _check_int(name, getattr(self, name), least=1)
        if self.max_seq_length is not None:  # None: unset; 0 is not
            _check_int("max_seq_length", self.max_seq_length, least=3)  # [CLS], a token, [SEP]
        if self.patience is not None:
            _check_int("patience", self.patience, least=0)
        _check_int("seed", self.seed, least=0, most=2**32 - 1)  # numpy's and Keras' seed range
        _check_number("learning_rate", self.learning_rate)
        if not self.learning_rate > 0:
            raise KbertError(f"{_flag('learning_rate')} must be more than 0, got {self.learning_rate}")
        _check_number("warmup_proportion", self.warmup_proportion)
        if not 0.0 <= self.warmup_proportion < 1.0:
            raise KbertError(f"{_flag('warmup_proportion')} must be in [0, 1), got {self.warmup_proportion}")
        _check_number("null_score_diff_threshold", self.null_score_diff_threshold)
        if self.strategy not in STRATEGIES:
            raise KbertError(
                f"--strategy {self.strategy!r}: fine-tuning runs on {', '.join(STRATEGIES[:-1])} or {STRATEGIES[-1]}"
            )


def resolve_options(options: FinetuneOptions | None, overrides: dict) -> FinetuneOptions:
    """`options` (default: `FinetuneOptions()`) with the keyword arguments a library call gave
    on top; an unknown name is a one-line error listing the known ones.

    >>> resolve_options(None, {"batch_size": 8}).batch_size
    8
    >>> resolve_options(None, {"batch": 8})
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: unknown option 'batch'; the options are FinetuneOptions' fields: epochs, batch_size, learning_rate, max_seq_length, warmup_proportion, seed, mixed_precision, strategy, patience, skip_bad_rows, format, doc_stride, max_query_length, n_best_size, max_answer_length, null_score_diff_threshold, overwrite, resume, save_every, progress
    """
    if options is not None and not isinstance(options, FinetuneOptions):
        raise KbertError(f"options must be a FinetuneOptions, not {type(options).__name__}")
    fields = [f.name for f in dataclasses.fields(FinetuneOptions)]
    unknown = [name for name in overrides if name not in fields]
    if unknown:
        raise KbertError(f"unknown option {unknown[0]!r}; the options are FinetuneOptions' fields: {', '.join(fields)}")
    return dataclasses.replace(options or FinetuneOptions(), **overrides)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_int(name, value, least: int, most: int | None = None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KbertError(f"{_flag(name)} must be a whole number, got {value!r}")
    if value < least:
        raise KbertError(f"{_flag(name)} must be at least {least}, got {value}")
    if most is not None and value > most:
        raise KbertError(f"{_flag(name)} must be at most {most}, got {value}")


def _check_number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise KbertError(f"{_flag(name)} must be a finite number, got {value!r}")
