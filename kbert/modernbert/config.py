"""ModernBERT's configuration: the keys of transformers' `ModernBertConfig`, read from and
written to a `config.json`.

Hugging Face's configs come in two spellings: transformers 4 wrote `global_attn_every_n_layers`,
`global_rope_theta` and `local_rope_theta` (ModernBERT's and Ettin's released folders), and
transformers 5 writes `layer_types` and `rope_parameters`. Both are read; both are written, so
that either version of transformers loads what kbert writes.

>>> config = ModernBertConfig.from_hf({"num_hidden_layers": 4, "global_attn_every_n_layers": 2})
>>> config.layer_types
('full_attention', 'sliding_attention', 'full_attention', 'sliding_attention')
>>> config.rope_theta("sliding_attention"), config.window
(10000.0, 64)
"""

from __future__ import annotations

import dataclasses

from kbert.runtime.errors import KbertError

FULL, SLIDING = "full_attention", "sliding_attention"
# The activations transformers' ACT2FN names that kbert computes alike: "gelu" is the exact erf
# form in both; gelu_new and gelu_pytorch_tanh the tanh approximation.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "tanh")
POOLINGS = ("cls", "mean")


@dataclasses.dataclass
class ModernBertConfig:
    """A ModernBERT's shape and numerics, as transformers' `ModernBertConfig` names them.

    `extras` keeps every other key of the config.json it was read from (and kbert's own,
    `kbert_model` and a task's record), so that writing it back loses nothing.
    """

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    local_attention: int = 128
    layer_types: tuple = ()
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    classifier_pooling: str = "cls"
    classifier_activation: str = "gelu"
    classifier_bias: bool = False
    decoder_bias: bool = True
    pad_token_id: int = 50283
    extras: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = layer_pattern(self.num_hidden_layers, 3)
        self.layer_types = tuple(self.layer_types)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def window(self) -> int:
        """How far apart two tokens of a sliding-window layer may be and still attend to each other."""
        return self.local_attention // 2

    def rope_theta(self, layer_type: str) -> float:
        return self.global_rope_theta if layer_type == FULL else self.local_rope_theta

    def validate(self, where: str = "config.json"):
        """One line for a config kbert would compute differently from transformers."""
        if self.hidden_size % self.num_attention_heads:
            raise KbertError(
                f"{where}: hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {FULL, SLIDING}:
            raise KbertError(
                f"{where}: layer_types must name {FULL!r} or {SLIDING!r} for each of the "
                f"{self.num_hidden_layers} layers"
            )
        for key in ("hidden_activation", "classifier_activation"):
            if getattr(self, key) not in ACTIVATIONS:
                raise KbertError(f"{where}: {key} {getattr(self, key)!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.classifier_pooling not in POOLINGS:
            raise KbertError(f"{where}: classifier_pooling {self.classifier_pooling!r}: kbert pools cls or mean")
        return self

    @classmethod
    def from_hf(cls, values: dict, where: str = "config.json") -> ModernBertConfig:
        """The config a Hugging Face ModernBERT config.json dict describes, in either spelling."""
        values = dict(values)
        fields = {f.name for f in dataclasses.fields(cls)} - {"extras", "layer_types"}
        known = {k: values.pop(k) for k in list(values) if k in fields}
        layers = known.get("num_hidden_layers", cls.num_hidden_layers)
        every = values.pop("global_attn_every_n_layers", 3)
        layer_types = values.pop("layer_types", None) or layer_pattern(layers, every)
        rope = values.pop("rope_parameters", None) or {}
        for layer_type, key in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
            params = rope.get(layer_type) or {}
            if params.get("rope_type", "default") != "default":
                raise KbertError(
                    f"{where}: rope_type {params['rope_type']!r} for {layer_type}; kbert computes the "
                    f"default rotary positions only"
                )
            if "rope_theta" in params:
                known[key] = float(params["rope_theta"])
        if values.get("head_dim") not in (
            None,
            known.get("hidden_size", cls.hidden_size) // known.get("num_attention_heads", cls.num_attention_heads),
        ):
            raise KbertError(f"{where}: head_dim {values['head_dim']} differs from hidden_size / num_attention_heads")
        if values.get("tie_word_embeddings") is False:
            raise KbertError(f"{where}: tie_word_embeddings is false; kbert ties the MLM decoder to the embeddings")
        return cls(**known, layer_types=tuple(layer_types), extras=values).validate(where)

    def to_hf(self) -> dict:
        """config.json's dict, which transformers 4 and 5 both read."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extras"}
        values["layer_types"] = list(self.layer_types)
        every = regular_interval(self.layer_types)
        if every is not None:
            values["global_attn_every_n_layers"] = every
        values["rope_parameters"] = {
            FULL: {"rope_type": "default", "rope_theta": self.global_rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": self.local_rope_theta},
        }
        return {**self.extras, **values, "model_type": "modernbert"}


def layer_pattern(num_layers: int, every: int) -> tuple:
    """Global attention on every `every`-th layer from the first, a sliding window elsewhere."""
    return tuple(SLIDING if i % every else FULL for i in range(num_layers))


def regular_interval(layer_types) -> int | None:
    """The N of "global every N layers" that gives `layer_types`, or None if no N does."""
    for every in range(1, len(layer_types) + 1):
        if tuple(layer_types) == layer_pattern(len(layer_types), every):
            return every
    return None
