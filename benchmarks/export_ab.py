"""Two kbert exports side by side, as TF Serving runs them, alternating request by request.

One process loads both SavedModels into TF1 sessions (what tensorflow_model_server does) and
sends each the same texts at batch 1, A then B, text by text, so that the host's drift (10-20%
from minute to minute here) falls on both alike. Then, in a fresh process each, the memory and
load time of each export: peak and final RSS of a process that loads it and serves 20 requests.

usage: .venv/bin/python benchmarks/export_ab.py EXPORT_A EXPORT_B [--texts texts.json] [--requests 150] [--batch 1] [--threads 1 1] [--env-b NAME=VALUE ...]
`--env-b NAME=VALUE`: B's server runs with these environment variables (a setting TensorFlow reads
once per process, such as TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1), so A and B each run in a process of
their own, still alternating request by request and timed inside each; A and B may be one export.
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


def serve_on_request(path, intra, inter, requests_file):
    """Run in a child: load `path`, then for each request index read on stdin serve that request and
    answer the milliseconds it took (`--env-b`: each side's process has its own environment)."""
    import tensorflow as tf

    with open(requests_file, encoding="utf-8") as f:
        requests = json.load(f)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra, inter_op_parallelism_threads=inter)
    serve = session_call(path, config)
    print("ready", flush=True)
    for line in sys.stdin:
        request = requests[int(line)]
        start = time.perf_counter()
        serve(request)
        print((time.perf_counter() - start) * 1000, flush=True)


def time_in_children(args, requests, env_b) -> list:
    """Each export served by a child process of its own (B's with `env_b`), alternating request by
    request: the milliseconds of each side's requests, after 20 warm-up requests each."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(requests, f)
    children = []
    for path, extra in zip(args.exports, ({}, env_b)):
        command = [sys.executable, __file__, "--serve", path, *map(str, args.threads), f.name]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra)
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout.readline().strip() == "ready", f"{path} did not load"
        children.append(child)

    def ask(child, index) -> float:
        child.stdin.write(f"{index}\n")
        child.stdin.flush()
        return float(child.stdout.readline())

    for index in range(min(20, len(requests))):  # warm-up
        for child in children:
            ask(child, index)
    times = [[ask(child, index) for child in children] for index in range(len(requests))]
    for child in children:
        child.stdin.close()
        child.wait()
    os.unlink(f.name)
    return [list(side) for side in zip(*times)]


def name_and_value(item: str) -> tuple:
    """`--env-b`'s NAME=VALUE, or argparse's one-line error."""
    name, equals, value = item.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"{item!r} is not NAME=VALUE")
    return name, value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs=2)
    parser.add_argument("--texts")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory and load-time children")
    parser.add_argument("--threads", type=int, nargs=2, default=[0, 0], metavar=("INTRA", "INTER"))
    parser.add_argument(
        "--env-b", nargs="+", type=name_and_value, default=[], metavar="NAME=VALUE", help="B's environment variables"
    )
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    env_b = dict(args.env_b)
    if args.texts:
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
    else:
        texts = [" ".join(["word"] * (8 + (i * 37) % 113)) for i in range(args.requests)]
    wanted = args.requests * args.batch
    texts = (texts * (wanted // len(texts) + 1))[:wanted]
    requests = [texts[i : i + args.batch] for i in range(0, wanted, args.batch)]
    intra, inter = args.threads
    if env_b:
        times = time_in_children(args, requests, env_b)
    else:
        import tensorflow as tf

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
    report = {"threads": {"intra_op": intra, "inter_op": inter}, "env_b": env_b}
    labels = list(args.exports)
    if env_b and labels[0] == labels[1]:
        labels[1] += " with " + " ".join(f"{k}={v}" for k, v in env_b.items())
    for label, path, extra, spent in zip(labels, args.exports, ({}, env_b), times):
        report[label] = dict(
            p50_ms=round(float(np.median(spent)), 1),
            mean_ms=round(float(np.mean(spent)), 1),
            seq_per_s=round(args.batch * 1000 / float(np.mean(spent)), 2),
        )
        if not args.no_memory:
            child = subprocess.run(
                [sys.executable, __file__, "--memory", path],
                capture_output=True,
                text=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra),
                check=True,
            )
            report[label].update(json.loads(child.stdout.strip().splitlines()[-1]))
    a, b = (report[label]["p50_ms"] for label in labels)
    report["b_p50_over_a_p50"] = round(b / a, 3)
    record.emit(report, "export-ab", args.output)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--memory"]:
        memory(sys.argv[2])
    elif sys.argv[1:2] == ["--serve"]:
        serve_on_request(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
