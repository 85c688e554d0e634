"""TF Hub BERT encoder SavedModels into kbert, read as files: no function of the SavedModel runs.

A SavedModel stores each variable under its position in the object graph
(`variables/0/.ATTRIBUTES/VARIABLE_VALUE`, ...), not under its name. The name is in
`saved_model.pb`: its object graph has one node per object, and a variable's node records
the name it was created with (Model Garden's `transformer/layer_0/self_attention/query/kernel`,
kbert's `transformer_layer_0/query/kernel`). The checkpoint in `variables/` has an object graph
of its own with the same node ids, whose attribute gives the tensor's key. So:
node id -> (name from saved_model.pb, tensor from the checkpoint). `hub.KerasLayer` is not
needed, and could not run under Keras 3 anyway (tensorflow#65419).

Names go through the one table (converters/names.py, its "model_garden" and "kbert" columns).
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import re

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2, trackable_object_graph_pb2

from kbert.config import BertConfig
from kbert.converters.loading import Converted
from kbert.converters.named import pretrainer_from_named
from kbert.formats.model_dir import CONFIG_FILE, check_vocab, lower_case_for
from kbert.model.bert import Vocabulary
from kbert.runtime.errors import KbertError, first_line, listing, option, os_error_or

log = logging.getLogger("kbert")

# Model Garden's registered activations as its Keras metadata names them -> kbert's hidden_act.
# Its "gelu" (official/modeling/activations/gelu.py) is the tanh approximation; Keras' own
# "gelu" defaults to the exact erf form.
MODEL_GARDEN_ACTIVATIONS = {"Text>gelu": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
# Variables of an export that are not weights: kbert's dropout RNG state.
NOT_WEIGHTS = re.compile(r"(^|/)seed_generator(_\d+)?/seed_generator_state$")


class SavedModelFiles:
    """The parts of a SavedModel directory a converter reads: variables by name, root
    attributes, assets and the Keras metadata, without loading the model."""

    def __init__(self, path: str, what: str):
        self.path = path
        pb = os.path.join(path, "saved_model.pb")
        if not os.path.isdir(path):
            raise KbertError(f"{path}: no such directory; pass the {what} SavedModel directory (with saved_model.pb)")
        if not os.path.isfile(pb):
            raise KbertError(f"{path}: no saved_model.pb; pass a TF Hub {what} SavedModel directory")
        saved_model = saved_model_pb2.SavedModel()
        try:
            with open(pb, "rb") as f:
                saved_model.ParseFromString(f.read())
        except Exception as e:  # protobuf's DecodeError
            raise KbertError(f"{pb}: not a SavedModel ({first_line(e)}); export or download it again") from None
        self.meta_graph = saved_model.meta_graphs[0]
        self.nodes = self.meta_graph.object_graph_def.nodes
        self.root = {child.local_name: child.node_id for child in self.nodes[0].children}
        self.assets = [os.path.join(path, "assets", a.filename) for a in self.meta_graph.asset_file_def]
        metadata = os.path.join(path, "keras_metadata.pb")
        self.keras_metadata = open(metadata, "rb").read().decode("utf-8", "replace") if os.path.isfile(metadata) else ""
        self._reader = None

    def _checkpoint(self):
        if self._reader is None:
            prefix = os.path.join(self.path, "variables", "variables")
            if not os.path.isfile(prefix + ".index"):
                raise KbertError(f"{self.path}: no variables/variables.index; the SavedModel is incomplete")
            try:
                self._reader = tf.train.load_checkpoint(prefix)
                graph = trackable_object_graph_pb2.TrackableObjectGraph()
                graph.ParseFromString(self._reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
            except Exception as e:
                raise os_error_or(
                    e, f"{prefix}: unreadable ({first_line(e)}); the files are truncated or damaged"
                ) from None
            self._keys = {
                i: a.checkpoint_key
                for i, node in enumerate(graph.nodes)
                for a in node.attributes
                if a.name == "VARIABLE_VALUE"
            }
        return self._reader

    def variable_nodes(self) -> tuple[dict, set]:
        """({variable name: node id}, names given to more than one variable) over the whole
        object graph (sub-objects such as `mlm` included)."""
        out, repeated = {}, set()
        for i, node in enumerate(self.nodes):
            if node.WhichOneof("kind") == "variable":
                name = node.variable.name.split(":")[0]
                if name in out:
                    repeated.add(name)
                out[name] = i
        return out, repeated

    def read(self, node_id: int) -> np.ndarray:
        reader = self._checkpoint()
        return reader.get_tensor(self._keys[node_id])

    def root_asset(self, name: str) -> str | None:
        """The file of the root's asset attribute `name` (a `tf.saved_model.Asset`), if any."""
        node = self.nodes[self.root[name]] if name in self.root else None
        if node is None or node.WhichOneof("kind") != "asset":
            return None
        return os.path.join(
            self.path, "assets", self.meta_graph.asset_file_def[node.asset.asset_file_def_index].filename
        )

    def root_bool(self, name: str) -> bool | None:
        node_id = self.root.get(name)
        if node_id is None or self.nodes[node_id].WhichOneof("kind") != "variable":
            return None
        return bool(self.read(node_id))

    def uses_op(self, op: str) -> bool:
        return any(n.op == op for f in self.meta_graph.graph_def.library.function for n in f.node_def)


