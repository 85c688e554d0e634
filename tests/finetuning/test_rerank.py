"""`kbert finetune --task rerank`, `kbert rerank`, `kbert.rerank` and `kbert evaluate` of rerankers:
the files read, the metrics against sentence-transformers' CrossEncoderRerankingEvaluator and
scikit-learn, the losses against PyTorch's and sentence-transformers' arithmetic, a model trained
with each loss, its rankings streamed, resumed and equal in every way of asking.
"""

import json
import os
import re
import signal
import subprocess

import numpy as np
import pytest

from conftest import TINY, assert_user_error, kbert_command, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, stop_mid_run
from kbert.finetuning.output import partial_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers reads local folders only

# Toy retrieval over the tiny vocabulary: a query is two cue words; its relevant document holds
# them and a word of praise, among filler; the others hold other words and a word of blame. A
# cross-encoder sees both texts at once, so it can learn both signs.
WORDS = FILLER[11:]
FLAGS = ["--epochs", "3", "--batch-size", "8", "--learning-rate", "1e-3", "--max-seq-length", "24"]


def document_for(words, rng, relevant=True):
    sign = str(rng.choice(POSITIVE if relevant else NEGATIVE))
    filler = str(rng.choice(FILLER[:11]))
    return " ".join(rng.permutation([filler, sign, *words]).tolist()) + "."


def groups(n, seed, negatives=3):
    """[(query, relevant document, [negatives])]."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        words = [str(w) for w in rng.choice(WORDS, size=2, replace=False)]
        others = [
            document_for(
                [str(w) for w in rng.choice([w for w in WORDS if w not in words], 2, replace=False)], rng, False
            )
            for _ in range(negatives)
        ]
        rows.append((" ".join(words), document_for(words, rng), others))
    return rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    work = tmp_path_factory.mktemp("rerank")
    train = groups(96, 0)
    with open(work / "groups.tsv", "w") as f:
        f.write("query\tpositive\tnegative_1\tnegative_2\tnegative_3\tteacher\n")
        for query, document, negatives in train:
            f.write("\t".join([query, document, *negatives, "6.0 1.0 0.5 -1.0"]) + "\n")
    with open(work / "pairs.jsonl", "w") as f:
        for query, document, negatives in train:
            f.write(json.dumps({"query": query, "document": document, "label": 1}) + "\n")
            f.writelines(json.dumps({"query": query, "document": n, "label": 0.0}) + "\n" for n in negatives)
    # Candidate lists in a first stage's order: the relevant document third of six.
    with open(work / "candidates.jsonl", "w") as f:
        for query, document, negatives in groups(24, 1, negatives=5):
            documents = [*negatives[:2], document, *negatives[2:]]
            f.write(json.dumps({"query": query, "documents": documents, "positive": [document]}) + "\n")
    return work


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    """The tiny checkpoint, converted once for the session (read, never written)."""
    return tiny_model_dir


@pytest.fixture(scope="module")
def reranker(base, files, tmp_path_factory):
    """A reranker trained on groups with the default loss (bce), and its run's result."""
    out = tmp_path_factory.mktemp("trained") / "bce"
    result = run_kbert(
        "finetune", base, "--task", "rerank", "--train", files / "groups.tsv", "--dev", files / "candidates.jsonl",
        "--output", out, *FLAGS,
    )  # fmt: skip
    return out, json.loads(result.stdout)


def candidate_rows(files):
    return [json.loads(line) for line in open(files / "candidates.jsonl")]


# === Reading ===


