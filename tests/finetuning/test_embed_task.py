"""`kbert finetune --task embed` and `kbert evaluate` of embedding models: the pairs reader, the
ranking metrics against their definitions and sentence-transformers' InformationRetrievalEvaluator,
the in-batch loss against a hand computation and sentence-transformers' MultipleNegativesRankingLoss,
a fine-tuned model that `kbert embed`, `predict`, `evaluate` and sentence-transformers itself read,
the pooling kept from a sentence-transformers source, an interrupted run resumed, and the refusals.
"""

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import TINY, assert_user_error, kbert_command, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, saved_weights

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers reads local folders only

# Toy retrieval over the tiny vocabulary: a query is two cue words, its document holds each
# one's partner word (a fixed shuffle) among filler, so the model must learn the pairing.
WORDS = POSITIVE + NEGATIVE + FILLER[11:]
PARTNER = dict(zip(WORDS, np.random.default_rng(0).permutation(WORDS).tolist()))
FLAGS = ["--epochs", "4", "--batch-size", "16", "--learning-rate", "1e-3", "--max-seq-length", "16"]


def pair_rows(n, seed, negatives=False):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        words = [str(w) for w in rng.choice(WORDS, size=2, replace=False)]
        document = " ".join([PARTNER[w] for w in words] + [str(rng.choice(FILLER[:11]))]) + "."
        row = [" ".join(words), document]
        if negatives:
            other = [str(w) for w in rng.choice([w for w in WORDS if w not in words], size=2, replace=False)]
            row.append(" ".join([PARTNER[w] for w in other] + [str(rng.choice(FILLER[:11]))]) + ".")
        rows.append(row)
    return rows


def write_pairs(path, rows, header=("query", "document", "negative")):
    with open(path, "w", encoding="utf-8") as f:
        if header:
            f.write("\t".join(header[: len(rows[0])]) + "\n")
        f.writelines("\t".join(row) + "\n" for row in rows)
    return path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    work = tmp_path_factory.mktemp("pairs")
    return (
        write_pairs(work / "train.tsv", pair_rows(256, 0, negatives=True)),
        write_pairs(work / "dev.tsv", pair_rows(64, 1)),
    )


@pytest.fixture(scope="module")
def embed_run(tmp_path_factory, pairs):
    train, dev = pairs
    out = tmp_path_factory.mktemp("embed") / "model"
    result = run_kbert(
        "finetune", TINY, "--task", "embed", "--train", train, "--dev", dev, "--output", out, "--pooling", "mean",
        *FLAGS,
    )  # fmt: skip
    return out, json.loads(result.stdout)


# === The pairs reader ===


def read(path, **kwargs):
    from kbert.finetuning.readers import read_pair_examples

    return read_pair_examples(path, **kwargs)


def test_pairs_are_read_by_header_or_by_position_in_every_format(tmp_path):
    tsv = tmp_path / "named.tsv"
    tsv.write_text('id\tnegative\tdocument\tquery\n7\tA cat.\tTea "leaves".\thow to brew\n')
    examples = read(tsv)
    assert (examples.queries, examples.documents, examples.negatives) == (
        ["how to brew"],
        ['Tea "leaves".'],
        ["A cat."],
    )
    (tmp_path / "bare.tsv").write_text("how to brew\tTea leaves.\n\nsick cat\tCall the vet.\n")
    examples = read(tmp_path / "bare.tsv")
    assert examples.queries == ["how to brew", "sick cat"] and examples.negatives is None and examples.lines == [1, 3]
    (tmp_path / "p.csv").write_text('query,document\n"tea, hot",Brew it.\n')
    assert read(tmp_path / "p.csv").queries == ["tea, hot"]
    (tmp_path / "p.jsonl").write_text(
        '{"query": "tea", "document": "Brew it.", "negative": "A cat."}\n["vet", "Call her.", "Buy tea."]\n'
    )
    examples = read(tmp_path / "p.jsonl")
    assert (examples.queries, examples.negatives, examples.format) == (["tea", "vet"], ["A cat.", "Buy tea."], "jsonl")


