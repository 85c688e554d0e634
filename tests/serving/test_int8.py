"""`kbert export --precision int8`: the encoder's matmuls as oneDNN int8 kernels (`kbert.serving.int8`).

The matmul is checked against its formula computed in numpy from the quantized inputs (what the
kernel must compute), and against the float product; the export is run as TF Serving runs it,
in a fresh process with only TensorFlow and TF Text, and its kernels listed; each task's model
rewritten in int8 stays close to its float32 outputs.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, assert_user_error, run_kbert
from helpers import run_in_fresh_process
from kbert.serving.int8 import (
    GELU_FLOOR,
    CalibratedInt8Kernel,
    Int8Kernel,
    calibrated_int8_matmul,
    cpu_int8_instructions,
    int8_matmul,
    quantize_kernel,
    shifted_bias,
)
from kbert.serving.optimize import measure_int8_ranges, optimize

pytestmark = pytest.mark.skipif(os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0", reason="oneDNN is off")


def cosine(a, b):
    a, b = np.asarray(a, np.float64).reshape(len(a), -1), np.asarray(b, np.float64).reshape(len(b), -1)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def gelu(x):
    return 0.5 * x * (1.0 + tf.math.erf(x / np.sqrt(2.0)))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("inputs", ["signed", "gelu", "largest", "zero-row"])
def test_int8_matmul_is_the_dequantized_product(graph, inputs):
    """out = x_scale[i] · w_scale[j] · (x_q @ w_q) + bias, as the quantization defines it, with
    each row's own scale: a signed row offset by its largest magnitude t and quantized as
    quint8 over [0, 2t], the offset's product taken out; a GELU's output shifted by
    -GELU_FLOOR, quantized as quint8 over [0, its largest], the shift taken out of the bias.
    In a graph TF's optimizer runs oneDNN's kernels (and its own quantize), eagerly the op's
    registered kernel: both give the formula."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 64)).astype(np.float32)
    if inputs == "gelu":
        x = gelu(tf.constant(x)).numpy()
    w = (rng.normal(size=(64, 48)) * 0.05).astype(np.float32)
    b = (rng.normal(size=48) * 0.05).astype(np.float32)
    if inputs == "largest":  # every product at its largest: nothing may saturate
        x, w = np.abs(x).max() * np.ones_like(x), np.abs(w).max() * np.ones_like(w)
    if inputs == "zero-row":
        x[3] = 0.0
    shift = -GELU_FLOOR if inputs == "gelu" else 0.0
    weights = Int8Kernel.of(w, b, shift)
    w_q, scale = quantize_kernel(w)

    def run(x):
        return int8_matmul(x, weights)

    got = (tf.function(run) if graph else run)(tf.constant(x)).numpy()
    if shift:
        top = np.maximum(x.max(axis=1, keepdims=True) + shift, 1e-12)
        x_q = np.rint((x + shift) * (255 / top))
        formula = top / 255 * scale * (x_q.astype(np.int64) @ w_q.astype(np.int64)) + shifted_bias(b, w_q, scale, shift)
    else:
        t = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-12)
        x_q = np.rint(x * (127.5 / t) + 127.5)
        offset = t * scale * w_q.astype(np.int64).sum(axis=0)
        formula = 2 * t / 255 * scale * (x_q.astype(np.int64) @ w_q.astype(np.int64)) - offset + b
    np.testing.assert_allclose(got, formula, rtol=1e-5, atol=1e-5 * np.abs(formula).max())
    exact = x @ w + b
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 0.03


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("gelu", [None, "exact", "approximate"])
def test_calibrated_int8_matmul_is_the_dequantized_product_on_its_fixed_range(graph, gelu):
    """On a range [low, high] fixed at export: levels = round(x · scale + zero_point), cut to
    [0, 255], with scale = 255 / (high - low) and zero_point = round(-low · scale); then
    out = (levels @ w_q) · w_scale / scale + b - zero_point / scale · w_scale · colsum(w_q),
    and the GELU, erf or tanh form, applied by the kernel. A row past the range is cut to it."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 64)).astype(np.float32)
    x[5] *= 4.0  # past the range
    w = (rng.normal(size=(64, 48)) * 0.05).astype(np.float32)
    b = (rng.normal(size=48) * 0.05).astype(np.float32)
    low, high = -2.5, 3.0
    weights = CalibratedInt8Kernel.of(w, b, low, high, gelu)
    w_q, w_scale = quantize_kernel(w)
    scale, zero_point = 255 / (high - low), np.rint(2.5 * 255 / (high - low))
    assert (weights.input_scale, weights.zero_point) == (pytest.approx(scale), zero_point)

    def run(x):
        return calibrated_int8_matmul(x, weights)

    got = (tf.function(run) if graph else run)(tf.constant(x)).numpy()
    levels = np.clip(np.rint(x * np.float32(scale) + np.float32(zero_point)), 0, 255).astype(np.int64)
    product = (levels @ w_q.astype(np.int64)) * w_scale / scale + b - zero_point / scale * w_scale * w_q.sum(axis=0)
    activations = {
        None: lambda v: v,
        "exact": lambda v: gelu_erf(v),
        "approximate": lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))),
    }
    formula = activations[gelu](product)
    np.testing.assert_allclose(got, formula, rtol=1e-5, atol=1e-5 * np.abs(formula).max())
    inside = np.abs(x).max(axis=1) < 2.5
    exact = activations[gelu](x @ w + b)
    assert np.linalg.norm(got[inside] - exact[inside]) / np.linalg.norm(exact[inside]) < 0.03
    assert not inside[5] and np.linalg.norm(got[5] - exact[5]) / np.linalg.norm(exact[5]) > 0.03


def gelu_erf(x):
    return gelu(tf.constant(x, tf.float64)).numpy()


def test_measured_ranges_are_each_dense_layers_input_range_in_float32():
    """`measure_int8_ranges` runs the model in float32 (on each batch cut to its longest text, as
    the export does) and keeps, for each int8 dense layer, the lowest and highest value its input
    took, widened to hold 0: the pooler's input is the [CLS] row of the float32 sequence output."""
    keras.utils.set_random_seed(0)
    encoder = kbert.bert_encoder(CONFIG)
    rng = np.random.default_rng(1)
    mask = (np.arange(16) < rng.integers(4, 17, size=(6, 1))).astype(np.int32)
    features = {
        "input_ids": (rng.integers(1, 40, size=(6, 16)) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((6, 16), np.int32),
    }
    ranges = measure_int8_ranges(encoder, [features])
    names = ("qkv", "attention_output", "intermediate", "output")
    want = [f"transformer_layer_{i}/{n}" for i in range(CONFIG.num_hidden_layers) for n in names]
    assert sorted(ranges) == sorted([*want, "pooler/pooler"])
    cls = np.asarray(encoder(features, training=False)["sequence_output"])[:, 0]
    np.testing.assert_allclose(ranges["pooler/pooler"], (min(cls.min(), 0), max(cls.max(), 0)), rtol=1e-5)
    low, high = ranges["transformer_layer_0/output"]  # a GELU's output: never below its minimum
    assert GELU_FLOOR < low < 0 < high


def test_weights_are_quantized_to_7_bits_so_no_cpu_saturates_their_products():
    """|w_q| <= 63 with the largest magnitude of each column at exactly ±63 (its scale is that
    magnitude / 63): a u8 input times such a weight, added in pairs, fits an int16."""
    w = np.random.default_rng(2).normal(size=(64, 48)).astype(np.float32)
    w_q, scale = quantize_kernel(w)
    assert np.abs(w_q).max(axis=0).tolist() == [63] * 48
    np.testing.assert_allclose(scale, np.abs(w).max(axis=0) / 63, rtol=1e-6)
    assert 2 * 255 * 63 <= 2**15 - 1


CONFIG = kbert.BertConfig(
    vocab_size=40,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=24,
    type_vocab_size=2,
)


@pytest.mark.parametrize("ranges", ["per-row", "calibrated"])
@pytest.mark.parametrize("task", ["encoder", "classify", "regress", "tag", "choice"])
def test_each_model_kind_in_int8_stays_close_to_its_float32_outputs(task, ranges):
    """Every kind an export serves, rewritten with every encoder matmul in int8, gives nearly the
    float32 model's outputs, its inputs quantized per row or on ranges measured on the same
    texts; the task heads stay float32."""
    keras.utils.set_random_seed(0)
    encoder = kbert.bert_encoder(CONFIG)
    model = {
        "encoder": lambda: encoder,
        "classify": lambda: kbert.bert_classifier(encoder, 3),
        "regress": lambda: kbert.bert_classifier(encoder, 1),
        "tag": lambda: kbert.bert_tagger(encoder, 4),
        "choice": lambda: kbert.bert_multiple_choice(encoder),
    }[task]()
    rng = np.random.default_rng(1)
    shape = (6, 3, 16) if task == "choice" else (6, 16)
    lengths = rng.integers(4, 17, size=shape[:-1])
    mask = (np.arange(16) < lengths[..., None]).astype(np.int32)
    features = {
        "input_ids": (rng.integers(1, 40, size=shape) * mask).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros(shape, np.int32),
    }
    want = model(features, training=False)
    measured = measure_int8_ranges(model, [features]) if ranges == "calibrated" else None
    got = optimize(model, int8=True, int8_ranges=measured)(features)
    for name, value in want.items():
        value, other = np.asarray(value), np.asarray(got[name])
        if value.ndim == mask.ndim + 1:  # per token: the real tokens only
            value, other = value[mask == 1], other[mask == 1]
        if value.shape[-1] == 1:  # a regressor's one score per row
            np.testing.assert_allclose(other, value, atol=0.05 * np.abs(value).max())
        else:
            assert np.median(cosine(other, value)) >= 0.995, name


SERVE = r"""
import json, sys
from collections import Counter
sys.modules["kbert"] = None  # importing it would now fail
import numpy as np
import tensorflow as tf
# TensorFlow 2.21 imports keras itself; anything more must not come from reading the export.
after_tensorflow = set(sys.modules)
from serving_session import ServingSession  # tests/reference: TF Serving's session, its default options

spec = json.load(open(sys.argv[1]))
out = {}
for name, path in spec["exports"].items():
    metadata = tf.compat.v1.RunMetadata()
    result = ServingSession(path).run(
        {"text": spec["texts"]},
        options=tf.compat.v1.RunOptions(output_partition_graphs=True),
        run_metadata=metadata,
    )
    nodes = [n for g in metadata.partition_graphs for n in g.node]
    kernels = Counter(n.op for n in nodes if n.op.endswith("MatMul"))
    fused = Counter(
        "+".join(op.decode() for op in n.attr["fused_ops"].list.s) for n in nodes if n.op == "_QuantizedMatMul"
    )
    out[name] = {
        "kernels": dict(kernels),
        "fused_ops": dict(fused),
        **{k: np.asarray(v).tolist() for k, v in result.items()},
    }
modules = sorted(m for m in set(sys.modules) - after_tensorflow if m.split(".")[0] in ("kbert", "keras", "tf_keras"))
print(json.dumps({"modules": modules, **out}))
"""


@pytest.fixture(scope="module")
def served_int8(tmp_path_factory, tiny_model_dir):
    """The tiny encoder exported in int8 (per row, and calibrated on sample texts) and in
    float32, all run in a fresh process."""
    work = tmp_path_factory.mktemp("int8")
    sample = os.path.join(FIXTURES, "sample_text.txt")
    stderr, printed = {}, {}
    for name, options in (
        ("int8", ["--precision", "int8"]),
        ("int8-calibrated", ["--precision", "int8", "--int8-ranges", "calibrated", "--calibration", sample]),
        ("float32", ["--precision", "float32"]),
    ):
        result = run_kbert("export", tiny_model_dir, work / name, *options)
        printed[name] = json.loads(result.stdout)
        stderr[name] = result.stderr
    with open(sample, encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()][:40]
    spec = {"exports": {name: str(work / name / "1") for name in printed}, "texts": texts}
    return {**run_in_fresh_process(work, SERVE, spec), "export_stderr": stderr, "printed": printed}


@pytest.mark.slow  # two exports: `make test` runs it, `make test-fast` leaves it out
def test_an_int8_export_runs_every_encoder_matmul_as_a_onednn_int8_kernel(served_int8, tiny_model_dir):
    """As TF Serving runs it (a TF1 session on the MetaGraph, in a process without Keras or
    kbert), every dense layer of the encoder is `_QuantizedMatMul`: each layer's Q, K and V as
    one, the attention output, the two feed-forward layers, and the pooler. No float matmul is
    left; the float32 export runs as many float matmuls (oneDNN's, or Eigen's where TensorFlow
    leaves oneDNN off, as it does on CPUs without AVX-512)."""
    layers = kbert.load(tiny_model_dir).config.num_hidden_layers
    assert served_int8["modules"] == []
    float32 = served_int8["float32"]["kernels"]
    dense = [op for op in float32 if op.endswith(("FusedMatMul", "MatMul")) and "Batch" not in op]
    assert sum(float32.pop(op) for op in dense) == 4 * layers + 1
    assert served_int8["printed"]["int8"]["int8_ranges"] == "per-row"
    for name in ("int8", "int8-calibrated"):
        int8 = dict(served_int8[name]["kernels"])
        assert int8.pop("_QuantizedMatMul") == 4 * layers + 1, name
        # What is left is attention's batched matmuls (scores and context), the same in both.
        assert int8 == float32 and all("Batch" in op for op in int8), name
    assert served_int8["int8"]["fused_ops"] == {"BiasAdd+Dequantize": 4 * layers + 1}
    # Calibrated: each layer's first feed-forward matmul applies its GELU in the kernel.
    assert served_int8["int8-calibrated"]["fused_ops"] == {
        "BiasAdd+Dequantize": 3 * layers + 1,
        "BiasAdd+GeluExact+Dequantize": layers,
    }


@pytest.mark.slow
def test_an_int8_export_says_in_one_line_when_this_cpu_lacks_int8_dot_products(served_int8):
    """On a CPU without VNNI or AMX (this one, or not: /proc/cpuinfo decides) the int8 export
    says so in one line, and the float32 export says nothing of it."""
    said = {
        p: [line for line in err.splitlines() if "int8 dot-product" in line]
        for p, err in served_int8["export_stderr"].items()
    }
    assert said["float32"] == []
    if cpu_int8_instructions():
        assert said["int8"] == []
    else:
        assert len(said["int8"]) == 1 and "TF_ENABLE_ONEDNN_OPTS=1" in said["int8"][0]


@pytest.mark.parametrize(
    "flags, found",
    [
        ("fpu avx2 fma avx512f avx512_vnni avx512_bf16", ["avx512_vnni"]),
        ("fpu avx2 fma avx_vnni amx_tile amx_int8", ["avx_vnni", "amx_int8"]),
        ("fpu avx2 fma", []),
    ],
    ids=["avx512-vnni", "avx-vnni-and-amx", "avx2-only"],
)
def test_cpu_int8_instructions_reads_the_flags_line(tmp_path, flags, found):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert cpu_int8_instructions(str(cpuinfo)) == found
    assert cpu_int8_instructions(str(tmp_path / "missing")) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "int8-calibrated"])