def test_groups_pairs_and_teacher_scores_are_read_as_written(files):
    from kbert.finetuning.rerank_files import read_rerank_examples

    grouped = read_rerank_examples(files / "groups.tsv", teacher_scores="teacher")
    query, document, negatives = groups(96, 0)[5]
    assert grouped.grouped and grouped.queries[5] == query
    assert grouped.groups[5] == [document, *negatives]  # negative_1, _2, _3 in their numbers' order
    assert grouped.labels[5] == [1.0, 0.0, 0.0, 0.0]
    assert grouped.teacher[5] == [6.0, 1.0, 0.5, -1.0]
    pairs = read_rerank_examples(files / "pairs.jsonl")
    assert not pairs.grouped and pairs.teacher is None
    assert pairs.groups[:2] == [[groups(96, 0)[0][1]], [groups(96, 0)[0][2][0]]]
    assert pairs.labels[:2] == [[1.0], [0.0]]


def test_jsonl_groups_hold_their_negatives_as_a_list(tmp_path):
    from kbert.finetuning.rerank_files import read_rerank_examples

    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"anchor": "q", "positive": "d", "negatives": ["n1", "n2"], "s": [3, 1, 0]}) + "\n")
    examples = read_rerank_examples(path, teacher_scores="s")
    assert examples.groups == [["d", "n1", "n2"]] and examples.teacher == [[3.0, 1.0, 0.0]]


@pytest.mark.parametrize(
    "row,why",
    [
        ({"query": "q", "document": "d", "label": 1.5}, "label 1.5"),
        ({"query": "q", "document": "d", "label": "yes"}, "not a number"),
        ({"query": "q", "document": "", "label": 1}, "empty document"),
    ],
)
def test_a_bad_pair_names_its_line_and_why(tmp_path, row, why):
    from kbert.finetuning.rerank_files import read_rerank_examples
    from kbert.runtime.errors import KbertError

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"query": "q", "document": "d", "label": 1}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(KbertError, match=f"line 2 .*{why}"):
        read_rerank_examples(path)
    assert len(read_rerank_examples(path, skip_bad_rows=True)) == 1


def test_teacher_scores_need_one_per_document(tmp_path):
    from kbert.finetuning.rerank_files import read_rerank_examples
    from kbert.runtime.errors import KbertError

    path = tmp_path / "g.tsv"
    path.write_text("query\tdocument\tnegative\tt\nq\td\tn\t1.0\n")
    with pytest.raises(KbertError, match="1 numbers; give one finite score per document \\(2\\)"):
        read_rerank_examples(path, teacher_scores="t")


# === Metrics ===


def test_ties_are_scored_as_scikit_learn_scores_them():
    from sklearn.metrics import average_precision_score, ndcg_score

    from kbert.finetuning.reranking import average_precision, ndcg

    rng = np.random.default_rng(0)
    for trial in range(500):
        n = int(rng.integers(2, 30))
        relevant = rng.integers(0, 2, n).astype(float)
        if not relevant.any():
            continue
        scores = rng.integers(0, 4, n).astype(float) if trial % 2 else rng.normal(size=n)
        assert average_precision(relevant, scores) == pytest.approx(
            average_precision_score(relevant, scores), abs=1e-12
        )
        assert ndcg(relevant, scores, 10) == pytest.approx(ndcg_score([relevant], [scores], k=10), abs=1e-12)


