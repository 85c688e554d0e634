"""Retrieve, then rerank, on real text: the Debian retrieval task's first stage reordered by a
cross-encoder, kbert's against sentence-transformers', one run, one table.

It continues `benchmarks/retrieval_bench.py`'s work folder (`--work`), which must hold the data,
the converted all-MiniLM-L6-v2 (`minilm/`), and the `kbert finetune --task embed` model with its
vectors of the test split (`kbert-finetune/`, `kbert-fit-{queries,documents}.npy`: run
`retrieval_bench.py --work DIR --only kbert-finetune` first). That embedder is the first stage: for
each test query, its `--top` nearest test documents are the candidates (`--first-stage bm25`:
BM25's top instead).

- BM25 (rank_bm25's `BM25Okapi`, as retrieval_bench runs it) and the embedder alone: each query's
  rank of its one relevant document among all the test documents.
- Training data, the same for both rerankers: the train split's first `--train-queries` pairs,
  each with `--negatives` hard negatives mined by the embedder (`kbert finetune --task rerank
  --mine-negatives`, which writes them to `kbert-reranker.mined.jsonl`; sentence-transformers
  trains on that file).
- kbert: `kbert finetune --task rerank`, from the converted all-MiniLM-L6-v2 with a new head of one
  output, `--loss` bce (the default) or listwise; sentence-transformers from the same weights:
  for bce `CrossEncoder(num_labels=1).fit` (its default loss for one label is the same binary
  cross-entropy), for listwise `CrossEncoderTrainer` on the groups with MultipleNegativesRankingLoss
  drawing no in-batch negatives, no activation, scale 1 (the same softmax cross-entropy over each
  query's group, its batches whole groups as kbert's). Both 1 epoch, 32 pairs
  a step (kbert batches whole groups: `--batch-size` 32 / (1 + negatives) queries; with
  `--group-by-length`, groups of like lengths), learning rate
  2e-5, warm-up 10%, linear decay, pairs cut to `--max-seq-length` tokens. Training pairs/s: pairs
  over the seconds of the training call (`fit`; the loop `kbert finetune` reports).
- Scoring: every candidate pair of the first `--test-queries` test queries, 32 pairs a batch:
  kbert's `rerank_file` (what `kbert rerank` runs: tokenising, batching across queries, the model)
  against `CrossEncoder.predict` over the same pairs, each in its own process after a warm-up:
  kbert's time includes opening the model, sentence-transformers' starts after loading it.
- Metrics after reranking: the relevant document's place in the reranked candidates (equal scores
  keep the first stage's order, as `kbert rerank`'s ranking does), or its first-stage rank where
  the first stage missed it: nDCG@10, recall@1, recall@10, MRR@10 (with one relevant document, MAP
  is MRR untruncated), over the same queries as the first stage's figures beside them.

usage: .venv/bin/python benchmarks/rerank_bench.py --work DIR [--train-queries 2000] [--negatives 3]
       [--top 20] [--test-queries 3000] [--max-seq-length 128] [--first-stage embedder|bm25]
       [--group-by-length] [--loss bce|listwise] [--reranker DIR (score with it, no training)] [--only NAME...] [--output FILE]
Needs what retrieval_bench.py needs (sentence-transformers' `fit` needs `datasets` and
`accelerate`). Progress on stderr, one JSON object on stdout.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import record
import retrieval_bench as rb

BATCH, EPOCHS, LEARNING_RATE, WARMUP = rb.BATCH, rb.EPOCHS, rb.LEARNING_RATE, rb.WARMUP
CONTENDERS = ("bm25", "kbert-rerank", "st-rerank")
FIRST_STAGES = {"embedder": "first stage: kbert finetune --task embed", "bm25": "first stage: BM25"}


def spawn(name, call):
    return rb.spawn(name, call, module="rerank_bench")


# === Children: each runs in a fresh process and prints one JSON object ===


def read_candidates(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def child_kbert_score(work_dir, model_dir, candidates, out, max_seq_length):
    """kbert's scores of every candidate pair, through `rerank_file` (what `kbert rerank` runs)."""
    from kbert.finetuning.predict import rerank_file

    rows = read_candidates(candidates)
    warm = os.path.join(work_dir, "candidates-warm-up.jsonl")
    with open(warm, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[:2])
    list(rerank_file(model_dir, warm, batch_size=BATCH, max_seq_length=max_seq_length))
    # Timed from opening the model (a generator: rerank_file opens it at the first answer).
    start = time.perf_counter()
    answers = list(rerank_file(model_dir, candidates, batch_size=BATCH, max_seq_length=max_seq_length))
    seconds = time.perf_counter() - start
    np.save(out, np.array([a["ranking"] for a in answers]))
    pairs = sum(len(r["documents"]) for r in rows)
    return {"pairs": pairs, "queries": len(rows), "seconds": seconds, "pairs_per_s": pairs / seconds}