def test_an_int8_export_gives_nearly_the_float32_exports_outputs(served_int8, name):
    int8, float32 = served_int8[name], served_int8["float32"]
    assert np.median(cosine(int8["pooled_output"], float32["pooled_output"])) >= 0.995
    mask = np.asarray(float32["input_mask"]) == 1
    tokens = cosine(np.asarray(int8["sequence_output"])[mask], np.asarray(float32["sequence_output"])[mask])
    assert np.median(tokens) >= 0.995


@pytest.mark.slow
def test_a_calibrated_int8_export_reports_its_ranges_and_its_drift(served_int8):
    """The calibrated export says so in its printed result and in its drift report, measured on
    the same calibration texts its ranges were."""
    printed = served_int8["printed"]["int8-calibrated"]
    assert printed["int8_ranges"] == "calibrated"
    assert printed["drift"]["int8_ranges"] == "calibrated" and printed["drift"]["precision"] == "int8"
    assert "int8_ranges" not in served_int8["printed"]["float32"]


def test_int8_is_for_tf_serving_exports_not_tf_hub(tmp_path, tiny_model_dir):
    result = run_kbert(
        "export", tiny_model_dir, tmp_path / "hub", "--format", "tfhub", "--precision", "int8", check=False
    )
    assert_user_error(result, "--format tfhub writes float32")
    assert not (tmp_path / "hub").exists()
