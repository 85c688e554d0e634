"""int8 matmuls for serving: oneDNN's VNNI kernels, activations quantized on every call.

`kbert export --precision int8` runs each dense layer of the encoder (Q/K/V, attention output,
both feed-forward matmuls, the pooler) as one `_QuantizedMatMul`: TensorFlow's oneDNN int8
matmul (`QuantizedFusedMatMulOp`, tensorflow/core/kernels/mkl/mkl_matmul_op_fused.cc), the op
Intel Neural Compressor emits, which every x86 TensorFlow wheel registers. What it computes,
with `fused_ops = [BiasAdd, Dequantize]` and `input_quant_mode = SCALED` (verified against a
numpy emulation of the kernel, to float32 rounding):

    out[i, j] = x_scale · w_scale[j] · Σ_k x_q[i, k] · w_q[k, j] + bias[j]

- **Weights**: int8, symmetric, one scale per output column, on 7 bits (WEIGHT_LEVELS):
  w_q = round(W · 63 / max|W[:, j]|), w_scale[j] = max|W[:, j]| / 63. Made once, at export.
  7 bits, not 8, so that the export computes the same numbers on every x86 CPU: without VNNI
  (AVX2, AVX-512 before Cascade Lake) oneDNN multiplies with `vpmaddubsw`, which adds each
  pair of u8·s8 products into a saturating int16, and a signed input is shifted by 128 into
  u8 first, so pairs reach 2·255·127 = 64770 and were cut at 32767: up to 23% off on AVX2
  (tests/serving/test_int8.py). With |w_q| ≤ 63 a pair is at most 2·255·63 = 32130. PyTorch's
  x86 int8 (`reduce_range`) and ONNX Runtime's (`reduce_range` for AVX2) give up a bit for the
  same reason; the accuracy measured with 7 bits is in docs/serving.md.
- **Activations**: quantized on every call, each row (token) with its own scale, from its own
  largest magnitude: qint8 with x_scale[i] = max|x[i]| / 127, so no calibration data is
  needed. BERT's activations have a few large channels, and one scale for a whole batch let
  them crush every other token's resolution (measured in docs/performance.md, "int8"). The
  kernel itself reads one scale for its whole input (a vector is silently cut to its first
  element), so QuantizeV2 quantizes per row (`axis=0`), the kernel gets a range of scale 1
  and a zero bias, and each output row is multiplied by its scale before the bias is added:
  out[i, j] = x_scale[i] · w_scale[j] · Σ_k x_q[i, k] · w_q[k, j] + bias[j].
- The input of the second feed-forward matmul is a GELU's output, never below GELU_FLOOR: it
  is shifted by -GELU_FLOOR and quantized as quint8 (twice the resolution of a symmetric
  int8), and the shift's product with the weights is taken out of the bias, once, at export.
- `QuantizeV2` runs with `narrow_range=True` for qint8: oneDNN's own quantize kernel quantizes
  qint8 with 127.5/max but reports ±max, which would make every product 0.39% too large.

Why not the others: `QuantizedMatMulWithBiasAndDequantize` adds `min_a / x_scale · colsum(W)`
to the bias in MIN_FIRST mode, where the offset is `min_a · w_scale · colsum(W)` (its output
is then neither the float product nor the int32 one), and recomputes that correction on every
call; `quantize_saved_model` and Keras' `quantize("int8")` run int8 on generic kernels, slower
than float32 (docs/performance.md, "int8").
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context, execute
from tensorflow.python.framework import op_def_library, op_def_registry

from kbert.errors import KbertError

# GELU's smallest value is about -0.16997 (erf form) and -0.17004 (tanh form): a GELU output
# shifted up by this much is never negative.
GELU_FLOOR = -0.171
# The CPU flags of an int8 dot product instruction oneDNN uses (VNNI, or AMX's int8 tiles).
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# The weights' largest integer: 7 bits, so that no pair of u8·s8 products passes int16 on CPUs
# without VNNI (2·255·63 ≤ 32767; the module docstring says why).
WEIGHT_LEVELS = 63
_OP = "_QuantizedMatMul"


def require_int8_matmul():
    """Raise KbertError if this TensorFlow has no oneDNN int8 matmul (a build without oneDNN)."""
    if op_def_registry.get(_OP) is None:
        raise KbertError(
            f"this TensorFlow ({tf.__version__}) has no oneDNN int8 matmul ({_OP}); use an x86 "
            "TensorFlow wheel, or export with --precision float32 or bfloat16"
        )


def cpu_int8_instructions(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The int8 dot-product instruction sets this CPU has, of VNNI_FLAGS ([] if unknown).

    >>> isinstance(cpu_int8_instructions(), list)
    True
    """
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in VNNI_FLAGS if flag in flags]


