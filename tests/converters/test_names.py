"""kbert.converters.names, the one table of weight names, against names and shapes kbert did not
write: the tf1-tiny checkpoint (google-research/bert's own code), hf-tiny (transformers' own
converter), Model Garden's TF Hub export of tf1-tiny, and keras-hub's BertBackbone."""

import json
import os
import struct

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import kbert
from conftest import FIXTURES, TINY
from kbert.converters.names import (
    COLUMNS,
    HEADS,
    HF_BUFFERS,
    HF_OPTIONAL,
    HF_TIED,
    KERAS_HUB_CLASSIFIER_HEAD,
    WEIGHT_NAMES,
    hf_canonical,
    hf_name,
    hf_to_tf1_names,
    names_to_kbert_paths,
    split_heads_shape,
    suspect_field,
    tf1_to_kbert_paths,
)

CONFIG = json.load(open(f"{TINY}/bert_config.json"))
LAYERS, HEADS_PER_LAYER = CONFIG["num_hidden_layers"], CONFIG["num_attention_heads"]


def _read(prefix):
    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _safetensors_shapes(path):
    """{name: shape} from a safetensors header, read by hand: 8 bytes of length, then JSON."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def _saved_model_variables(path):
    """{variable name: shape} of a SavedModel's trainable variables, from its object graph."""
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return {
        node.variable.name: tuple(d.size for d in node.variable.shape.dim)
        for node in saved_model.meta_graphs[0].object_graph_def.nodes
        if node.WhichOneof("kind") == "variable" and node.variable.trainable
    }


ORIGINAL = _read(f"{TINY}/bert_model.ckpt")
TF1_SHAPES = {name: tuple(value.shape) for name, value in ORIGINAL.items()}
HF_ORIGINAL = _safetensors_shapes(os.path.join(FIXTURES, "hf-tiny", "model.safetensors"))


# === google-research/bert ===


def test_table_covers_every_weight_both_ways():
    model = kbert.bert_pretrainer(kbert.BertConfig.from_json_file(f"{TINY}/bert_config.json"))
    paths = {v.path for v in model.weights}
    mapping = tf1_to_kbert_paths(2)
    assert set(mapping.values()) == paths
    assert set(mapping) == set(ORIGINAL)
    assert len({row[0] for row in WEIGHT_NAMES}) == len(WEIGHT_NAMES)


def test_every_row_is_per_layer_in_every_format_or_in_none():
    for row in WEIGHT_NAMES:
        assert len(row) == len(COLUMNS)
        assert {"{i}" in name for name in row if name is not None} in ({True}, {False}), row
    assert names_to_kbert_paths("tf1", 3) == tf1_to_kbert_paths(3)
    # modeling.py: 5 embedding variables, 16 per layer, the pooler's 2; the heads' 5 + 2 (tf1-tiny: 46)
    assert len(tf1_to_kbert_paths(24)) == 5 + 16 * 24 + 2 + 5 + 2


def test_heads_are_the_originals_cls_scopes():
    for head, prefix in HEADS.items():
        names = {name for name in ORIGINAL if name.startswith(prefix)}
        assert len(names) == {"masked_lm": 5, "next_sentence": 2}[head]
    assert {name for name in ORIGINAL if not name.startswith("bert/")} == {
        name for name in ORIGINAL if name.startswith(tuple(HEADS.values()))
    }


def test_suspect_field_names_the_config_field_that_sets_that_axis():
    # Shapes as google-research/bert's modeling.py makes them (tf1-tiny: vocab 300, H 64, 128 intermediate).
    cases = [
        ("bert/embeddings/word_embeddings", (300, 64), (30522, 64), "vocab_size"),
        ("bert/embeddings/word_embeddings", (300, 64), (300, 768), "hidden_size"),
        ("bert/embeddings/token_type_embeddings", (2, 64), (16, 64), "type_vocab_size"),
        ("bert/embeddings/position_embeddings", (64, 64), (512, 64), "max_position_embeddings"),
        ("bert/encoder/layer_1/intermediate/dense/kernel", (64, 128), (64, 3072), "intermediate_size"),
        ("bert/encoder/layer_1/intermediate/dense/kernel", (64, 128), (768, 128), "hidden_size"),
        ("bert/encoder/layer_0/output/dense/kernel", (128, 64), (3072, 64), "intermediate_size"),
        # attention/output/dense is [H, H]: "layer_N/output/dense" must not match it
        ("bert/encoder/layer_0/attention/output/dense/kernel", (64, 64), (768, 64), "hidden_size"),
        ("cls/predictions/output_bias", (300,), (30522,), "vocab_size"),
        ("bert/pooler/dense/kernel", (64, 64), (64, 64, 1), "the checkpoint's format (ranks differ)"),
        ("bert/pooler/dense/kernel", (64, 64), (64, 64), "none (shapes agree)"),
    ]
    for name, expected, found, field in cases:
        assert suspect_field(name, expected, found) == field, name


def test_suspect_field_agrees_with_every_axis_of_the_original_checkpoint():
    """Whatever variable and axis differ, the field named has that axis's length in bert_config.json."""
    for name, shape in TF1_SHAPES.items():
        if name.startswith(HEADS["next_sentence"]):
            continue  # its 2 classes are no config field's (suspect_field says hidden_size)
        for axis, length in enumerate(shape):
            found = tuple(n + 1 if a == axis else n for a, n in enumerate(shape))
            assert CONFIG[suspect_field(name, shape, found)] == length, (name, axis)


