"""`kbert pretrain` and `kbert finetune` on TensorFlow, JAX and PyTorch, on this machine's CPU, in one run.

Each backend runs the real commands, each run a fresh process with `KERAS_BACKEND` set: pretraining
from a random start (L=4, H=256, A=4, I=1024, V=30522, sequence 128, batch 32, 20 predictions),
on records `kbert create-data` makes from tests/fixtures/sample_text.txt, and fine-tuning a
classifier from that size's pretrained model on texts of the same sample (batch 32, sequence 128).

A command's wall time holds fixed costs (Python and the backend's import, building the model,
tracing or compiling the step, writing the model) that differ a lot between backends and say
nothing of the training speed. So each command runs twice, for a short and a long run, and the
steady speed is the extra sequences over the extra seconds:
(long - short) steps x batch / (long's wall - short's wall). The fixed cost is reported too
(what the short run took beyond its steps at that speed). `--rounds` alternate the backends
(TensorFlow, JAX, PyTorch, TensorFlow, ...); each backend's median round is reported, and its
ratio to TensorFlow's.

usage: .venv/bin/python benchmarks/backend_bench.py [--short 10] [--long 40] [--rounds 2]
       [--backends tensorflow jax torch] [--only pretrain finetune] [--output FILE]
Needs the jax extra and torch (the test extra). Progress on stderr, one JSON object on stdout.
"""

# The standard library only: each backend runs in `kbert` processes of its own.
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import record

ROOT = record.ROOT
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
VOCAB = os.path.join(FIXTURES, "vocab-uncased.txt")
CONFIG = dict(
    vocab_size=30522,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=1024,
    max_position_embeddings=512,
    type_vocab_size=2,
    hidden_act="gelu",
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    initializer_range=0.02,
)
SEQ, BATCH, PREDICTIONS = 128, 32, 20
BACKENDS = ("tensorflow", "jax", "torch")


def kbert(*args) -> list:
    return [os.path.join(os.path.dirname(sys.executable), "kbert"), *map(str, args)]


def timed(name: str, command: list, backend: str) -> float:
    """Run `command` with `backend`; its wall seconds (a failure ends the benchmark with its stderr)."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    print(f"{name}: running", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stderr[-3000:]}")
    print(f"{name}: {seconds:.1f} s (load average {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    return seconds


def prepare(work: str) -> dict:
    """The records, the config and the fine-tuning file, made once (by TensorFlow-free commands)."""
    paths = {
        "records": os.path.join(work, "sample.tfrecord"),
        "config": os.path.join(work, "bert_config.json"),
        "train": os.path.join(work, "classify.tsv"),
        "base": os.path.join(work, "base"),
    }
    with open(paths["config"], "w") as f:
        json.dump(CONFIG, f)
    timed(
        "create-data",
        kbert(
            "create-data",
            "--input",
            SAMPLE,
            "--vocab",
            VOCAB,
            "--output",
            paths["records"],
            "--dupe-factor",
            5,
            "--max-seq-length",
            SEQ,
            "--max-predictions-per-seq",
            PREDICTIONS,
        ),
        "tensorflow",
    )
    # The model fine-tuning starts from: this size, pretrained for one step.
    timed("base model", pretrain_command(paths, paths["base"], 1), "tensorflow")
    # Sentences of the sample as texts, labelled by whether they hold a comma: real text, and a
    # label the model can learn; enough rows for the long run's steps.
    with open(SAMPLE, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if len(line.split()) > 3]
    with open(paths["train"], "w", encoding="utf-8") as f:
        f.write("text\tlabel\n")
        for i in range(BATCH * 200):
            text = sentences[i % len(sentences)].replace("\t", " ")
            f.write(f"{text}\t{int(',' in text)}\n")
    return paths


def pretrain_command(paths: dict, model_dir: str, steps: int) -> list:
    return kbert(
        "pretrain", "--model-dir", model_dir, "--data", paths["records"], "--config", paths["config"],
        "--vocab", VOCAB, "--max-seq-length", SEQ, "--max-predictions-per-seq", PREDICTIONS,
        "--steps", steps, "--batch-size", BATCH, "--save-every", steps, "--steps-per-loop", min(steps, 10),
    )  # fmt: skip


def finetune_command(paths: dict, out: str, steps: int, work: str) -> list:
    train = os.path.join(work, f"classify-{steps}.tsv")
    with open(paths["train"], encoding="utf-8") as f:
        lines = f.readlines()[: 1 + steps * BATCH]
    with open(train, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return kbert(
        "finetune", paths["base"], "--task", "classify", "--train", train, "--output", out, "--epochs", 1,
        "--batch-size", BATCH, "--max-seq-length", SEQ, "--overwrite",
    )  # fmt: skip


def steady(job: str, backend: str, paths: dict, work: str, short: int, long: int) -> dict:
    """One round of `job` on `backend`: the short and the long run, and the speed between them."""
    seconds = {}
    for steps in (short, long):
        out = tempfile.mkdtemp(dir=work)
        if job == "pretrain":
            command = pretrain_command(paths, os.path.join(out, "model"), steps)
        else:
            command = finetune_command(paths, os.path.join(out, "model"), steps, work)
        seconds[steps] = timed(f"{job} {backend} {steps} steps", command, backend)
    rate = (long - short) * BATCH / (seconds[long] - seconds[short])
    return {
        "seq_per_s": rate,
        "fixed_seconds": seconds[short] - short * BATCH / rate,
        "wall_seconds": {str(k): round(v, 2) for k, v in seconds.items()},
        "load_average": os.getloadavg()[0],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", type=int, default=10, help="steps of the short run")
    parser.add_argument("--long", type=int, default=40, help="steps of the long run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each backend's median is kept")
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--only", nargs="*", default=["pretrain", "finetune"], choices=["pretrain", "finetune"])
    parser.add_argument("--work", help="a directory for the records and models (default: a new temporary one)")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    if args.long <= args.short:
        parser.error("--long must be more steps than --short")
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="backend-bench-"))
    os.makedirs(work, exist_ok=True)
    paths = prepare(work)
    report = {
        "settings": dict(
            config=CONFIG,
            max_seq_length=SEQ,
            batch_size=BATCH,
            precision="float32",
            short=args.short,
            long=args.long,
            rounds=args.rounds,
        ),
    }
    for job in args.only:
        rounds = {b: [] for b in args.backends}
        for _ in range(args.rounds):
            for backend in args.backends:
                rounds[backend].append(steady(job, backend, paths, work, args.short, args.long))
        results = {}
        for backend, runs in rounds.items():
            median = statistics.median(r["seq_per_s"] for r in runs)
            results[backend] = {"seq_per_s": round(median, 2), "rounds": runs}
        if "tensorflow" in results:
            for result in results.values():
                result["vs_tensorflow"] = round(result["seq_per_s"] / results["tensorflow"]["seq_per_s"], 3)
        report[job] = results
    record.emit(report, "backends", args.output)


if __name__ == "__main__":
    main()
