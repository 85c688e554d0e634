"""The one table between kbert's Keras weight paths and google-research/bert's variable names.

Every converter (TF1 checkpoints, and any later format) goes through `WEIGHT_NAMES`; nothing
else in kbert spells a checkpoint name. Shapes are the same on both sides (kbert keeps the
original layouts), so each row is a plain copy.
"""

from __future__ import annotations

import re

# (kbert weight path, google-research/bert name). "{i}" is the transformer layer index.
WEIGHT_NAMES = (
    # --- encoder: modeling.BertModel ---
    ("embeddings/word_embeddings/embeddings", "bert/embeddings/word_embeddings"),
    ("embeddings/token_type_embeddings/embeddings", "bert/embeddings/token_type_embeddings"),
    ("embeddings/position_embeddings/embeddings", "bert/embeddings/position_embeddings"),
    ("embeddings/layer_norm/gamma", "bert/embeddings/LayerNorm/gamma"),
    ("embeddings/layer_norm/beta", "bert/embeddings/LayerNorm/beta"),
    ("transformer_layer_{i}/query/kernel", "bert/encoder/layer_{i}/attention/self/query/kernel"),
    ("transformer_layer_{i}/query/bias", "bert/encoder/layer_{i}/attention/self/query/bias"),
    ("transformer_layer_{i}/key/kernel", "bert/encoder/layer_{i}/attention/self/key/kernel"),
    ("transformer_layer_{i}/key/bias", "bert/encoder/layer_{i}/attention/self/key/bias"),
    ("transformer_layer_{i}/value/kernel", "bert/encoder/layer_{i}/attention/self/value/kernel"),
    ("transformer_layer_{i}/value/bias", "bert/encoder/layer_{i}/attention/self/value/bias"),
    ("transformer_layer_{i}/attention_output/kernel", "bert/encoder/layer_{i}/attention/output/dense/kernel"),
    ("transformer_layer_{i}/attention_output/bias", "bert/encoder/layer_{i}/attention/output/dense/bias"),
    ("transformer_layer_{i}/attention_layer_norm/gamma", "bert/encoder/layer_{i}/attention/output/LayerNorm/gamma"),
    ("transformer_layer_{i}/attention_layer_norm/beta", "bert/encoder/layer_{i}/attention/output/LayerNorm/beta"),
    ("transformer_layer_{i}/intermediate/kernel", "bert/encoder/layer_{i}/intermediate/dense/kernel"),
    ("transformer_layer_{i}/intermediate/bias", "bert/encoder/layer_{i}/intermediate/dense/bias"),
    ("transformer_layer_{i}/output/kernel", "bert/encoder/layer_{i}/output/dense/kernel"),
    ("transformer_layer_{i}/output/bias", "bert/encoder/layer_{i}/output/dense/bias"),
    ("transformer_layer_{i}/output_layer_norm/gamma", "bert/encoder/layer_{i}/output/LayerNorm/gamma"),
    ("transformer_layer_{i}/output_layer_norm/beta", "bert/encoder/layer_{i}/output/LayerNorm/beta"),
    ("pooler/kernel", "bert/pooler/dense/kernel"),
    ("pooler/bias", "bert/pooler/dense/bias"),
    # --- masked-LM head: run_pretraining.get_masked_lm_output ---
    ("mlm_head/transform/kernel", "cls/predictions/transform/dense/kernel"),
    ("mlm_head/transform/bias", "cls/predictions/transform/dense/bias"),
    ("mlm_head/layer_norm/gamma", "cls/predictions/transform/LayerNorm/gamma"),
    ("mlm_head/layer_norm/beta", "cls/predictions/transform/LayerNorm/beta"),
    ("mlm_head/output_bias", "cls/predictions/output_bias"),
    # --- next-sentence head: run_pretraining.get_next_sentence_output ---
    ("nsp_head/output_weights", "cls/seq_relationship/output_weights"),
    ("nsp_head/output_bias", "cls/seq_relationship/output_bias"),
)

# Which head a TF1 name belongs to, by prefix; used to report heads present or fresh.
HEADS = {"masked_lm": "cls/predictions/", "next_sentence": "cls/seq_relationship/"}

# Which bert_config.json field most likely set each dimension of a weight, for shape errors.
# (regex on the TF1 name, axis) -> config field; any other axis is hidden_size.
_SUSPECT_FIELDS = {
    (r"word_embeddings$", 0): "vocab_size",
    (r"token_type_embeddings$", 0): "type_vocab_size",
    (r"position_embeddings$", 0): "max_position_embeddings",
    (r"intermediate/dense/kernel$", 1): "intermediate_size",
    (r"intermediate/dense/bias$", 0): "intermediate_size",
    (r"layer_\d+/output/dense/kernel$", 0): "intermediate_size",
    (r"cls/predictions/output_bias$", 0): "vocab_size",
}


def tf1_to_kbert_paths(num_layers: int) -> dict[str, str]:
    """{google-research name: kbert weight path} for a model with `num_layers` layers.

    >>> tf1_to_kbert_paths(1)["bert/encoder/layer_0/attention/self/query/kernel"]
    'transformer_layer_0/query/kernel'
    """
    out = {}
    for kbert_path, tf1_name in WEIGHT_NAMES:
        if "{i}" in kbert_path:
            for i in range(num_layers):
                out[tf1_name.format(i=i)] = kbert_path.format(i=i)
        else:
            out[tf1_name] = kbert_path
    return out


def suspect_field(tf1_name: str, expected: tuple, found: tuple) -> str:
    """The bert_config.json field that most likely explains a shape mismatch on `tf1_name`."""
    if len(expected) != len(found):
        return "the checkpoint's format (ranks differ)"
    for axis, (e, f) in enumerate(zip(expected, found)):
        if e == f:
            continue
        for (pattern, suspect_axis), field in _SUSPECT_FIELDS.items():
            if re.search(pattern, tf1_name) and axis == suspect_axis:
                return field
        return "hidden_size"
    return "none (shapes agree)"
