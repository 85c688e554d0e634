"""Tokenizer throughput (tokens/s) on the same text, and agreement with the original.

Compares, one timed pass each over the same lines:
  original     google-research/bert's `tokenization.FullTokenizer` (PyPI `bert-tensorflow`)
  kbert        `kbert.Tokenizer`, one line at a time (its per-word cache fills during the pass)
  kbert_graph  `kbert.GraphTokenizer` in a tf.function, batches of 1024 lines
  hf           Hugging Face `tokenizers`' BertWordPieceTokenizer.encode_batch, batches of 1024
               (skipped with a note if `tokenizers` is not installed: `pip install .[bench]`)

Every tokenizer object is created fresh, so caches start cold. Only the graph tokenizer gets a
warm-up call (tf.function tracing is a one-off cost, not throughput). For each tokenizer the
report gives its token count, seconds, tokens/s, `ratio_vs_original` (its tokens/s divided by
the original's: above 1 is faster) and how many lines' ids differ from the original's.

Run from the repository root:
    .venv/bin/python benchmarks/tokenizer_bench.py [--quick] [--corpus PATH] [--lines N]
Without --corpus, tests/fixtures/sample_text.txt is repeated up to --lines lines; that text is
small, so the kbert cache hits almost always: use a real corpus for numbers worth quoting
(e.g. `python scripts/debian_corpus.py corpus.txt`). Progress goes to stderr, one
JSON object to stdout.
"""

import argparse
import array
import itertools
import os
import sys
import time

import record

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import absl.flags
import tensorflow as tf
from bert import tokenization

import kbert

try:
    from tokenizers import BertWordPieceTokenizer
except ImportError:  # the bench extra is not installed: the hf row is skipped
    BertWordPieceTokenizer = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "fixtures", "vocab-uncased.txt")
SAMPLE = os.path.join(ROOT, "tests", "fixtures", "sample_text.txt")
BATCH = 1024


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
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
    }


def read_lines(path, n):
    """The first `n` non-blank lines of `path`, cycling through it if it is shorter."""
    with open(path, encoding="utf-8", errors="ignore") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not lines:
        sys.exit(f"{path}: no non-blank lines")
    return list(itertools.islice(itertools.cycle(lines), n))


def batches(lines):
    for start in range(0, len(lines), BATCH):
        yield lines[start : start + BATCH]


def run(name, tokenize_batch, to_ids, lines, reference):
    """Time `tokenize_batch` over all lines in batches; ids are compared outside the timing.

    Timing only the tokenizer call per batch (and comparing per batch) keeps memory small on
    a large corpus: nothing but the original's ids is kept for the whole run.
    """
    seconds, tokens, differing, ids_out, line = 0.0, 0, 0, [], 0
    for batch in batches(lines):
        t0 = time.perf_counter()
        result = tokenize_batch(batch)
        seconds += time.perf_counter() - t0
        for ids in to_ids(result):
            ids = array.array("i", ids)  # compact: a few bytes per token, not a Python int each
            tokens += len(ids)
            if reference is None:
                ids_out.append(ids)
            elif ids != reference[line]:
                differing += 1
            line += 1
    assert line == len(lines), f"{name}: {line} results for {len(lines)} lines"
    log(
        f"{name:12s} {tokens:>10d} tokens in {seconds:8.2f} s = {tokens / seconds:>12,.0f} tokens/s"
        + ("" if ids_out else f", {differing} lines differ from the original")
    )
    report = {"tokens": tokens, "seconds": round(seconds, 4), "tokens_per_second": round(tokens / seconds, 1)}
    if reference is not None:
        report["lines_differing_from_original"] = differing
    return report, ids_out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", help="text file, one sentence per line (default: sample text repeated)")
    parser.add_argument("--lines", type=int, default=None, help="lines to tokenize (default 200000; quick 5000)")
    parser.add_argument("--quick", action="store_true", help="small run to check the script works")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    n = args.lines or (5000 if args.quick else 200_000)
    corpus = os.path.abspath(args.corpus or SAMPLE)
    lines = read_lines(corpus, n)
    log(f"{len(lines)} lines from {corpus}")

    # tokenization.py reads the absl flag preserve_unused_tokens; flags must be parsed first.
    absl.flags.FLAGS(["x"])
    results = {}

    original = tokenization.FullTokenizer(VOCAB, do_lower_case=True)
    results["original"], reference = run(
        "original",
        lambda b: [original.tokenize(line) for line in b],
        lambda r: (original.convert_tokens_to_ids(t) for t in r),
        lines,
        None,
    )

    ktok = kbert.Tokenizer(VOCAB, do_lower_case=True)
    results["kbert"], _ = run(
        "kbert",
        lambda b: [ktok.tokenize(line) for line in b],
        lambda r: (ktok.convert_tokens_to_ids(t) for t in r),
        lines,
        reference,
    )

    gtok = kbert.GraphTokenizer(VOCAB, do_lower_case=True)
    graph = tf.function(gtok, input_signature=[tf.TensorSpec([None], tf.string)])
    graph(tf.constant(lines[:BATCH]))  # warm-up: trace once, outside the timing
    results["kbert_graph"], _ = run(
        "kbert_graph", lambda b: graph(tf.constant(b)), lambda r: r.to_list(), lines, reference
    )

    if BertWordPieceTokenizer is None:
        log("hf: skipped, `tokenizers` is not installed (pip install .[bench])")
        results["hf"] = {"skipped": "tokenizers not installed"}
    else:
        hf = BertWordPieceTokenizer(
            VOCAB, lowercase=True, clean_text=True, handle_chinese_chars=True, strip_accents=None
        )
        results["hf"], _ = run(
            "hf", lambda b: hf.encode_batch(b, add_special_tokens=False), lambda r: (e.ids for e in r), lines, reference
        )

    base = results["original"]["tokens_per_second"]
    results["original"]["lines_differing_from_original"] = 0
    for name, report in results.items():
        if "tokens_per_second" in report:
            results[name] = {
                "seconds": report["seconds"],
                "tokens": report["tokens"],
                "tokens_per_second": report["tokens_per_second"],
                "ratio_vs_original": round(report["tokens_per_second"] / base, 2),
                "lines_differing_from_original": report["lines_differing_from_original"],
            }
    record.emit(
        {
            "machine": machine_info(),
            "corpus": corpus,
            "lines": len(lines),
            "tokens": results["original"]["tokens"],
            "note": "one pass each; kbert's per-word cache starts empty and fills during the pass",
            "tokenizers": results,
        },
        "tokenizer-quick" if args.quick else "tokenizer",
        args.output,
        indent=2,
    )


if __name__ == "__main__":
    main()