def test_bad_rows_name_their_lines_or_are_skipped(tmp_path):
    from kbert.runtime.errors import KbertError

    path = tmp_path / "train.tsv"
    path.write_text("query\tdocument\ntea\tBrew it.\n \tNo query.\nvet\t\nonly one column\ncat\tA pet.\n")
    with pytest.raises(KbertError) as error:
        read(path)
    assert str(error.value).startswith(f"{path}: bad rows at lines 3, 4, 5 (line 3: empty query); fix them, or pass")
    examples = read(path, skip_bad_rows=True)
    assert examples.queries == ["tea", "cat"] and examples.skipped_rows == [3, 4, 5] and examples.lines == [2, 6]
    path.write_text('{"query": "tea", "document": "Brew.", "negative": "Cat."}\n{"query": "vet", "document": "V."}\n')
    with pytest.raises(KbertError, match=r"line 2: no negative, which other rows have"):
        read(path, format="jsonl")


@pytest.mark.parametrize(
    "content,said",
    [
        ("just one column\nanother\n", "one column; a pairs file holds a query and a document per row"),
        ("a\tb\tc\td\n", "4 columns and no header"),
        ("query\ttext\ntea\tBrew.\n", "names query but not both query and document"),
        ("query\tdocument\n", "has a header but no rows"),
    ],
    ids=["one-column", "four-columns", "half-a-header", "header-only"],
)
def test_files_of_another_shape_are_one_line(tmp_path, content, said):
    from kbert.runtime.errors import KbertError

    path = tmp_path / "pairs.tsv"
    path.write_text(content)
    with pytest.raises(KbertError, match=said):
        read(path)


def test_a_header_of_other_column_names_is_skipped_not_trained_on(tmp_path):
    rows = "How do I brew tea?\tPut the kettle on.\nMy cat is sick.\tCall the vet.\n"
    for header, want in [
        ("question\tanswer\n", ["How do I brew tea?", "My cat is sick."]),  # named: read by its names
        ("answer\tquestion\n", ["Put the kettle on.", "Call the vet."]),
        ("anchor\tpositive\n", ["How do I brew tea?", "My cat is sick."]),  # sentence-transformers' names
        ("q\td\n", ["How do I brew tea?", "My cat is sick."]),  # short names above longer rows
        ("sentence1\tsentence2\n", ["How do I brew tea?", "My cat is sick."]),  # another file's names
    ]:
        (tmp_path / "pairs.tsv").write_text(header + rows)
        examples = read(tmp_path / "pairs.tsv")
        assert examples.queries == want and examples.lines == [2, 3], header
    # Without one, the first row is a pair like the others.
    (tmp_path / "pairs.tsv").write_text("tea\tBrew it.\n" + rows)
    assert read(tmp_path / "pairs.tsv").queries == ["tea", "How do I brew tea?", "My cat is sick."]


@pytest.mark.parametrize(
    "content,said",
    [
        ("text\tlabel\ngold fresh.\tpos\ndead dust.\tneg\n", "its header (text, label) names a label column"),
        (
            "".join(f"text number {i}.\t{'pos' if i % 2 else 'neg'}\n" for i in range(20)),
            "its 20 documents take only 2 distinct one-word values (neg, pos), as a label column does: it does not "
            "look like pairs",
        ),
    ],
    ids=["classify-header", "classify-without-header"],
)
def test_a_classify_file_given_as_pairs_is_refused(tmp_path, content, said):
    from kbert.runtime.errors import KbertError

    path = tmp_path / "train.tsv"
    path.write_text(content)
    with pytest.raises(KbertError, match=re.escape(said)):
        read(path)