def _naming(names) -> str:
    if any(n.startswith(("transformer/layer_", "pooler_transform/")) for n in names):
        return "model_garden"
    if any(n.startswith(("transformer_layer_", "embeddings/word_embeddings/")) for n in names):
        return "kbert"
    return ""


def _model_garden_config(arrays: dict, files: SavedModelFiles, hidden_act: str | None) -> BertConfig:
    """A BertConfig from the weights' shapes and Model Garden's Keras metadata."""
    layers = {int(m.group(1)) for n in arrays for m in [re.match(r"transformer/layer_(\d+)/", n)] if m}
    try:
        vocab_size, hidden = arrays["word_embeddings/embeddings"].shape
        heads = arrays["transformer/layer_0/self_attention/query/kernel"].shape[1]
        intermediate = arrays["transformer/layer_0/intermediate/kernel"].shape[1]
        positions = arrays["position_embedding/embeddings"].shape[0]
        types = arrays["type_embeddings/embeddings"].shape[0]
    except KeyError as e:
        raise KbertError(f"{files.path}: no {e.args[0]} variable; is this a BERT encoder?") from None
    if hidden_act is None:
        recorded = re.findall(r'"inner_activation": "([^"]+)"', files.keras_metadata)
        if not recorded:
            raise KbertError(
                f"{files.path}: the SavedModel does not record its activation; pass {option('hidden_act', 'gelu_tanh')} "
                f"(Model Garden's gelu) or gelu (the exact erf form)"
            )
        if recorded[0] not in MODEL_GARDEN_ACTIVATIONS:
            raise KbertError(
                f"{files.path}: activation {recorded[0]!r} is not one kbert computes; "
                f"kbert converts BERTs with {', '.join(MODEL_GARDEN_ACTIVATIONS)}"
            )
        hidden_act = MODEL_GARDEN_ACTIVATIONS[recorded[0]]
    dropout = re.findall(r'"output_dropout": ([0-9.]+)', files.keras_metadata)
    attention_dropout = re.findall(r'"attention_dropout": ([0-9.]+)', files.keras_metadata)
    return BertConfig(
        vocab_size=int(vocab_size),
        hidden_size=int(hidden),
        num_hidden_layers=len(layers),
        num_attention_heads=int(heads),
        intermediate_size=int(intermediate),
        hidden_act=hidden_act,
        hidden_dropout_prob=float(dropout[0]) if dropout else 0.1,
        attention_probs_dropout_prob=float(attention_dropout[0]) if attention_dropout else 0.1,
        max_position_embeddings=int(positions),
        type_vocab_size=int(types),
    )


def _kbert_config(files: SavedModelFiles, hidden_act: str | None) -> BertConfig:
    config_file = files.root_asset("bert_config_file")
    if config_file is None:
        raise KbertError(
            f"{files.path}: kbert-named weights but no assets/{CONFIG_FILE}; export it again with "
            f"`kbert export --format tfhub`"
        )
    values = json.load(open(config_file, encoding="utf-8"))
    if hidden_act:
        values["hidden_act"] = hidden_act
    return BertConfig.from_dict(values)


def _vocabulary(encoder: SavedModelFiles, preprocessor: SavedModelFiles | None) -> tuple:
    """(vocab.txt path, where it came from); the preprocessor's must equal the encoder's."""
    ours = encoder.root_asset("vocab_file")
    theirs = None
    if preprocessor is not None:
        theirs = preprocessor.root_asset("vocab_file") or next(
            (a for a in preprocessor.assets if os.path.basename(a) == "vocab.txt"), None
        )
        if theirs is None:
            raise KbertError(f"{preprocessor.path}: no vocab.txt in its assets; is this a BERT preprocessor?")
        if ours is not None and not filecmp.cmp(ours, theirs, shallow=False):
            raise KbertError(
                f"{preprocessor.path}: its vocabulary differs from the encoder's ({ours}); pass the "
                f"preprocessor published with this encoder"
            )
        return theirs, "preprocessor"
    if ours is None:
        raise KbertError(
            f"{encoder.path}: no vocabulary in the encoder's assets; pass {option('preprocessor')}, the "
            f"preprocessor SavedModel published with it"
        )
    return ours, "encoder"