# === Hugging Face transformers ===


def test_names_follow_transformers_for_every_weight():
    names = {hf_name(tf1)[0] for tf1 in tf1_to_kbert_paths(2)}
    assert names == set(HF_ORIGINAL)  # the fixture was named by transformers itself


def test_hf_stores_exactly_the_kernels_transposed():
    for tf1, shape in TF1_SHAPES.items():
        name, transposed = hf_name(tf1)
        assert HF_ORIGINAL[name] == (shape[::-1] if transposed else shape), tf1
        assert transposed == (len(shape) == 2 and tf1.endswith("/kernel")), tf1


def test_hf_to_tf1_names_is_one_to_one():
    mapping = hf_to_tf1_names(LAYERS)
    assert set(mapping) == set(HF_ORIGINAL)
    assert sorted(mapping.values()) == sorted(ORIGINAL)


def test_tied_buffered_and_optional_hf_names():
    # transformers leaves the tied decoder out of the file; what it is tied to is there.
    assert not set(HF_TIED) & set(HF_ORIGINAL)
    assert set(HF_TIED.values()) <= set(HF_ORIGINAL)
    assert not set(HF_BUFFERS) & set(hf_to_tf1_names(LAYERS))
    # Each optional part's prefix selects exactly its weights.
    parts = {**HEADS, "pooler": "bert/pooler/"}
    assert set(HF_OPTIONAL) == set(parts)
    for part, tf1_prefix in parts.items():
        expected = {hf_name(n)[0] for n in ORIGINAL if n.startswith(tf1_prefix)}
        assert {n for n in HF_ORIGINAL if n.startswith(HF_OPTIONAL[part])} == expected, part


def test_hf_canonical_reads_bert_model_files_and_legacy_layer_norm_names():
    for name in HF_ORIGINAL:
        assert hf_canonical(name) == name
        if name.startswith("bert."):
            legacy = (
                name[len("bert.") :]
                .replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta")
            )
            assert hf_canonical(legacy) == name, legacy


# === Model Garden (TF Hub) and keras-hub: attention split by head ===


def test_model_garden_names_and_shapes_are_its_tfhub_exports():
    exported = _saved_model_variables(os.path.join(FIXTURES, "model-garden-tfhub", "encoder_mlm"))
    mapping = names_to_kbert_paths("model_garden", LAYERS)
    assert set(mapping) == set(exported)
    kbert_to_tf1 = {path: name for name, path in tf1_to_kbert_paths(LAYERS).items()}
    for name, path in mapping.items():
        assert split_heads_shape(path, TF1_SHAPES[kbert_to_tf1[path]], HEADS_PER_LAYER) == exported[name], name


def _keras_hub_backbone():
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=CONFIG["vocab_size"],
        num_layers=LAYERS,
        num_heads=HEADS_PER_LAYER,
        hidden_dim=CONFIG["hidden_size"],
        intermediate_dim=CONFIG["intermediate_size"],
        max_sequence_length=CONFIG["max_position_embeddings"],
        num_segments=CONFIG["type_vocab_size"],
    )


def test_keras_hub_paths_and_shapes_are_its_bert_backbones():
    import keras_hub

    # The backbone's weights, and the masked-LM head's of a BertMaskedLM task (its tied embedding aside).
    masked_lm = keras_hub.models.BertMaskedLM(_keras_hub_backbone(), preprocessor=None)
    weights = {w.path: tuple(w.shape) for w in masked_lm.weights}
    mapping = names_to_kbert_paths("keras_hub", LAYERS)
    assert set(mapping) == set(weights)
    kbert_to_tf1 = {path: name for name, path in tf1_to_kbert_paths(LAYERS).items()}
    for path, kbert_path in mapping.items():
        assert split_heads_shape(kbert_path, TF1_SHAPES[kbert_to_tf1[kbert_path]], HEADS_PER_LAYER) == weights[path]


def test_keras_hub_classifier_head_is_its_logits_layer():
    import keras_hub

    classifier = keras_hub.models.BertTextClassifier(backbone=_keras_hub_backbone(), num_classes=3, preprocessor=None)
    theirs = {w.path: tuple(w.shape) for w in classifier.weights}
    config = kbert.BertConfig.from_json_file(f"{TINY}/bert_config.json")
    ours = {w.path: tuple(w.shape) for w in kbert.bert_classifier(kbert.bert_encoder(config), 3).weights}
    assert ours["classifier_head/output_weights"] == (3, 64)  # run_classifier.py's [num_labels, H]
    for kbert_path, keras_hub_path, transposed in KERAS_HUB_CLASSIFIER_HEAD:
        assert theirs[keras_hub_path] == (ours[kbert_path][::-1] if transposed else ours[kbert_path])


@pytest.mark.parametrize(
    "path, shape, split",
    [
        ("transformer_layer_5/key/kernel", (1024, 1024), (1024, 16, 64)),
        ("transformer_layer_5/key/bias", (1024,), (16, 64)),
        ("transformer_layer_5/attention_output/kernel", (1024, 1024), (16, 64, 1024)),
        ("transformer_layer_5/attention_output/bias", (1024,), (1024,)),
        ("transformer_layer_5/intermediate/kernel", (1024, 4096), (1024, 4096)),
        ("mlm_head/transform/kernel", (1024, 1024), (1024, 1024)),
    ],
)
def test_split_heads_shape_for_bert_large(path, shape, split):
    assert split_heads_shape(path, shape, 16) == split
