"""`export_model`: a kbert model directory -> a TF Serving SavedModel that takes raw text.

`EXPORT_BASE/<version>/` holds the SavedModel (`saved_model.pb`, `variables/`,
`assets/vocab.txt`, `assets.extra/tf_serving_warmup_requests`); `EXPORT_BASE/models.config`
and `EXPORT_BASE/batching_parameters.txt` are the files `tensorflow_model_server` reads
(`kbert.serving.models_config` writes them). Tokenization runs inside the graph
(`BertPreprocessor`, the original tokenizer's ids), so a client sends strings and needs
neither kbert nor the vocabulary.

Three signatures for TF Serving's Predict API (`tensorflow/serving/predict`), with the same outputs:

- `serving_default`: string `text` [batch] (and `text_b` for sentence-pair models);
- `serve_ids`: int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq], already tokenized;
- `serve_examples`: serialized `tf.Example`s [batch] named `examples`, with bytes features
  `text` (and `text_b`).

And one for TF Serving's Classify or Regress API, which check the method name and the keys:
classifiers get `classify` (`tensorflow/serving/classify`: `inputs` serialized tf.Examples as
above -> `classes` [batch, C] label strings and `scores` [batch, C]); regressors get `regress`
(`tensorflow/serving/regress`: `inputs` -> `outputs` [batch]).

Outputs by model (each task's `serve` in `kbert.finetuning.tasks`): encoders and pretrained
models `pooled_output`, `sequence_output`, `input_mask`; classifiers `probabilities`,
`label_id`, `label`; regressors `score`; taggers per-token `label_id`, `label` and
`input_mask`, and from `serving_default`/`serve_examples` also `word_label` [batch, words]: the
tag of each whitespace-separated word of `text` (on its first WordPiece, as `kbert predict`
tags CoNLL words; "" past a sentence's words). Multiple-choice models take `text` [batch] and
`endings` [batch, choices] strings (`serve_ids`: [batch, choices, seq] ids; `serve_examples`:
a bytes feature `endings` with one value per ending) and give `probabilities` [batch, choices]
and `label_id`. Floats are float32 and pass through
`tf.debugging.check_numerics`, so a NaN fails the request instead of being served.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

import keras
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from kbert.config import sequence_length
from kbert.errors import KbertError
from kbert.outputs import writes
from kbert.files import atomic_output_dir
from kbert.finetuning.tasks import API_METHODS, TASKS, ServingHead, finite, get_task
from kbert.model.bert import BertEncoder, BertMultipleChoice, BertPretrainer, BertTagger
from kbert.model_dir import describe_source, open_model
from kbert.serving.models_config import configured_name, write_batching_parameters, write_models_config
from kbert.serving.signatures import set_method_name
# Names of this module from before their code moved, which `kbert export` imports from here.
from kbert.serving.models_config import BATCHING_PARAMETERS, MODELS_CONFIG  # noqa: F401
from kbert.serving.signatures import exported_signatures  # noqa: F401
from kbert.text.preprocessing import BertPreprocessor

log = logging.getLogger("kbert")

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
SIGNATURES = ("serving_default", "serve_ids", "serve_examples")
PRECISIONS = ("float32", "bfloat16")
# The Classify and Regress APIs' signature names, method names and keys (TF Serving's
# signature_constants): TF Serving refuses a signature of the predict method for them.
# Representative warmup requests: TF Serving runs them at load so that the first real request
# does not pay for graph set-up; one per batch shape that a client typically sends.
WARMUP_TEXTS = (["Hello, world!"],
                ["The quick brown fox jumps over the lazy dog.", "A second sentence in the same batch."],
                [" ".join(["a long request that will be truncated"] * 100)])


def _next_version(export_base: str) -> int:
    versions = [int(name) for name in os.listdir(export_base) if re.fullmatch(r"\d+", name)] \
        if os.path.isdir(export_base) else []
    return max(versions, default=0) + 1


# Requests run on their longest text rounded up to this many tokens: a few distinct shapes
# (oneDNN and TF cache kernels per shape) at most 7 padding positions each.
LENGTH_MULTIPLE = 8
# A batch is sorted by length and run in groups of this many texts, each on its own longest
# text. Measured in benchmarks/serving_bench.py (see docs/performance.md): on the Debian
# descriptions, batches of 32 pay for about 1.3x fewer positions than one group would.
GROUP_ROWS = 8


# The export's query, key and value projections run as one [H, 3H] matmul, from weights
# concatenated at export time (`TransformerLayer.fuse_attention_inputs`); the model directory
# keeps the checkpoint's layout. Measured alone in docs/performance.md.
FUSE_ATTENTION_INPUTS = True

# Each LayerNorm runs as one oneDNN kernel (`LayerNorm.as_one_kernel`) instead of keras' twenty
# element-wise ops and reductions. Measured alone in docs/performance.md.
LAYER_NORM_AS_ONE_KERNEL = True


# `constant_weights` (`kbert export --constant-weights`) puts the weights in the graph as
# constants, if they fit in a GraphDef (protobuf's 2 GiB limit, with room for the rest). oneDNN
# then keeps a constant weight in its reordered layout between calls, where it reorders a
# variable's on every call: a BERT-base bfloat16 export 1.13x faster at batch 1 on real texts.
# But TF Serving's process then holds 5x the memory (5.2 GiB against 1.1) and loads 6-8x
# slower, so it is not the default. Measured in docs/performance.md.
CONSTANT_WEIGHTS_MAX_BYTES = 1 << 30


class _WeightsAsConstants(keras.StatelessScope):
    """Within it, each read of a Keras weight gives a constant of the graph being traced, made
    on its first read from `values` ({id(weight): numpy array}), so only the weights that the
    traced code reads go into the graph (not, say, Q, K and V beside their fused copy)."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def get_current_value(self, variable):
        # Keras' Variable.value asks the scope first; the real value would be a variable read.
        if id(variable) not in self.state_mapping and id(variable) in self.values:
            self.state_mapping[id(variable)] = tf.constant(self.values[id(variable)])
        return self.state_mapping.get(id(variable))


