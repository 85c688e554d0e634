"""One int8 dense layer, per call: kbert's int8 matmul against ONNX Runtime's and PyTorch's dynamic int8.

serving_bench.py times whole requests; this times the part where the int8 exports differ most,
one dense layer of the model at a time, to show where kbert's int8 time goes at each row count
(a batch-1 request of a real text is one text's tokens: about 90 rows for the Debian texts):

- "kbert int8": `kbert.serving.int8.int8_matmul` (each row quantized on its own scale, oneDNN's
  `_QuantizedMatMul`, each row rescaled) in a TF1 session, as the int8 export runs it;
- "kbert int8 kernel": `_QuantizedMatMul` alone, on already quantized uint8 rows;
- "kbert int8 calibrated": `calibrated_int8_matmul` (`--int8-ranges calibrated`: the input
  rounded onto a fixed range by element-wise ops, then the kernel);
- "kbert int8 calibrated, QuantizeV2": the same levels made by one `QuantizeV2` op (MIN_FIRST mode
  on the same range, which oneDNN builds run as `_MklQuantizeV2`), then the same kernel;
- "tf float32": `tf.matmul`, what the float32 export runs (Eigen, unless TF_ENABLE_ONEDNN_OPTS=1);
- "onnxruntime int8": a MatMul + Add graph through `onnxruntime.quantization.quantize_dynamic`
  (int8 weights, what serving_bench's ONNX Runtime int8 model runs: `DynamicQuantizeMatMul`);
- "torch int8": `torch.ao.quantization.quantize_dynamic` on `nn.Linear`.

Each graph holds 10 copies of the layer with different weights (identical ones would be merged
by the graph optimizers), run one after another on the same input; a call is the median run
over `--runs`, divided by 10. Each library runs in a fresh process, one after another.

It also reports which oneDNN implementation TensorFlow's int8 kernel runs at each shape and the
layout of its weights (from `ONEDNN_VERBOSE`): a plain layout means oneDNN's GEMM packs the
weights again on every call, which TF's weight cache cannot help (docs/performance.md, "int8
serving on AVX2").

usage: .venv/bin/python benchmarks/int8_matmul_bench.py [--model minilm|base] [--rows 1 8 32 88 256] [--runs 100]
Needs the bench extra and PyTorch, as serving_bench.py does. One JSON object on stdout.
"""

# Only the standard library and numpy at the top: each child imports only the library it times.
import argparse
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np
import record

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COPIES = 10
MODELS = {"minilm": (384, 1536), "base": (768, 3072)}  # hidden, intermediate


def layer_shapes(model: str) -> dict:
    """The encoder's four dense layers, name -> (in, out).

    >>> layer_shapes("minilm")["query, key and value"]
    (384, 1152)
    """
    hidden, intermediate = MODELS[model]
    return {
        "query, key and value": (hidden, 3 * hidden),
        "attention output": (hidden, hidden),
        "feed-forward in": (hidden, intermediate),
        "feed-forward out": (intermediate, hidden),
    }


def weights(n_in: int, n_out: int) -> list:
    """COPIES float32 kernels [in, out], each different."""
    rng = np.random.default_rng(n_in * 7 + n_out)
    base = rng.normal(0.0, 0.05, (n_in, n_out)).astype(np.float32)
    return [base * np.float32(1.0 + 0.01 * i) for i in range(COPIES)]


def per_call_ms(run, runs: int) -> float:
    for _ in range(10):
        run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3 / COPIES


def kernel_alone(x_u8, k):
    """`_QuantizedMatMul` on already quantized uint8 rows, with `int8_matmul`'s fixed ranges (TF graph mode)."""
    import tensorflow as tf

    from serving.int8 import _quantized_matmul

    weight_range = tf.constant(k.weight_range)
    return _quantized_matmul(
        tf.bitcast(x_u8, tf.quint8),
        tf.bitcast(tf.constant(k.kernel), tf.qint8),
        tf.constant(k.kernel_bias),
        tf.constant(0.0),
        tf.constant(255.0),
        weight_range,
        weight_range,
    )