def child_st_fit(work_dir, base, mined, out_dir, max_seq_length, loss="bce"):
    """CrossEncoder(num_labels=1).fit on the mined groups, as labelled pairs; saves to `out_dir`.
    With `loss` "listwise", CrossEncoderTrainer on the groups instead (`st_listwise_fit`)."""
    if loss == "listwise":
        return st_listwise_fit(work_dir, base, mined, out_dir, max_seq_length)
    import torch
    from sentence_transformers import InputExample
    from sentence_transformers.cross_encoder import CrossEncoder
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    examples = []
    for row in read_candidates(mined):
        examples.append(InputExample(texts=[row["query"], row["document"]], label=1.0))
        examples.extend(InputExample(texts=[row["query"], n], label=0.0) for n in row["negatives"])
    model = CrossEncoder(base, num_labels=1, max_length=max_seq_length, device="cpu")
    loader = DataLoader(examples, shuffle=True, batch_size=BATCH)
    steps = math.ceil(len(examples) / BATCH) * EPOCHS
    os.chdir(work_dir)  # fit's trainer keeps its checkpoints folder in the working directory
    start = time.perf_counter()
    model.fit(
        train_dataloader=loader,
        epochs=EPOCHS,
        warmup_steps=int(WARMUP * steps),
        optimizer_params={"lr": LEARNING_RATE},
        show_progress_bar=False,
    )
    seconds = time.perf_counter() - start
    model.save(out_dir)
    return {
        "pairs": len(examples),
        "steps": steps,
        "loss": type(model.loss_fct).__name__ if hasattr(model, "loss_fct") else None,
        "train_seconds": seconds,
        "pairs_per_s": len(examples) / seconds,
        "torch_threads": torch.get_num_threads(),
    }


def st_group_softmax(model):
    """sentence-transformers' MultipleNegativesRankingLoss for `model` (a CrossEncoder) drawing no
    in-batch negatives, with no activation and scale 1: softmax cross-entropy of each query's
    logits over its own group (query, positive, negative_1, ...), as kbert's `--loss listwise`."""
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    class GroupSoftmax(MultipleNegativesRankingLoss):
        def get_in_batch_negatives(self, anchors, candidates):
            return iter(())  # the group's own negatives only (num_negatives=0 cannot be sampled)

    return GroupSoftmax(model, num_negatives=None, scale=1.0, activation_fn=None)