def quantize_kernel(kernel) -> tuple[np.ndarray, np.ndarray]:
    """A float kernel [in, out] -> (int8 kernel within ±WEIGHT_LEVELS, float32 scale per output column).

    >>> q, scale = quantize_kernel(np.array([[1.0, -0.5], [-2.0, 0.25]]))
    >>> q.tolist(), scale.tolist()
    ([[31, -63], [-63, 31]], [0.0317460335791111, 0.007936508394777775])
    """
    kernel = np.asarray(kernel, np.float32)
    largest = np.maximum(np.abs(kernel).max(axis=0), np.float32(1e-12))
    scale = (largest / np.float32(WEIGHT_LEVELS)).astype(np.float32)
    return np.clip(np.rint(kernel / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8), scale


def shifted_bias(bias, kernel_q, scale, shift: float) -> np.ndarray:
    """The bias that undoes an input shift: `(x + shift) @ W + b'` equals `x @ W + b`, with W
    the dequantized kernel (`kernel_q · scale`)."""
    column_sums = kernel_q.astype(np.int64).sum(axis=0).astype(np.float64)
    return (np.asarray(bias, np.float64) - shift * scale.astype(np.float64) * column_sums).astype(np.float32)


def int8_matmul(x, kernel_q, scale, bias, shift: float = 0.0, per_row: bool = True):
    """x [rows, in] float32 @ the int8 kernel [in, out] + bias [out] -> float32 [rows, out].

    `kernel_q` is int8 (a tensor or Keras weight) and `scale` its float32 scale per column. With
    `per_row`, each row of x gets its own scale (for inputs with a few large channels, such as
    a LayerNorm's output); otherwise one scale for all of x, and the kernel adds the bias
    itself (fewer ops). With `shift` (for inputs never below -shift, e.g. GELU_FLOOR's
    negation), x + shift is quantized as quint8 and `bias` must come from `shifted_bias`.

    >>> x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    >>> w = np.random.default_rng(1).normal(size=(16, 8)).astype("float32")
    >>> q, s = quantize_kernel(w)
    >>> y = int8_matmul(tf.constant(x), tf.constant(q), tf.constant(s), tf.zeros([8]))
    >>> bool(np.abs(y.numpy() - x @ w).max() < 0.05 * np.abs(x @ w).max())
    True
    """
    x = tf.convert_to_tensor(x, tf.float32)
    if shift:
        x = tf.maximum(x + shift, 0.0)
        top = tf.reduce_max(x, axis=1) if per_row else tf.reduce_max(x)
        top = tf.maximum(top, 1e-12)
        bottom, levels, dtype = tf.zeros_like(top), 255.0, tf.quint8
    else:
        top = tf.reduce_max(tf.abs(x), axis=1) if per_row else tf.reduce_max(tf.abs(x))
        top = tf.maximum(top, 1e-12)
        bottom, levels, dtype = -top, 127.0, tf.qint8
    # Per row: one range per row (axis 0), QuantizeV2's own per-slice quantization. The matmul
    # takes one scale for its whole input, so it is given a range whose scale is 1 (its integer
    # product times the weights' scales), and each row's scale is applied to its output here.
    quantized = tf.raw_ops.QuantizeV2(
        input=x,
        min_range=bottom,
        max_range=top,
        T=dtype,
        mode="SCALED",
        round_mode="HALF_TO_EVEN",
        narrow_range=not shift,
        axis=0 if per_row else -1,
    )
    scale = tf.convert_to_tensor(scale, tf.float32)
    largest = scale * 127.0  # the float value of qint8's 127: the kernel's range, whatever the weights' levels
    kernel = tf.bitcast(tf.convert_to_tensor(kernel_q), tf.qint8)
    bias = tf.convert_to_tensor(bias, tf.float32)
    if not per_row:
        return _quantized_matmul(
            quantized.output, kernel, bias, quantized.output_min, quantized.output_max, -largest, largest
        )
    unit = tf.constant(levels)
    low = tf.zeros([]) if shift else -unit
    product = _quantized_matmul(quantized.output, kernel, tf.zeros_like(scale), low, unit, -largest, largest)
    return product * (top / levels)[:, None] + bias


def _quantized_matmul(x_q, kernel_q, bias, x_min, x_max, w_min, w_max):
    """`_QuantizedMatMul` with [BiasAdd, Dequantize]: not in tf.raw_ops (its name starts with
    an underscore), so it is added to the graph, or run eagerly, by its registered name. All
    inputs are host inputs, as Intel Neural Compressor passes them."""
    inputs = [x_q, kernel_q, bias, x_min, x_max, w_min, w_max]
    attrs = dict(
        Tdevice_outputs=[],
        Thost_outputs=[tf.float32],
        T1=x_q.dtype,
        T2=tf.qint8,
        Tbias=tf.float32,
        U=tf.float32,
        Tout=tf.float32,
        transpose_a=False,
        transpose_b=False,
        is_weight_const=True,
        is_bias_const=True,
        fused_ops=["BiasAdd", "Dequantize"],
        input_quant_mode="SCALED",
        output_quant_mode="SCALED",
        leakyrelu_alpha=0.2,
    )
    if tf.executing_eagerly():
        # Eagerly every attr is given, the inferred input types too.
        flat = ["Tdevice_inputs", [], "Thost_inputs", [t.dtype.as_datatype_enum for t in inputs]]
        for key, value in attrs.items():
            if isinstance(value, tf.DType):
                value = value.as_datatype_enum
            elif key in ("Tdevice_outputs", "Thost_outputs"):
                value = [v.as_datatype_enum for v in value]
            flat += [key, value]
        return execute.execute(_OP, 1, inputs, tuple(flat), context.context())[0]
    op = op_def_library._apply_op_helper(_OP, device_inputs=[], host_inputs=inputs, name="int8_matmul", **attrs)[2]
    return op.outputs[0]
