"""Two kbert exports side by side, as TF Serving runs them, alternating request by request.

One process loads both SavedModels into TF1 sessions (what tensorflow_model_server does) and
sends each the same texts at batch 1, A then B, text by text, so that the host's drift (10-20%
from minute to minute here) falls on both alike. Then, in a fresh process each, the memory and
load time of each export: peak and final RSS of a process that loads it and serves 20 requests.

usage: .venv/bin/python benchmarks/export_ab.py EXPORT_A EXPORT_B [--texts texts.json] [--requests 150] [--batch 1] [--threads 1 1]
`--threads INTRA INTER`: both sessions' thread pools, as tensorflow_model_server's
--tensorflow_intra_op_parallelism and --tensorflow_inter_op_parallelism set them (default 0 0: a thread per core).
`--batch N`: each request N consecutive texts (p50 and sequences/s reported). `--texts`: a JSON list of strings (serving_bench.py --work DIR writes DIR/texts.json, the Debian
descriptions); default: sentences of 8 to 120 words. One JSON object on stdout.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import record

# tests/reference/serving_session.py: an export in a TF1 session, as TF Serving runs it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "reference"))
from serving_session import session_call


def memory(path):
    """Run in a child: load `path`, serve 20 requests, report RSS and the time to the first answer."""
    start = time.perf_counter()
    serve = session_call(path)
    serve(["hello world"])
    first = time.perf_counter() - start
    for n in range(20):
        serve(["hello world " * (n * 5)] * (1 + n % 3))
    # /proc's VmHWM, not getrusage's ru_maxrss, which a child inherits from its parent's peak.
    status = {
        line.split(":")[0]: int(line.split()[1]) // 1024
        for line in open("/proc/self/status")
        if line.startswith(("VmRSS", "VmHWM"))
    }
    print(
        json.dumps(
            {
                "load_and_first_answer_s": round(first, 1),
                "final_rss_mib": status["VmRSS"],
                "peak_rss_mib": status["VmHWM"],
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs=2)
    parser.add_argument("--texts")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory and load-time children")
    parser.add_argument("--threads", type=int, nargs=2, default=[0, 0], metavar=("INTRA", "INTER"))
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    if args.texts:
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
    else:
        texts = [" ".join(["word"] * (8 + (i * 37) % 113)) for i in range(args.requests)]
    wanted = args.requests * args.batch
    texts = (texts * (wanted // len(texts) + 1))[:wanted]
    requests = [texts[i : i + args.batch] for i in range(0, wanted, args.batch)]
    import tensorflow as tf

    intra, inter = args.threads
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra, inter_op_parallelism_threads=inter)
    serves = [session_call(path, config) for path in args.exports]
    for serve in serves:  # warm-up
        for request in requests[:20]:
            serve(request)
    times = [[], []]
    for request in requests:
        for serve, spent in zip(serves, times):
            start = time.perf_counter()
            serve(request)
            spent.append((time.perf_counter() - start) * 1000)
    report = {"threads": {"intra_op": intra, "inter_op": inter}}
    for path, spent in zip(args.exports, times):
        report[path] = dict(
            p50_ms=round(float(np.median(spent)), 1),
            mean_ms=round(float(np.mean(spent)), 1),
            seq_per_s=round(args.batch * 1000 / float(np.mean(spent)), 2),
        )
        if not args.no_memory:
            child = subprocess.run(
                [sys.executable, __file__, "--memory", path],
                capture_output=True,
                text=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                check=True,
            )
            report[path].update(json.loads(child.stdout.strip().splitlines()[-1]))
    a, b = (report[p]["p50_ms"] for p in args.exports)
    report["b_p50_over_a_p50"] = round(b / a, 3)
    record.emit(report, "export-ab", args.output)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--memory"]:
        memory(sys.argv[2])
    else:
        main()
