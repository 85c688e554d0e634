"""The two kinds of records create-data makes, picked by its vocabulary file, in one place.

- a WordPiece `vocab.txt`: BERT's records (masked LM + next sentence), google-research/bert's
  algorithm and defaults (`instances.InstanceBuilder`);
- a `tokenizer.json` (a ModernBERT's): masked-LM-only records, ModernBERT's recipe of 30% masking
  and no next-sentence task (`mlm_instances.MlmInstanceBuilder`).

`data_options` resolves each kind's defaults and refuses, in one line, the options that do not
apply to it; `instance_builder` builds the kind's builder (every worker calls it); `statistics`
is what the summary reports of the records made.
"""

from __future__ import annotations

import os

from kbert.pretraining.instances import DataOptions, InstanceBuilder, InstanceCounts
from kbert.runtime.errors import KbertError, option
from kbert.text.tokenizer import load_vocab

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")
BERT_MASKED_LM_PROB, BERT_MAX_PREDICTIONS_PER_SEQ = 0.15, 20  # google-research/bert's flags
MLM_MASKED_LM_PROB = 0.3  # ModernBERT's recipe


def is_tokenizer_json(vocab_file) -> bool:
    """Whether `vocab_file` is a tokenizer.json (masked-LM-only records), not a vocab.txt.

    Example:
    >>> is_tokenizer_json("model/tokenizer.json"), is_tokenizer_json("vocab.txt")
    (True, False)
    """
    return os.fspath(vocab_file).endswith(".json")


def data_options(
    vocab_file,
    *,
    max_seq_length: int,
    max_predictions_per_seq: int | None = None,
    masked_lm_prob: float | None = None,
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
    whole_word_mask: bool = False,
    seed: int = 12345,
    do_lower_case: bool | None = None,
) -> tuple[DataOptions, bool | None]:
    """(the checked DataOptions, do_lower_case) for `vocab_file`'s kind; None takes the kind's default.

    A vocab.txt: masked_lm_prob 0.15, max_predictions_per_seq 20, lower-cased. A tokenizer.json:
    masked_lm_prob 0.3 and max_predictions_per_seq round(max_seq_length * masked_lm_prob), so no
    instance has more positions to predict than it may hold; its own normalizer decides the
    casing, and whole-word masking (WordPiece's ## pieces) does not apply.

    Example:
    >>> options, lower = data_options("tokenizer.json", max_seq_length=128)
    >>> options.masked_lm_prob, options.max_predictions_per_seq, lower
    (0.3, 38, None)
    >>> options, lower = data_options("vocab.txt", max_seq_length=128)
    >>> options.masked_lm_prob, options.max_predictions_per_seq, lower
    (0.15, 20, True)
    """
    if is_tokenizer_json(vocab_file):
        why = "a tokenizer.json's byte-level BPE has no WordPiece ## pieces to keep together"
        if whole_word_mask:
            raise KbertError(f"{option('whole_word_mask', True)} does not apply to {vocab_file}: {why}; leave it out")
        if do_lower_case is not None:
            raise KbertError(
                f"{option('do_lower_case', flag='--lowercase/--no-lowercase')} does not apply to {vocab_file}: "
                "a tokenizer.json's own normalizer decides the casing; leave it out"
            )
        masked_lm_prob = MLM_MASKED_LM_PROB if masked_lm_prob is None else masked_lm_prob
        if max_predictions_per_seq is None:
            max_predictions_per_seq = max(1, round(max_seq_length * masked_lm_prob))
    else:
        masked_lm_prob = BERT_MASKED_LM_PROB if masked_lm_prob is None else masked_lm_prob
        if max_predictions_per_seq is None:
            max_predictions_per_seq = BERT_MAX_PREDICTIONS_PER_SEQ
        do_lower_case = True if do_lower_case is None else do_lower_case
    options = DataOptions(
        max_seq_length,
        max_predictions_per_seq,
        masked_lm_prob,
        dupe_factor,
        short_seq_prob,
        bool(whole_word_mask),
        seed,
    )
    options.check()
    return options, do_lower_case


def instance_builder(vocab_file: str, do_lower_case: bool | None, options: DataOptions):
    """The builder of `vocab_file`'s kind of records, or one line saying why the file cannot make them.

    Example:
    >>> type(instance_builder("tests/fixtures/vocab-uncased.txt", True, DataOptions())).__name__
    'InstanceBuilder'
    """
    vocab_file = os.fspath(vocab_file)
    if is_tokenizer_json(vocab_file):
        from kbert.pretraining.mlm_instances import MlmInstanceBuilder  # `tokenizers`: only when used

        return MlmInstanceBuilder(vocab_file, options)
    missing = [t for t in SPECIAL_TOKENS if t not in load_vocab(vocab_file)]
    if missing:
        raise KbertError(
            f"{vocab_file} has no {', '.join(missing)}; pass a BERT vocab.txt (kbert vocab writes one) "
            "or a ModernBERT's tokenizer.json"
        )
    return InstanceBuilder(vocab_file, True if do_lower_case is None else do_lower_case, options)


def statistics(counts: InstanceCounts, vocab_file, options: DataOptions) -> dict:
    """What the summary reports of the records: `InstanceCounts.statistics`, and for masked-LM-only
    records their objective and the shapes `kbert pretrain` reads them with (no random_next_share:
    they have no next-sentence task)."""
    result = counts.statistics()
    if not is_tokenizer_json(vocab_file):
        return result
    del result["random_next_share"]
    return {
        **result,
        "objective": "mlm",
        "max_seq_length": options.max_seq_length,
        "max_predictions_per_seq": options.max_predictions_per_seq,
        "masked_lm_prob": options.masked_lm_prob,
    }