def st_listwise_fit(work_dir, base, mined, out_dir, max_seq_length):
    """CrossEncoderTrainer on the mined groups (query, positive, negative_1, ...), 32 pairs a step,
    with `st_group_softmax`, the loss of `--loss listwise`."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments

    torch.manual_seed(0)
    rows = read_candidates(mined)
    negatives = len(rows[0]["negatives"])
    columns = {"query": [r["query"] for r in rows], "positive": [r["document"] for r in rows]}
    for i in range(negatives):
        columns[f"negative_{i + 1}"] = [r["negatives"][i] for r in rows]
    model = CrossEncoder(base, num_labels=1, max_length=max_seq_length, device="cpu")
    arguments = CrossEncoderTrainingArguments(
        output_dir=os.path.join(work_dir, "st-listwise-checkpoints"),
        num_train_epochs=EPOCHS,
        per_device_train_batch_size=BATCH // (1 + negatives),
        learning_rate=LEARNING_RATE,
        warmup_ratio=WARMUP,
        lr_scheduler_type="linear",
        save_strategy="no",
        report_to="none",
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    train = Dataset.from_dict(columns)
    trainer = CrossEncoderTrainer(model=model, args=arguments, train_dataset=train, loss=st_group_softmax(model))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    model.save(out_dir)
    pairs = len(rows) * (1 + negatives)
    return {
        "pairs": pairs,
        "steps": trainer.state.global_step,
        "loss": "MultipleNegativesRankingLoss over each group (no in-batch negatives, no activation, scale 1)",
        "train_seconds": seconds,
        "pairs_per_s": pairs / seconds,
        "torch_threads": torch.get_num_threads(),
    }


def child_st_score(work_dir, model_dir, candidates, out, max_seq_length):
    """`CrossEncoder.predict` of every candidate pair at batch 32; each query's ranking (stable)."""
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    model = CrossEncoder(model_dir, max_length=max_seq_length, device="cpu")
    rows = read_candidates(candidates)
    pairs = [(r["query"], d) for r in rows for d in r["documents"]]
    start = time.perf_counter()
    scores = model.predict(pairs, batch_size=BATCH, show_progress_bar=False)
    seconds = time.perf_counter() - start
    scores = np.asarray(scores, np.float64).reshape(len(rows), -1)
    np.save(out, np.argsort(-scores, axis=1, kind="stable"))
    return {
        "pairs": len(pairs),
        "queries": len(rows),
        "seconds": seconds,
        "pairs_per_s": len(pairs) / seconds,
        "torch_threads": torch.get_num_threads(),
    }


# === The parent ===


def child_bm25_scores(work_dir, out):
    """BM25's score of every test document for every test query, to `out` (.npy)."""
    from rank_bm25 import BM25Okapi

    queries, documents = rb.read_pairs(os.path.join(work_dir, "data", "test.tsv"))
    index = BM25Okapi([rb.bm25_tokens(d) for d in documents], k1=1.5, b=0.75)
    np.save(out, np.stack([index.get_scores(rb.bm25_tokens(q)) for q in queries]).astype(np.float32))
    return {}


def first_stage(work_dir, top, test_queries, kind="embedder"):
    """The first stage's candidates (indexes of test documents, best first) of the first
    `test_queries` queries, and every query's rank of its document among all: the embedder's
    (cosine of its vectors) or BM25's."""
    if kind == "bm25":
        out = os.path.join(work_dir, "bm25-scores.npy")
        if not os.path.exists(out):
            rb.spawn("bm25 scores", f"child_bm25_scores({work_dir!r}, {out!r})", module="rerank_bench")
        scores = np.load(out)
    else:
        queries = np.load(os.path.join(work_dir, "kbert-fit-queries.npy"))
        documents = np.load(os.path.join(work_dir, "kbert-fit-documents.npy"))
        scores = queries @ documents.T
    order = np.argsort(-scores, axis=1, kind="stable")[:test_queries, :top]
    return order, rb.ranks(scores)


def reranked_ranks(candidates, rankings, base_ranks):
    """Each query's rank of its document (document i for query i) after reranking its candidates.

    >>> reranked_ranks(np.array([[4, 0, 7], [3, 5, 6]]), np.array([[1, 0, 2], [2, 1, 0]]), np.array([2, 40]))
    array([ 1, 40])
    """
    found = []
    for i, (row, ranking) in enumerate(zip(candidates, rankings)):
        where = np.flatnonzero(row == i)
        found.append(int(np.flatnonzero(np.asarray(ranking) == where[0])[0]) + 1 if len(where) else int(base_ranks[i]))
    return np.array(found)


def write_inputs(work_dir, args, order):
    """candidates.jsonl (query, documents, positive) and the reranker's training pairs."""
    queries, documents = rb.read_pairs(os.path.join(work_dir, "data", "test.tsv"))
    candidates = os.path.join(work_dir, f"candidates-{args.first_stage}-{args.top}-{len(order)}.jsonl")
    with open(candidates, "w", encoding="utf-8") as f:
        for i, row in enumerate(order):
            line = {"query": queries[i], "documents": [documents[j] for j in row], "positive": [documents[i]]}
            f.write(json.dumps(line) + "\n")
    train_queries, train_documents = rb.read_pairs(os.path.join(work_dir, "data", "train.tsv"))
    train = os.path.join(work_dir, f"rerank-train-{args.train_queries}.tsv")
    with open(train, "w", encoding="utf-8") as f:
        f.write("query\tdocument\n")
        f.writelines(f"{q}\t{d}\n" for q, d in list(zip(train_queries, train_documents))[: args.train_queries])
    return candidates, train


