"""The layers of google-research/bert's `modeling.py`, as Keras 3 layers.

Each layer keeps its weights in the original's shapes ([H, H] attention kernels, [2, H]
next-sentence weights), so converting a checkpoint is a copy, never a reshape, and a round
trip is bit for bit. Why not keras-hub's `TransformerEncoder`: it has one dropout rate where
`bert_config.json` has two (`hidden_dropout_prob`, `attention_probs_dropout_prob`), and it
masks attention with its own large negative number rather than the original's -10000.
Why not keras-hub's `PositionEmbedding`: importing keras_hub costs every process memory and
start-up time (docs/performance.md, "Figures behind the code's comments"), for a slice of one table.

The math is `keras.ops`, the same on TensorFlow, JAX and PyTorch. On TensorFlow, training runs
through `kbert.backend.tensorflow_fused`'s XLA kernels and inference through the plain Keras ops; `use_fused`
alone decides which, and tests/model/test_layers.py checks that both paths agree. The other
backends have no fused kernels and run the plain ops throughout (`kbert.backend` picks what a
backend runs, once).
What an export runs differently (Q, K and V as one matmul, LayerNorm as one oneDNN kernel) is
`kbert.serving.optimize`'s, which rewrites a built model without changing these layers.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from kbert.backend import fused, matmul_transposed, take_positions
from kbert.config import BertConfig
from kbert.model.initializers import initializer


def activation(name: str):
    """The activation a `hidden_act` value names.

    "gelu" is the exact erf form used to train the released checkpoints (google-research/bert's
    first release); "gelu_new"/"gelu_tanh" are the tanh approximation.
    """
    if name == "gelu":
        return exact_gelu
    if name in ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh"):
        return lambda x: keras.activations.gelu(x, approximate=True)
    return keras.activations.get(name)


def exact_gelu(x):
    """x·Φ(x) written as modeling.gelu: 0.5·x·(1 + erf(x/√2)).

    Not keras.activations.gelu(approximate=False): that one uses erfc, which on this CPU runs
    much slower than erf in bfloat16 (docs/performance.md, "Figures behind the code's comments"),
    and it is not the formula the checkpoints were trained with.

    >>> [round(float(v), 4) for v in exact_gelu(keras.ops.convert_to_tensor([-1.0, 0.0, 2.0]))]
    [-0.1587, 0.0, 1.9545]
    """
    return 0.5 * x * (1.0 + ops.erf(x / math.sqrt(2.0)))


def use_fused(training, *denses) -> bool:
    """Whether this call runs `kbert.backend.tensorflow_fused`'s training kernels rather than the plain ops.

    True when training on TensorFlow, unless inside `fused.disabled()` or one of `denses` (the
    Dense layers whose kernel and bias the fused kernel would apply itself) is not a plain Dense.

    Example:
    >>> use_fused(True), use_fused(False)
    (True, False)
    >>> with fused.disabled():
    ...     use_fused(True)
    False
    """
    return bool(training) and fused is not None and fused.enabled() and all(_plain_dense(d) for d in denses)


def _plain_dense(dense) -> bool:
    # The fused kernels do `matmul(x, dense.kernel)` and add `dense.bias` themselves, bypassing
    # `Dense.call`. That is only the same computation for keras' own Dense, unquantized (an int8
    # or int4 layer's `kernel` lacks its scale; Layer.__call__ sends it to `quantized_call`) and
    # without LoRA (Keras 3.15's `kernel` property adds the LoRA delta, but a later Keras may
    # apply it in `call` instead). Any other Dense keeps its own `call`, in training as at
    # inference, and gets the plain path.
    return (
        type(dense) is keras.layers.Dense
        and dense.quantization_mode is None
        and not dense.lora_enabled
        and dense.bias is not None
        and dense.activation in (None, keras.activations.linear)
    )


def dense(config: BertConfig, units: int, name: str, act=None, dtype=None):
    return keras.layers.Dense(
        units,
        activation=act,
        kernel_initializer=initializer(config, "kernel"),
        bias_initializer=initializer(config, "bias"),
        name=name,
        dtype=dtype,
    )


class PositionEmbedding(keras.layers.Layer):
    """`bert/embeddings/position_embeddings`: a [max_position_embeddings, H] table whose first
    `seq` rows are added to a [batch, seq, H] input."""

    def __init__(self, max_positions: int, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.max_positions = max_positions
        self.initializer = initializer

    def build(self, inputs_shape):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.max_positions, inputs_shape[-1]), initializer=self.initializer
        )
        self.built = True

    def call(self, inputs):
        seq = ops.shape(inputs)[1]
        return ops.expand_dims(ops.cast(self.embeddings[:seq], self.compute_dtype), 0)


def layer_norm(config: BertConfig, name: str, dtype=None):
    # tf.contrib.layers.layer_norm as modeling.py calls it: last axis, epsilon 1e-12.
    return LayerNorm(
        axis=-1,
        epsilon=1e-12,
        gamma_initializer=initializer(config, "gamma"),
        beta_initializer=initializer(config, "beta"),
        name=name,
        dtype=dtype,
    )


class LayerNorm(keras.layers.LayerNormalization):
    """keras' LayerNormalization (same weights) that trains through `fused.layer_norm`: one XLA
    loop forward and one backward instead of about twenty ops. Inference runs keras' own ops.
    """

    def call(self, inputs, training=None):
        last_axis = self.axis in (-1, [-1], [len(inputs.shape) - 1]) and self.center and self.scale
        if use_fused(training) and last_axis and not self.rms_scaling:
            return fused.layer_norm(
                inputs, ops.cast(self.gamma, "float32"), ops.cast(self.beta, "float32"), self.epsilon
            )
        return super().call(inputs)


class Dropout(keras.layers.Dropout):
    """keras' Dropout (same seed generator, same float32 masks) that trains through
    `fused.dropout`: one XLA loop each way, and 16-bit noise for bfloat16 tensors."""

    def call(self, inputs, training=False):
        if use_fused(training) and self.rate > 0 and self.noise_shape is None:
            return fused.dropout(inputs, self.rate, self.next_seed())
        return super().call(inputs, training=training)

    def next_seed(self):
        """The int32 [2] seed of this layer's next mask, drawn as keras' Dropout draws it."""
        seed = self.seed_generator.next()
        # As keras' TF backend does (`_cast_seed`): stateless ops want int32 seeds.
        if keras.backend.standardize_dtype(seed.dtype) != "int32":
            seed = ops.cast(ops.mod(seed, 2**31 - 2), "int32")
        return seed


class BertEmbeddings(keras.layers.Layer):
    """Word + segment + position embeddings, then LayerNorm and dropout (`embedding_postprocessor`).

    Call with `(input_ids, segment_ids)`, both int [batch, seq]; returns [batch, seq, H].
    """

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(**kwargs)
        init = initializer(config, "embeddings")

        def table(rows, name):
            return keras.layers.Embedding(
                rows, config.hidden_size, embeddings_initializer=init, name=name, dtype=self.dtype_policy
            )

        self.word_embeddings = table(config.vocab_size, "word_embeddings")
        self.token_type_embeddings = table(config.type_vocab_size, "token_type_embeddings")
        self.position_embeddings = PositionEmbedding(
            config.max_position_embeddings, initializer=init, name="position_embeddings", dtype=self.dtype_policy
        )
        self.layer_norm = layer_norm(config, "layer_norm", self.dtype_policy)
        self.dropout = Dropout(config.hidden_dropout_prob, name="dropout", dtype=self.dtype_policy)

    def build(self, input_ids_shape, segment_ids_shape=None):
        self.word_embeddings.build(input_ids_shape)
        self.token_type_embeddings.build(input_ids_shape)
        hidden_shape = tuple(input_ids_shape) + (self.word_embeddings.output_dim,)
        self.position_embeddings.build(hidden_shape)
        self.layer_norm.build(hidden_shape)
        self.built = True

    def call(self, input_ids, segment_ids, training=None):
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(segment_ids)
        x = x + self.position_embeddings(x)  # broadcast over the batch
        return self.dropout(self.layer_norm(x, training=training), training=training)

    def compute_output_spec(self, input_ids, segment_ids, training=None):
        return keras.KerasTensor(tuple(input_ids.shape) + (self.word_embeddings.output_dim,), dtype=self.compute_dtype)


class TransformerLayer(keras.layers.Layer):
    """One post-LayerNorm transformer layer, as modeling.transformer_model builds it.

    Call with `(hidden, attention_adder)`: hidden [batch, seq, H] and attention_adder
    [batch, 1, 1, seq] (0 for real tokens, -10000 for padding, see `attention_adder`).
    """

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        policy = self.dtype_policy
        H = config.hidden_size
        self.query = dense(config, H, "query", dtype=policy)
        self.key = dense(config, H, "key", dtype=policy)
        self.value = dense(config, H, "value", dtype=policy)
        self.attention_output = dense(config, H, "attention_output", dtype=policy)
        self.attention_layer_norm = layer_norm(config, "attention_layer_norm", policy)
        # The activation is applied in `call`, so that training can use the fused exact GELU.
        self.intermediate = dense(config, config.intermediate_size, "intermediate", dtype=policy)
        self.intermediate_activation = activation(config.hidden_act)
        self.fused_gelu = config.hidden_act == "gelu"
        self.output_dense = dense(config, H, "output", dtype=policy)
        self.output_layer_norm = layer_norm(config, "output_layer_norm", policy)
        self.attention_dropout = Dropout(config.attention_probs_dropout_prob, name="attention_dropout", dtype=policy)
        self.hidden_dropout = Dropout(config.hidden_dropout_prob, name="hidden_dropout", dtype=policy)

    def build(self, hidden_shape, attention_adder_shape=None):
        H = hidden_shape[-1]
        for dense in (self.query, self.key, self.value, self.attention_output):
            dense.build(hidden_shape)
        self.attention_layer_norm.build(hidden_shape)
        self.intermediate.build(hidden_shape)
        self.output_dense.build(tuple(hidden_shape[:-1]) + (self.intermediate.units,))
        self.output_layer_norm.build(hidden_shape)
        assert H == self.num_heads * self.head_size
        self.built = True

    def _split_heads(self, x, batch, seq):
        # [batch·seq, H] -> [batch, heads, seq, head_size]
        x = ops.reshape(x, (batch, seq, self.num_heads, self.head_size))
        return ops.transpose(x, (0, 2, 1, 3))

    def call(self, hidden, attention_adder, training=None):
        batch, seq = ops.shape(hidden)[0], ops.shape(hidden)[1]
        H = self.num_heads * self.head_size
        # Every dense layer works on [batch·seq, H], as modeling.py's reshape_to_matrix does: a
        # 2-D MatMul lets TF's graph optimizer fuse its bias add and GELU into one oneDNN call,
        # which it cannot across the reshapes a 3-D dense adds.
        flat = ops.reshape(hidden, (-1, H))
        q = self._split_heads(self.query(flat), batch, seq)
        k = self._split_heads(self.key(flat), batch, seq)
        v = self._split_heads(self.value(flat), batch, seq)
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        scale, rate = 1.0 / math.sqrt(self.head_size), self.attention_dropout.rate
        if use_fused(training) and rate > 0:
            # The same arithmetic as below, with the scaling, casts and dropout fused around
            # the softmax, forward and backward.
            probs = fused.attention_probs(
                scores, ops.cast(attention_adder, "float32"), scale, rate, self.attention_dropout.next_seed()
            )
        else:
            # Softmax in float32 even under mixed precision: bf16 loses the small probabilities.
            scores = ops.cast(scores * scale, "float32") + ops.cast(attention_adder, "float32")
            probs = self.attention_dropout(
                ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype), training=training
            )
        context = ops.transpose(ops.matmul(probs, v), (0, 2, 1, 3))
        context = ops.reshape(context, (-1, H))

        attended = self._dense_then_dropout(self.attention_output, context, training)
        attended = self.attention_layer_norm(attended + flat, training=training)
        if self.fused_gelu and use_fused(training, self.intermediate):
            # The bias add, the GELU and the bias's gradient in one fused pass each way.
            inner = fused.gelu(
                ops.matmul(attended, self.intermediate.kernel), ops.cast(self.intermediate.bias, self.compute_dtype)
            )
        else:
            # Inference keeps the plain ops: TF's graph optimizer fuses them into oneDNN's matmul.
            inner = self.intermediate_activation(self.intermediate(attended))
        out = self._dense_then_dropout(self.output_dense, inner, training)
        return ops.reshape(self.output_layer_norm(out + attended, training=training), (batch, seq, H))

    def _dense_then_dropout(self, dense, x, training):
        if self.hidden_dropout.rate > 0 and use_fused(training, dense):
            # The bias add, the dropout and the bias's gradient in one fused pass each way.
            return fused.bias_dropout(
                ops.matmul(x, dense.kernel),
                ops.cast(dense.bias, self.compute_dtype),
                self.hidden_dropout.rate,
                self.hidden_dropout.next_seed(),
            )
        return self.hidden_dropout(dense(x), training=training)

    def compute_output_spec(self, hidden, attention_adder, training=None):
        return keras.KerasTensor(hidden.shape, dtype=self.compute_dtype)


def attention_adder(input_mask, dtype="float32"):
    """[batch, seq] mask (1 = real token) -> [batch, 1, 1, seq] of 0 / -10000, as modeling.py."""
    mask = ops.cast(input_mask, dtype)
    return ops.expand_dims(ops.expand_dims((1.0 - mask) * -10000.0, 1), 1)


class MaskedLMHead(keras.layers.Layer):
    """`cls/predictions`: dense(H) + activation + LayerNorm, logits against the tied word embeddings.

    Call with `(sequence_output, masked_lm_positions)`; returns float32 logits
    [batch, positions, vocab]. Only the masked positions are transformed and projected,
    which is where the original spends its time too (`gather_indexes`).
    """

    def __init__(self, config: BertConfig, word_embeddings: keras.layers.Embedding, **kwargs):
        super().__init__(**kwargs)
        self.word_embeddings = word_embeddings
        self.transform = dense(
            config, config.hidden_size, "transform", activation(config.hidden_act), dtype=self.dtype_policy
        )
        self.bias_initializer = initializer(config, "output_bias")
        self.layer_norm = layer_norm(config, "layer_norm", self.dtype_policy)
        self.vocab_size = config.vocab_size

    def build(self, sequence_output_shape, masked_lm_positions_shape=None):
        self.transform.build(sequence_output_shape)
        self.layer_norm.build(sequence_output_shape)
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocab_size,), initializer=self.bias_initializer
        )
        self.built = True

    def call(self, sequence_output, masked_lm_positions, training=None):
        picked = take_positions(sequence_output, masked_lm_positions)
        batch, positions = ops.shape(picked)[0], ops.shape(picked)[1]
        # [batch·P, H], as modeling.py's gather_indexes returns: a 2-D dense fuses its bias and GELU.
        picked = self.layer_norm(self.transform(ops.reshape(picked, (-1, ops.shape(picked)[-1]))), training=training)
        table = ops.cast(self.word_embeddings.embeddings, self.compute_dtype)
        # Against the [vocab, H] table as it is stored (`matmul_transposed` says why).
        logits = matmul_transposed(picked, table)
        bias = ops.cast(self.output_bias, "float32")
        logits = fused.bias_add_float32(logits, bias) if use_fused(training) else ops.cast(logits, "float32") + bias
        return ops.reshape(logits, (batch, positions, self.vocab_size))

    def compute_output_spec(self, sequence_output, masked_lm_positions, training=None):
        return keras.KerasTensor(
            (sequence_output.shape[0], masked_lm_positions.shape[1], self.vocab_size), dtype="float32"
        )


class OutputProjection(keras.layers.Layer):
    """logits = x · Wᵀ + b with W kept [units, H], the layout of the original's task heads.

    google-research/bert stores every head it adds on top of the encoder this way:
    `cls/seq_relationship/output_weights` [2, H] (run_pretraining.py), `output_weights`
    [num_labels, H] (run_classifier.py), `cls/squad/output_weights` [2, H] (run_squad.py).
    Works on [batch, H] and [batch, seq, H]; returns float32 logits.
    """

    def __init__(self, config: BertConfig, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.weights_initializer = initializer(config, "output_weights")
        self.bias_initializer = initializer(config, "output_bias")

    def build(self, input_shape):
        self.output_weights = self.add_weight(
            name="output_weights", shape=(self.units, input_shape[-1]), initializer=self.weights_initializer
        )
        self.output_bias = self.add_weight(name="output_bias", shape=(self.units,), initializer=self.bias_initializer)
        self.built = True

    def call(self, x):
        logits = ops.matmul(x, ops.transpose(ops.cast(self.output_weights, self.compute_dtype)))
        return ops.cast(logits, "float32") + ops.cast(self.output_bias, "float32")

    def compute_output_spec(self, x):
        return keras.KerasTensor(tuple(x.shape[:-1]) + (self.units,), dtype="float32")


class NextSentenceHead(OutputProjection):
    """`cls/seq_relationship`: logits [batch, 2] from the pooled output; label 0 = "B follows A"."""

    def __init__(self, config: BertConfig, **kwargs):
        super().__init__(config, 2, **kwargs)
