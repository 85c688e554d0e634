"""`FinetuneOptions`: every setting of `kbert finetune / predict / evaluate` besides the model, task and files."""

from __future__ import annotations

import dataclasses
import math
import numbers

from kbert.runtime.errors import KbertError, option
from kbert.runtime.precision import check_mixed_precision_dtype

STRATEGIES = ("auto", "cpu", "gpu", "mirrored")
# --long-text: what classify, regress and tag do with a text longer than the window.
LONG_TEXT = ("truncate", "windows")
SQUAD_DOC_STRIDE = 128  # run_squad.py's --doc_stride
# --loss of rerank: pairs' sigmoid cross-entropy, softmax over a query's group, a teacher's margins.
RERANK_LOSSES = ("bce", "listwise", "margin-mse")


@dataclasses.dataclass
class FinetuneOptions:
    """The flags of `kbert finetune` (see its --help); `predict` and `evaluate` read the data
    and decoding ones (batch_size, max_seq_length, format, skip_bad_rows, the squad fields).

    Every number is checked when the options are made (and again by `dataclasses.replace`):
    a value out of range is a one-line `KbertError` naming the field (the flag, on the command line).

    Example:
    >>> FinetuneOptions(epochs=2).learning_rate
    5e-05
    >>> FinetuneOptions(batch_size=0)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: batch_size must be at least 1, got 0
    """

    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 5e-5
    max_seq_length: int | None = None  # default: the task's (128, or 384 for squad)
    warmup_proportion: float = 0.1  # run_classifier.py's default
    seed: int = 12345
    mixed_precision: bool = False
    mixed_precision_dtype: str = "auto"  # auto | bfloat16 | float16; naming one turns mixed precision on
    strategy: str = "auto"  # auto | cpu | gpu | mirrored
    patience: int | None = None  # stop after this many epochs without a better dev score
    skip_bad_rows: bool = False
    format: str = "auto"
    long_text: str = "truncate"  # truncate | windows: classify, regress and tag
    # Tokens between two windows' starts. None: squad 128 (run_squad.py's), windows
    # `window_stride`'s half the window.
    doc_stride: int | None = None
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    overwrite: bool = False
    resume: bool = False  # continue the unfinished run in OUTPUT.partial/
    save_every: int = 1000  # steps between checkpoints (and one at each epoch's end)
    progress: bool = True
    # embed: the sentence vectors' pooling (kbert.model.pooling.POOLING_MODES) and L2
    # normalisation; None: the pretrained model's embedding record.
    pooling: str | None = None
    normalize: bool | None = None
    # rerank: the loss (None: bce), and the column of a teacher's scores that margin-mse learns from.
    loss: str | None = None
    teacher_scores: str | None = None
    # rerank: the embedding model that mines each pair's hard negatives, and how many (default 3).
    mine_negatives: str | None = None
    negatives: int | None = None
    # embed, rerank: batches of texts of like lengths (`kbert.backend.portable.length_grouped`).
    group_by_length: bool = False

    def __post_init__(self):
        for name in (
            "epochs",
            "batch_size",
            "save_every",
            "max_query_length",
            "n_best_size",
            "max_answer_length",
        ):
            _check_int(name, getattr(self, name), least=1)
        if self.doc_stride is not None:  # None: the default; 0 is not
            _check_int("doc_stride", self.doc_stride, least=1)
        if self.max_seq_length is not None:  # None: unset; 0 is not
            _check_int("max_seq_length", self.max_seq_length, least=3)  # [CLS], a token, [SEP]
        if self.negatives is not None:
            _check_int("negatives", self.negatives, least=1)
        if self.patience is not None:
            _check_int("patience", self.patience, least=0)
        _check_int("seed", self.seed, least=0, most=2**32 - 1)  # numpy's and Keras' seed range
        _check_number("learning_rate", self.learning_rate)
        if not self.learning_rate > 0:
            raise KbertError(f"{_option('learning_rate')} must be more than 0, got {self.learning_rate}")
        _check_number("warmup_proportion", self.warmup_proportion)
        if not 0.0 <= self.warmup_proportion < 1.0:
            raise KbertError(f"{_option('warmup_proportion')} must be in [0, 1), got {self.warmup_proportion}")
        _check_number("null_score_diff_threshold", self.null_score_diff_threshold)
        if self.strategy not in STRATEGIES:
            raise KbertError(
                f"{_option('strategy', self.strategy)}: fine-tuning runs on {', '.join(STRATEGIES[:-1])} or "
                f"{STRATEGIES[-1]}"
            )
        check_mixed_precision_dtype(self.mixed_precision_dtype)
        if self.long_text not in LONG_TEXT:
            raise KbertError(f"{_option('long_text', self.long_text)}: use truncate (the default) or windows")
        if self.pooling is not None:
            self._check_pooling()
        if self.loss is not None and self.loss not in RERANK_LOSSES:
            raise KbertError(f"{_option('loss', self.loss)}: use one of {', '.join(RERANK_LOSSES)}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise KbertError(f"{_option('normalize', self.normalize)}: give True or False")
        if self.long_text == "windows" and self.max_seq_length is not None:
            window_stride(self.doc_stride, self.max_seq_length)  # a stride the window cannot take: now

    def _check_pooling(self):
        from kbert.model.pooling import POOLING_MODES  # here: the command line imports this module before Keras

        if self.pooling not in POOLING_MODES:
            raise KbertError(f"{_option('pooling', self.pooling)}: use one of {', '.join(POOLING_MODES)}")


def resolve_options(options: FinetuneOptions | None, overrides: dict) -> FinetuneOptions:
    """`options` (default: `FinetuneOptions()`) with the keyword arguments a library call gave
    on top; an unknown name is a one-line error listing the known ones.

    >>> resolve_options(None, {"batch_size": 8}).batch_size
    8
    >>> resolve_options(None, {"batch": 8})
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: unknown option 'batch'; the options are FinetuneOptions' fields: epochs, batch_size, learning_rate, max_seq_length, warmup_proportion, seed, mixed_precision, mixed_precision_dtype, strategy, patience, skip_bad_rows, format, long_text, doc_stride, max_query_length, n_best_size, max_answer_length, null_score_diff_threshold, overwrite, resume, save_every, progress, pooling, normalize, loss, teacher_scores, mine_negatives, negatives, group_by_length
    """
    if options is not None and not isinstance(options, FinetuneOptions):
        raise KbertError(f"options must be a FinetuneOptions, not {type(options).__name__}")
    fields = [f.name for f in dataclasses.fields(FinetuneOptions)]
    unknown = [name for name in overrides if name not in fields]
    if unknown:
        raise KbertError(f"unknown option {unknown[0]!r}; the options are FinetuneOptions' fields: {', '.join(fields)}")
    return dataclasses.replace(options or FinetuneOptions(), **overrides)


def window_stride(doc_stride: int | None, sequence_length: int) -> int:
    """The stride of --long-text windows: `doc_stride`, or by default half the window's room
    for tokens ((sequence_length - 2) // 2, so each token is in two windows and has at least a
    quarter of a window of context on each side in one of them, as far as its document allows).

    The windows must overlap: a stride of the whole room or more is refused.

    >>> window_stride(None, 128), window_stride(100, 128)
    (63, 100)
    >>> window_stride(126, 128)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: doc_stride=126 must be less than the 126 tokens a window holds (max_seq_length=128 less [CLS] and [SEP]), so that windows overlap; use doc_stride=63 (the default) or less, or a larger max_seq_length
    """
    room = sequence_length - 2
    if room < 2:
        raise KbertError(
            f"{_option('long_text', 'windows')} needs windows of at least 2 tokens; "
            f"{_option('max_seq_length', sequence_length)} leaves {room} beside [CLS] and [SEP]: use {_option('max_seq_length', 4)} or more"
        )
    if doc_stride is None:
        return room // 2
    if doc_stride >= room:
        raise KbertError(
            f"{_option('doc_stride', doc_stride)} must be less than the {room} tokens a window holds "
            f"({_option('max_seq_length', sequence_length)} less [CLS] and [SEP]), so that windows overlap; use "
            f"{_option('doc_stride', room // 2)} (the default) or less, or a larger {_option('max_seq_length')}"
        )
    return int(doc_stride)


def _option(name: str, *value) -> str:
    # These are `kbert finetune`'s flags: a model's recorded values reach predict, evaluate and
    # export too, which name the flags they lack with the command that has them.
    return option(name, *value, command="finetune")


def _check_int(name, value, least: int, most: int | None = None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KbertError(f"{_option(name)} must be a whole number, got {value!r}")
    if value < least:
        raise KbertError(f"{_option(name)} must be at least {least}, got {value}")
    if most is not None and value > most:
        raise KbertError(f"{_option(name)} must be at most {most}, got {value}")


def _check_number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise KbertError(f"{_option(name)} must be a finite number, got {value!r}")