def _encoder(model) -> BertEncoder:
    """`model` itself if it is an encoder, else the encoder a pretrainer or a task model holds."""
    return model if isinstance(model, BertEncoder) else model.encoder


def _transformer_layers(model):
    """The TransformerLayers of `model`'s encoder."""
    return _encoder(model).transformer_layers


def _layer_norms(model):
    """The LayerNorms of `model`'s encoder: the embeddings' and two in each transformer layer."""
    return [_encoder(model).embeddings.layer_norm] + [norm for layer in _transformer_layers(model)
                                                      for norm in (layer.attention_layer_norm, layer.output_layer_norm)]


class OnLongestText:
    """`model` called on a batch cut to its longest text, rounded up to LENGTH_MULTIPLE tokens.

    BertPreprocessor packs every text to max_seq_length (so truncation is the original's), but
    a 6-word query would then pay for 128 positions. Cutting the batch to its longest text
    changes nothing for the real tokens: padding is masked out of attention (-10000 before the
    softmax, exp underflows to 0), so pooled outputs, logits and per-token outputs agree with
    the padded run to float32 rounding. Outputs with a value per token are padded back to the
    length of the inputs, with zeros at the positions past each text (input_mask 0), where the
    padded run gave the model's outputs for padding, which mean nothing.

    A batch of more than GROUP_ROWS texts is sorted by length and run GROUP_ROWS texts at a
    time, each group cut to its own longest text, then put back in the request's order: in a
    batch of 32 real texts one long text would otherwise make all 32 pay for its length.

    With `constant_weights`, the model is traced with its weights as constants of the graph
    (`kbert export --constant-weights`), made from their values when OnLongestText is built.

    Attribute reads go to `model` (num_classes, config, ...), so a task's serving head takes
    it in the model's place.
    """

    def __init__(self, model, constant_weights=False):
        self.model = model
        self.values = {id(w): w.numpy() for w in model.weights} if constant_weights else None
        # Every signature calls this one traced function (per rank of the inputs), so the
        # model is traced, and its constant weights saved, once. The model's ops sit directly
        # in the loop's body, where TF's graph optimizer fuses their bias adds and GELUs.
        self.function = tf.function(self._grouped)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, features, training=False):
        if training:
            raise ValueError("OnLongestText serves: train the model itself")
        specs = {k: tf.TensorSpec([None] * v.shape.rank, v.dtype, name=k) for k, v in features.items()}
        return self.function.get_concrete_function(specs)(features)

    def _weights(self):
        """Where the model's weights come from while it is traced: graph constants or its variables."""
        return _WeightsAsConstants(self.values) if self.values is not None else contextlib.nullcontext()

    def _grouped(self, features):
        mask = features["input_mask"]
        if mask.shape.rank != 2:  # multiple choice, [batch, choices, seq]: one group
            return self._on_longest(features)
        lengths = tf.reduce_sum(mask, axis=-1)
        order = tf.argsort(lengths, stable=True)
        ordered = {k: tf.gather(v, order) for k, v in features.items()}
        rows = tf.shape(mask)[0]
        groups = (rows + GROUP_ROWS - 1) // GROUP_ROWS
        specs = {k: v for k, v in self.model.output.items()}
        arrays = {k: tf.TensorArray(spec.dtype, size=groups, infer_shape=False, element_shape=[None, *spec.shape[1:]])
                  for k, spec in specs.items()}

        def group(i, arrays):
            part = {k: v[i * GROUP_ROWS:(i + 1) * GROUP_ROWS] for k, v in ordered.items()}
            out = self._on_longest(part)
            return i + 1, {k: arrays[k].write(i, out[k]) for k in arrays}

        _, arrays = tf.while_loop(lambda i, _: i < groups, group, (tf.constant(0), arrays))
        # argsort of the order is its inverse: each row back to where the request had it.
        back = tf.argsort(order)
        full = tf.shape(mask)[-1]
        return {k: tf.gather(_concat(arrays[k], specs[k].shape, full), back) for k in arrays}

    def _on_longest(self, features):
        mask = features["input_mask"]
        full = tf.shape(mask)[-1]
        # The longest text's tokens; 0 for an empty batch (reduce_max of nothing is the lowest int).
        longest = tf.reduce_max(tf.concat([tf.reshape(tf.reduce_sum(mask, axis=-1), [-1]), [0]], axis=0))
        rounded = (longest + LENGTH_MULTIPLE - 1) // LENGTH_MULTIPLE * LENGTH_MULTIPLE
        length = tf.clip_by_value(rounded, tf.minimum(LENGTH_MULTIPLE, full), full)
        with self._weights():
            outputs = self.model({k: v[..., :length] for k, v in features.items()}, training=False)
        per_token = mask.shape.rank + 1  # [batch, seq, width] from [batch, seq] inputs
        return {k: _pad_positions(v, full) if v.shape.rank == per_token else v for k, v in outputs.items()}


