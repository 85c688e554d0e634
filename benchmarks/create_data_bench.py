"""Pretraining-data throughput: google-research/bert's create_pretraining_data.py vs kbert create-data.

Runs, one after the other on the same corpus and flags, each as its own command line:
  original  `python -m bert.create_pretraining_data` (PyPI bert-tensorflow 1.0.4, unmodified;
            it runs on TF 2.21 through tensorflow.compat.v1 as it is)
  kbert     `kbert create-data --workers N` (the local default)
  beam      `kbert create-data --runner DirectRunner --pipeline-options "--direct_num_workers=N
            --direct_running_mode=multi_processing"` (Beam's own runner, N worker processes)
Both times are wall-clock seconds of the whole command, TensorFlow's start-up included, and
instances/s is records written / those seconds. Peak memory: the original's is its process's
ru_maxrss (from wait4); kbert's is what it reports, its own peak plus each worker's. Then the
statistics of both outputs (kbert.pretraining.record_statistics.compute_statistics) side by side.

Run from the repository root:
    .venv/bin/python benchmarks/create_data_bench.py [--corpus /tmp/debian.txt]
        [--dupe-factor 10] [--workers 2] [--max-docs N] [--files N] [--keep DIR]
The default corpus is built by scripts/debian_corpus.py. --max-docs takes only the
first N documents (for a quick run, or if the original does not fit in memory; the output
says so). Progress goes to stderr, one JSON object to stdout.
"""

# The parent imports nothing heavy until both commands have run: on Linux a child's ru_maxrss
# starts from the RSS of the process it was forked from.
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "fixtures", "vocab-uncased.txt")
BIN = os.path.dirname(sys.executable)
FLAGS = dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15, short_seq_prob=0.1, seed=12345)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def machine_info():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cores_usable": len(os.sched_getaffinity(0)),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
    }


def first_documents(corpus, max_docs, out_path):
    """Copy the first `max_docs` blank-line-separated documents of `corpus` to `out_path`."""
    documents, in_document = 0, False
    with open(corpus, "rb") as src, open(out_path, "wb") as dst:
        for line in src:
            if line.strip():
                in_document = True
            elif in_document:
                documents += 1
                in_document = False
                if documents >= max_docs:
                    break
            dst.write(line)
    return out_path


