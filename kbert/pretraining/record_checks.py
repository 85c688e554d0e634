"""The pretraining records a run is given: found (`find_files`) and checked before it trains.

`check_records` reads the records with kbert's own reader (`record_reader`, CRC-checked) and
imports no TensorFlow; every engine checks its records with it.

>>> INPUT_KEYS + LABEL_KEYS
('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions', 'masked_lm_ids', 'masked_lm_weights', 'next_sentence_labels')
"""

from __future__ import annotations

import glob
import logging
import os

from kbert.pretraining.record_encoder import INPUT_KEYS, LABEL_KEYS, MLM_INPUT_KEYS, MLM_LABEL_KEYS
from kbert.runtime.errors import KbertError, on_command_line, option
from kbert.runtime.files import folder_of_glob
from kbert.runtime.records import check_records_file

# Records of each file whose token ids check_records compares with the vocabulary: enough to
# catch records made with another vocab.txt, which shows in the first records already.
CHECKED_RECORDS = 256


def named(flag: str) -> str:
    """`--data` or `--eval-data` as the caller names it: the flag, or `pretrain`'s argument.

    >>> named("--eval-data")
    'eval_data'
    """
    return option(flag.lstrip("-").replace("-", "_"), flag=flag)


def find_files(pattern: str, flag: str = "--data") -> list[str]:
    """The record files a --data glob names (comma-separated globs allowed), sorted.

    Example:
    >>> find_files("no/such/*.tfrecord")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: data 'no/such/*.tfrecord' matches no files; no/such/ does not exist; make records with `kbert create-data` and pass their path or a glob such as 'data/train.tfrecord-*'
    """
    files = sorted({f for part in pattern.split(",") if part for f in glob.glob(part)})
    files = [f for f in files if os.path.isfile(f)]
    empty = [f for f in files if os.path.getsize(f) == 0]
    if empty and len(empty) < len(files):  # skipped, as create_pretraining_data.py skips empty input
        for path in empty:
            logging.getLogger("kbert").warning(f"{named(flag)} {path}: the file is empty; skipped")
        files = [f for f in files if f not in empty]
    if not files:
        beside = [folder_of_glob(part) for part in pattern.split(",") if part and glob.has_magic(part)]
        raise KbertError(
            f"{named(flag)} {pattern!r} matches no files; {'; '.join(b for b in beside if b) + '; ' if any(beside) else ''}"
            "make records with `kbert create-data` and pass their path or a glob such as 'data/train.tfrecord-*'"
        )
    return files


def check_records(
    files,
    max_seq_length: int,
    max_predictions_per_seq: int,
    flag: str = "--data",
    vocab_size: int | None = None,
    objective=None,
):
    """Walk every file's record framing to its end (`kbert.runtime.records.check_records_file`: the
    headers only), then read its first record: a cut-short, corrupt or wrongly sized file is
    named here, before anything is written, rather than failing deep in the run. With
    `vocab_size`, the token ids of each file's first CHECKED_RECORDS records must lie in the
    vocabulary (made with another vocab.txt, they would fail in a gather mid-run on a CPU, and
    read zeros unnoticed on a GPU). `objective` (`kbert.pretraining.pretrainers.Objective`; default
    BERT's) names the features the records must hold."""
    from kbert.runtime.records import parse_example, read_frames

    for path in files:
        check_records_file(path, named(flag))
        checked = 0
        for _, record in read_frames(path):
            try:
                example = parse_example(record)
            except (ValueError, IndexError, UnicodeDecodeError):
                raise not_examples(path) from None
            if checked == 0:
                check_features(path, set(example), objective)
                seq, pred = len(example["input_ids"]), len(example["masked_lm_positions"])
                if (seq, pred) != (max_seq_length, max_predictions_per_seq):
                    raise other_shape(path, seq, pred, max_seq_length, max_predictions_per_seq)
            checked += 1
            if vocab_size is not None:
                for key in ("input_ids", "masked_lm_ids"):
                    bad = ((example[key] < 0) | (example[key] >= vocab_size)).nonzero()[0]
                    if len(bad):
                        raise outside_vocabulary(path, checked - 1, int(example[key][bad[0]]), key, vocab_size)
            if vocab_size is None or checked == CHECKED_RECORDS:
                break
        if checked == 0:
            raise no_records(path)


def check_features(path, found: set, objective=None):
    """One line unless a file's records hold the features `objective` reads (default: BERT's,
    masked LM + next sentence). Records made for the other objective are named as such: a
    ModernBERT's masked-LM-only records lack segment ids and next-sentence labels, and a BERT's
    records hold them.

    >>> check_features("data.tfrecord", set(MLM_INPUT_KEYS + MLM_LABEL_KEYS))
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: data.tfrecord: masked-LM-only records (made from a tokenizer.json, for a ModernBERT); a BERT pretrains on masked-LM + next-sentence records: make them from the model's vocab.txt (`kbert create-data --vocab MODEL_DIR/vocab.txt`)
    """
    keys = (*objective.input_keys, *objective.label_keys) if objective else INPUT_KEYS + LABEL_KEYS
    next_sentence = "next_sentence_labels" in keys
    if next_sentence and set(MLM_INPUT_KEYS + MLM_LABEL_KEYS) <= found and "next_sentence_labels" not in found:
        raise KbertError(
            f"{path}: masked-LM-only records (made from a tokenizer.json, for a ModernBERT); a BERT pretrains on "
            "masked-LM + next-sentence records: make them from the model's vocab.txt "
            "(`kbert create-data --vocab MODEL_DIR/vocab.txt`)"
        )
    if not next_sentence and "next_sentence_labels" in found:
        raise KbertError(
            f"{path}: masked-LM + next-sentence records (made from a vocab.txt, for a BERT); a ModernBERT "
            "pretrains on masked-LM-only records: make them from the model's tokenizer.json "
            "(`kbert create-data --vocab MODEL_DIR/tokenizer.json`)"
        )
    missing = [k for k in keys if k not in found]
    if missing:
        raise not_pretraining_records(path, missing)


def no_records(path) -> KbertError:
    return KbertError(f"{path}: holds no records; recreate it with kbert create-data")


def not_examples(path) -> KbertError:
    return KbertError(f"{path}: its records are not tf.train.Example protos; recreate it with kbert create-data")


def not_pretraining_records(path, missing) -> KbertError:
    return KbertError(
        f"{path}: records lack {', '.join(missing)}; these are not pretraining records (make them with kbert create-data)"
    )


def other_shape(path, seq, pred, max_seq_length, max_predictions_per_seq) -> KbertError:
    return KbertError(
        f"{path}: records have max_seq_length {seq} and max_predictions_per_seq "
        f"{pred}, but {'the flags say' if on_command_line() else 'the call says'} {max_seq_length} and "
        f"{max_predictions_per_seq}; pass {option('max_seq_length', seq)} "
        f"{option('max_predictions_per_seq', pred)}"
    )


def outside_vocabulary(path, row, value, key, vocab_size) -> KbertError:
    where = f"{path}: record {row + 1} holds token id {value} ({key}), outside the model's vocabulary"
    return KbertError(
        f"{where} of {vocab_size:,} (ids 0 to {vocab_size - 1:,}); the records were made with another vocabulary: "
        "make them again with the model's vocab.txt or tokenizer.json (`kbert create-data --vocab`)"
    )