def _concat(array, shape, full):
    """The groups of a TensorArray as one [rows, ...] tensor; an empty batch gives [0, ...], with
    `full` positions where the model's output has a sequence axis."""
    empty = tf.zeros([0] + [full if d is None else d for d in shape[1:]], array.dtype)
    return tf.ensure_shape(tf.cond(array.size() > 0, array.concat, lambda: empty), [None, *shape[1:]])


def _pad_positions(x, length):
    """x [batch, seq, ...] padded with zeros along seq to `length`."""
    paddings = tf.concat([[[0, 0], [0, length - tf.shape(x)[1]]], tf.zeros([tf.rank(x) - 2, 2], tf.int32)], axis=0)
    return tf.pad(x, paddings)


def _constant_weights(model, requested: bool) -> bool:
    """Whether the export holds `model`'s weights as graph constants: if `requested` and they fit."""
    if not requested:
        return False
    size = sum(w.numpy().nbytes for w in model.weights)
    if size > CONSTANT_WEIGHTS_MAX_BYTES:
        log.warning("the weights (%.0f MiB) are too large for graph constants; the export keeps them as variables",
                    size / 2**20)
    return size <= CONSTANT_WEIGHTS_MAX_BYTES


def _serving_head(model, task_info, text_pairs, constant_weights=False) -> ServingHead:
    """How to serve `model`: its task's record says, and encoders serve their outputs.
    Either way the model runs on each batch's longest text (`OnLongestText`), with its weights
    as graph constants if `constant_weights`."""
    def serving(m):
        return OnLongestText(m, constant_weights)

    task = task_info.get("task")
    if isinstance(model, (BertEncoder, BertPretrainer)):
        encoder = serving(_encoder(model))

        def outputs(features):
            out = encoder(features, training=False)
            return {"pooled_output": finite("pooled_output", out["pooled_output"]),
                    "sequence_output": finite("sequence_output", out["sequence_output"]),
                    "input_mask": features["input_mask"]}
        return ServingHead(outputs, {"text": 1, "text_b": 1} if text_pairs else {"text": 1})
    if task is None:  # a head saved without fine-tuning metadata: its kind says which task
        task = {BertTagger: "tag", BertMultipleChoice: "choice"}.get(type(model)) or (
            "regress" if getattr(model, "num_classes", 0) == 1 else "classify")
    record = get_task(task)
    if record.serve is None:
        raise KbertError(f"kbert export serves encoders, pretrained models and the {task_list()} tasks; a "
                         f"{task} model needs its question/context windows, which export does not build yet: "
                         f"serve its encoder or use kbert predict")
    head = record.serve(serving(model), task_info.get("labels"))
    if task in ("classify", "regress"):
        # finetune records "text_pairs"; directories from before it did may get pairs.
        pairs = bool(task_info.get("text_pairs", True)) if text_pairs is None else text_pairs
        head = head._replace(text_inputs={"text": 1, "text_b": 1} if pairs else {"text": 1})
    return head