def test_evaluate_says_which_columns_it_read(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("q\td\n" + "".join(f"{q}\t{d}\n" for q, d in pair_rows(8, 3)))
    result = run_kbert("evaluate", TINY, "--input", path, "--task", "embed", "--pooling", "mean")
    assert json.loads(result.stdout)["examples"] == 8
    said = f"{path}: line 1 (q, d) is a header; read the query from column 1 and the document from column 2"
    assert said in result.stderr, result.stderr


# === Ranking metrics: the definitions, and sentence-transformers' evaluator ===


def test_ranking_metrics_on_a_ranking_worked_by_hand():
    from kbert.finetuning.metrics import ranking_metrics, top_documents

    # Query 0: its document (3) second. Query 1: documents 0 and 4 relevant, ranked 1st and 12th.
    # Query 2: its document (5) 11th, past every cut-off.
    ranked = [[1, 3, 0, 2], [0] + [i for i in range(1, 12) if i != 4] + [4], [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]]
    metrics = ranking_metrics(ranked, [{3}, {0, 4}, {5}])
    ndcg_0 = 1 / np.log2(3)  # one relevant document, at rank 2
    ndcg_1 = 1 / (1 + 1 / np.log2(3))  # at rank 1 of two relevant ones; the ideal has both first
    assert metrics == pytest.approx(
        {
            "recall@1": (0 + 1 / 2 + 0) / 3,
            "recall@10": (1 + 1 / 2 + 0) / 3,
            "mrr@10": (1 / 2 + 1 + 0) / 3,
            "ndcg@10": (ndcg_0 + ndcg_1 + 0) / 3,
        },
        abs=1e-12,
    )
    # Equal scores rank in document order.
    assert top_documents([[0.5, 0.7, 0.5, 0.7]], k=4).tolist() == [[1, 3, 0, 2]]


def test_ranking_metrics_are_information_retrieval_evaluators():
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from kbert.finetuning.metrics import ranking_metrics, top_documents

    rng = np.random.default_rng(3)
    scores = np.round(rng.normal(size=(40, 30)), 1)  # rounded: ties occur
    relevant = [set(rng.choice(30, size=int(rng.integers(1, 4)), replace=False).tolist()) for _ in range(40)]
    ids = [f"d{j:03d}" for j in range(30)]  # ids in document order: the evaluator breaks ties by id
    evaluator = InformationRetrievalEvaluator(
        {f"q{i}": "" for i in range(40)},
        dict.fromkeys(ids, ""),
        {f"q{i}": {ids[j] for j in r} for i, r in enumerate(relevant)},
    )
    hits = [[{"corpus_id": ids[j], "score": float(s)} for j, s in enumerate(row)] for row in scores]
    theirs = evaluator.compute_metrics(hits)
    ours = ranking_metrics(top_documents(scores), relevant)
    assert ours == pytest.approx(
        {
            "recall@1": theirs["recall@k"][1],
            "recall@10": theirs["recall@k"][10],
            "mrr@10": theirs["mrr@k"][10],
            "ndcg@10": theirs["ndcg@k"][10],
        },
        abs=1e-12,
    )


# === The loss: a hand computation, and sentence-transformers' MultipleNegativesRankingLoss ===


def test_the_in_batch_loss_is_multiple_negatives_ranking_loss(tmp_path):
    import torch
    from sentence_transformers import SentenceTransformer, models
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    import kbert
    from kbert.finetuning.encoding import encode_texts
    from kbert.finetuning.ranking import InBatchNegatives, PairRanker
    from kbert.model.pooling import pool
    from kbert.text.graph_packer import BertPreprocessor

    base = kbert.converters.load_tf1_checkpoint(TINY)
    ranker = PairRanker(base.encoder, "mean", negatives=True)
    rows = pair_rows(6, 5, negatives=True)
    preprocessor = BertPreprocessor(os.path.join(TINY, "vocab.txt"), True, 16)
    features, raw = {}, {}
    for k, side in enumerate(("query", "document", "negative")):
        encoded, _ = encode_texts(preprocessor, [row[k] for row in rows])
        features.update({f"{side}_{name}": v for name, v in encoded.items()})
        tokens = base.encoder(encoded, training=False)["sequence_output"]
        raw[side] = np.asarray(pool(tokens, encoded["input_mask"], "mean"), np.float64)
    ours = float(InBatchNegatives()(np.zeros(6), ranker(features, training=False)["logits"]))

    # By hand: 20 * cosine of each query with the 6 documents then the 6 negatives; -log softmax at i.
    unit = {side: v / np.linalg.norm(v, axis=1, keepdims=True) for side, v in raw.items()}
    logits = 20 * unit["query"] @ np.concatenate([unit["document"], unit["negative"]]).T
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert ours == pytest.approx(-np.mean(np.diag(log_softmax)), rel=1e-5)

    # sentence-transformers' own loss on the same vectors (a real model holds it; it is not called).
    hf_model = SentenceTransformer(
        modules=[models.Transformer(os.path.join(os.path.dirname(TINY), "hf-tiny")), models.Pooling(64)], device="cpu"
    )
    loss = MultipleNegativesRankingLoss(hf_model)  # scale 20, cosine
    theirs = loss.compute_loss_from_embeddings([torch.tensor(raw[s]) for s in ("query", "document", "negative")], None)
    assert ours == pytest.approx(float(theirs), rel=1e-5)


# === A fine-tuned embedding model ===


def test_finetune_embed_learns_and_writes_an_embedding_model(embed_run, pairs):
    out, result = embed_run
    config = json.loads((out / "bert_config.json").read_text())
    assert config["kbert_model"] == "encoder" and config["task"] == "embed"
    assert config["embedding"] == {"pooling": "mean", "normalize": False, "max_seq_length": 16}
    history = json.loads((out / "eval_results.json").read_text())["history"]
    assert [row["epoch"] for row in history] == [1, 2, 3, 4] and "dev_ndcg@10" in history[0]
    # Better than the pretrained model ranks the same dev file with the same pooling.
    before = json.loads(run_kbert("evaluate", TINY, "--input", pairs[1], "--task", "embed", "--pooling", "mean").stdout)
    assert result["ndcg@10"] > before["ndcg@10"] + 0.1, (result, before)
    assert set(result) >= {"recall@1", "recall@10", "mrr@10", "ndcg@10", "epoch"}


def test_the_model_embeds_predicts_and_evaluates_with_no_flags(embed_run, pairs, tmp_path):
    out, result = embed_run
    texts = tmp_path / "texts.txt"
    texts.write_text("gold dust.\nthe camp at dim morning.\n")
    embedded = [json.loads(line) for line in run_kbert("embed", out, "--input", texts).stdout.splitlines()]
    predicted = [json.loads(line) for line in run_kbert("predict", out, "--input", texts).stdout.splitlines()]
    assert predicted == embedded and len(embedded[0]["embedding"]) == 64
    scores = json.loads(run_kbert("evaluate", out, "--input", pairs[1]).stdout)
    assert scores["examples"] == 64 and scores["documents"] == 64
    assert {k: scores[k] for k in ("recall@1", "recall@10", "mrr@10", "ndcg@10")} == pytest.approx(
        {k: result[k] for k in ("recall@1", "recall@10", "mrr@10", "ndcg@10")}, abs=1e-6
    )


def test_sentence_transformers_ranks_the_converted_model_as_kbert_evaluate(embed_run, pairs, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    out, _ = embed_run
    run_kbert("convert", "to-hf", out, tmp_path / "st")
    rows = [line.split("\t") for line in pairs[1].read_text().splitlines()[1:]]
    rows[5][1] = rows[2][1]  # a document twice: one corpus entry, relevant to both queries
    dev = write_pairs(tmp_path / "dev.tsv", rows)
    corpus = {text: f"d{i:03d}" for i, text in enumerate(dict.fromkeys(row[1] for row in rows))}
    queries = {text: f"q{i:03d}" for i, text in enumerate(dict.fromkeys(row[0] for row in rows))}
    relevant = {}
    for query, document in rows:
        relevant.setdefault(queries[query], set()).add(corpus[document])
    evaluator = InformationRetrievalEvaluator(
        {i: text for text, i in queries.items()}, {i: text for text, i in corpus.items()}, relevant, write_csv=False
    )
    theirs = evaluator(SentenceTransformer(str(tmp_path / "st"), device="cpu"))
    ours = json.loads(run_kbert("evaluate", out, "--input", dev).stdout)
    assert (ours["documents"], ours["queries"]) == (len(corpus), len(queries)) and len(corpus) < len(rows)
    for name, key in (
        ("recall@1", "recall@1"),
        ("recall@10", "recall@10"),
        ("mrr@10", "mrr@10"),
        ("ndcg@10", "ndcg@10"),
    ):
        assert ours[name] == pytest.approx(theirs[f"cosine_{key}"], abs=1e-5), name


def test_a_sentence_transformers_source_keeps_its_pooling(tmp_path, pairs):
    from test_embed import tiny_sentence_transformer

    source = tiny_sentence_transformer(tmp_path / "st", "cls", normalize=True, max_seq_length=24)
    train = write_pairs(tmp_path / "train.tsv", pair_rows(32, 2))
    for flags, want in (
        ([], {"pooling": "cls", "normalize": True, "max_seq_length": 24}),
        (["--no-normalize", "--max-seq-length", "12"], {"pooling": "cls", "normalize": False, "max_seq_length": 12}),
    ):
        out = tmp_path / f"out{len(flags)}"
        result = run_kbert(
            "finetune", source, "--task", "embed", "--train", train, "--output", out, "--epochs", "1",
            "--batch-size", "16", *flags,
        )  # fmt: skip
        assert json.loads((out / "bert_config.json").read_text())["embedding"] == want
        # The length every later command reads texts at is said: in the result, and where it is not the source's.
        assert json.loads(result.stdout)["max_seq_length"] == want["max_seq_length"]
        shorter = (
            f"{source} embeds texts of up to 24 tokens; the fine-tuned model records --max-seq-length 12, its "
            "training length, so kbert embed, predict, evaluate and export keep 12 tokens of a text unless given "
            "another --max-seq-length"
        )
        assert (shorter in result.stderr) == bool(flags), result.stderr


# === Refusals ===


def test_refusals_are_one_line(tmp_path, pairs, tiny_model_dir):
    train = pairs[0]
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "embed", "--train", train, "--output", tmp_path / "o", check=False
    )
    assert_user_error(result, "records no sentence-embedding pooling", "--pooling cls|mean|max|mean_sqrt_len")
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--pooling", "mean", "--train", train,
        "--output", tmp_path / "o",
        check=False,
    )  # fmt: skip
    assert_user_error(result, "--pooling applies to --task embed; drop it for --task classify")
    result = run_kbert("evaluate", tiny_model_dir, "--input", pairs[1], "--task", "embed", check=False)
    assert_user_error(result, "records no sentence-embedding pooling", "pass --pooling cls|mean|max|mean_sqrt_len")
    result = run_kbert("evaluate", tiny_model_dir, "--input", pairs[1], "--task", "classify", check=False)
    assert_user_error(result, "has no classify head to score", "--task embed")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