def test_candidate_metrics_are_cross_encoder_reranking_evaluators(files):
    """The same candidate lists, the same scores (a real CrossEncoder's): kbert's metrics before and
    after reranking are the evaluator's, with always_rerank_positives=False (the reranker orders
    what the first stage found)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    from kbert.finetuning.rerank_files import read_candidate_lists
    from kbert.finetuning.tasks.rerank import candidate_scores

    samples = candidate_rows(files)
    # One query whose relevant document the first stage missed, one with two relevant documents.
    samples[0] = dict(samples[0], positive=["a document nobody found."])
    samples[1] = dict(samples[1], positive=[samples[1]["documents"][0], samples[1]["documents"][4]])
    path = files.parent / "evaluator-candidates.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    model = CrossEncoder(os.path.join(os.path.dirname(TINY), "hf-tiny"), num_labels=1)
    evaluator = CrossEncoderRerankingEvaluator(samples, always_rerank_positives=False, write_csv=False)
    expected = evaluator(model)
    scores = [model.predict([[s["query"], d] for d in s["documents"]]) for s in samples]
    got = candidate_scores(read_candidate_lists(path, require_positives=True), scores)
    for name in ("map", "mrr@10", "ndcg@10", "base_map", "base_mrr@10", "base_ndcg@10"):
        assert got[name] == pytest.approx(expected[name], abs=1e-9), name
    assert got["queries"] == len(samples)


# === Losses ===


def test_losses_are_pytorch_and_sentence_transformers_arithmetic():
    import torch

    from kbert.finetuning.reranking import loss_of

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 3)).astype(np.float32)
    labels = np.array([[1, 0, 0]] * 4, np.float32)
    teacher = rng.normal(size=(4, 3)).astype(np.float32)
    t_logits = torch.tensor(logits)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(t_logits, torch.tensor(labels))
    listwise = torch.nn.functional.cross_entropy(t_logits, torch.zeros(4, dtype=torch.long))
    # MarginMSELoss: the positive's logit less each negative's, against the teacher's margins.
    t_teacher = torch.tensor(teacher)
    margin = torch.nn.MSELoss()(
        t_logits[:, 0].unsqueeze(1) - t_logits[:, 1:], t_teacher[:, 0].unsqueeze(1) - t_teacher[:, 1:]
    )
    for name, target, expected in (
        ("bce", labels, bce),
        ("listwise", labels, listwise),
        ("margin-mse", teacher, margin),
    ):
        got = float(loss_of(name)(target, logits))
        assert got == pytest.approx(float(expected), abs=1e-6), name


def test_pairs_scored_in_chunks_of_like_lengths_train_as_one_batch_does():
    """Training steps of whole groups (pairs of unlike lengths; a batch of fewer pairs than
    chunks) move every weight as the same steps on each batch scored at once: the chunks change
    what is computed, not the loss or its gradient (dropout off, so both see the same model)."""
    import keras

    import kbert
    from kbert.finetuning.reranking import LENGTH_CHUNKS, GroupScorer, loss_of

    config = kbert.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    rng = np.random.default_rng(0)

    def batch(queries, documents, seq=40):
        mask = (np.arange(seq) < rng.integers(3, seq + 1, (queries, documents))[..., None]).astype("int32")
        labels = np.zeros((queries, documents), "float32")
        labels[:, 0] = 1
        return {"input_ids": rng.integers(5, 100, mask.shape).astype("int32") * mask, "input_mask": mask,
                "segment_ids": np.zeros_like(mask)}, {"logits": labels}  # fmt: skip

    batches = [batch(8, 4), batch(1, 2), batch(3, 4, seq=16)]
    trained = {}
    for chunks in (1, LENGTH_CHUNKS):
        keras.utils.set_random_seed(0)
        scorer = kbert.bert_classifier(config, 1, dropout=0.0)
        model = GroupScorer(scorer, chunks=chunks)
        initial = [keras.ops.convert_to_numpy(v) for v in scorer.weights]
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss={"logits": loss_of("bce")}, jit_compile=False)
        losses = [model.train_on_batch(x, y, return_dict=True)["loss"] for x, y in batches]
        trained[chunks] = losses, [keras.ops.convert_to_numpy(v) for v in scorer.weights]
    (whole_losses, whole), (chunked_losses, chunked) = trained[1], trained[LENGTH_CHUNKS]
    np.testing.assert_allclose(chunked_losses, whole_losses, atol=1e-6)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, chunked)) < 1e-6
    assert max(float(np.abs(a - b).max()) for a, b in zip(initial, chunked)) > 1e-3  # the steps moved it


# === Training and ranking ===


def test_a_trained_reranker_beats_the_first_stage_and_records_its_task(reranker, files):
    out, result = reranker
    assert result["ndcg@10"] > result["base_ndcg@10"] + 0.1, result
    assert result["queries"] == 24 and result["documents"] == 144
    config = json.loads((out / "bert_config.json").read_text())
    assert (config["kbert_model"], config["task"], config["activation"]) == ("classifier", "rerank", "sigmoid")


def test_truncation_counts_a_groups_pairs(base, files, tmp_path):
    """Each of a group's pairs is packed alone, so the warning counts pairs: 96 groups of 4 make 384."""
    flags = ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "8"]
    result = run_kbert(
        "finetune", base, "--task", "rerank", "--train", files / "groups.tsv", "--output", tmp_path / "o", *flags
    )  # fmt: skip
    truncated = re.search(r"groups\.tsv: (\d+) of (\d+) (\w+) longer than --max-seq-length 8", result.stderr)
    assert truncated and truncated.group(2, 3) == ("384", "pairs"), result.stderr
    assert 96 < int(truncated.group(1)) <= 384