def task_list() -> str:
    return ", ".join(name for name, task in TASKS.items() if task.serve is not None)


def _warmup_requests(path: str, name: str, text_inputs: dict):
    """A TFRecord of PredictionLog protos: `serving_default` requests TF Serving replays at load."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for texts in WARMUP_TEXTS:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=name, signature_name="serving_default"))
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts, dtype=tf.string))
            for extra, rank in list(text_inputs.items())[1:]:  # text_b: one more text; endings: a list
                value = [["ends here.", "goes on and on."]] * len(texts) if rank == 2 else \
                    ["And its second text."] * len(texts)
                request.inputs[extra].CopyFrom(tf.make_tensor_proto(value, dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


@writes("export_base", inputs=("model_dir",), in_place=True)
def export_model(model_dir, export_base, version: int | None = None, max_seq_length: int | None = None,
                 overwrite: bool = False, name: str | None = None, text_pairs: bool | None = None,
                 precision: str = "float32", constant_weights: bool = False) -> str:
    """Export a kbert model directory for TF Serving; returns the path of `EXPORT_BASE/<version>`.

    The version directory is built in a temporary directory inside `export_base` and renamed
    into place, so TF Serving (which only loads all-digit names) never sees a half-written one.

    Args:
        model_dir: str. A kbert model directory (converted, pretrained or fine-tuned), or a
            google-research checkpoint directory (converted on the fly).
        export_base: str. The directory TF Serving watches (`--model_base_path`).
        version: int. The version number; default: one more than the highest there, or 1.
        max_seq_length: int. Tokens per request (longer texts are truncated); default: the
            length the model was fine-tuned with, else 128, capped at max_position_embeddings.
        overwrite: bool. Replace an existing version directory.
        name: str. The model name in models.config; default: the base name of `export_base`.
        text_pairs: bool. Whether `serving_default` takes `text_b`; default: yes for classifiers
            and regressors (a request with an empty `text_b` is a single text, as in
            run_classifier.py), no otherwise. bert_config.json does not record whether a model
            was fine-tuned on pairs, so a single-text classifier's clients send `text_b` "".
        precision: str. "float32" (the trained model's numbers) or "bfloat16": weights and
            matmuls in bfloat16: on this project's AVX512-BF16 CPU 1.4x faster at batch 1 and 1.7x at
            batch 32 for BERT-base, at about 1e-2 of difference in the outputs (softmax and LayerNorm statistics
            stay in float32; the outputs are float32).
        constant_weights: bool. Put the weights in the graph as constants instead of variables
            (up to CONSTANT_WEIGHTS_MAX_BYTES): oneDNN then keeps their reordered layout, 1.13-1.2x
            faster for a bfloat16 BERT-base at batch 1 on real texts, but the serving process
            holds about 5x the memory and loads 6-8x slower; a float32 export got slower on
            texts of varied lengths. See docs/serving.md.

    Example:
    >>> path = export_model("out/classifier", "exports/sentiment")  # doctest: +SKIP
    >>> path  # doctest: +SKIP
    '/abs/exports/sentiment/1'
    """
    model_dir, export_base = os.fspath(model_dir), os.path.abspath(os.fspath(export_base))
    if precision not in PRECISIONS:
        raise KbertError(f"--precision {precision!r}: choose {' or '.join(PRECISIONS)}")
    source = describe_source(model_dir)  # a clear error for a path that is neither model nor checkpoint
    if os.path.isfile(export_base):
        raise KbertError(f"{export_base} is a file; EXPORT_BASE must be a directory (TF Serving's --model_base_path)")
    if version is None:
        version = _next_version(export_base)
    if version < 0:
        raise KbertError(f"--version {version}: TF Serving versions are non-negative integers")
    path = os.path.join(export_base, str(version))
    if os.path.exists(path) and not overwrite:
        raise KbertError(f"{path} already exists; pass --version with a new number, leave --version out for "
                         f"the next free one ({_next_version(export_base)}), or pass --overwrite")
    name = name or configured_name(export_base) or os.path.basename(export_base)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise KbertError(f"model name {name!r} must be letters, digits, '_', '-' or '.'; pass --name")

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)  # the variables' dtype as well as the compute's
    try:
        model = open_model(model_dir, do_lower_case=source.do_lower_case)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if FUSE_ATTENTION_INPUTS:
        for layer in _transformer_layers(model):
            layer.fuse_attention_inputs()
    if LAYER_NORM_AS_ONE_KERNEL:
        for layer_norm in _layer_norms(model):
            layer_norm.as_one_kernel()
    task_info = getattr(model, "task_info", None) or {}
    length = sequence_length(max_seq_length, model.config.max_position_embeddings, task_info.get("max_seq_length"))
    if length < 3:
        raise KbertError(f"--max-seq-length {length} must be at least 3 ([CLS] x [SEP])")
    head = _serving_head(model, task_info, text_pairs, _constant_weights(model, constant_weights))
    outputs = head.outputs
    preprocessor = BertPreprocessor(model.vocab_file, model.do_lower_case, length)
    preprocessor((tf.constant(["warm up"]), tf.constant(["b"])))  # builds it, so ExportArchive may track it

    # Packing is traced once per input form and shared by every signature that packs text: the
    # tokenizer's graph is large, and tracing it for each signature made exports 1.5x slower.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def pack_single(text):
        return preprocessor(text)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def pack_pair(text, text_b):
        # A row whose text_b has no tokens is packed as a single text, as run_classifier.py does.
        return preprocessor((text, text_b))

    def pack(text, text_b=None):
        return pack_single(text) if text_b is None else pack_pair(text, text_b)

    archive = keras.export.ExportArchive()
    # The model's variables are not tracked here: add_endpoint saves every variable the signatures
    # use, and tracking the model as well saved each weight a second time (Keras' own variables
    # beside the tf.Variables they wrap), which made a BERT-base float32 export 839 MiB instead of 421.
    archive.track(preprocessor)  # its tokenizer's vocabulary lookup table
    # The tokenizer's table is built from the vocabulary in memory (the exact load_vocab
    # semantics: stripped lines, the last id of a repeated token). This id -> token table
    # reads the vocabulary from the SavedModel's assets, which puts vocab.txt there for clients.
    archive.track(tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
        model.vocab_file, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
        tf.string, tf.lookup.TextFileIndex.WHOLE_LINE), default_value="[UNK]"))

    names = list(head.text_inputs)  # "text", then "text_b" or "endings" (see the task's ServingHead)

    def text_outputs(strings):
        if head.text_outputs is not None:
            return head.text_outputs(strings, pack, preprocessor)
        return outputs(pack(strings["text"], strings.get("text_b")))

    # serving_default takes the head's string inputs, in order; their names are the TensorSpecs'.
    if len(names) == 1:
        def serve_text(text):
            return text_outputs({names[0]: text})
    else:
        def serve_text(text, second):
            return text_outputs({names[0]: text, names[1]: second})
    text_signature = [tf.TensorSpec([None] * rank, tf.string, name=name) for name, rank in head.text_inputs.items()]

    def serve_ids(input_ids, input_mask, segment_ids):
        return outputs({"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids})

    def parse_examples(examples):
        # One bytes feature per input: `text` required, a second text "" when absent, and a
        # list input (endings) with one value per item.
        spec = {name: tf.io.RaggedFeature(tf.string) if rank == 2 else
                tf.io.FixedLenFeature([], tf.string, default_value=None if name == "text" else "")
                for name, rank in head.text_inputs.items()}
        strings = tf.io.parse_example(examples, spec)
        return {name: value.to_tensor("") if isinstance(value, tf.RaggedTensor) else value
                for name, value in strings.items()}

    def serve_examples(examples):
        return text_outputs(parse_examples(examples))

    def serve_api(inputs):
        strings = parse_examples(inputs)
        return head.api_outputs(pack(strings["text"], strings.get("text_b")))

    archive.add_endpoint("serving_default", serve_text, text_signature)
    archive.add_endpoint("serve_ids", serve_ids, [tf.TensorSpec([None] * head.ids_rank, tf.int32, name=n) for n in
                                                  ("input_ids", "input_mask", "segment_ids")])
    archive.add_endpoint("serve_examples", serve_examples, [tf.TensorSpec([None], tf.string, name="examples")])
    if head.api:
        archive.add_endpoint(head.api, serve_api, [tf.TensorSpec([None], tf.string, name="inputs")])

    os.makedirs(export_base, exist_ok=True)
    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        archive.write_out(tmp, verbose=False)
        if head.api:
            set_method_name(tmp, head.api, API_METHODS[head.api])
        _warmup_requests(os.path.join(tmp, WARMUP_FILE), name, head.text_inputs)
    write_models_config(export_base, name, version)
    write_batching_parameters(export_base)
    return path