def split_documents(corpus, parts, work):
    """`corpus` cut into `parts` files of whole documents (at blank lines), each ending with one."""
    with open(corpus, "rb") as f:
        documents = [d for d in f.read().split(b"\n\n") if d.strip()]
    paths, size = [], -(-len(documents) // parts)
    for i in range(parts):
        paths.append(os.path.join(work, f"corpus-part{i}.txt"))
        with open(paths[-1], "wb") as f:
            f.write(b"\n\n".join(documents[i * size : (i + 1) * size]) + b"\n\n")
    return paths


def run_timed(command, log_path):
    """(wall seconds, peak RSS MiB of the process itself, stdout text) of one command."""
    log("$ " + " ".join(command))
    with open(log_path, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        sys.exit(f"{command[0]} failed:\n{tail}")
    return seconds, usage.ru_maxrss / 1024, out.decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="/tmp/debian.txt")
    parser.add_argument("--dupe-factor", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-docs", type=int, default=None, help="use only the first N documents of the corpus")
    parser.add_argument(
        "--files",
        type=int,
        default=1,
        help="split the corpus into this many files of whole documents, given to every command",
    )
    parser.add_argument("--keep", help="write outputs and logs to this directory and keep them")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    if not os.path.isfile(args.corpus):
        sys.exit(f"{args.corpus}: no such corpus; build it with python scripts/debian_corpus.py {args.corpus}")
    work = args.keep or tempfile.mkdtemp(prefix="create_data_bench-")
    os.makedirs(work, exist_ok=True)
    corpus = os.path.abspath(args.corpus)
    if args.max_docs:
        corpus = first_documents(corpus, args.max_docs, os.path.join(work, "corpus.txt"))
    inputs = split_documents(corpus, args.files, work) if args.files > 1 else [corpus]
    info = machine_info()
    log(
        f"corpus {corpus} in {len(inputs)} file(s) ({os.path.getsize(corpus) / 2**20:.1f} MiB), dupe_factor "
        f"{args.dupe_factor}, kbert workers {args.workers}; outputs in {work}"
    )

    original_out = os.path.join(work, "original.tfrecord")
    seconds, peak, _ = run_timed(
        [
            sys.executable,
            "-m",
            "bert.create_pretraining_data",
            f"--input_file={','.join(inputs)}",
            f"--output_file={original_out}",
            f"--vocab_file={VOCAB}",
            "--do_lower_case=True",
            f"--max_seq_length={FLAGS['max_seq_length']}",
            f"--max_predictions_per_seq={FLAGS['max_predictions_per_seq']}",
            f"--masked_lm_prob={FLAGS['masked_lm_prob']}",
            f"--short_seq_prob={FLAGS['short_seq_prob']}",
            f"--random_seed={FLAGS['seed']}",
            f"--dupe_factor={args.dupe_factor}",
        ],
        os.path.join(work, "original.log"),
    )
    original = {"seconds": round(seconds, 2), "peak_rss_mib": round(peak, 1)}
    log(f"original: {seconds:.1f} s, peak {peak:.0f} MiB")

    kbert_out = os.path.join(work, "kbert.tfrecord")
    seconds, peak_main, stdout = run_timed(
        [
            os.path.join(BIN, "kbert"),
            "create-data",
            "--input",
            *inputs,
            "--vocab",
            VOCAB,
            "--output",
            kbert_out,
            "--overwrite",
            "--workers",
            str(args.workers),
            "--dupe-factor",
            str(args.dupe_factor),
            "--max-seq-length",
            str(FLAGS["max_seq_length"]),
            "--max-predictions-per-seq",
            str(FLAGS["max_predictions_per_seq"]),
            "--masked-lm-prob",
            str(FLAGS["masked_lm_prob"]),
            "--short-seq-prob",
            str(FLAGS["short_seq_prob"]),
            "--seed",
            str(FLAGS["seed"]),
        ],
        os.path.join(work, "kbert.log"),
    )
    report = json.loads(stdout)
    kbert = {
        "seconds": round(seconds, 2),
        "seconds_reported": report["seconds"],
        "peak_rss_mib": report["peak_rss_mib"],
        "peak_rss_mib_main": report["peak_rss_mib_main"],
        "peak_rss_mib_largest_worker": report["peak_rss_mib_largest_worker"],
        "chunks": report["chunks"],
        "workers": report["workers"],
    }
    log(f"kbert: {seconds:.1f} s, peak {report['peak_rss_mib']:.0f} MiB (main + workers)")

    beam_out = os.path.join(work, "beam.tfrecord")
    seconds, peak_main, stdout = run_timed(
        [
            os.path.join(BIN, "kbert"),
            "create-data",
            "--input",
            *inputs,
            "--vocab",
            VOCAB,
            "--output",
            beam_out,
            "--overwrite",
            "--runner",
            "DirectRunner",
            "--pipeline-options",
            f"--direct_num_workers={args.workers} --direct_running_mode=multi_processing",
            "--dupe-factor",
            str(args.dupe_factor),
            "--max-seq-length",
            str(FLAGS["max_seq_length"]),
            "--max-predictions-per-seq",
            str(FLAGS["max_predictions_per_seq"]),
            "--masked-lm-prob",
            str(FLAGS["masked_lm_prob"]),
            "--short-seq-prob",
            str(FLAGS["short_seq_prob"]),
            "--seed",
            str(FLAGS["seed"]),
        ],
        os.path.join(work, "beam.log"),
    )
    report = json.loads(stdout)
    beam = {
        "seconds": round(seconds, 2),
        "seconds_reported": report["seconds"],
        "peak_rss_mib_main": round(peak_main, 1),
        "peak_rss_mib_largest_worker": report["peak_rss_mib_largest_worker"],
        "chunks": report["chunks"],
        "workers": args.workers,
    }
    log(f"beam: {seconds:.1f} s, largest worker peak {report['peak_rss_mib_largest_worker']:.0f} MiB")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, ROOT)
    import tensorflow as tf

    from kbert.pretraining.record_statistics import compute_statistics

    def records(path):
        return sorted(r.numpy() for r in tf.data.TFRecordDataset([path]))

    same_records = records(kbert_out) == records(beam_out)
    log(f"beam wrote the local path's records, as a set: {same_records}")

    stats = {
        "original": compute_statistics([original_out], VOCAB),
        "kbert": compute_statistics([kbert_out], VOCAB),
        "beam": compute_statistics([beam_out], VOCAB),
    }
    for name, result in (("original", original), ("kbert", kbert), ("beam", beam)):
        result["instances"] = stats[name]["instances"]
        result["instances_per_second"] = round(result["instances"] / result["seconds"], 1)
    record.emit(
        {
            "machine": info,
            "corpus": corpus,
            "corpus_mib": round(os.path.getsize(corpus) / 2**20, 2),
            "max_docs": args.max_docs,
            "files": len(inputs),
            "dupe_factor": args.dupe_factor,
            "flags": FLAGS,
            "original": original,
            "kbert": kbert,
            "beam": beam,
            "speedup_instances_per_second": round(kbert["instances_per_second"] / original["instances_per_second"], 2),
            "beam_speedup_instances_per_second": round(
                beam["instances_per_second"] / original["instances_per_second"], 2
            ),
            "beam_over_local_seconds": round(beam["seconds"] / kbert["seconds"], 2),
            "beam_records_equal_local_records": same_records,
            "statistics": {key: {name: round(stats[name][key], 5) for name in stats} for key in stats["original"]},
            "note": (
                "wall-clock seconds of each whole command, TensorFlow start-up included; kbert's "
                "random-next segments come from its chunk, the original's from the whole corpus"
                + (f"; only the first {args.max_docs} documents" if args.max_docs else "")
            ),
        },
        "create-data",
        args.output,
        indent=2,
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