def test_evaluate_gives_the_runs_dev_metrics(reranker, files):
    out, result = reranker
    evaluated = json.loads(run_kbert("evaluate", out, "--input", files / "candidates.jsonl").stdout)
    for name in ("map", "mrr@10", "ndcg@10", "recall@1", "base_ndcg@10", "base_recall@1"):
        assert evaluated[name] == pytest.approx(result[name], abs=1e-6), name


def test_rerank_answers_alike_in_every_way_of_asking(reranker, files, tmp_path):
    """The command's rows, the Python call's answer, predict's rows and another batch size agree;
    the ranking orders the scores; --top-k keeps the first indexes."""
    import kbert

    out, _ = reranker
    rows = [
        json.loads(line)
        for line in run_kbert("rerank", out, "--input", files / "candidates.jsonl").stdout.split("\n")
        if line
    ]
    assert len(rows) == 24
    predicted = [
        json.loads(line)
        for line in run_kbert("predict", out, "--input", files / "candidates.jsonl").stdout.split("\n")
        if line
    ]
    assert predicted == rows
    other_batches = run_kbert("rerank", out, "--input", files / "candidates.jsonl", "--batch-size", "5", "--top-k", "2")
    for row, cut, sample in zip(rows, map(json.loads, other_batches.stdout.split("\n")), candidate_rows(files)):
        assert np.allclose(row["scores"], cut["scores"], atol=1e-6)
        assert row["ranking"] == np.argsort(-np.asarray(row["scores"]), kind="stable").tolist()
        assert cut["ranking"] == row["ranking"][:2]
        asked = kbert.rerank(out, sample["query"], sample["documents"], top_k=2)
        assert np.allclose(asked["scores"], row["scores"], atol=1e-6) and asked["ranking"] == row["ranking"][:2]
    assert all(0 < s < 1 for row in rows for s in row["scores"])  # the recorded sigmoid


