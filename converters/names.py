"""The one table between kbert's Keras weight paths and google-research/bert's variable names.

Every converter (TF1 checkpoints, Hugging Face safetensors, and any later format) goes through
`WEIGHT_NAMES`; nothing else in kbert spells a checkpoint name. Its columns are kbert, TF1,
Model Garden (TF Hub encoders) and keras-hub. Shapes are the original's in kbert and TF1; Model
Garden and keras-hub split attention weights by head (`split_heads_shape`), a reshape of the same
numbers. Hugging Face names are derived from the TF1 column by one rule (`hf_name`), not listed
a second time.
"""

from __future__ import annotations

import re

# One row per weight: (kbert weight path, google-research/bert name, Model Garden name, keras-hub
# path). Model Garden's is the variable name in its TF Hub encoders (`official.nlp` BertEncoder
# and BertPretrainerV2's MaskedLM, as `export_tfhub_lib` saves them); keras-hub's is the weight
# path in a BertBackbone, or in a BertMaskedLM for the masked-LM head. None: that format has no such weight. "{i}" is the layer index.
# fmt: off
WEIGHT_NAMES = (
    # --- encoder: modeling.BertModel ---
    ("embeddings/word_embeddings/embeddings", "bert/embeddings/word_embeddings", "word_embeddings/embeddings", "token_embedding/embeddings"),
    ("embeddings/token_type_embeddings/embeddings", "bert/embeddings/token_type_embeddings", "type_embeddings/embeddings", "segment_embedding/embeddings"),
    ("embeddings/position_embeddings/embeddings", "bert/embeddings/position_embeddings", "position_embedding/embeddings", "position_embedding/embeddings"),
    ("embeddings/layer_norm/gamma", "bert/embeddings/LayerNorm/gamma", "embeddings/layer_norm/gamma", "embeddings_layer_norm/gamma"),
    ("embeddings/layer_norm/beta", "bert/embeddings/LayerNorm/beta", "embeddings/layer_norm/beta", "embeddings_layer_norm/beta"),
    ("transformer_layer_{i}/query/kernel", "bert/encoder/layer_{i}/attention/self/query/kernel", "transformer/layer_{i}/self_attention/query/kernel", "transformer_layer_{i}/self_attention_layer/query/kernel"),
    ("transformer_layer_{i}/query/bias", "bert/encoder/layer_{i}/attention/self/query/bias", "transformer/layer_{i}/self_attention/query/bias", "transformer_layer_{i}/self_attention_layer/query/bias"),
    ("transformer_layer_{i}/key/kernel", "bert/encoder/layer_{i}/attention/self/key/kernel", "transformer/layer_{i}/self_attention/key/kernel", "transformer_layer_{i}/self_attention_layer/key/kernel"),
    ("transformer_layer_{i}/key/bias", "bert/encoder/layer_{i}/attention/self/key/bias", "transformer/layer_{i}/self_attention/key/bias", "transformer_layer_{i}/self_attention_layer/key/bias"),
    ("transformer_layer_{i}/value/kernel", "bert/encoder/layer_{i}/attention/self/value/kernel", "transformer/layer_{i}/self_attention/value/kernel", "transformer_layer_{i}/self_attention_layer/value/kernel"),
    ("transformer_layer_{i}/value/bias", "bert/encoder/layer_{i}/attention/self/value/bias", "transformer/layer_{i}/self_attention/value/bias", "transformer_layer_{i}/self_attention_layer/value/bias"),
    ("transformer_layer_{i}/attention_output/kernel", "bert/encoder/layer_{i}/attention/output/dense/kernel", "transformer/layer_{i}/self_attention/attention_output/kernel", "transformer_layer_{i}/self_attention_layer/attention_output/kernel"),
    ("transformer_layer_{i}/attention_output/bias", "bert/encoder/layer_{i}/attention/output/dense/bias", "transformer/layer_{i}/self_attention/attention_output/bias", "transformer_layer_{i}/self_attention_layer/attention_output/bias"),
    ("transformer_layer_{i}/attention_layer_norm/gamma", "bert/encoder/layer_{i}/attention/output/LayerNorm/gamma", "transformer/layer_{i}/self_attention_layer_norm/gamma", "transformer_layer_{i}/self_attention_layer_norm/gamma"),
    ("transformer_layer_{i}/attention_layer_norm/beta", "bert/encoder/layer_{i}/attention/output/LayerNorm/beta", "transformer/layer_{i}/self_attention_layer_norm/beta", "transformer_layer_{i}/self_attention_layer_norm/beta"),
    ("transformer_layer_{i}/intermediate/kernel", "bert/encoder/layer_{i}/intermediate/dense/kernel", "transformer/layer_{i}/intermediate/kernel", "transformer_layer_{i}/feedforward_intermediate_dense/kernel"),
    ("transformer_layer_{i}/intermediate/bias", "bert/encoder/layer_{i}/intermediate/dense/bias", "transformer/layer_{i}/intermediate/bias", "transformer_layer_{i}/feedforward_intermediate_dense/bias"),
    ("transformer_layer_{i}/output/kernel", "bert/encoder/layer_{i}/output/dense/kernel", "transformer/layer_{i}/output/kernel", "transformer_layer_{i}/feedforward_output_dense/kernel"),
    ("transformer_layer_{i}/output/bias", "bert/encoder/layer_{i}/output/dense/bias", "transformer/layer_{i}/output/bias", "transformer_layer_{i}/feedforward_output_dense/bias"),
    ("transformer_layer_{i}/output_layer_norm/gamma", "bert/encoder/layer_{i}/output/LayerNorm/gamma", "transformer/layer_{i}/output_layer_norm/gamma", "transformer_layer_{i}/feedforward_layer_norm/gamma"),
    ("transformer_layer_{i}/output_layer_norm/beta", "bert/encoder/layer_{i}/output/LayerNorm/beta", "transformer/layer_{i}/output_layer_norm/beta", "transformer_layer_{i}/feedforward_layer_norm/beta"),
    ("pooler/kernel", "bert/pooler/dense/kernel", "pooler_transform/kernel", "pooled_dense/kernel"),
    ("pooler/bias", "bert/pooler/dense/bias", "pooler_transform/bias", "pooled_dense/bias"),
    # --- masked-LM head: run_pretraining.get_masked_lm_output ---
    ("mlm_head/transform/kernel", "cls/predictions/transform/dense/kernel", "bert/cls/predictions/transform/dense/kernel", "mlm_head/intermediate_dense/kernel"),
    ("mlm_head/transform/bias", "cls/predictions/transform/dense/bias", "bert/cls/predictions/transform/dense/bias", "mlm_head/intermediate_dense/bias"),
    ("mlm_head/layer_norm/gamma", "cls/predictions/transform/LayerNorm/gamma", "bert/cls/predictions/transform/LayerNorm/gamma", "mlm_head/intermediate_layer_norm/gamma"),
    ("mlm_head/layer_norm/beta", "cls/predictions/transform/LayerNorm/beta", "bert/cls/predictions/transform/LayerNorm/beta", "mlm_head/intermediate_layer_norm/beta"),
    ("mlm_head/output_bias", "cls/predictions/output_bias", "bert/cls/predictions/output_bias/bias", "mlm_head/output_bias"),
    # --- next-sentence head: run_pretraining.get_next_sentence_output ---
    ("nsp_head/output_weights", "cls/seq_relationship/output_weights", None, None),
    ("nsp_head/output_bias", "cls/seq_relationship/output_bias", None, None),
)
# fmt: on

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


