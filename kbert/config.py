"""`BertConfig`: the keys of google-research/bert's `bert_config.json`, read and written as is."""

from __future__ import annotations

import dataclasses
import json
import os

from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import require_path

# A kbert model directory's config and vocabulary, as google-research's checkpoints name them
# (kbert.formats.model_dir has the rest of the format).
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"

# hidden_act values and the activation each one means (DESIGN.md, "Numerics").
# "gelu" is the exact erf form: the released checkpoints were trained with it.
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "relu", "tanh")
# Tokens per example when nothing else says: run_classifier.py's and create_pretraining_data.py's default.
DEFAULT_MAX_SEQ_LENGTH = 128
# The encoder's inputs, int32 [batch, seq], named as google-research/bert names them: what every
# packer makes, every model takes, pretraining records hold and every export serves.
ENCODER_INPUTS = ("input_ids", "input_mask", "segment_ids")


def sequence_length(
    requested: int | None, limit: int, trained: int | None = None, default: int = DEFAULT_MAX_SEQ_LENGTH
) -> int:
    """The tokens per example to use: the `requested` length, else the length the model was
    `trained` with, else `default`; a default is capped at `limit` (max_position_embeddings),
    a request past it is an error.

    >>> sequence_length(None, 512), sequence_length(None, 64), sequence_length(None, 512, trained=256)
    (128, 64, 256)
    >>> sequence_length(600, 512)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: max_seq_length=600 exceeds the model's max_position_embeddings 512; lower it
    >>> sequence_length(0, 512)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: max_seq_length=0: give at least 3 ([CLS], a token, [SEP])
    """
    if requested is not None:  # 0 is a mistake to name, not "unset"
        if requested < 3:
            raise KbertError(f"{option('max_seq_length', requested)}: give at least 3 ([CLS], a token, [SEP])")
        if requested > limit:
            raise KbertError(
                f"{option('max_seq_length', requested)} exceeds the model's max_position_embeddings {limit}; lower it"
            )
        return int(requested)
    return min(int(trained or default), limit)


@dataclasses.dataclass
class BertConfig:
    """The shape and regularisation of a BERT, with google-research/bert's key names.

    Args:
        vocab_size: int. Rows of the word-embedding table (30522 for the English uncased models).
        hidden_size: int. Width H of every layer.
        num_hidden_layers: int. Number of transformer layers L.
        num_attention_heads: int. Heads A per layer; must divide `hidden_size`.
        intermediate_size: int. Width of the feed-forward layer (4H in the released models).
        hidden_act: str. "gelu" (exact erf), "gelu_new"/"gelu_tanh" (tanh approximation), "relu", "tanh".
        hidden_dropout_prob: float. Dropout after embeddings, attention output and feed-forward.
        attention_probs_dropout_prob: float. Dropout on the attention probabilities.
        max_position_embeddings: int. Longest sequence the position table covers.
        type_vocab_size: int. Number of segment ids (2: sentence A and B).
        initializer_range: float. Stddev of the truncated-normal initializer.
        extras: dict. Keys kbert adds (`do_lower_case`, `kbert_model`, task, labels...);
            written back to `bert_config.json` after the original keys.

    Example:
    >>> config = BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2,
    ...                     num_attention_heads=4, intermediate_size=128)
    >>> config.head_size
    16
    >>> BertConfig.from_dict(config.to_dict()) == config
    True
    """

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 16  # google-research/bert's default; released configs say 2
    initializer_range: float = 0.02
    extras: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extras")

    def validate(self):
        """Raise `KbertError` naming the first key whose type or value is wrong."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KbertError(f"bert_config: {name} must be a positive integer, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise KbertError(f"bert_config: {name} must be a number in [0, 1), got {value!r}")
        if (
            isinstance(self.initializer_range, bool)
            or not isinstance(self.initializer_range, (int, float))
            or self.initializer_range <= 0
        ):
            raise KbertError(
                f"bert_config: initializer_range must be a positive number, got {self.initializer_range!r}"
            )
        if self.hidden_act not in HIDDEN_ACTS:
            raise KbertError(
                f"bert_config: hidden_act {self.hidden_act!r} is not supported; use one of {', '.join(HIDDEN_ACTS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise KbertError(
                f"bert_config: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if not isinstance(self.extras, dict):
            raise KbertError("bert_config: extras must be a dict")

    @classmethod
    def from_dict(cls, values: dict) -> BertConfig:
        """Build from a `bert_config.json` dict; unknown keys are kept in `extras`."""
        if not isinstance(values, dict):
            raise KbertError(f"bert_config must be a JSON object, got {type(values).__name__}")
        if "vocab_size" not in values:
            raise KbertError("bert_config: vocab_size is missing; add it (the number of lines of vocab.txt)")
        known = {k: v for k, v in values.items() if k in cls.field_names()}
        extras = {k: v for k, v in values.items() if k not in cls.field_names() and k != "extras"}
        extras.update(values.get("extras") or {})
        return cls(**known, extras=extras)

    def to_dict(self) -> dict:
        """The original keys in the original order, then kbert's extras."""
        out = {name: getattr(self, name) for name in self.field_names()}
        out.update(self.extras)
        return out

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> BertConfig:
        """Read a `bert_config.json` as google-research/bert's `BertConfig.from_json_file` does."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise KbertError(f"{path}: no such config file; pass the bert_config.json that came with the checkpoint")
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise KbertError(f"{path}: invalid JSON ({e}); fix the file or re-download it") from None
        try:
            return cls.from_dict(values)
        except KbertError as e:
            raise KbertError(f"{path}: {e}") from None
        except TypeError as e:
            raise KbertError(f"{path}: {e}") from None

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def to_json_file(self, path: str | os.PathLike):
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json_string())


def load_config(model_dir) -> BertConfig:
    """The `BertConfig` of a kbert model directory (its bert_config.json, kbert's keys in `extras`)."""
    require_path(model_dir, "model directory", "pass a directory written by kbert (convert, pretrain, finetune)")
    return BertConfig.from_json_file(os.path.join(model_dir, CONFIG_FILE))
