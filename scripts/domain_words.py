"""Teach a pretrained model a domain's words, and measure what it buys: `kbert extend --corpus`
on the Debian descriptions, the same short continued pretraining with and without the new
words, then the same fine-tuning on the Debian sections task.

Inputs, all built on this machine from apt's lists:
- the corpus: `python scripts/debian_corpus.py corpus.txt` (one sentence a line, documents
  apart by a blank line);
- the task: `python scripts/debian_sections.py TASK_DIR` (train/dev/test.tsv);
- a pretrained kbert model, e.g. all-MiniLM-L6-v2 converted with `kbert convert from-hf`.

What it does, every step a kbert command (logged to WORK/*.err):
1. Holds out the task's dev and test descriptions: corpus documents that are one of them are
   dropped from the pretraining text; the test descriptions become the held-out text.
2. `kbert extend MODEL WORK/words --corpus pretrain.txt --max-new N`.
3. Counts the held-out texts' WordPiece tokens under both vocabularies.
4. `kbert create-data` with each vocabulary on the same documents (same seed), and on the
   held-out text.
5. `kbert pretrain --init` each model for the same steps on its records, then evaluates the
   masked-LM loss and accuracy on its held-out records (every held-out instance).
6. `kbert finetune` each continued-pretrained model on the task, `kbert evaluate` on test.

usage: python scripts/domain_words.py WORK --model MODEL --corpus corpus.txt --task TASK_DIR
       [--max-new 994] [--docs 6000] [--steps 150] [--batch-size 16] [--epochs 2]
Prints one JSON object with every number (also written to WORK/results.json).
"""

import argparse
import csv
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

csv.field_size_limit(1 << 30)
HERE = os.path.dirname(os.path.abspath(__file__))
KBERT = [os.path.join(os.path.dirname(sys.executable), "kbert")]  # the venv's kbert script


def kbert(work, name, *args):
    """Run one kbert command; its JSON result, the seconds it took."""
    start = time.time()
    with open(os.path.join(work, f"{name}.err"), "w") as err:
        out = subprocess.run([*KBERT, *map(str, args)], stdout=subprocess.PIPE, stderr=err, text=True)
    if out.returncode != 0:
        sys.exit(f"{name} failed: see {work}/{name}.err")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), round(time.time() - start, 1)


def key(text):
    """A document's identity across the corpus's and the task's layouts: its first 100 letters and digits."""
    return re.sub(r"[^0-9a-z]", "", text.lower())[:100]


def documents(path):
    with open(path, encoding="utf-8") as f:
        return [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]


def task_texts(task_dir, split):
    with open(os.path.join(task_dir, f"{split}.tsv"), encoding="utf-8", newline="") as f:
        return [row["text"] for row in csv.DictReader(f, delimiter="\t")]


def as_sentences(text):
    """One sentence a line, as create-data reads documents."""
    return "\n".join(s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip())


def split_text(args):
    held_keys = {key(t) for split in ("dev", "test") for t in task_texts(args.task, split)}
    docs = documents(args.corpus)
    kept = [d for d in docs if key(d.replace("\n", " ")) not in held_keys]
    sample = random.Random(1).sample(kept, min(args.docs, len(kept)))
    paths = {name: os.path.join(args.work, f"{name}.txt") for name in ("pretrain", "sample", "heldout")}
    for name, chosen in (("pretrain", kept), ("sample", sample)):
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("\n\n".join(chosen) + "\n")
    heldout = task_texts(args.task, "test")
    with open(paths["heldout"], "w", encoding="utf-8") as f:
        f.write("\n\n".join(as_sentences(t) for t in heldout) + "\n")
    return paths, {
        "corpus_documents": len(docs),
        "held_out_documents_dropped": len(docs) - len(kept),
        "pretraining_documents": len(sample),
        "heldout_texts": len(heldout),
    }


