"""`optimize`: a built kbert model rewritten for serving, faster on a CPU (with the same numbers, but for int8).

`kbert.model.layers` holds google-research/bert's numerics and the switch to the training
kernels, nothing else. Everything an export does differently lives here, in five rewrites:

- **Grouping by length** (`OnLongestText`, LENGTH_MULTIPLE, GROUP_ROWS). The export packs
  every text to max_seq_length, as the original does, so a six-word query would pay for all
  128 positions. Each batch is sorted by length and run GROUP_ROWS texts at a time, each group
  cut to its own longest text rounded up to LENGTH_MULTIPLE tokens (a few distinct shapes,
  since oneDNN and TF cache their kernels per shape). Padding is masked out of attention, so
  the real tokens' outputs are the padded run's; per-token outputs are padded back with zeros.
- **Q, K and V as one matmul** (`InferenceTransformerLayer`). The query, key and value
  kernels and biases are concatenated once, into an [H, 3H] kernel and a [3H] bias, so each
  layer runs one matmul where the checkpoint's layout asks for three; the model keeps the
  checkpoint's weights as they are.
- **LayerNorm in few ops** (`layer_norm_in_few_ops`, LAYER_NORMS). Keras' LayerNormalization
  calls about twenty ops (casts, reshapes, moments' bookkeeping); the export writes LayerNorm in
  eight plain ops, each a fast Eigen kernel. The other form,
  a training-mode batch norm over rows (`layer_norm_as_batch_norm`), is one oneDNN kernel
  where TensorFlow turns oneDNN on (CPUs with AVX-512 and up), but several times slower where
  it does not (AVX2 CPUs, where TensorFlow's CPU batch norm transposes its input): a served
  model should not depend on which CPU runs it, so the few ops are the default.
- **int8 matmuls** (`optimize(..., int8=True)`, `kbert export --precision int8`). Each dense
  layer of the encoder runs as oneDNN's int8 matmul from int8 copies of its weights, made
  here (`kbert.serving.int8`, `Int8Dense`); the numbers then differ by the quantization. Each
  input is quantized per row on every call, or, with `int8_ranges` measured on real texts
  (`measure_int8_ranges`), on fixed ranges, the GELU inside the kernel.
- **Weights as graph constants** (`optimize(..., constant_weights=True)`, `kbert export
  --constant-weights`, up to CONSTANT_WEIGHTS_MAX_BYTES). oneDNN keeps a constant weight in
  its reordered layout between calls, where it reorders a variable's on every call. But the
  serving process holds several times the memory and loads slower, so it is not the default.

What each gains and costs is measured in docs/performance.md ("LayerNorm in few ops",
"LayerNorm as one kernel", "constant weights", the serving runs): `benchmarks/export_ab.py` runs two
exports alternately, request by request, and `benchmarks/serving_bench.py --variants` times the
export with each rewrite undone alone (the keyword arguments of `optimize`).

How the rewrites act on a built model: `keras.models.clone_model` rebuilds the model's
functional graph, and its encoder's, around the same layer objects, except that each
`BertEmbeddings` and `TransformerLayer` is replaced by an inference layer written here
(`InferenceEmbeddings`, `InferenceTransformerLayer`). An inference layer holds the layer it
replaces, so the weights are the same variables, and computes that layer's forward at inference
from those weights, calling the layer's own sublayers (dense layers, embeddings, activation)
wherever nothing changes. Why this way:

- layers.py keeps no flag and no export-only weight: training, checkpoints and converters see
  only the original's model, and the model a caller holds is untouched (it still trains and
  saves as it was); the rewritten model is a separate object, used only by the export.
- Not subclasses of the model's layers, swapped in: a subclass instance builds its own weights,
  and BertEncoder builds its layers itself. Not monkeypatched `call`s: those would change the
  caller's model behind its back.
- The price: the inference forward of a transformer layer (its attention and the order of its
  sublayers) is written twice, here and in `TransformerLayer.call`. tests/serving/test_optimize.py
  checks that both give the same outputs, float32 and bfloat16, on padded batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from kbert._compat import reads_replaced
from kbert.model.bert import encoder_of
from kbert.model.families import MODERNBERT, family_of
from kbert.model.layers import BertEmbeddings, TransformerLayer
from kbert.runtime.errors import KbertError, option
from kbert.serving.int8 import (
    GELU_FLOOR,
    CalibratedInt8Kernel,
    Int8Kernel,
    calibrated_int8_matmul,
    int8_matmul,
    require_int8_matmul,
)

log = logging.getLogger("kbert")

# Requests run on their longest text rounded up to this many tokens: a few distinct shapes
# (oneDNN and TF cache kernels per shape), at most 7 padding positions each.
LENGTH_MULTIPLE = 8
# A batch is sorted by length and run in groups of this many texts, each on its own longest
# text (measured against one group in benchmarks/serving_bench.py's "one-group" variant).
GROUP_ROWS = 8
# The largest model whose weights `constant_weights` puts in the graph: a GraphDef is a protobuf,
# which cannot pass 2 GiB, and the rest of the graph (the tokenizer) needs room too.
CONSTANT_WEIGHTS_MAX_BYTES = 1 << 30


def optimize(
    model,
    constant_weights: bool = False,
    *,
    int8: bool = False,
    int8_ranges=None,
    fuse_qkv: bool = True,
    layer_norm: str = "few-ops",
    group_rows: int = GROUP_ROWS,
) -> OnLongestText:
    """`model` as the export runs it: every rewrite of this module's docstring, same numbers.

    Args:
        model: keras.Model. A built kbert model (an encoder or a task model on one): each of its
            `BertEmbeddings` and `TransformerLayer`s runs through its inference layer (a
            ModernBERT runs as `optimize_modernbert` says).
        constant_weights: bool. Trace the model with its weights as graph constants, if they fit
            (CONSTANT_WEIGHTS_MAX_BYTES; otherwise a warning, and variables).
        int8: bool. Run the encoder's dense layers (Q/K/V, attention output, both feed-forward
            matmuls, the pooler) as oneDNN int8 matmuls (`kbert.serving.int8`); the model must
            be float32. Outputs then differ from float32's by the quantization.
        int8_ranges: with `int8`, how the dense layers' inputs are quantized: None, each row on
            its own scale, per call (`int8_matmul`); a dict {layer key: (low, high)}, measured
            by `measure_int8_ranges`, each layer it names on that fixed range
            (`calibrated_int8_matmul`, its GELU in the kernel), the others per row; or an
            `Int8Recorder`, which each dense layer's float32 input is shown to as the model
            runs in float32 (what `measure_int8_ranges` does).
        fuse_qkv: bool. Q, K and V as one matmul.
        layer_norm: str. How each LayerNorm is written, a key of LAYER_NORMS: "few-ops"
            (`layer_norm_in_few_ops`), "one-kernel" (`layer_norm_as_batch_norm`) or "keras".
        group_rows: int. Texts per group of similar length (a large number: one group).

    Returns:
        An `OnLongestText`: call it with a dict of int32 `input_ids`, `input_mask`, `segment_ids`
        for the model's outputs; other attributes are `model`'s. `model` itself is unchanged.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> encoder = kbert.bert_encoder(config)
    >>> served = optimize(encoder)
    >>> ids = np.array([[2, 7, 9, 3, 0, 0]], dtype="int32")
    >>> out = served({"input_ids": ids, "input_mask": np.sign(ids), "segment_ids": np.zeros_like(ids)})
    >>> tuple(out["sequence_output"].shape), served.config.hidden_size
    ((1, 6, 32), 32)
    """

    if layer_norm not in LAYER_NORMS:
        raise ValueError(f"layer_norm {layer_norm!r}: one of {', '.join(LAYER_NORMS)}")
    if family_of(model) == MODERNBERT:  # its blocks are its own: cut to the longest text, int8 dense layers
        if int8_ranges is not None:
            raise KbertError(
                f"{option('int8_ranges', 'calibrated')} measures a BERT's dense layers; a ModernBERT's int8 export "
                f"quantizes per row: drop {option('int8_ranges')}"
            )
        return optimize_modernbert(model, constant_weights, int8=int8)
    if int8:
        require_int8_matmul()
    encoder = encoder_of(model)
    pooler = encoder.pooler if encoder is not None else None

    def inference_layer(layer):
        if isinstance(layer, TransformerLayer):
            return InferenceTransformerLayer(layer, fuse_qkv, layer_norm, int8=int8, int8_ranges=int8_ranges)
        if isinstance(layer, BertEmbeddings):
            return InferenceEmbeddings(layer, layer_norm)
        if int8 and layer is pooler:
            return Int8Dense(layer, int8_ranges)
        return layer  # the same layer or op, and so the same weights: the pooler, the heads, the mask's arithmetic

    rewritten = keras.models.clone_model(model, clone_function=inference_layer, recursive=True)
    return OnLongestText(rewritten, model, _fits_in_graph(model) if constant_weights else False, group_rows)


def measure_int8_ranges(model, batches) -> dict:
    """{layer key: (low, high)}: the range of each int8 dense layer's input (Q/K/V, attention
    output, both feed-forward matmuls, the pooler) as `model` runs in float32 on `batches`
    (dicts of int32 `input_ids`, `input_mask`, `segment_ids`, each cut to its longest text as the
    export cuts it), for `optimize(model, int8=True, int8_ranges=...)`.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> encoder = kbert.bert_encoder(config)
    >>> ids = np.array([[2, 7, 9, 3, 0, 0]], dtype="int32")
    >>> ranges = measure_int8_ranges(encoder, [{"input_ids": ids, "input_mask": np.sign(ids),
    ...                                        "segment_ids": np.zeros_like(ids)}])
    >>> sorted(ranges)[:2], all(low <= 0.0 <= high for low, high in ranges.values())
    (['pooler/pooler', 'transformer_layer_0/attention_output'], True)
    """
    recorder = Int8Recorder()
    served = optimize(model, int8=True, int8_ranges=recorder)
    for features in batches:
        served._on_longest({k: tf.convert_to_tensor(v, tf.int32) for k, v in features.items()})
    return dict(recorder)


def optimize_modernbert(model, constant_weights: bool = False, *, int8: bool = False) -> OnLongestText:
    """A ModernBERT as the export runs it: each batch cut to its longest text (`OnLongestText`;
    its blocks already skip padding in their dense layers), its weights as graph constants if
    `constant_weights`, and with `int8` every dense layer of its blocks and head (Wqkv, Wo, Wi,
    the head's dense) as one `Int8Dense`; the embeddings, norms and attention stay float32.
    `model` is changed in place by int8: export opens a model of its own.
    """
    if int8:
        require_int8_matmul()
        from kbert.modernbert.layers import Attention, EncoderLayer

        blocks = [
            layer for layer in model._flatten_layers(recursive=True) if isinstance(layer, (Attention, EncoderLayer))
        ]
        for layer in blocks:
            for name, child in list(vars(layer).items()):
                if isinstance(child, keras.layers.Dense) and child.built and len(child.kernel.shape) == 2:
                    # Past Keras' tracking (the block is built, and would refuse a new sub-layer):
                    # the export saves the variables its signatures read, these among them.
                    object.__setattr__(layer, name, Int8Dense(child))
    return OnLongestText(model, model, _fits_in_graph(model) if constant_weights else False, GROUP_ROWS)


def _fits_in_graph(model) -> bool:
    """Whether `model`'s weights fit in a GraphDef as constants (the fused Q, K and V replace the
    three they are made of, so the export holds as many numbers as the model)."""
    size = sum(w.numpy().nbytes for w in model.weights)
    if size > CONSTANT_WEIGHTS_MAX_BYTES:
        log.warning(
            "the weights (%.0f MiB) are too large for graph constants; the export keeps them as variables", size / 2**20
        )
    return size <= CONSTANT_WEIGHTS_MAX_BYTES


def layer_norm_as_batch_norm(x, gamma, beta, epsilon: float):
    """LayerNorm over the last axis of a rank-2 or rank-3 `x`, in the form TF's graph optimizer
    (Grappler's remapper, on oneDNN builds: every x86 CPU build) replaces with one
    `_MklLayerNorm` kernel: each row a channel of a training-mode `FusedBatchNormV3`, then
    gamma and beta. Keras' own form is about twenty element-wise ops and reductions.
    Without the rewrite (the optimizer off, or eagerly) TF's CPU batch norm kernel computes the
    same numbers (tested); on a GPU it would run as cuDNN's batch norm, not checked here.
    Statistics in float32 either way; epsilon as given (tf.nn.fused_batch_norm would raise
    1e-12 to 1e-5, so the raw op is called).

    >>> x = tf.constant([[1.0, 2.0, 3.0], [2.0, 2.0, 5.0]])
    >>> y = layer_norm_as_batch_norm(x, tf.ones([3]), tf.zeros([3]), 1e-12)
    >>> [round(float(v), 4) for v in y[0]]
    [-1.2247, 0.0, 1.2247]
    """
    shape = tf.shape(x)
    rows = tf.reduce_prod(shape[:-1])
    channels = tf.reshape(rows, [1])
    normalized = tf.raw_ops.FusedBatchNormV3(
        x=tf.reshape(x, tf.stack([1, rows, shape[-1], 1])),
        scale=tf.fill(channels, 1.0),
        offset=tf.fill(channels, 0.0),
        mean=tf.constant([], tf.float32),
        variance=tf.constant([], tf.float32),
        epsilon=epsilon,
        data_format="NCHW",
        is_training=True,
    ).y
    return tf.reshape(normalized, shape) * gamma + beta


def layer_norm_in_few_ops(x, gamma, beta, epsilon: float):
    """LayerNorm over the last axis of `x` in eight plain ops: the mean, x centred, the mean of
    its squares, rsqrt(variance + epsilon) · gamma, then beta + centred · that. Statistics, gamma
    and beta in float32 whatever x's dtype (the result is cast back to it). Fast on every CPU
    build of TensorFlow, with or without oneDNN (docs/performance.md, "LayerNorm in few ops"),
    and as close to Keras' LayerNorm as the one-kernel form (tests/finetuning/test_predict.py).

    >>> x = tf.constant([[1.0, 2.0, 3.0], [2.0, 2.0, 5.0]])
    >>> y = layer_norm_in_few_ops(x, tf.ones([3]), tf.zeros([3]), 1e-12)
    >>> [round(float(v), 4) for v in y[0]]
    [-1.2247, 0.0, 1.2247]
    """
    dtype = x.dtype
    x = tf.cast(x, tf.float32)
    gamma, beta = tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return tf.cast(beta + centered * (tf.math.rsqrt(variance + epsilon) * gamma), dtype)


def _last_axis_with_gamma_and_beta(norm) -> bool:
    return norm.axis in (-1, [-1]) and norm.center and norm.scale and not norm.rms_scaling


def _few_ops(norm, x):
    """`norm` (a kbert LayerNorm) applied to `x` as `layer_norm_in_few_ops`."""
    if not _last_axis_with_gamma_and_beta(norm):
        return norm(x)
    return layer_norm_in_few_ops(x, norm.gamma, norm.beta, norm.epsilon)


def _one_kernel(norm, x):
    """`norm` (a kbert LayerNorm) applied to `x` as `layer_norm_as_batch_norm`."""
    if not _last_axis_with_gamma_and_beta(norm):
        return norm(x)  # not the last axis with gamma and beta: not a form the optimizer fuses
    return layer_norm_as_batch_norm(x, ops.cast(norm.gamma, x.dtype), ops.cast(norm.beta, x.dtype), norm.epsilon)


def _keras_ops(norm, x):
    return norm(x)


# The ways the export may write a LayerNorm (`optimize(..., layer_norm=...)`); the benchmarks
# time each (benchmarks/serving_bench.py --variants).
LAYER_NORMS = {"few-ops": _few_ops, "one-kernel": _one_kernel, "keras": _keras_ops}


class InferenceEmbeddings(keras.layers.Layer):
    """`embeddings` (a `BertEmbeddings`) at inference: the same sum of embeddings, its LayerNorm
    written as `layer_norm` says (a key of LAYER_NORMS), and no dropout."""

    def __init__(self, embeddings: BertEmbeddings, layer_norm: str = "few-ops"):
        super().__init__(name=embeddings.name, dtype=embeddings.dtype_policy)
        self.embeddings = embeddings
        self.norm = LAYER_NORMS[layer_norm]
        self.built = True

    def call(self, input_ids, segment_ids):
        e = self.embeddings
        x = e.word_embeddings(input_ids) + e.token_type_embeddings(segment_ids)
        x = x + e.position_embeddings(x)  # broadcast over the batch
        return self.norm(e.layer_norm, x)

    def compute_output_spec(self, input_ids, segment_ids):
        return self.embeddings.compute_output_spec(input_ids, segment_ids)


class InferenceTransformerLayer(keras.layers.Layer):
    """`layer` (a `TransformerLayer`) at inference, from its weights: Q, K and V as one matmul if
    `fuse_qkv`, each LayerNorm written as `layer_norm` says (a key of LAYER_NORMS), no dropout.

    The concatenated kernel and bias are two non-trainable weights of this layer, copied from
    `layer`'s when it is made: they do not follow later training of `layer`.

    Example:
    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> layer = InferenceTransformerLayer(kbert.bert_encoder(config).transformer_layers[0])
    >>> [tuple(w.shape) for w in (layer.qkv_kernel, layer.qkv_bias)]
    [(32, 96), (96,)]
    """

    def __init__(
        self,
        layer: TransformerLayer,
        fuse_qkv: bool = True,
        layer_norm: str = "few-ops",
        *,
        int8: bool = False,
        int8_ranges=None,
    ):
        super().__init__(name=layer.name, dtype=layer.dtype_policy)
        self.layer = layer
        self.norm = LAYER_NORMS[layer_norm]
        self.qkv_kernel = self.qkv_bias = None
        self.int8 = None
        denses = (layer.query, layer.key, layer.value)
        if int8:
            if layer.compute_dtype != "float32":
                raise ValueError(f"int8 serving quantizes a float32 model, not {layer.compute_dtype}")
            # Q, K and V as one int8 matmul, and the three other dense layers each as one.
            ranges = int8_ranges  # {layer key: (low, high)}, an Int8Recorder, or None: per row
            qkv = _Int8Weights(
                self, "qkv", _concatenated(denses, "kernel"), _concatenated(denses, "bias"), ranges=ranges
            )
            gelu = _gelu_form(layer.intermediate_activation)
            shift = -GELU_FLOOR if gelu else 0.0
            self.int8 = {
                "qkv": qkv,
                "attention_output": _Int8Weights.of(self, layer.attention_output, ranges=ranges),
                # On a fixed range the kernel applies the GELU itself.
                "intermediate": _Int8Weights.of(self, layer.intermediate, ranges=ranges, gelu=gelu),
                # The input of the second feed-forward matmul is a GELU's output: never below
                # GELU_FLOOR, most values near 0 and a few channels far out. On one fixed range it
                # lost the most accuracy (docs/serving.md), so it stays per row, measured or not.
                "output": _Int8Weights.of(
                    self, layer.output_dense, shift=shift, ranges=ranges if isinstance(ranges, Int8Recorder) else None
                ),
            }
        elif fuse_qkv:
            kernel, bias = _concatenated(denses, "kernel"), _concatenated(denses, "bias")
            self.qkv_kernel = self.add_weight(
                name="qkv_kernel", shape=kernel.shape, dtype=kernel.dtype, trainable=False, initializer="zeros"
            )
            self.qkv_bias = self.add_weight(
                name="qkv_bias", shape=bias.shape, dtype=bias.dtype, trainable=False, initializer="zeros"
            )
            self.qkv_kernel.assign(kernel)
            self.qkv_bias.assign(bias)
        self.built = True

    def call(self, hidden, attention_adder):
        # TransformerLayer.call at inference, with the rewrites; the comments there say why each step.
        layer = self.layer
        batch, seq = ops.shape(hidden)[0], ops.shape(hidden)[1]
        H = layer.num_heads * layer.head_size
        flat = ops.reshape(hidden, (-1, H))
        dense = self._dense
        q, k, v = self._query_key_value(flat, batch, seq)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        scores = ops.cast(scores * (1.0 / math.sqrt(layer.head_size)), "float32") + ops.cast(attention_adder, "float32")
        probs = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        context = ops.reshape(ops.transpose(ops.matmul(probs, v), (0, 2, 1, 3)), (-1, H))
        attended = self.norm(layer.attention_layer_norm, dense("attention_output", context) + flat)
        inner = dense("intermediate", attended)
        if self.int8 is None or self.int8["intermediate"].gelu is None:  # unless the int8 kernel applied it
            inner = layer.intermediate_activation(inner)
        out = self.norm(layer.output_layer_norm, dense("output", inner) + attended)
        return ops.reshape(out, (batch, seq, H))

    def _dense(self, name, x):
        """The layer's dense layer `name` applied to x [rows, in]: its own, or its int8 matmul."""
        if self.int8 is not None:
            return self.int8[name](x)
        return {
            "attention_output": self.layer.attention_output,
            "intermediate": self.layer.intermediate,
            "output": self.layer.output_dense,
        }[name](x)

    def _query_key_value(self, flat, batch, seq):
        """Q, K and V, each [batch, heads, seq, head_size], from `flat` [batch·seq, H]."""
        heads, size = self.layer.num_heads, self.layer.head_size
        if self.int8 is not None:
            projected = self.int8["qkv"](flat)
            projected = ops.reshape(projected, (batch, seq, 3, heads, size))
            return ops.unstack(ops.transpose(projected, (2, 0, 3, 1, 4)), 3, axis=0)
        if self.qkv_kernel is None:  # three matmuls, as the checkpoint stores them
            return [
                ops.transpose(ops.reshape(dense(flat), (batch, seq, heads, size)), (0, 2, 1, 3))
                for dense in (self.layer.query, self.layer.key, self.layer.value)
            ]
        projected = ops.matmul(flat, ops.cast(self.qkv_kernel, self.compute_dtype)) + ops.cast(
            self.qkv_bias, self.compute_dtype
        )
        # [batch·seq, 3H] -> 3 x [batch, heads, seq, head_size], with one transpose for all three.
        projected = ops.reshape(projected, (batch, seq, 3, heads, size))
        return ops.unstack(ops.transpose(projected, (2, 0, 3, 1, 4)), 3, axis=0)

    def compute_output_spec(self, hidden, attention_adder):
        return self.layer.compute_output_spec(hidden, attention_adder)


def _concatenated(denses, name):
    return ops.concatenate([ops.convert_to_tensor(getattr(d, name)) for d in denses], axis=-1)


def _gelu_form(activation) -> str | None:
    """Which GELU `activation` (a transformer layer's) is: "exact" (erf), "approximate" (tanh),
    or None for another function. The two forms part by 1.5e-4 at 1.0."""
    x = tf.constant([-0.75, 0.0, 1.0])
    y = activation(x).numpy()
    for form, expected in (("exact", [-0.169963, 0.0, 0.841345]), ("approximate", [-0.170036, 0.0, 0.841192])):
        if np.allclose(y, expected, atol=3e-5):
            return form
    return None


class Int8Recorder(dict):
    """{layer key: (low, high)}: the range of each int8 dense layer's input seen so far, filled
    as a model built with `optimize(..., int8=True, int8_ranges=recorder)` runs eagerly, in
    float32 (`measure_int8_ranges`)."""

    def record(self, key: str, x):
        x = ops.convert_to_numpy(x)
        low, high = float(x.min(initial=0.0)), float(x.max(initial=0.0))
        seen = self.get(key, (low, high))
        self[key] = (min(seen[0], low), max(seen[1], high))


class _Int8Weights:
    """One dense layer's int8 form, its arrays held as non-trainable weights of `owner`: an
    `Int8Kernel` (each row quantized per call), or, where `ranges` holds its input's range, a
    `CalibratedInt8Kernel` (that range fixed; with `gelu`, the kernel applies it). Its key in
    `ranges` is "OWNER/NAME", e.g. "transformer_layer_0/qkv"."""

    def __init__(self, owner, name, kernel, bias, shift: float = 0.0, ranges=None, gelu: str | None = None):
        self.key = f"{owner.name}/{name}"
        kernel, bias = ops.convert_to_numpy(kernel), ops.convert_to_numpy(bias)
        self.recorder = ranges if isinstance(ranges, Int8Recorder) else None
        self.float_weights = (kernel, bias) if self.recorder is not None else None
        calibrated = self.recorder is None and ranges is not None and self.key in ranges
        self.gelu = gelu if calibrated else None
        if calibrated:
            made = CalibratedInt8Kernel.of(kernel, bias, *ranges[self.key], gelu=gelu)
            fields = ("kernel", "weight_range", "bias")
        else:
            made = Int8Kernel.of(kernel, bias, shift)
            fields = ("kernel", "weight_range", "kernel_bias", "bias")
        self.matmul = calibrated_int8_matmul if calibrated else int8_matmul
        self.weights = dataclasses.replace(
            made, **{field: _constant_weight(owner, f"{name}_int8_{field}", getattr(made, field)) for field in fields}
        )

    @classmethod
    def of(cls, owner, dense, shift: float = 0.0, ranges=None, gelu: str | None = None):
        bias = dense.bias if dense.use_bias else np.zeros(dense.units, np.float32)
        return cls(owner, dense.name, dense.kernel, bias, shift, ranges, gelu)

    def __call__(self, x):
        if self.recorder is not None:  # measuring: the float32 layer, its input's range noted
            self.recorder.record(self.key, x)
            kernel, bias = self.float_weights
            return ops.matmul(x, kernel) + bias
        return self.matmul(x, self.weights)


def _constant_weight(owner, name, value):
    weight = owner.add_weight(
        name=name, shape=value.shape, dtype=str(value.dtype), trainable=False, initializer="zeros"
    )
    weight.assign(value)
    return weight


class Int8Dense(keras.layers.Layer):
    """`dense` (a float32 Dense with a bias) as one int8 matmul, then its activation: the pooler
    of an int8 export."""

    def __init__(self, dense: keras.layers.Dense, int8_ranges=None):
        super().__init__(name=dense.name, dtype=dense.dtype_policy)
        self.dense = dense
        self.weights_int8 = _Int8Weights.of(self, dense, ranges=int8_ranges)
        self.built = True

    def call(self, x):
        return self.dense.activation(self.weights_int8(x))

    def compute_output_spec(self, x):
        return self.dense.compute_output_spec(x)


def _weights_as_constants(values):
    """Within it, each read of a Keras weight gives a constant of the graph being traced, made
    on its first read from `values` ({id(weight): numpy array}), so only the weights that the
    traced code reads go into the graph (not, say, Q, K and V beside their fused copy)."""
    return reads_replaced(lambda variable: tf.constant(values[id(variable)]) if id(variable) in values else None)


class OnLongestText:
    """`model` called on a batch cut to its longest text, rounded up to LENGTH_MULTIPLE tokens.

    BertPreprocessor packs every text to max_seq_length (so truncation is the original's), but
    a 6-word query would then pay for 128 positions. Cutting the batch to its longest text
    changes nothing for the real tokens: padding is masked out of attention (-10000 before the
    softmax, exp underflows to 0), so pooled outputs, logits and per-token outputs agree with
    the padded run to float32 rounding. Outputs with a value per token are padded back to the
    length of the inputs, with zeros at the positions past each text (input_mask 0), where the
    padded run gave the model's outputs for padding, which mean nothing.

    A batch of more than `group_rows` texts is sorted by length and run `group_rows` texts at a
    time, each group cut to its own longest text, then put back in the request's order: in a
    batch of 32 real texts one long text would otherwise make all 32 pay for its length.

    With `constant_weights`, the model is traced with its weights as constants of the graph
    (`kbert export --constant-weights`), made from their values when OnLongestText is built.

    Attribute reads go to `attributes_of` (default `model`: num_classes, config, ...), so a task's
    serving head takes it in the model's place.
    """

    def __init__(self, model, attributes_of=None, constant_weights=False, group_rows=GROUP_ROWS):
        self.attributes_of = model if attributes_of is None else attributes_of
        self.model, self.group_rows = model, group_rows
        self.values = {id(w): w.numpy() for w in model.weights} if constant_weights else None
        # Every signature calls this one traced function (per rank of the inputs), so the
        # model is traced, and its constant weights saved, once. The model's ops sit directly
        # in the loop's body, where TF's graph optimizer fuses their bias adds and GELUs.
        self.function = tf.function(self._grouped)

    def __getattr__(self, name):
        return getattr(self.attributes_of, name)

    def __call__(self, features, training=False):
        if training:
            raise ValueError("OnLongestText serves: train the model itself")
        features = {k: tf.convert_to_tensor(v) for k, v in features.items()}
        specs = {k: tf.TensorSpec([None] * v.shape.rank, v.dtype, name=k) for k, v in features.items()}
        return self.function.get_concrete_function(specs)(features)

    def _weights(self):
        """Where the model's weights come from while it is traced: graph constants or its variables."""
        return _weights_as_constants(self.values) if self.values is not None else contextlib.nullcontext()

    def _grouped(self, features):
        mask = features["input_mask"]
        if mask.shape.rank != 2:  # multiple choice, [batch, choices, seq]: one group
            return self._on_longest(features)
        lengths = tf.reduce_sum(mask, axis=-1)
        order = tf.argsort(lengths, stable=True)
        ordered = {k: tf.gather(v, order) for k, v in features.items()}
        rows, size = tf.shape(mask)[0], self.group_rows
        groups = (rows + size - 1) // size
        specs = dict(self.model.output)
        arrays = {
            k: tf.TensorArray(spec.dtype, size=groups, infer_shape=False, element_shape=[None, *spec.shape[1:]])
            for k, spec in specs.items()
        }

        def group(i, arrays):
            part = {k: v[i * size : (i + 1) * size] for k, v in ordered.items()}
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
