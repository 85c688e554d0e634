"""ModernBERT's forward pass: kbert against transformers (`sdpa` attention), same weights, same host.

A ModernBERT-base-sized model (22 layers, hidden 768, 12 heads, GeGLU 1152, a 128-token local
window, global attention every third layer) with random weights is saved by transformers and
converted by `kbert convert from-hf`. Each side runs in a process of its own on `--threads`
threads, alternating rounds; each reports the best of its forward passes and how far its peak
resident memory rose above what it held once the model was loaded.

Cases: one text of `--length` tokens, and a batch of 32 lines of the repo's
sample text (its 31 lines, then the first again; each line's length in tokens, ids drawn at
random), padded to its longest.

    python benchmarks/modernbert_bench.py --length 4096 --rounds 3
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from record import OUTPUT_HELP, emit

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "sample_text.txt")
BASE = dict(
    vocab_size=50368,
    hidden_size=768,
    intermediate_size=1152,
    num_hidden_layers=22,
    num_attention_heads=12,
    local_attention=128,
    global_attn_every_n_layers=3,
    pad_token_id=50283,
)

WORKER = r"""
import json, os, sys, time
import numpy as np
job = json.loads(sys.argv[1])
threads = job["threads"]

def resident(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024

def batches():
    rng = np.random.default_rng(0)
    for case in job["cases"]:
        lengths = case["lengths"]
        ids = rng.integers(5, 50000, size=(len(lengths), max(lengths))).astype("int32")
        mask = (np.arange(max(lengths))[None, :] < np.asarray(lengths)[:, None]).astype("int32")
        yield case["name"], ids, mask

if job["side"] == "transformers":
    import torch
    from transformers import ModernBertModel
    torch.set_num_threads(threads)
    model = ModernBertModel.from_pretrained(job["hf"], attn_implementation="sdpa").eval()
    def forward(ids, mask):
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask)).last_hidden_state
else:
    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import kbert
    model = kbert.load(job["kbert"])
    def forward(ids, mask):
        return model.predict_on_batch({"input_ids": ids, "input_mask": mask})["sequence_output"]

loaded = resident("VmRSS")
report = {}
for name, ids, mask in batches():
    forward(ids, mask)  # warm-up: traces and compiles
    times = []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        forward(ids, mask)
        times.append(time.perf_counter() - start)
    report[name] = {"seconds": min(times), "tokens": int(mask.sum())}
report["peak_rss_growth_mb"] = resident("VmHWM") - loaded
print(json.dumps(report))
"""


def make_models(folder: str):
    """A random ModernBERT-base-sized model, saved by transformers and converted by kbert."""
    hf, converted = os.path.join(folder, "hf"), os.path.join(folder, "kbert")
    if os.path.isdir(converted):
        return hf, converted
    script = (
        "import sys, json, torch\n"
        "from transformers import ModernBertConfig, ModernBertModel\n"
        "torch.manual_seed(0)\n"
        "ModernBertModel(ModernBertConfig(**json.loads(sys.argv[2]))).save_pretrained(sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", script, hf, json.dumps(BASE)], check=True)
    # The benchmark feeds ids, never text: any tokenizer.json makes the folder whole.
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(os.path.join(hf, "tokenizer.json"))
    kbert = os.path.join(os.path.dirname(sys.executable), "kbert")
    subprocess.run([kbert, "convert", "from-hf", hf, converted], check=True, stdout=subprocess.DEVNULL)
    return hf, converted


def sample_lengths(count: int = 32) -> list:
    """The token counts of `count` lines of the sample text, its non-empty lines in order and
    from the first again when they run out (it has 31), with [CLS] and [SEP] (four bytes a
    token, ModernBERT's BPE's rough rate on English)."""
    with open(SAMPLE, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return [2 + max(1, len(lines[i % len(lines)].encode()) // 4) for i in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="tensorflow", help="kbert's Keras backend")
    parser.add_argument("--models", default=os.path.join(tempfile.gettempdir(), "kbert-modernbert-bench"))
    parser.add_argument("--output", help=OUTPUT_HELP)
    args = parser.parse_args()
    hf, converted = make_models(args.models)
    cases = [
        {"name": f"one text of {args.length} tokens", "lengths": [args.length]},
        {"name": "a batch of sample-text lines", "lengths": sample_lengths()},
    ]
    rounds = {"kbert": [], "transformers": []}
    for _ in range(args.rounds):
        for side in rounds:
            job = {"side": side, "hf": hf, "kbert": converted, "threads": args.threads, "repeats": args.repeats}
            env = dict(os.environ, KERAS_BACKEND=args.backend, OMP_NUM_THREADS=str(args.threads))
            done = subprocess.run(
                [sys.executable, "-c", WORKER, json.dumps({**job, "cases": cases})],
                capture_output=True,
                text=True,
                env=env,
            )
            if done.returncode:
                sys.exit(f"{side} failed:\n{done.stderr[-3000:]}")
            rounds[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(side, rounds[side][-1], file=sys.stderr, flush=True)
    report = {"backend": args.backend, "threads": args.threads, "model": BASE, "cases": {}}
    for case in cases:
        best = {side: min(r[case["name"]]["seconds"] for r in runs) for side, runs in rounds.items()}
        report["cases"][case["name"]] = {
            "kbert_seconds": round(best["kbert"], 3),
            "transformers_seconds": round(best["transformers"], 3),
            "kbert_speed_vs_transformers": round(best["transformers"] / best["kbert"], 2),
        }
    # Every round's: the peak varies from one process to the next.
    report["peak_rss_growth_mb"] = {
        side: [round(r["peak_rss_growth_mb"]) for r in runs] for side, runs in rounds.items()
    }

    print(emit(report, "modernbert", args.output))


if __name__ == "__main__":
    main()
