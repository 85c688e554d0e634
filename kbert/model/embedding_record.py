"""A sentence-embedding model's record: how its token vectors become one vector per text.

bert_config.json's `embedding` (and a .keras file's config) says it, e.g. {"pooling": "mean",
"normalize": true, "max_seq_length": 256}, as a sentence-transformers model's modules say
(converters/hf.py). `embedding_settings` is what `kbert embed`, `kbert evaluate` and `kbert
finetune --task embed` use: the settings given, over the record.

Example:
>>> import kbert
>>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
...                           intermediate_size=16, extras={"embedding": {"pooling": "cls"}})
>>> embedding_settings(kbert.bert_encoder(config), max_seq_length=64)
EmbeddingSettings(pooling='cls', normalize=False, max_seq_length=64)
"""

from __future__ import annotations

import dataclasses

from kbert.config import BertConfig, sequence_length
from kbert.model.kinds import model_kind
from kbert.model.pooling import POOLING_MODES
from kbert.runtime.errors import KbertError, on_command_line, option

# The key of the record in bert_config.json.
EMBEDDING_KEY = "embedding"
# The kinds of model whose encoder makes the sentence vectors: a task head's encoder was trained
# for its task instead.
EMBEDDING_KINDS = ("encoder", "pretrainer")


def check_embedding(config: BertConfig, where) -> dict | None:
    """The embedding record `config` holds (`EMBEDDING_KEY`), checked; None when it has none.

    >>> config = BertConfig(vocab_size=10, extras={"embedding": {"pooling": "mean", "normalize": True}})
    >>> check_embedding(config, "bert_config.json")
    {'pooling': 'mean', 'normalize': True}
    >>> check_embedding(BertConfig(vocab_size=10, extras={"embedding": {"pooling": "sum"}}), "bert_config.json")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: bert_config.json: embedding pooling 'sum' is not one of cls, mean, max, mean_sqrt_len; fix bert_config.json or convert the model again
    """
    record = config.extras.get(EMBEDDING_KEY)
    if record is None:
        return None
    fix = "fix bert_config.json or convert the model again"
    if not isinstance(record, dict) or set(record) - {"pooling", "normalize", "max_seq_length"}:
        raise KbertError(
            f"{where}: embedding must be an object of pooling, normalize and max_seq_length, got {record!r}; {fix}"[
                :400
            ]
        )
    if record.get("pooling") not in POOLING_MODES:
        raise KbertError(
            f"{where}: embedding pooling {record.get('pooling')!r} is not one of {', '.join(POOLING_MODES)}; {fix}"
        )
    if not isinstance(record.get("normalize", False), bool):
        raise KbertError(f"{where}: embedding normalize must be true or false, got {record['normalize']!r}; {fix}")
    length = record.get("max_seq_length")
    limit = config.max_position_embeddings
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or not 3 <= length <= limit):
        raise KbertError(
            f"{where}: embedding max_seq_length {length!r} must be a whole number from 3 to {limit} "
            f"(max_position_embeddings); {fix}"
        )
    return dict(record)


@dataclasses.dataclass(frozen=True)
class EmbeddingSettings:
    """How a model's token vectors become one vector per text.

    Args:
        pooling: str. One of `kbert.model.pooling.POOLING_MODES`.
        normalize: bool. L2-normalise each vector.
        max_seq_length: int. Tokens per text (or per window), [CLS] and [SEP] included.
    """

    pooling: str
    normalize: bool
    max_seq_length: int


def embedding_of(model) -> dict | None:
    """The embedding record of a kbert model (its config's `embedding`, checked), or None: a
    model with a task head has none, as its encoder was trained for the task."""
    if model_kind(model) not in EMBEDDING_KINDS:
        return None
    return check_embedding(model.config, getattr(model, "name", "the model"))


def check_pooling(pooling=None, normalize=None):
    """One line for a pooling or normalize that no model takes.

    >>> check_pooling("sum")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: pooling='sum': use one of cls, mean, max, mean_sqrt_len
    """
    if pooling is not None and pooling not in POOLING_MODES:
        raise KbertError(f"{option('pooling', pooling)}: use one of {', '.join(POOLING_MODES)}")
    if normalize is not None and not isinstance(normalize, bool):
        raise KbertError(f"{option('normalize', normalize)}: give True or False")


def embedding_settings(
    model, pooling: str | None = None, normalize: bool | None = None, max_seq_length: int | None = None, where=None
) -> EmbeddingSettings:
    """What `embed` uses for `model`: the arguments given, over the model's embedding record.

    A model with no record (a plain BERT, a classifier) needs `pooling`; `normalize` then
    defaults to False and `max_seq_length` to 128 (capped at max_position_embeddings).

    Example:
    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                           intermediate_size=16, extras={"embedding": {"pooling": "mean", "normalize": True}})
    >>> embedding_settings(kbert.bert_encoder(config))
    EmbeddingSettings(pooling='mean', normalize=True, max_seq_length=128)
    >>> embedding_settings(kbert.bert_encoder(kbert.BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
    ...                    num_attention_heads=2, intermediate_size=16)), where="plain-bert")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: plain-bert records no sentence-embedding pooling (kbert convert from-hf records a sentence-transformers model's); pass pooling='cls', 'mean', 'max' or 'mean_sqrt_len' to choose one (and normalize=True for unit-length vectors)
    """
    record = embedding_of(model) or {}
    if pooling is None and not record:
        if on_command_line():
            said = f"{option('pooling')} {'|'.join(POOLING_MODES)}"
        else:
            said = f"pooling={', '.join(repr(m) for m in POOLING_MODES[:-1])} or {POOLING_MODES[-1]!r}"
        raise KbertError(
            f"{where or 'the model'} records no sentence-embedding pooling (kbert convert from-hf records a "
            f"sentence-transformers model's); pass {said} to choose one (and {option('normalize', True)} for "
            f"unit-length vectors)"
        )
    check_pooling(pooling, normalize)
    if max_seq_length is not None and (isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int)):
        raise KbertError(f"{option('max_seq_length', max_seq_length)}: give a whole number of tokens")
    length = sequence_length(max_seq_length, model.config.max_position_embeddings, record.get("max_seq_length"))
    return EmbeddingSettings(
        pooling=pooling or record["pooling"],
        normalize=bool(record.get("normalize", False) if normalize is None else normalize),
        max_seq_length=length,
    )