# === --group-by-length ===


def test_group_by_length_batches_rows_of_like_lengths_from_the_shuffle():
    from kbert.backend.portable import MEGA_BATCH, length_grouped

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 65, size=1000)
    mask = (np.arange(64) < lengths[:, None]).astype("int32")
    order = rng.permutation(1000)
    grouped = length_grouped(order, {"input_mask": mask}, batch_size=8, seed=3)
    assert sorted(grouped.tolist()) == list(range(1000))
    batches = grouped[:1000].reshape(-1, 8)
    mega = {int(i): position // (MEGA_BATCH * 8) for position, i in enumerate(order)}
    spread = []
    for batch in batches:
        assert len({mega[int(i)] for i in batch}) == 1  # one run of the shuffle's rows
        spread.append(lengths[batch].max() - lengths[batch].min())
    # Sorted within 400 rows of lengths 1..64: neighbours differ by a token or so; shuffled, by ~50.
    assert np.mean(spread) < 3 and np.mean([np.ptp(lengths[b]) for b in order.reshape(-1, 8)]) > 40
    assert not np.array_equal(grouped, length_grouped(order, {"input_mask": mask}, batch_size=8, seed=4))
    # rerank's groups ([rows, documents, tokens]) count their longest document, and each text adds its own.
    groups = np.zeros((3, 2, 8), "int32")
    groups[0, 1, :6] = groups[1, 0, :2] = groups[2, 1, :4] = 1
    queries = (np.arange(8) < np.array([[1], [7], [1]])).astype("int32")
    features = {"document_input_mask": groups, "query_input_mask": queries}
    assert length_grouped(np.arange(3), features, batch_size=3, seed=0).tolist() == [1, 0, 2]  # longest 7, 6, 4
    # Sorted by the longest text (each text is cut to its own longest in the batch), ties by all texts' tokens:
    # (query, document) tokens (6, 2), (1, 7), (5, 1), (1, 6), where adding them would put row 0 first.
    queries, documents = ((np.arange(8) < np.array(n)[:, None]).astype("int32") for n in ([6, 1, 5, 1], [2, 7, 1, 6]))
    features = {"query_input_mask": queries, "document_input_mask": documents}
    assert length_grouped(np.arange(4), features, batch_size=4, seed=0).tolist() == [1, 0, 3, 2]


@pytest.mark.parametrize("engine, multiple", [("tensorflow", 8), ("portable", 16), ("portable", 8)])
def test_group_by_length_cuts_each_batch_to_its_like_lengths(engine, multiple):
    """Both engines' epochs (tf.data's, and the numpy batches of JAX, 16 tokens a step, and PyTorch,
    8): a batch of short texts is cut short, the same rows come in the same order, and a resumed
    epoch skips alike."""
    from kbert.backend import portable, tensorflow
    from kbert.finetuning.options import FinetuneOptions
    from kbert.finetuning.tasks.base import TaskData

    lengths = np.random.default_rng(1).integers(2, 129, size=256)
    mask = (np.arange(128) < lengths[:, None]).astype("int32")
    features = {"document_input_ids": mask * 7, "document_input_mask": mask, "document_segment_ids": 0 * mask}
    data = TaskData(features, {"logits": np.arange(256)}, None, 256, trim_batches=True)
    opts = FinetuneOptions(batch_size=16, group_by_length=True)
    if engine == "tensorflow":
        epoch_data = tensorflow.epoch_batches(data, opts)
    else:
        epoch_data = portable.epoch_batches(data, opts, trim_multiple=multiple)
    widths, rows = [], []
    for features, targets in epoch_data(1, 0):
        got = np.asarray(targets["logits"])
        widths.append(np.asarray(features["document_input_mask"]).shape[1])
        assert widths[-1] == -(-lengths[got].max() // multiple) * multiple
        rows.append(got)
    assert sorted(np.concatenate(rows).tolist()) == list(range(256))
    assert np.mean(widths) < 0.7 * 128  # ungrouped, nearly every batch of 16 holds a text near 128
    skipped = [np.asarray(targets["logits"]) for _, targets in epoch_data(1, 3)]
    assert all(np.array_equal(a, b) for a, b in zip(skipped, rows[3:])) and len(skipped) == 13
    if engine == "portable":  # the same order from either engine: the shuffle is each backend's own
        assert np.array_equal(np.concatenate(rows), portable.epoch_order(data, opts, 1))


def test_finetune_embed_learns_with_group_by_length(tmp_path, pairs):
    train, dev = pairs
    out = tmp_path / "model"
    flags = ["--task", "embed", "--pooling", "mean", "--train", train, "--dev", dev, *FLAGS]
    result = json.loads(run_kbert("finetune", TINY, "--output", out, *flags, "--group-by-length").stdout)
    before = json.loads(run_kbert("evaluate", TINY, "--input", dev, "--task", "embed", "--pooling", "mean").stdout)
    # Grouped, a batch's negatives are texts of its own length: harder, and on these near-equal
    # toy texts slower to learn from than the shuffle's (the real task's result: docs/embeddings.md).
    assert result["ndcg@10"] > before["ndcg@10"] + 0.05, (result, before)
    assert json.loads((out.parent / "model" / "eval_results.json").read_text())["history"][-1]["epoch"] == 4
    refused = run_kbert(
        "finetune", TINY, "--task", "classify", "--group-by-length", "--train", train, "--output", tmp_path / "c",
        check=False,
    )  # fmt: skip
    assert_user_error(
        refused, "--group-by-length applies to --task embed or --task rerank; drop it for --task classify"
    )


def test_a_grouped_run_that_recorded_no_length_order_is_not_resumed_in_another(tmp_path, pairs):
    """A --group-by-length run of the release that sorted rows by all their texts' tokens added
    (its state records no `length_order`) is refused, not continued in this release's order."""
    train, _ = pairs
    (tmp_path / "model.partial").mkdir()
    (tmp_path / "model.partial" / "state.json").write_text(
        json.dumps({"step": 2, "fingerprint": {"group_by_length": True}})
    )
    flags = ["--task", "embed", "--pooling", "mean", "--train", train, *FLAGS, "--group-by-length", "--resume"]
    refused = run_kbert("finetune", TINY, "--output", tmp_path / "model", *flags, check=False)
    assert_user_error(
        refused,
        f"--resume: the run in {tmp_path / 'model.partial'} was started by an earlier kbert, whose --group-by-length "
        "batched the rows in another order; finish it with that release, or --overwrite to start over",
        alone=False,  # after what reading the model and the pairs said
    )


# === Interrupted and resumed ===


@pytest.mark.slow
def test_sigterm_then_resume_ends_as_the_uninterrupted_run(tmp_path, pairs, embed_run):
    train, dev = pairs
    flags = ["--task", "embed", "--pooling", "mean", "--train", train, "--dev", dev, *FLAGS, "--save-every", "4"]
    reference = embed_run[0]  # the same flags but --save-every, which must not change the result either
    out = tmp_path / "model"
    command = [*kbert_command(), "finetune", str(TINY), "--output", str(out), *map(str, flags)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state, deadline = out.with_name("model.partial") / "state.json", time.monotonic() + 300
    while not state.exists() or json.loads(state.read_text() or "{}").get("step", 0) < 20:  # in epoch 2 (steps 17-32)
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143 and "--resume" in stderr.strip().splitlines()[-1], stderr[-2000:]
    run_kbert("finetune", TINY, "--output", out, *flags, "--resume")  # in this process: no signal reaches it
    ours, want = saved_weights(out), saved_weights(reference)  # an encoder's 39 arrays
    assert ours.keys() == want.keys() and len(ours) == 39
    assert max(float(np.abs(ours[k] - want[k]).max()) for k in ours) <= 1e-6
    ours, want = (json.loads((p / "eval_results.json").read_text()) for p in (out, reference))
    assert ours["best"]["epoch"] == want["best"]["epoch"]
    assert len(ours["history"]) == len(want["history"]) == 4
    for a, b in zip(ours["history"], want["history"]):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-6) for k in a)