def calibrated_by_quantize_v2(x, k):
    """`calibrated_int8_matmul` with its input quantized by one `QuantizeV2` op: in MIN_FIRST mode it
    makes round(x · scale) + zero_point, cut to [0, 255], for min = -zero_point / scale (the same
    levels as the element-wise ops, ties aside)."""
    import tensorflow as tf

    from serving.int8 import _quantized_matmul

    low = -k.zero_point / k.input_scale
    quantized = tf.raw_ops.QuantizeV2(
        input=x,
        min_range=tf.constant(low),
        max_range=tf.constant(low + 255.0 / k.input_scale),
        T=tf.quint8,
        mode="MIN_FIRST",
        ensure_minimum_range=0.0,
    ).output
    weight_range = tf.constant(k.weight_range)
    return _quantized_matmul(
        quantized,
        tf.bitcast(tf.constant(k.kernel), tf.qint8),
        tf.constant(k.bias),
        tf.constant(0.0),
        tf.constant(255.0 / k.input_scale),
        weight_range,
        weight_range,
    )


def child_tf(shapes, rows_list, runs):
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from serving.int8 import CalibratedInt8Kernel, Int8Kernel, calibrated_int8_matmul, int8_matmul

    out = {}
    for name, (n_in, n_out) in shapes.items():
        kernels = weights(n_in, n_out)
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, n_in])
            x_u8 = tf.compat.v1.placeholder(tf.uint8, [None, n_in])
            made = [Int8Kernel.of(w, np.zeros(n_out, np.float32)) for w in kernels]
            # Each copy's range a little different, so that the graph optimizer merges no quantizing ops.
            calibrated = [
                CalibratedInt8Kernel.of(w, np.zeros(n_out, np.float32), -3.0 - 0.01 * i, 4.0)
                for i, w in enumerate(kernels)
            ]
            fetches = {
                "kbert int8": [int8_matmul(x, k) for k in made],
                "kbert int8 kernel": [kernel_alone(x_u8, k) for k in made],
                "kbert int8 calibrated": [calibrated_int8_matmul(x, k) for k in calibrated],
                "kbert int8 calibrated, QuantizeV2": [calibrated_by_quantize_v2(x, k) for k in calibrated],
                "tf float32": [tf.matmul(x, tf.constant(w)) for w in kernels],
            }
            session = tf.compat.v1.Session(graph=graph)
        rng = np.random.default_rng(0)
        for rows in rows_list:
            feed = {
                x: rng.normal(size=(rows, n_in)).astype(np.float32),
                x_u8: rng.integers(0, 256, (rows, n_in)).astype(np.uint8),
            }
            # The two ways of quantizing give the same levels but where float32 rounding puts a value
            # on the other side of a half (round(x·s + z) against round(x·s) + z): one level, rarely.
            ops_way, quantize_v2 = session.run(
                [fetches["kbert int8 calibrated"], fetches["kbert int8 calibrated, QuantizeV2"]], feed
            )
            differ = np.abs(np.asarray(ops_way) - np.asarray(quantize_v2))
            assert np.mean(differ > 1e-4 * np.abs(ops_way).max()) < 0.01, "QuantizeV2 made other levels"
            for label, fetch in fetches.items():
                out.setdefault(label, {}).setdefault(name, {})[rows] = per_call_ms(
                    functools.partial(session.run, fetch, feed), runs
                )
    return out


def child_onnxruntime(shapes, rows_list, runs):
    import tempfile

    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = {}
    for name, (n_in, n_out) in shapes.items():
        kernels = weights(n_in, n_out)
        nodes, outputs = [], []
        initializers = [numpy_helper.from_array(np.zeros(n_out, np.float32), "bias")]
        for i, w in enumerate(kernels):
            initializers.append(numpy_helper.from_array(w, f"w{i}"))
            nodes += [
                helper.make_node("MatMul", ["x", f"w{i}"], [f"product{i}"]),
                helper.make_node("Add", [f"product{i}", "bias"], [f"y{i}"]),
            ]
            outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [None, n_out]))
        graph = helper.make_graph(
            nodes,
            "layers",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n_in])],
            outputs,
            initializers,
        )
        with tempfile.TemporaryDirectory() as tmp:
            plain, int8 = os.path.join(tmp, "float32.onnx"), os.path.join(tmp, "int8.onnx")
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), plain)
            quantize_dynamic(plain, int8, weight_type=QuantType.QInt8)
            session = onnxruntime.InferenceSession(int8, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        for rows in rows_list:
            feed = {"x": rng.normal(size=(rows, n_in)).astype(np.float32)}
            out.setdefault("onnxruntime int8", {}).setdefault(name, {})[rows] = per_call_ms(
                functools.partial(session.run, None, feed), runs
            )
    return out


def child_torch(shapes, rows_list, runs):
    import torch

    out = {}
    for name, (n_in, n_out) in shapes.items():
        layers = []
        for w in weights(n_in, n_out):
            linear = torch.nn.Linear(n_in, n_out)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(w.T.copy()))
                linear.bias.zero_()
            layers.append(torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}))
        rng = np.random.default_rng(0)
        for rows in rows_list:
            x = torch.from_numpy(rng.normal(size=(rows, n_in)).astype(np.float32))

            def run(layers=layers, x=x):
                with torch.inference_mode():
                    for layer in layers:
                        layer(x)

            out.setdefault("torch int8", {}).setdefault(name, {})[rows] = per_call_ms(run, runs)
    return out


