"""One batch through one model, kbert's TensorFlow forward pass against Hugging Face's PyTorch one:
where a pairs/s ratio between the two libraries comes from once tokenising and batching are gone.

rerank_bench.py times whole scoring runs (tokenising, sorting by length, batching, the model). Both
kbert's `rerank_file` and sentence-transformers' `CrossEncoder.predict` sort pairs by length before
batching, so what is left between them is the forward pass itself. This times that part alone: the
same weights (a kbert model directory and its Hugging Face folder, as `kbert convert` writes or
reads them), the same int32 ids, every row `--length` tokens long, `--batch` rows a call:

- "kbert": `model.predict_on_batch`, what `kbert rerank` and `kbert predict` call per batch;
- "transformers": the `AutoModelForSequenceClassification` forward under `torch.inference_mode`,
  what `CrossEncoder.predict` calls per batch, on as many threads as the host has cores;
- each in float32, and with `--bfloat16` also in bfloat16 (Keras' mixed_bfloat16 policy; the
  PyTorch model cast to bfloat16), as a user of either would ask for it.

Each library runs in its own fresh process, `--rounds` times, alternating, so drift on the host
falls on both; a figure is the median of `--calls` calls after 3 warm-up calls, and the report
gives each round's figures and the ratio of the medians over the rounds.

With `--groups` (the groups `kbert finetune --task rerank --mine-negatives` writes), it also counts
the tokens each trainer's batches pay for on them (`child_padding`): at one per-token rate, what
padding less can give a training run, and at most.

usage: .venv/bin/python benchmarks/forward_bench.py --kbert DIR --hf DIR [--batch 32]
       [--length 48 80 128] [--calls 10] [--rounds 2] [--bfloat16] [--groups FILE]
       [--max-seq-length 128] [--output FILE]
Needs PyTorch and transformers (the test extra). One JSON object on stdout.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import record

HERE = os.path.dirname(os.path.abspath(__file__))
PAIRS_PER_STEP = 32  # rerank_bench.py's batches: 4 groups of a query, its document and 7 negatives


def child(library: str, model_dir: str, batch: int, length: int, calls: int, bfloat16: bool) -> dict:
    """Milliseconds a call, the median of `calls` calls of one library's forward pass."""
    import time

    import numpy as np

    ids = np.random.default_rng(0).integers(1000, 20000, (batch, length)).astype("int32")
    if library == "transformers":
        import torch
        from transformers import AutoModelForSequenceClassification

        torch.set_num_threads(os.cpu_count())
        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        model = model.to(torch.bfloat16) if bfloat16 else model
        inputs = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "attention_mask": torch.ones(batch, length, dtype=torch.long),
            "token_type_ids": torch.zeros(batch, length, dtype=torch.long),
        }

        def call():
            with torch.inference_mode():
                return model(**inputs).logits.float().numpy()

    else:
        import keras

        if bfloat16:
            keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
        import kbert

        model = kbert.load(model_dir)
        inputs = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}

        def call():
            return model.predict_on_batch(inputs)

    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"ms_per_call": 1000 * statistics.median(times)}