def count_tokens(model_dir, texts):
    from kbert.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_model_dir(model_dir)
    return sum(len(tokenizer.tokenize(t)) for t in texts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work")
    parser.add_argument("--model", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--max-new", type=int, default=994)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--docs", type=int, default=6000)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--finetune-seq-length", type=int, default=64)
    parser.add_argument(
        "--runs", default="base,words", help="which runs to make; the others' WORK/NAME.json are reused"
    )
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    work = args.work
    paths, results = split_text(args)

    models = {"base": args.model, "words": os.path.join(work, "model-words")}
    results["extend"], results["extend_s"] = kbert(
        work,
        "extend",
        "extend",
        args.model,
        models["words"],
        "--corpus",
        paths["pretrain"],
        "--max-new",
        args.max_new,
        "--min-count",
        args.min_count,
        "--overwrite",
    )
    results["extend"]["new_words"]["words"] = results["extend"]["new_words"]["words"][:40]  # the first, for the README
    heldout = task_texts(args.task, "test")
    results["heldout_tokens"] = {name: count_tokens(m, heldout) for name, m in models.items()}

    for name, model in models.items():
        if name not in args.runs.split(","):
            with open(os.path.join(work, f"{name}.json")) as f:
                results[name] = json.load(f)
            continue
        vocab = os.path.join(model, "vocab.txt")
        run = os.path.join(work, name)
        os.makedirs(run, exist_ok=True)
        common = [
            "--vocab",
            vocab,
            "--max-seq-length",
            128,
            "--max-predictions-per-seq",
            20,
            "--dupe-factor",
            1,
            "--seed",
            1,
            "--overwrite",
        ]
        made, _ = kbert(
            work,
            f"{name}-data",
            "create-data",
            "--input",
            paths["sample"],
            "--output",
            os.path.join(run, "train.tfrecord"),
            *common,
        )
        held, _ = kbert(
            work,
            f"{name}-heldout-data",
            "create-data",
            "--input",
            paths["heldout"],
            "--output",
            os.path.join(run, "heldout.tfrecord"),
            *common,
        )
        instances = held["instances"]
        shutil.rmtree(
            os.path.join(run, "pretrained"), ignore_errors=True
        )  # a fresh run (pretrain resumes only on --resume)
        pretrained, seconds = kbert(
            work,
            f"{name}-pretrain",
            "pretrain",
            "--init",
            model,
            "--model-dir",
            os.path.join(run, "pretrained"),
            "--data",
            os.path.join(run, "train.tfrecord"),
            "--steps",
            args.steps,
            "--batch-size",
            args.batch_size,
            "--learning-rate",
            args.learning_rate,
            "--save-every",
            args.steps,
            "--eval-data",
            os.path.join(run, "heldout.tfrecord"),
            "--eval-every",
            args.steps,
            "--eval-steps",
            max(1, int(instances) // args.batch_size),
            "--seed",
            1,
        )
        tuned, tune_s = kbert(
            work,
            f"{name}-finetune",
            "finetune",
            os.path.join(run, "pretrained"),
            "--task",
            "classify",
            "--train",
            os.path.join(args.task, "train.tsv"),
            "--output",
            os.path.join(run, "finetuned"),
            "--epochs",
            args.epochs,
            "--batch-size",
            32,
            "--learning-rate",
            1e-4,
            "--seed",
            1,
            "--max-seq-length",
            args.finetune_seq_length,
            "--overwrite",
        )
        tested, _ = kbert(
            work,
            f"{name}-test",
            "evaluate",
            os.path.join(run, "finetuned"),
            "--input",
            os.path.join(args.task, "test.tsv"),
        )
        results[name] = {
            "train_data": made,
            "heldout_data": held,
            "pretrain": pretrained,
            "pretrain_s": seconds,
            "finetune": tuned,
            "finetune_s": tune_s,
            "test": tested,
        }
        with open(os.path.join(work, f"{name}.json"), "w") as f:
            json.dump(results[name], f, indent=1)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