# Hugging Face's BertForPreTraining names each parameter by the rule transformers' own TF1
# converter (`load_tf_weights_in_bert`) applies to the names above: "/" -> ".", "layer_N" ->
# "layer.N", kernel/gamma/output_weights -> weight, beta/output_bias -> bias, and an embedding
# table gains ".weight". A kernel is stored transposed (torch's Linear is [out, in]);
# output_weights is already [2, H] in both. `hf_name` is that rule, so the table stays one table.
_HF_LEAF = {"kernel": "weight", "gamma": "weight", "beta": "bias", "output_weights": "weight", "output_bias": "bias"}
# Parameters transformers has that google-research/bert does not: the MLM decoder, tied to the
# word embeddings and to cls.predictions.bias (an HF file may hold copies of them, or not).
HF_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Buffers some HF files hold that are not weights (position indices 0..max_position-1).
HF_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
# Parts an HF file may lack, freshly initialised then: the two heads as in TF1, and the pooler,
# which transformers leaves out of BertForMaskedLM (add_pooling_layer=False).
HF_OPTIONAL = {**{head: prefix.replace("/", ".") for head, prefix in HEADS.items()}, "pooler": "bert.pooler."}


def hf_name(tf1_name: str) -> tuple[str, bool]:
    """(Hugging Face BertForPreTraining name, stored transposed?) of a google-research name.

    >>> hf_name("bert/encoder/layer_3/attention/output/dense/kernel")
    ('bert.encoder.layer.3.attention.output.dense.weight', True)
    >>> hf_name("bert/embeddings/word_embeddings")
    ('bert.embeddings.word_embeddings.weight', False)
    >>> hf_name("cls/predictions/output_bias"), hf_name("cls/seq_relationship/output_weights")
    (('cls.predictions.bias', False), ('cls.seq_relationship.weight', False))
    """
    parts = tf1_name.split("/")
    leaf = parts[-1]
    if leaf.endswith("_embeddings"):
        parts.append("weight")
    else:
        parts[-1] = _HF_LEAF.get(leaf, leaf)
    return re.sub(r"\.layer_(\d+)\.", r".layer.\1.", ".".join(parts)), leaf == "kernel"