def child_padding(mined: str, vocab_file: str, max_seq_length: int, epochs: int = 3) -> dict:
    """The tokens each trainer's batches pay for, over `epochs` shuffles of the mined groups,
    counted (not timed) from each pair's length, [CLS] query [SEP] document [SEP] cut to
    `max_seq_length`: batches of 4 whole groups (32 pairs); sentence-transformers pads a batch to
    its longest pair; kbert scores its pairs sorted by length in `LENGTH_CHUNKS` runs, each cut to
    its longest at a multiple of `CHUNK_MULTIPLE` (`ScoreInLengthChunks`). The pairs' own tokens
    are what no padding at all would cost: at one per-token rate, the bound of what padding gives."""
    import numpy as np

    from kbert.finetuning.reranking import CHUNK_MULTIPLE, LENGTH_CHUNKS
    from kbert.text.tokenizer import Tokenizer

    tokenizer = Tokenizer(vocab_file, do_lower_case=True)
    lengths = []
    with open(mined, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        query = len(tokenizer.tokenize(row["query"]))
        documents = [row["document"], *row["negatives"]]
        lengths.append([min(max_seq_length, query + len(tokenizer.tokenize(d)) + 3) for d in documents])
    lengths = np.array(lengths)
    groups = PAIRS_PER_STEP // lengths.shape[1]
    own = st = ours = 0
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(len(lengths))
        for start in range(0, len(order) - groups + 1, groups):
            batch = np.sort(lengths[order[start : start + groups]].reshape(-1))
            own, st = own + int(batch.sum()), st + len(batch) * int(batch.max())
            for run in np.array_split(batch, LENGTH_CHUNKS):
                ours += len(run) * int(-(-run.max() // CHUNK_MULTIPLE) * CHUNK_MULTIPLE)
    return {
        "pairs_tokens": own,
        "sentence_transformers_pays": st,
        "kbert_pays": ours,
        "kbert_over_st": round(ours / st, 3),
        "unpadded_over_st": round(own / st, 3),
    }


def spawn(call: str, what: str) -> dict:
    """`call` (a function of this file) in a fresh Python: its JSON result."""
    code = f"import json, sys; sys.path.insert(0, {HERE!r}); import forward_bench as b; print(json.dumps(b.{call}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"{what} failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_child(library, model_dir, args, length, bfloat16) -> float:
    call = f"child({library!r}, {model_dir!r}, {args.batch}, {length}, {args.calls}, {bfloat16})"
    ms = spawn(call, f"{library} at {length} tokens")["ms_per_call"]
    print(
        f"{library} {'bfloat16' if bfloat16 else 'float32'} {length} tokens: {ms:.1f} ms", file=sys.stderr, flush=True
    )
    return ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kbert", required=True, help="a kbert model directory")
    parser.add_argument("--hf", required=True, help="the same model as a Hugging Face folder")
    parser.add_argument("--batch", type=int, default=32, help="rows a call")
    parser.add_argument("--length", type=int, nargs="+", default=[48, 80, 128], help="tokens a row")
    parser.add_argument("--calls", type=int, default=10, help="timed calls a process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per library and setting, alternating")
    parser.add_argument("--bfloat16", action="store_true", help="also time both in bfloat16")
    parser.add_argument(
        "--groups", help="also count the tokens each trainer pays for on these mined groups (JSON Lines)"
    )
    parser.add_argument("--max-seq-length", type=int, default=128, help="tokens a pair is cut to, for --groups")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    for path in (args.kbert, args.hf):
        if not os.path.isdir(path):
            sys.exit(f"{path}: no such model folder")
    if args.groups and not os.path.isfile(args.groups):
        sys.exit(f"{args.groups}: no such file of groups")
    results = {}
    for precision in ["float32"] + (["bfloat16"] if args.bfloat16 else []):
        for length in args.length:
            rounds = {"kbert": [], "transformers": []}
            for _ in range(args.rounds):
                for library, model_dir in (("kbert", args.kbert), ("transformers", args.hf)):
                    rounds[library].append(run_child(library, model_dir, args, length, precision == "bfloat16"))
            kbert_ms, hf_ms = statistics.median(rounds["kbert"]), statistics.median(rounds["transformers"])
            results[f"{precision} {length} tokens"] = {
                "kbert_ms": rounds["kbert"],
                "transformers_ms": rounds["transformers"],
                "kbert_pairs_per_s_over_transformers": round(hf_ms / kbert_ms, 3),
            }
    report = {
        "task": {"batch": args.batch, "calls": args.calls, "rounds": args.rounds, "threads": os.cpu_count()},
        "forward": results,
    }
    if args.groups:
        vocab = os.path.join(args.kbert, "vocab.txt")
        call = f"child_padding({os.path.abspath(args.groups)!r}, {vocab!r}, {args.max_seq_length})"
        report["training_tokens"] = {"groups": args.groups, **spawn(call, "counting the tokens")}
    report["machine"] = {"cpu_flags": record.cpu_flags()}
    record.emit(report, f"forward-{args.batch}", args.output)


if __name__ == "__main__":
    main()