def _lower_case(encoder: SavedModelFiles, preprocessor: SavedModelFiles | None) -> tuple:
    """(do_lower_case, where it came from) as the SavedModels record it, else None."""
    if preprocessor is not None:
        recorded = preprocessor.root_bool("do_lower_case")
        if recorded is not None:
            return recorded, "preprocessor"
        # Model Garden's preprocessor is tf.text's BertTokenizer, which case-folds only when lower-casing.
        return preprocessor.uses_op("CaseFoldUTF8"), "preprocessor's graph"
    recorded = encoder.root_bool("do_lower_case")
    return (recorded, "encoder") if recorded is not None else (None, None)


def load_tfhub_encoder(src, preprocessor=None, do_lower_case: bool | None = None, hidden_act: str | None = None):
    """A `BertPretrainer` holding the weights of a TF Hub BERT encoder SavedModel.

    Reads Model Garden's exports (`export_tfhub.py`: BertEncoder names, with or without the
    `mlm` sub-object) and kbert's own (`kbert export --format tfhub`). The next-sentence head,
    which TF Hub encoders do not carry, is freshly initialised and reported.

    Args:
        src: str. The encoder SavedModel directory.
        preprocessor: str. Its preprocessor SavedModel; the vocabulary and casing are read
            from there (else from the encoder's assets and `do_lower_case`).
        do_lower_case: bool. Overrides what the SavedModels record.
        hidden_act: str. Overrides the activation the SavedModel records ("gelu_tanh" for
            Model Garden's gelu, "gelu" for the exact form).

    Returns the model, declaring its vocabulary; `convert_tfhub_encoder` also returns its report.

    Example:
    >>> model = kbert.converters.load_tfhub_encoder("bert_en_uncased_L-12_H-768_A-12_4")  # doctest: +SKIP
    """
    return convert_tfhub_encoder(src, preprocessor, do_lower_case, hidden_act).model


def convert_tfhub_encoder(
    src, preprocessor=None, do_lower_case: bool | None = None, hidden_act: str | None = None
) -> Converted:
    """`load_tfhub_encoder`'s model (same arguments) and its report."""
    src = os.fspath(src)
    files = SavedModelFiles(src, "encoder")
    pre = SavedModelFiles(os.fspath(preprocessor), "preprocessor") if preprocessor else None
    nodes, repeated = files.variable_nodes()
    lower_node = files.root.get("do_lower_case")
    names = {n: i for n, i in nodes.items() if i != lower_node and not NOT_WEIGHTS.search(n)}
    column = _naming(names)
    if not column:
        raise KbertError(
            f"{src}: not a BERT encoder: none of its {len(names)} variables ({listing(names, 4)}) is "
            f"named as in Model Garden's BertEncoder or kbert's; pass a TF Hub BERT encoder"
        )
    if repeated & set(names):
        raise KbertError(
            f"{src}: more than one variable is named {listing(repeated & set(names), 2)}; "
            f"which one is the weight cannot be told, so it is not converted"
        )
    if column == "kbert" and any(n.startswith(("classifier/", "tagger/", "span_", "choice")) for n in names):
        raise KbertError(
            f"{src}: a kbert TF Serving export, not a TF Hub encoder; convert the model directory "
            f"it came from, or export it with `kbert export --format tfhub`"
        )
    arrays = {name: files.read(i) for name, i in names.items()}
    config = (
        _model_garden_config(arrays, files, hidden_act)
        if column == "model_garden"
        else _kbert_config(files, hidden_act)
    )
    vocab_file, vocab_origin = _vocabulary(files, pre)
    check_vocab(vocab_file, config)
    lower_origin = option("do_lower_case", flag="--lowercase/--no-lowercase")
    if do_lower_case is None:
        do_lower_case, lower_origin = _lower_case(files, pre)
    if do_lower_case is None:
        do_lower_case, lower_origin = lower_case_for(src), "folder name"
    model, fresh_heads = pretrainer_from_named(config, arrays, column, src, Vocabulary(vocab_file, bool(do_lower_case)))
    if lower_origin == "folder name":
        log.info(
            "do_lower_case=%s, from the folder name; pass %s to set it",
            do_lower_case,
            option("do_lower_case", flag="--lowercase/--no-lowercase", command="convert from-tfhub"),
        )
    return Converted(
        model,
        {
            "source": src,
            "names": {"model_garden": "Model Garden", "kbert": "kbert"}[column],
            "loaded": len(arrays),
            "fresh_heads": fresh_heads,
            "skipped": sorted(n for n in nodes if n not in names),
            "hidden_act": config.hidden_act,
            "vocab_from": vocab_origin,
            "do_lower_case_from": lower_origin,
        },
    )