@pytest.mark.slow
def test_a_killed_rerank_keeps_its_rows_and_resumes(reranker, files, tmp_path):
    """SIGKILL mid-file: the finished rows stay in FILE.partial; --resume appends the rest, as the
    uninterrupted run wrote them; another --top-k would append other rows, so it is refused."""
    out, _ = reranker
    source = tmp_path / "many.jsonl"
    with open(source, "w") as f:
        for query, document, negatives in groups(3000, 2):
            f.write(json.dumps({"query": query, "documents": [*negatives, document]}) + "\n")
    whole = tmp_path / "whole.jsonl"
    run_kbert("rerank", out, "--input", source, "--output", whole)
    resumed = tmp_path / "resumed.jsonl"
    job = subprocess.Popen(
        kbert_command() + ["rerank", str(out), "--input", str(source), "--output", str(resumed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    written, _, _ = stop_mid_run(job, partial_path(resumed), signal.SIGKILL, 256, 3000)
    refused = run_kbert("rerank", out, "--input", source, "--output", resumed, "--resume", "--top-k", "2", check=False)
    assert_user_error(refused, "--top-k", alone=False)
    result = run_kbert("rerank", out, "--input", source, "--output", resumed, "--resume")
    assert json.loads(result.stdout) == {"output": str(resumed), "rows": 3000, "rows_kept": written}
    rows = [json.loads(line) for line in open(resumed)]
    expected = [json.loads(line) for line in open(whole)]
    assert [r["ranking"] for r in rows] == [r["ranking"] for r in expected]
    assert np.abs(np.array([r["scores"] for r in rows]) - np.array([r["scores"] for r in expected])).max() <= 1e-5


@pytest.mark.parametrize("loss", ["listwise", "margin-mse", "bce-on-pairs"])
def test_each_loss_trains_a_reranker_that_beats_the_first_stage(base, files, tmp_path, loss):
    train = files / ("pairs.jsonl" if loss == "bce-on-pairs" else "groups.tsv")
    extra = {"listwise": ["--loss", "listwise"], "margin-mse": ["--loss", "margin-mse", "--teacher-scores", "teacher"]}
    result = run_kbert(
        "finetune", base, "--task", "rerank", "--train", train, "--dev", files / "candidates.jsonl",
        "--output", tmp_path / "out", *FLAGS, *extra.get(loss, []),
    )  # fmt: skip
    metrics = json.loads(result.stdout)
    assert metrics["ndcg@10"] > metrics["base_ndcg@10"] + 0.1, metrics


# === Serving ===


@pytest.mark.slow
def test_the_export_scores_pairs_as_kbert_rerank_and_the_server_reranks(reranker, files, tmp_path):
    """`kbert export` of a reranker serves `score` from raw (text, text_b) pairs: the tokenizer, the
    pair packing and the activation in the graph. Served by the stand-in server, `kbert predict
    --server` prints `kbert rerank`'s rows (float32: scores to 1e-5) and `Client.rerank` answers
    as `kbert.rerank`; bfloat16 and int8 exports serve the same kind of scores."""
    import kbert
    from helpers import start_standin_server
    from kbert.serving.client import Client

    out, _ = reranker
    local = [
        json.loads(line)
        for line in run_kbert("rerank", out, "--input", files / "candidates.jsonl").stdout.split("\n")
        if line
    ]
    configs = []
    for precision in ("float32", "bfloat16", "int8"):
        run_kbert("export", out, tmp_path / precision, "--precision", precision, "--name", precision)
        configs.append(tmp_path / precision / "models.config")
    process, ready = start_standin_server(configs, tmp_path / "server.log")
    try:
        server = f"127.0.0.1:{ready['grpc_port']}"
        for precision, bound in (("float32", 1e-5), ("bfloat16", 0.05), ("int8", 0.05)):
            remote = run_kbert(
                "predict", "--server", server, "--model", precision, "--input", files / "candidates.jsonl"
            )
            rows = [json.loads(line) for line in remote.stdout.split("\n") if line]
            difference = max(np.abs(np.subtract(r["scores"], mine["scores"])).max() for r, mine in zip(rows, local))
            assert len(rows) == len(local) and difference <= bound, (precision, difference)
            if precision == "float32":
                assert [r["ranking"] for r in rows] == [mine["ranking"] for mine in local]
        sample = candidate_rows(files)[0]
        served = Client(server, "float32").rerank(sample["query"], sample["documents"])
        asked = kbert.rerank(out, sample["query"], sample["documents"])
        assert served["ranking"] == asked["ranking"] and np.allclose(served["scores"], asked["scores"], atol=1e-5)
    finally:
        process.terminate()
        process.wait(timeout=30)


# === The first stage: mined negatives, candidates from an embedding model ===


@pytest.fixture(scope="module")
def embedder(base, tmp_path_factory):
    """The tiny model as a sentence-embedding model: the record kbert convert from-hf writes for a
    sentence-transformers folder (mean pooling, normalised)."""
    import shutil

    out = tmp_path_factory.mktemp("embedder") / "tiny-embed"
    shutil.copytree(base, out)
    config = json.loads((out / "bert_config.json").read_text())
    config["embedding"] = {"pooling": "mean", "normalize": True, "max_seq_length": 24}
    (out / "bert_config.json").write_text(json.dumps(config))
    return out


def test_mined_negatives_are_the_nearest_other_documents_and_train_a_reranker(base, embedder, files, tmp_path):
    """Each pair's negatives are the documents nearest its query by the embedding model's cosine,
    none of them the query's own or a near-duplicate of its document; they are written beside the
    output as a groups file, on which the run repeats: the same reranker, the same metrics.

    Here the nearest documents are other queries' relevant ones, which the tiny model does not
    learn to tell from a query's own in a few steps (its dev score stays near the first stage's):
    that a reranker learns is tested on groups above."""
    import kbert
    from kbert.finetuning.first_stage import NEAR_DUPLICATE

    pairs = files / "positives.tsv"
    rows = groups(96, 0)
    pairs.write_text("query\tdocument\n" + "".join(f"{q}\t{d}\n" for q, d, _ in rows))
    result = run_kbert(
        "finetune", base, "--task", "rerank", "--train", pairs, "--mine-negatives", embedder, "--negatives", "2",
        "--dev", files / "candidates.jsonl", "--output", tmp_path / "out", *FLAGS,
    )  # fmt: skip
    metrics = json.loads(result.stdout)
    # The progress counts groups, each a query with its document and 2 negatives: not sequences.
    assert " examples/s  ETA " in result.stderr and " seq/s" not in result.stderr, result.stderr
    mined = [json.loads(line) for line in open(tmp_path / "out.mined.jsonl")]
    corpus = list(dict.fromkeys(d for _, d, _ in rows))
    vectors = kbert.embed(embedder, corpus)
    queries = kbert.embed(embedder, [q for q, _, _ in rows])
    own = {}
    for q, d, _ in rows:
        own.setdefault(q, set()).add(d)
    assert len(mined) == len(rows)
    for row, query_vector in zip(mined, queries):
        assert len(row["negatives"]) == 2 and not own[row["query"]] & set(row["negatives"])
        positive = vectors[corpus.index(row["document"])]
        allowed = [
            i for i in np.argsort(-(vectors @ query_vector), kind="stable")
            if corpus[i] not in own[row["query"]] and vectors[i] @ positive < NEAR_DUPLICATE
        ]  # fmt: skip
        assert row["negatives"] == [corpus[i] for i in allowed[:2]]
    again = run_kbert(
        "finetune", base, "--task", "rerank", "--train", tmp_path / "out.mined.jsonl",
        "--dev", files / "candidates.jsonl", "--output", tmp_path / "again", *FLAGS,
    )  # fmt: skip
    repeated = json.loads(again.stdout)
    assert {k: repeated[k] for k in metrics if k != "train_examples_per_second"} == {
        k: v for k, v in metrics.items() if k != "train_examples_per_second"
    }


def test_candidates_from_an_embedding_model_are_its_nearest_and_reranked(reranker, embedder, files, tmp_path):
    import kbert

    out, _ = reranker
    corpus = sorted({d for sample in candidate_rows(files) for d in sample["documents"]})
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
    queries = [sample["query"] for sample in candidate_rows(files)]
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps({"query": q}) + "\n" for q in queries))
    result = run_kbert(
        "rerank", out, "--input", tmp_path / "queries.jsonl", "--candidates-from", embedder,
        "--corpus", tmp_path / "corpus.txt", "--k", "5",
    )  # fmt: skip
    rows = [json.loads(line) for line in result.stdout.split("\n") if line]
    document_vectors = kbert.embed(embedder, corpus)
    for query, row, vector in zip(queries, rows, kbert.embed(embedder, queries)):
        assert row["candidates"] == np.argsort(-(document_vectors @ vector), kind="stable")[:5].tolist()
        asked = kbert.rerank(out, query, [corpus[i] for i in row["candidates"]])
        assert np.allclose(asked["scores"], row["scores"], atol=1e-6) and asked["ranking"] == row["ranking"]
