"""int8 matmuls for serving: oneDNN's VNNI kernels, activations quantized on every call.

`kbert export --precision int8` runs each dense layer of the encoder (Q/K/V, attention output,
both feed-forward matmuls, the pooler) as one `_QuantizedMatMul`: TensorFlow's oneDNN int8
matmul (`QuantizedFusedMatMulOp`, tensorflow/core/kernels/mkl/mkl_matmul_op_fused.cc), the op
Intel Neural Compressor emits, which every x86 TensorFlow wheel registers. What it computes,
with `fused_ops = [BiasAdd, Dequantize]` and `input_quant_mode = SCALED` (verified against a
numpy emulation of the kernel, to float32 rounding; `range` is max(|min|, |max|) of the
ranges it is given, 255 for quint8 and 127 for qint8):

    out[i, j] = (x_range / 255) · (w_range[j] / 127) · Σ_k x_q[i, k] · w_q[k, j] + bias[j]

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
  largest value, so no calibration data is needed. BERT's activations have a few large
  channels, and one scale for a whole batch let them crush every other token's resolution
  (measured in docs/performance.md, "int8"). Every input is made non-negative and quantized
  as quint8, what the int8 instructions multiply (u8 · s8): a signed row by its own largest
  magnitude, the GELU's output (never below GELU_FLOOR) by -GELU_FLOOR, both taken out again
  through a bias made at export (`Int8Kernel`, `int8_matmul` gives the formula).
- The kernel reads one input scale for its whole input (a vector is silently cut to its first
  element), and keys its cached oneDNN primitive by the ranges' values. So it gets fixed
  ranges (scale 1 for the input, the weights' own), each row is quantized on its own scale
  (Mul, Round, Cast), and each output row is multiplied by that scale before the bias is added.

With ranges measured at export (`kbert export --int8-ranges calibrated --calibration FILE`,
`CalibratedInt8Kernel`, `calibrated_int8_matmul`), an input is quantized on its layer's fixed
range instead (one scale and zero point for every row and request), and the kernel itself
rescales, adds the bias and, after the first feed-forward matmul, applies the GELU
(`fused_ops = [BiasAdd, GeluExact, Dequantize]`): fewer ops per call, nothing computed per row.

Why not the others: `QuantizedMatMulWithBiasAndDequantize` adds `min_a / x_scale · colsum(W)`
to the bias in MIN_FIRST mode, where the offset is `min_a · w_scale · colsum(W)` (its output
is then neither the float product nor the int32 one), and recomputes that correction on every
call; `quantize_saved_model` and Keras' `quantize("int8")` run int8 on generic kernels, slower
than float32 (docs/performance.md, "int8").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from kbert.backend.tensorflow_compat import add_op_to_graph, op_registered, run_op_eagerly
from kbert.runtime.errors import KbertError, option

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
    if not op_registered(_OP):
        raise KbertError(
            f"this TensorFlow ({tf.__version__}) has no oneDNN int8 matmul ({_OP}); use an x86 "
            f"TensorFlow wheel, or export with {option('precision', 'float32')} (or bfloat16)"
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


@dataclasses.dataclass(frozen=True)
class Int8Kernel:
    """One dense layer as `int8_matmul` runs it, made once at export (`Int8Kernel.of`). The
    fields are numpy arrays, or tensors or Keras weights holding them (`dataclasses.replace`).

    kernel: int8 [in, out], within ±WEIGHT_LEVELS.
    weight_range: float32 [out], what qint8's 127 stands for in each column (its scale · 127):
        the kernel's weight range, passed as its min and max alike, so no op runs on it per call.
    kernel_bias: float32 [out], what the kernel adds to each row's integer product (times the
        weights' scales): the input's offset taken out, for a signed input; zeros otherwise.
    bias: float32 [out], added after the rows are rescaled (shifted for a GELU's input).
    shift: 0.0 for a signed input (each row offset by its own largest magnitude), or how far
        the input is shifted up to be non-negative (-GELU_FLOOR for a GELU's output).
    """

    kernel: object
    weight_range: object
    kernel_bias: object
    bias: object
    shift: float = 0.0

    @classmethod
    def of(cls, kernel, bias, shift: float = 0.0) -> Int8Kernel:
        """A float kernel [in, out] and bias [out] -> their int8 form, for inputs as `shift` says."""
        kernel_q, scale = quantize_kernel(kernel)
        bias = np.asarray(bias, np.float32)
        if shift:
            kernel_bias = np.zeros_like(scale)
            bias = shifted_bias(bias, kernel_q, scale, shift)
        else:
            # A signed row x, offset by its largest magnitude t, is quantized as u8 over
            # [0, 2t]: u_q ≈ (x + t) · 255 / 2t. Its product with W is then x @ W plus
            # t · colsum(W) = (2t / 255) · 127.5 · colsum(W): the kernel takes the last
            # factor out before the row is rescaled.
            kernel_bias = shifted_bias(np.zeros_like(scale), kernel_q, scale, 127.5)
        return cls(kernel_q, (scale * np.float32(127.0)).astype(np.float32), kernel_bias, bias, shift)


def int8_matmul(x, weights: Int8Kernel):
    """x [rows, in] float32 @ the int8 kernel [in, out] + bias [out] -> float32 [rows, out].

    Each row of x gets its own scale, from its own largest magnitude (BERT's activations have a
    few large channels: one scale for a batch would crush every other token's resolution). The
    row is made non-negative and quantized as quint8: a signed row x is offset by its largest
    magnitude t (x + t over [0, 2t], the resolution of a symmetric int8), a GELU's output by
    the constant shift (over [0, its largest], twice that). Unsigned inputs are what the int8
    instructions multiply (u8 · s8): a signed int8 input costs oneDNN a shift and a
    compensation on every call, measured at twice the time on AVX2 (docs/performance.md,
    "int8 serving").

    The kernel gets fixed ranges, [0, 255] for the input and `weight_range` for the weights,
    so that its oneDNN primitive is made once per shape: its cache is keyed by the ranges'
    values, and a range that changes on every call made it build a new primitive on every
    call. It returns each row's integer product times the weights' scales plus
    `kernel_bias`, and each row is then rescaled by its own scale, and the bias added:

        out[i, j] = (top[i] / 255) · (w_scale[j] · Σ_k u_q[i, k] · w_q[k, j] + kernel_bias[j]) + bias[j]

    with top[i] = 2 · max|x[i]| (signed) or max(x[i] + shift) (shifted).

    >>> x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    >>> w = np.random.default_rng(1).normal(size=(16, 8)).astype("float32")
    >>> y = int8_matmul(tf.constant(x), Int8Kernel.of(w, np.zeros(8)))
    >>> bool(np.abs(y.numpy() - x @ w).max() < 0.05 * np.abs(x @ w).max())
    True
    """
    x = tf.convert_to_tensor(x, tf.float32)
    # The quantizing and rescaling ops get scopes of their own, so that a profile of the export
    # can tell them from the model's other element-wise ops (benchmarks/request_profile.py).
    with tf.name_scope("int8_quantize"):
        quantized, row_scale = _quantize_rows(x, weights.shift)
    weight_range = tf.convert_to_tensor(weights.weight_range, tf.float32)
    product = _quantized_matmul(
        quantized,
        tf.bitcast(tf.convert_to_tensor(weights.kernel), tf.qint8),
        tf.convert_to_tensor(weights.kernel_bias, tf.float32),
        tf.constant(0.0),
        tf.constant(255.0),
        weight_range,
        weight_range,
    )
    with tf.name_scope("int8_dequantize"):
        return product * row_scale + tf.convert_to_tensor(weights.bias, tf.float32)


def _quantize_rows(x, shift: float):
    """x [rows, in] float32 -> (quint8 levels [rows, in], each row's scale [rows, 1]), as
    `int8_matmul` says: a signed row over [0, 2·max|x|], a shifted one over [0, max(x + shift)]."""
    # Each row's largest value, kept as a column [rows, 1] (no op to reshape it).
    if shift:  # x + shift > 0 (GELU_FLOOR is below the GELU's minimum)
        top = tf.maximum(tf.reduce_max(x, axis=1, keepdims=True) + shift, 1e-12)
        levels = (x + shift) * (255.0 / top)
        row_scale = top * (1.0 / 255.0)
    else:
        largest = tf.maximum(tf.reduce_max(tf.abs(x), axis=1, keepdims=True), 1e-12)
        levels = x * (127.5 / largest) + 127.5  # (x + largest) · 255 / (2 · largest)
        row_scale = largest * (2.0 / 255.0)
    # Each row on its own scale, rounded half to even as QuantizeV2 does (whose per-row form
    # is several times slower: docs/performance.md, "int8 serving"); within [0, 255] by construction.
    return tf.bitcast(tf.cast(tf.round(levels), tf.uint8), tf.quint8), row_scale


def _quantized_matmul(x_q, kernel_q, bias, x_min, x_max, w_min, w_max, fused_ops=("BiasAdd", "Dequantize")):
    """`_QuantizedMatMul` with `fused_ops` ([BiasAdd, Dequantize], or with a GELU between): not
    in tf.raw_ops (its name starts with an underscore), so it is added to the graph, or run
    eagerly, by its registered name. All inputs are host inputs, as Intel Neural Compressor
    passes them."""
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
        fused_ops=list(fused_ops),
        input_quant_mode="SCALED",
        output_quant_mode="SCALED",
        leakyrelu_alpha=0.2,
    )
    if tf.executing_eagerly():
        # Eagerly every attr is given, the inferred input types too. And the weights are not
        # marked constant: TensorFlow runs every eager call with the same attrs on one cached
        # kernel, which would keep the first call's weights for every later kernel of that shape.
        attrs.update(is_weight_const=False, is_bias_const=False)
        flat = ["Tdevice_inputs", [], "Thost_inputs", [t.dtype.as_datatype_enum for t in inputs]]
        for key, value in attrs.items():
            if isinstance(value, tf.DType):
                value = value.as_datatype_enum
            elif key in ("Tdevice_outputs", "Thost_outputs"):
                value = [v.as_datatype_enum for v in value]
            flat += [key, value]
        return run_op_eagerly(_OP, 1, inputs, flat)[0]
    op = add_op_to_graph(_OP, name="int8_matmul", device_inputs=[], host_inputs=inputs, **attrs)
    return op.outputs[0]


@dataclasses.dataclass(frozen=True)
class CalibratedInt8Kernel:
    """One dense layer for inputs within a range measured on real texts at export
    (`kbert export --precision int8 --calibration FILE --int8-ranges calibrated`), as
    `calibrated_int8_matmul` runs it. Made once (`CalibratedInt8Kernel.of`); the fields are
    numpy arrays, or tensors or Keras weights holding them, but `gelu` and the input's scalars.

    kernel: int8 [in, out], within ±WEIGHT_LEVELS, as `Int8Kernel`'s.
    weight_range: float32 [out], as `Int8Kernel`'s.
    bias: float32 [out], the layer's bias less the input's zero point times the kernel's column sums.
    input_scale: levels per unit of the input: 255 / (high - low) of its measured range.
    zero_point: the level that stands for 0.0 (an integer in [0, 255]).
    gelu: None, "exact" (erf) or "approximate" (tanh): the GELU the kernel applies to its output.
    """

    kernel: object
    weight_range: object
    bias: object
    input_scale: float
    zero_point: float
    gelu: str | None = None

    @classmethod
    def of(cls, kernel, bias, low: float, high: float, gelu: str | None = None) -> CalibratedInt8Kernel:
        """A float kernel [in, out] and bias [out] -> their int8 form, for inputs in [low, high]
        (widened to hold 0.0, which is then a level of its own: padding and zeros stay exact).

        >>> k = CalibratedInt8Kernel.of(np.eye(2), np.zeros(2), -1.0, 3.0)
        >>> k.input_scale, k.zero_point
        (63.75, 64.0)
        """
        low, high = min(float(low), 0.0), max(float(high), 0.0)
        scale = 255.0 / max(high - low, 1e-6)
        zero_point = float(np.clip(np.rint(-low * scale), 0, 255))
        kernel_q, weight_scale = quantize_kernel(kernel)
        # x ≈ (q - zero_point) / scale, so x @ W + b = (q @ W) / scale + (b - zero_point / scale · colsum(W)).
        corrected = shifted_bias(bias, kernel_q, weight_scale, zero_point / scale)
        return cls(kernel_q, (weight_scale * np.float32(127.0)).astype(np.float32), corrected, scale, zero_point, gelu)


def calibrated_int8_matmul(x, weights: CalibratedInt8Kernel):
    """x [rows, in] float32 @ the int8 kernel [in, out] + bias [out] (then the kernel's GELU, if
    it has one) -> float32 [rows, out], with x quantized on the fixed scale measured at export.

    One quantizing step per call (levels = round(x · scale + zero_point), cut to [0, 255]) and
    one kernel, which rescales, adds the bias and applies the GELU itself: nothing is computed
    per row, and no range per call, so the kernel's oneDNN primitive is made once per shape.
    An input beyond the measured range is cut to it.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.uniform(-1, 1, size=(4, 16)).astype("float32")
    >>> w = rng.normal(size=(16, 8)).astype("float32")
    >>> y = calibrated_int8_matmul(tf.constant(x), CalibratedInt8Kernel.of(w, np.zeros(8), -1.0, 1.0))
    >>> bool(np.abs(y.numpy() - x @ w).max() < 0.05 * np.abs(x @ w).max())
    True
    """
    x = tf.convert_to_tensor(x, tf.float32)
    with tf.name_scope("int8_quantize"):
        levels = tf.clip_by_value(tf.round(x * weights.input_scale + weights.zero_point), 0.0, 255.0)
        quantized = tf.bitcast(tf.cast(levels, tf.uint8), tf.quint8)
    fused = [
        "BiasAdd",
        *({"exact": ["GeluExact"], "approximate": ["GeluApproximate"]}.get(weights.gelu, [])),
        "Dequantize",
    ]
    weight_range = tf.convert_to_tensor(weights.weight_range, tf.float32)
    return _quantized_matmul(
        quantized,
        tf.bitcast(tf.convert_to_tensor(weights.kernel), tf.qint8),
        tf.convert_to_tensor(weights.bias, tf.float32),
        tf.constant(0.0),
        # The kernel multiplies its integer product by (this / 255) · weight_range / 127: 1 / input_scale.
        tf.constant(255.0 / weights.input_scale),
        weight_range,
        weight_range,
        fused_ops=fused,
    )
