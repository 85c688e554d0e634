"""Where a kbert export's batch-1 request spends its time, as TF Serving runs it: op time by part
(the model, the tokenizer and packing, the rest) and by op type, from TF's step stats.

A TF1 session on the export's MetaGraph (what tensorflow_model_server runs), warmed on `--warmup` texts,
then each of `--requests` texts traced alone (FULL_TRACE). Op time is the sum of every node's
own time: with 2 cores it can pass the request's wall time. Tracing slows each node, so the
untraced p50 is reported beside it.

usage: .venv/bin/python benchmarks/request_profile.py EXPORT_VERSION_DIR [--texts texts.json] [--requests 100] [--top 25]
`--texts`: a JSON list of strings (serving_bench.py --work DIR writes DIR/texts.json, the Debian
descriptions); default: sentences of 8 to 120 words. One JSON object on stdout.
"""

import argparse
import collections
import json
import os
import sys
import time

import numpy as np
import record
import tensorflow as tf

# tests/reference/serving_session.py: an export in a TF1 session, as TF Serving runs it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "reference"))
import serving_session


def part_of(node_name: str) -> str:
    """Which part of the export a node belongs to, by the name kbert's export gives its scope."""
    if "preprocessor" in node_name or "tokenizer" in node_name:
        return "tokenizer and packing"
    if any(word in node_name for word in ("transformer_layer", "embeddings", "pooler", "int8")):
        return "model"
    return "grouping loop and the rest"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="a kbert export's version directory (EXPORT_BASE/N)")
    parser.add_argument("--texts")
    parser.add_argument("--requests", type=int, default=100, help="traced batch-1 requests")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--top", type=int, default=25, help="op types listed")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    if args.texts:
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
    else:
        texts = [" ".join(["words"] * (8 + (n * 7) % 113)) for n in range(args.warmup + args.requests)]
    session, fetches, feed = serving_session.load(args.export)
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
    ops, op_nodes = collections.Counter(), collections.Counter()
    for text in timed:
        metadata = tf.compat.v1.RunMetadata()
        session.run(fetches, {feed: [text]}, options=options, run_metadata=metadata)
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                label = node.timeline_label
                op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else "?"
                part = part_of(node.node_name)
                parts[part] += node.all_end_rel_micros
                part_nodes[part] += 1
                ops[op] += node.all_end_rel_micros
                op_nodes[op] += 1
    n, total = len(timed), sum(parts.values())
    record.emit(
        {
            "export": args.export,
            "requests": n,
            "untraced_p50_ms": round(float(np.median(untraced)) * 1000, 2),
            "op_ms_per_request": round(total / n / 1000, 2),
            "parts": {
                part: {"ms": round(us / n / 1000, 2), "share": round(us / total, 3), "nodes": part_nodes[part] // n}
                for part, us in parts.most_common()
            },
            "ops": {
                op: {"ms": round(us / n / 1000, 3), "share": round(us / total, 3), "nodes": op_nodes[op] // n}
                for op, us in ops.most_common(args.top)
            },
        },
        "request-profile",
        args.output,
    )


if __name__ == "__main__":
    main()