def child_onednn(shapes, rows_list, runs):
    """Which oneDNN implementation and weight layout the int8 kernel runs, per shape (run with ONEDNN_VERBOSE=1)."""
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from serving.int8 import Int8Kernel

    for n_in, n_out in shapes.values():
        k = Int8Kernel.of(weights(n_in, n_out)[0], np.zeros(n_out, np.float32))
        graph = tf.Graph()
        with graph.as_default():
            x_u8 = tf.compat.v1.placeholder(tf.uint8, [None, n_in])
            y = kernel_alone(x_u8, k)
            session = tf.compat.v1.Session(graph=graph)
        for rows in rows_list:
            session.run(y, {x_u8: np.zeros((rows, n_in), np.uint8)})
    return {}


def implementations(stderr: str) -> list:
    """oneDNN's verbose lines -> the distinct (implementation, weight layout) of its int8 inner products.

    >>> implementations("onednn_verbose,v1,primitive,exec,cpu,inner_product,x64:gemm_s8u8s32:jit,"
    ...     "forward_inference,src:u8::blocked:ab::f0 wei:s8:a:blocked:ba::f0 bia:f32:a:blocked:a::f0,,,mb5ic384oc1152,0.2")
    [['x64:gemm_s8u8s32:jit', 'ba']]
    """
    found = []
    for line in stderr.splitlines():
        fields = line.split(",")
        if len(fields) < 10 or fields[2:6] != ["primitive", "exec", "cpu", "inner_product"]:
            continue
        layout = next((part.split(":")[4] for part in fields[8].split() if part.startswith("wei:")), "?")
        if [fields[6], layout] not in found:
            found.append([fields[6], layout])
    return found


def spawn(kind, args, verbose=False):
    code = (
        f"import json, sys; sys.path.insert(0, {HERE!r}); import int8_matmul_bench as b; "
        f"print(json.dumps(b.child_{kind}(b.layer_shapes({args.model!r}), {args.rows!r}, {args.runs})))"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if verbose:
        env["ONEDNN_VERBOSE"] = "1"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"{kind}: failed: {tail}", file=sys.stderr)
        return {"error": tail}, ""
    print(f"{kind}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout + done.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="minilm")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 88, 256])
    parser.add_argument("--runs", type=int, default=100, help="timed runs of the 10 layers")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    per_call = {}
    for kind in ("tf", "onnxruntime", "torch"):
        result, _ = spawn(kind, args)
        if "error" in result:
            per_call[kind] = result
        else:
            per_call.update(result)
    _, verbose = spawn("onednn", args, verbose=True)
    shapes = layer_shapes(args.model)
    timed = {label: result for label, result in per_call.items() if "error" not in result}
    int8_peers = [label for label in ("onnxruntime int8", "torch int8") if label in timed]
    ratios = {}  # the fastest int8 peer's time / kbert int8's: above 1.0, kbert is faster
    for name in shapes:
        for rows in args.rows:
            key = str(rows)
            if "kbert int8" in timed and int8_peers:
                best = min(timed[peer][name][key] for peer in int8_peers)
                ratios.setdefault(name, {})[key] = round(best / timed["kbert int8"][name][key], 3)
    report = {
        "model": args.model,
        "shapes": {name: list(shape) for name, shape in shapes.items()},
        "rows": args.rows,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_flags": record.cpu_flags(),
            "tf_enable_onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        },
        "ms_per_call": per_call,
        "gops": {
            label: {
                name: {
                    key: round(2 * int(key) * shapes[name][0] * shapes[name][1] / ms / 1e6, 1)
                    for key, ms in by_rows.items()
                }
                for name, by_rows in result.items()
            }
            for label, result in timed.items()
        },
        "best_int8_peer_time_over_kbert_int8": ratios,
        "onednn_int8_implementations": implementations(verbose),
    }
    onednn = "-onednn" if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1" else ""
    record.emit(report, f"int8-matmul-{args.model}{onednn}", args.output)


if __name__ == "__main__":
    main()
