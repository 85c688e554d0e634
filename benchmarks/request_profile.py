"""Where a batch-1 request spends its time: a kbert export as TF Serving runs it, or an ONNX
Runtime model as its CPU users run it, by kind of work, by op type, and the int8 kernels' rate.

kbert (EXPORT_VERSION_DIR): a TF1 session on the export's MetaGraph (what tensorflow_model_server
runs), warmed on `--warmup` texts, then each of `--requests` texts traced alone (FULL_TRACE). Op
time is the sum of every node's own time: with 2 cores it can pass the request's wall time, and
tracing slows each node, so the untraced p50 is reported beside it. `--threads INTRA INTER` sets
the session's thread pools, as `tensorflow_model_server --tensorflow_intra_op_parallelism=INTRA
--tensorflow_inter_op_parallelism=INTER` does (default 0 0: one thread per core each).

ONNX Runtime (`--onnx MODEL.onnx`, serving_bench.py's models): the fast tokenizer, then the
session with ONNX Runtime's profiler on; op time from its node events, the tokenizer timed apart.

The kinds (`kind_of`): the tokenizer (and packing), int8 matmul kernels, quantize/dequantize ops,
float matmuls, attention (batched products, softmax, transposes), element-wise ops (LayerNorm,
GELU, residual adds, casts) and everything else (embedding gathers, control flow, copies, the
executor's own nodes). `int8_gops` is the int8 kernels' rate (2 ops per multiply-add, from their
shapes), set against `int8_peak_gops`: oneDNN's int8 matmul on a 2048^3 product, measured in
the same run (serving_bench.py's peak).

usage: .venv/bin/python benchmarks/request_profile.py EXPORT_VERSION_DIR [--texts texts.json] [--requests 100] [--top 25] [--threads 1 1]
       .venv/bin/python benchmarks/request_profile.py --onnx MODEL.onnx --texts texts.json [--requests 100]
`--texts`: a JSON list of strings (serving_bench.py --work DIR writes DIR/texts.json, the Debian
descriptions); default: sentences of 8 to 120 words. One JSON object on stdout.
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np
import record

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB = os.path.join(ROOT, "tests", "fixtures", "vocab-uncased.txt")
KINDS = (
    "tokenizer",
    "int8 matmul kernels",
    "quantize/dequantize",
    "float matmuls",
    "attention",
    "element-wise",
    "everything else",
)
ELEMENT_WISE = {
    "Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "Erf", "Tanh", "Square", "Rsqrt", "Sqrt",
    "Mean", "Max", "Maximum", "Minimum", "Abs", "Round", "Cast", "Bitcast", "Neg", "Exp", "AddN",
    "SquaredDifference", "Sum", "Pow", "_MklLayerNorm", "FusedBatchNormV3", "_FusedBatchNormEx",
    "_MklFusedBatchNormV3", "LayerNormalization", "SkipLayerNormalization", "BiasGelu", "Gelu",
    "FastGelu", "Relu", "Where",
}  # fmt: skip


def part_of(node_name: str) -> str:
    """Which part of a kbert export a node belongs to, by the name kbert's export gives its scope.

    >>> part_of("StatefulPartitionedCall/preprocessor/WordpieceTokenizeWithOffsets")
    'tokenizer and packing'
    """
    if "preprocessor" in node_name or "tokenizer" in node_name:
        return "tokenizer and packing"
    if any(word in node_name for word in ("transformer_layer", "embeddings", "pooler", "int8")):
        return "model"
    return "grouping loop and the rest"


def kind_of(node_name: str, op: str) -> str:
    """Which of KINDS a node's time counts as, by its name (kbert's scopes) and op type. ONNX
    Runtime's quantized attention (`QAttention`) holds its int8 Q/K/V product, and counts as
    attention.

    >>> kind_of("m/transformer_layer_0/int8_quantize/Round", "Round")
    'quantize/dequantize'
    >>> kind_of("m/transformer_layer_0/Softmax", "_MklSoftmax"), kind_of("m/x", "_MklFusedMatMul")
    ('attention', 'float matmuls')
    >>> kind_of("m/transformer_layer_0/Erf", "Erf"), kind_of("m/while/Enter", "Enter")
    ('element-wise', 'everything else')
    """
    if part_of(node_name) == "tokenizer and packing":
        return "tokenizer"
    if op in ("_QuantizedMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"):
        return "int8 matmul kernels"
    if "int8_quantize" in node_name or "int8_dequantize" in node_name or op in ("DynamicQuantizeLinear",):
        return "quantize/dequantize"
    if any(word in op for word in ("BatchMatMul", "Softmax", "Transpose", "Attention")):
        return "attention"
    if "MatMul" in op or op == "Gemm":
        return "float matmuls"
    if op in ELEMENT_WISE or op.startswith("_MklFused") and "MatMul" not in op:
        return "element-wise"
    return "everything else"


def layer_flops(kernels: list) -> float:
    """Multiply-adds × 2 of one scope's int8 kernels, [(node name, rows, out columns)], in the
    encoder's order (Q/K/V, attention output, feed-forward in, feed-forward out; or the pooler
    alone): each takes the previous one's width, the first two the attention output's.

    >>> layer_flops([("l/int8_matmul", 8, 1152), ("l/int8_matmul_1", 8, 384),
    ...              ("l/int8_matmul_2", 8, 1536), ("l/int8_matmul_3", 8, 384)]) == 2 * 8 * 384 * (1152 + 384 + 1536 + 1536)
    True
    """
    kernels = sorted(kernels, key=lambda k: int(k[0].rsplit("_", 1)[1]) if k[0][-1].isdigit() else 0)
    width = kernels[min(1, len(kernels) - 1)][2]
    flops = 0.0
    for i, (_, rows, out) in enumerate(kernels):
        flops += 2.0 * rows * (width if i < 2 else kernels[i - 1][2]) * out
    return flops


def summary(kinds, kind_nodes, ops, op_nodes, n, top) -> dict:
    total = sum(kinds.values())
    return {
        "op_ms_per_request": round(total / n / 1000, 2),
        "kinds": {
            kind: {
                "ms": round(kinds[kind] / n / 1000, 3),
                "share": round(kinds[kind] / total, 3),
                "nodes": kind_nodes[kind] // n,
            }
            for kind in KINDS
        },
        "ops": {
            op: {"ms": round(us / n / 1000, 3), "share": round(us / total, 3), "nodes": op_nodes[op] // n}
            for op, us in ops.most_common(top)
        },
    }


def profile_kbert(args, texts) -> dict:
    import tensorflow as tf

    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    from serving_bench import child_peak

    import serving_session  # an export in a TF1 session, as TF Serving runs it

    intra, inter = args.threads
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra, inter_op_parallelism_threads=inter)
    session, fetches, feed = serving_session.load(args.export, config)
    warm, timed = texts[: args.warmup], texts[args.warmup : args.warmup + args.requests]
    for text in warm:
        session.run(fetches, {feed: [text]})
    untraced = []
    for text in timed:
        start = time.perf_counter()
        session.run(fetches, {feed: [text]})
        untraced.append(time.perf_counter() - start)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    parts, part_nodes = collections.Counter(), collections.Counter()
    kinds, kind_nodes = collections.Counter(), collections.Counter()
    ops, op_nodes = collections.Counter(), collections.Counter()
    int8_us, int8_flops = 0, 0.0
    for text in timed:
        metadata = tf.compat.v1.RunMetadata()
        session.run(fetches, {feed: [text]}, options=options, run_metadata=metadata)
        scopes = collections.defaultdict(list)
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                label = node.timeline_label
                op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else "?"
                us = node.all_end_rel_micros
                parts[part_of(node.node_name)] += us
                part_nodes[part_of(node.node_name)] += 1
                kind = kind_of(node.node_name, op)
                kinds[kind] += us
                kind_nodes[kind] += 1
                ops[op] += us
                op_nodes[op] += 1
                if op == "_QuantizedMatMul":
                    rows, out = (d.size for d in node.output[0].tensor_description.shape.dim)
                    scopes[node.node_name.rsplit("/", 1)[0]].append((node.node_name, rows, out))
                    int8_us += us
        int8_flops += sum(layer_flops(kernels) for kernels in scopes.values())
    n = len(timed)
    report = {
        "export": args.export,
        "threads": {"intra_op": intra, "inter_op": inter},
        "requests": n,
        "untraced_p50_ms": round(float(np.median(untraced)) * 1000, 2),
        "parts": {
            part: {
                "ms": round(us / n / 1000, 2),
                "share": round(us / sum(parts.values()), 3),
                "nodes": part_nodes[part] // n,
            }
            for part, us in parts.most_common()
        },
    }
    report.update(summary(kinds, kind_nodes, ops, op_nodes, n, args.top))
    if int8_us:
        peak = child_peak(None, None, None)["int8"]
        report["int8_gops"] = round(int8_flops / (int8_us * 1e-6) / 1e9, 1)
        report["int8_peak_gops"] = round(peak, 1)
        report["int8_of_peak"] = round(report["int8_gops"] / peak, 3)
    return report


def profile_onnx(args, texts) -> dict:
    import onnxruntime
    import transformers

    tokenizer = transformers.BertTokenizerFast(VOCAB, do_lower_case=True)
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = onnxruntime.InferenceSession(args.onnx, options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    warm, timed = texts[: args.warmup], texts[args.warmup : args.warmup + args.requests]

    def tokenize(text):
        x = tokenizer([text], max_length=128, truncation=True, padding=True, return_tensors="np")
        return {k: v.astype("int64") for k, v in x.items() if k in wanted}

    for text in warm:
        session.run(None, tokenize(text))
    tokenizer_us, wall = 0.0, []
    for text in timed:
        start = time.perf_counter()
        feed = tokenize(text)
        tokenized = time.perf_counter()
        session.run(None, feed)
        wall.append(time.perf_counter() - start)
        tokenizer_us += (tokenized - start) * 1e6
    with open(session.end_profiling()) as f:
        events = json.load(f)
    # The profile holds every run, warm-up included: keep the last len(timed) runs' nodes.
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first = runs[-len(timed)]["ts"]
    kinds, kind_nodes = collections.Counter(), collections.Counter()
    ops, op_nodes = collections.Counter(), collections.Counter()
    kinds["tokenizer"] = tokenizer_us
    kind_nodes["tokenizer"] = len(timed)
    int8_us, int8_flops = 0.0, 0.0
    for event in events:
        if event.get("cat") != "Node" or event["ts"] < first or not event["name"].endswith("_kernel_time"):
            continue
        op = event["args"]["op_name"]
        kind = kind_of(event["name"], op)
        kinds[kind] += event["dur"]
        kind_nodes[kind] += 1
        ops[op] += event["dur"]
        op_nodes[op] += 1
        if op in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"):
            # Weights are initializers, without a shape here: [rows..., in] in, [rows..., out] out.
            x = list(event["args"]["input_type_shape"][0].values())[0]
            y = list(event["args"]["output_type_shape"][0].values())[0]
            int8_flops += 2.0 * float(np.prod(x)) * y[-1]
            int8_us += event["dur"]
    report = {"onnx": args.onnx, "requests": len(timed), "p50_ms": round(float(np.median(wall)) * 1000, 2)}
    report.update(summary(kinds, kind_nodes, ops, op_nodes, len(timed), args.top))
    if int8_us:
        report["int8_gops"] = round(int8_flops / (int8_us * 1e-6) / 1e9, 1)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", nargs="?", help="a kbert export's version directory (EXPORT_BASE/N)")
    parser.add_argument("--onnx", help="profile this ONNX model in ONNX Runtime instead")
    parser.add_argument("--texts")
    parser.add_argument("--requests", type=int, default=100, help="traced batch-1 requests")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--top", type=int, default=25, help="op types listed")
    parser.add_argument("--threads", type=int, nargs=2, default=[0, 0], metavar=("INTRA", "INTER"))
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    if bool(args.export) == bool(args.onnx):
        parser.error("give an export's version directory or --onnx MODEL.onnx, one of the two")
    if args.texts:
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
    else:
        texts = [" ".join(["words"] * (8 + (n * 7) % 113)) for n in range(args.warmup + args.requests)]
    report = profile_onnx(args, texts) if args.onnx else profile_kbert(args, texts)
    record.emit(report, "request-profile", args.output)


if __name__ == "__main__":
    main()