def plain_hf_folder(base, work_dir):
    """The base's transformers files without sentence-transformers' modules: what a new
    CrossEncoder starts from (a bi-encoder's folder would bring its pooling modules along)."""
    folder = os.path.join(work_dir, "minilm-hf")
    if not os.path.exists(folder):
        os.makedirs(folder)
        for name in os.listdir(base):
            if name in ("config.json", "model.safetensors") or name.startswith(("tokenizer", "vocab", "special")):
                shutil.copy(os.path.join(base, name), folder)
    return folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="retrieval_bench.py's work directory")
    parser.add_argument("--train-queries", type=int, default=2000, help="training queries: the train split's first N")
    parser.add_argument("--negatives", type=int, default=3, help="hard negatives mined per training query")
    parser.add_argument("--top", type=int, default=20, help="candidates per query from the first stage")
    parser.add_argument("--test-queries", type=int, default=3000, help="test queries reranked: the first N")
    parser.add_argument("--max-seq-length", type=int, default=128, help="tokens per pair, for every contender")
    parser.add_argument(
        "--first-stage", default="embedder", choices=("embedder", "bm25"), help="whose candidates are reranked"
    )
    parser.add_argument(
        "--group-by-length",
        action="store_true",
        help="kbert finetune trains with --group-by-length (batches of groups of like lengths)",
    )
    parser.add_argument(
        "--seed", type=int, help="kbert finetune's --seed (its default unless given): another run's draws"
    )
    parser.add_argument(
        "--loss",
        default="bce",
        choices=("bce", "listwise"),
        help="both rerankers' loss: binary cross-entropy on pairs, or softmax cross-entropy over each group",
    )
    parser.add_argument("--reranker", help="kbert-rerank: score with this kbert reranker instead of training one")
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS), choices=CONTENDERS, help="parts to run")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    work_dir = os.path.abspath(args.work)
    embedder = os.path.join(work_dir, "kbert-finetune")
    needed = [os.path.join(work_dir, "minilm"), embedder, os.path.join(work_dir, "kbert-fit-queries.npy")]
    if not all(os.path.exists(p) for p in needed):
        sys.exit(f"{work_dir} lacks the first stage: run benchmarks/retrieval_bench.py --work {work_dir} first")
    if BATCH % (1 + args.negatives):
        sys.exit(f"--negatives: 1 + negatives must divide {BATCH}, the pairs of a step")
    seq = args.max_seq_length
    order, base_ranks = first_stage(work_dir, args.top, args.test_queries, args.first_stage)
    candidates, train = write_inputs(work_dir, args, order)
    base_ranks = np.asarray(base_ranks)
    subset = base_ranks[: len(order)]
    first_name = FIRST_STAGES[args.first_stage]
    results = {first_name: rb.metrics(subset)}
    training, scoring = {}, {}

    if "bm25" in args.only:
        done = rb.spawn("bm25", f"child_bm25({work_dir!r})")
        results["BM25"] = done if "error" in done else rb.metrics(np.asarray(done["ranks"])[: len(order)])

    def rerank_results(name, done, rankings_file):
        scoring[name] = done
        if "error" in done:
            results[name] = done
        else:
            results[name] = rb.metrics(reranked_ranks(order, np.load(rankings_file), base_ranks))

    tuned = os.path.join(work_dir, "kbert-reranker")
    mined = tuned + ".mined.jsonl"
    if "kbert-rerank" in args.only and args.reranker:
        out = os.path.join(work_dir, "kbert-reranker-rankings.npy")
        reranker = os.path.abspath(args.reranker)
        score = spawn("kbert rerank", f"child_kbert_score({work_dir!r}, {reranker!r}, {candidates!r}, {out!r}, {seq})")
        rerank_results("kbert rerank", score, out)
    elif "kbert-rerank" in args.only:
        done = rb._run(
            "kbert finetune --task rerank",
            rb.kbert_finetune(
                os.path.join(work_dir, "minilm"),
                "rerank",
                train,
                tuned,
                seq,
                "--mine-negatives",
                embedder,
                "--negatives",
                args.negatives,
                *["--group-by-length"] * args.group_by_length,
                *(["--seed", args.seed] if args.seed is not None else []),
                "--loss",
                args.loss,
                batch_size=BATCH // (1 + args.negatives),
            ),
            parse=True,
        )
        if "train_examples_per_second" in done:  # queries (groups) per second of its training loop
            done["pairs_per_s"] = done["train_examples_per_second"] * (1 + args.negatives)
            with open(mined, encoding="utf-8") as f:
                done["pairs"] = sum(1 + len(json.loads(line)["negatives"]) for line in f)
            done["pairs_per_s_whole_command"] = done["pairs"] / done["wall_seconds"]
        training["kbert finetune --task rerank"] = done
        if "error" not in done:
            out = os.path.join(work_dir, "kbert-reranker-rankings.npy")
            score = spawn("kbert rerank", f"child_kbert_score({work_dir!r}, {tuned!r}, {candidates!r}, {out!r}, {seq})")
            rerank_results("kbert rerank", score, out)

    if "st-rerank" in args.only:
        if not os.path.exists(mined):
            sys.exit(f"{mined} is missing: run the kbert-rerank part first (it mines the negatives both train on)")
        st_model = os.path.join(work_dir, "st-reranker")
        base = plain_hf_folder(rb.base_model(), work_dir)
        fit = spawn(
            "st CrossEncoder fit",
            f"child_st_fit({work_dir!r}, {base!r}, {mined!r}, {st_model!r}, {seq}, {args.loss!r})",
        )
        training["sentence-transformers CrossEncoder fit"] = fit
        if "error" not in fit:
            out = os.path.join(work_dir, "st-reranker-rankings.npy")
            score = spawn(
                "st CrossEncoder predict", f"child_st_score({work_dir!r}, {st_model!r}, {candidates!r}, {out!r}, {seq})"
            )
            rerank_results("sentence-transformers CrossEncoder", score, out)

    report = {
        "task": {
            "data": "scripts/debian_retrieval.py on this machine's apt lists, retrieval_bench.py's work folder",
            "first_stage": first_name,
            "reranker": args.reranker,
            "top": args.top,
            "test_queries": len(order),
            "train_queries": args.train_queries,
            "negatives": args.negatives,
            "loss": args.loss,
            "max_seq_length": seq,
            "epochs": EPOCHS,
            "pairs_per_step": BATCH,
            "learning_rate": LEARNING_RATE,
            "warmup_proportion": WARMUP,
            "base": "all-MiniLM-L6-v2, a new head of one output",
            "kbert_group_by_length": args.group_by_length,
            "kbert_seed": args.seed,
            "relevant_in_candidates": float(np.mean(subset <= args.top)),
        },
        "retrieval": results,
        "training": training,
        "scoring_batch32": scoring,
        "summary": summary(results, training, scoring, first_name),
        "machine": {"cpus": os.cpu_count(), "cpu_flags": record.cpu_flags()},
    }
    record.emit(report, "rerank", args.output)


def summary(results, training, scoring, first_name):
    """Each target's figure against its anchor, measured in this run (absent where either failed)."""
    found = {}
    ours, theirs = results.get("kbert rerank", {}), results.get("sentence-transformers CrossEncoder", {})
    first = results[first_name]
    if "ndcg@10" in ours:
        found["ndcg@10_kbert_minus_first_stage"] = round(ours["ndcg@10"] - first["ndcg@10"], 4)
        if "ndcg@10" in theirs:
            found["ndcg@10_kbert_minus_st"] = round(ours["ndcg@10"] - theirs["ndcg@10"], 4)
    pairs = [
        (
            "train_pairs_per_s_kbert_over_st",
            training,
            "kbert finetune --task rerank",
            "sentence-transformers CrossEncoder fit",
        ),
        ("score_pairs_per_s_kbert_over_st", scoring, "kbert rerank", "sentence-transformers CrossEncoder"),
    ]
    for key, table, a, b in pairs:
        x, y = table.get(a, {}).get("pairs_per_s"), table.get(b, {}).get("pairs_per_s")
        if x and y:
            found[key] = round(x / y, 3)
    return found


if __name__ == "__main__":
    main()