def hf_canonical(key: str) -> str:
    """An HF file's key as BertForPreTraining names it: BertModel files lack the `bert.` prefix,
    and files converted by early pytorch-pretrained-bert still say LayerNorm.gamma/beta.

    >>> hf_canonical("encoder.layer.0.output.LayerNorm.gamma")
    'bert.encoder.layer.0.output.LayerNorm.weight'
    >>> hf_canonical("cls.predictions.bias")
    'cls.predictions.bias'
    """
    if not key.startswith(("bert.", "cls.")):
        key = "bert." + key
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))


def tf1_to_kbert_paths(num_layers: int) -> dict[str, str]:
    """{google-research name: kbert weight path} for a model with `num_layers` layers.

    >>> tf1_to_kbert_paths(1)["bert/encoder/layer_0/attention/self/query/kernel"]
    'transformer_layer_0/query/kernel'
    """
    out = {}
    for kbert_path, tf1_name, *_ in WEIGHT_NAMES:
        if "{i}" in kbert_path:
            for i in range(num_layers):
                out[tf1_name.format(i=i)] = kbert_path.format(i=i)
        else:
            out[tf1_name] = kbert_path
    return out


COLUMNS = ("kbert", "tf1", "model_garden", "keras_hub")


def names_to_kbert_paths(column: str, num_layers: int) -> dict[str, str]:
    """{name in `column` of WEIGHT_NAMES: kbert weight path} for a model with `num_layers` layers.

    >>> names_to_kbert_paths("keras_hub", 2)["transformer_layer_1/self_attention_layer/query/kernel"]
    'transformer_layer_1/query/kernel'
    >>> names_to_kbert_paths("model_garden", 1)["pooler_transform/bias"]
    'pooler/bias'
    """
    index = COLUMNS.index(column)
    out = {}
    for row in WEIGHT_NAMES:
        if row[index] is None:
            continue
        for i in range(num_layers) if "{i}" in row[0] else [None]:
            out[row[index].format(i=i)] = row[0].format(i=i)
    return out


def split_heads_shape(kbert_path: str, shape: tuple, num_heads: int) -> tuple:
    """The shape Model Garden and keras-hub store a kbert weight in: attention weights split by
    head (their EinsumDense layers), the rest as kbert. The values are the same in row-major
    order, so converting is a reshape.

    >>> split_heads_shape("transformer_layer_0/query/kernel", (768, 768), 12)
    (768, 12, 64)
    >>> split_heads_shape("transformer_layer_0/value/bias", (768,), 12)
    (12, 64)
    >>> split_heads_shape("transformer_layer_0/attention_output/kernel", (768, 768), 12)
    (12, 64, 768)
    >>> split_heads_shape("pooler/kernel", (768, 768), 12)
    (768, 768)
    """
    layer_weight = kbert_path.split("/", 1)[-1]
    if layer_weight in ("query/kernel", "key/kernel", "value/kernel"):
        return (shape[0], num_heads, shape[1] // num_heads)
    if layer_weight in ("query/bias", "key/bias", "value/bias"):
        return (num_heads, shape[0] // num_heads)
    if layer_weight == "attention_output/kernel":
        return (num_heads, shape[0] // num_heads, shape[1])
    return tuple(shape)


def hf_to_tf1_names(num_layers: int) -> dict[str, str]:
    """{Hugging Face name: google-research name} for a model with `num_layers` layers.

    >>> hf_to_tf1_names(1)["bert.encoder.layer.0.intermediate.dense.weight"]
    'bert/encoder/layer_0/intermediate/dense/kernel'
    """
    return {hf_name(tf1)[0]: tf1 for tf1 in tf1_to_kbert_paths(num_layers)}


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


# A fine-tuned classifier's head as run_classifier.py's create_model names it in its checkpoints:
# {TF1 name: kbert path}; output_weights is [num_labels, H] in both.
TF1_CLASSIFIER_HEAD = {"output_weights": "classifier_head/output_weights", "output_bias": "classifier_head/output_bias"}

# A fine-tuned classifier's head (run_classifier.py's output_weights [num_labels, H] and
# output_bias) in keras-hub's BertTextClassifier: its "logits" Dense, kernel [H, num_labels].
# (kbert path, keras-hub path, stored transposed?)
KERAS_HUB_CLASSIFIER_HEAD = (
    ("classifier_head/output_weights", "logits/kernel", True),
    ("classifier_head/output_bias", "logits/bias", False),
)
