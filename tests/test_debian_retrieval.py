"""scripts/debian_retrieval.py: synopsis -> long description pairs, split by source package.

On a small Packages text written here: no source package has pairs in two splits, a query or a
document that repeats (up to case and spacing) is kept once, the long text is found in
Translation-en by the description's checksum, and the same seed writes the same files.
"""

import csv
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import debian_retrieval  # noqa: E402  (scripts/ is a folder of scripts, not a package)

WORDS = "reads writes converts checks plots serves parses builds tests renders".split()


def stanza(package, synopsis, body, source=None):
    lines = [f"Package: {package}"] + ([f"Source: {source} (1.0-1)"] if source else [])
    lines.append(f"Description: {synopsis}")
    lines += [" " + line if line else " ." for line in body.split("\n")]
    return "\n".join(lines) + "\nSection: misc\n"


def document(source, n):
    # Distinct per source and package, and long enough to pass --min-words.
    return f"The {source} tool number {n} " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(8)) + " files."


@pytest.fixture
def packages(tmp_path):
    """(a Packages file, {query: its source package})."""
    stanzas, sources = [], {}

    def add(package, synopsis, body, source=None):
        stanzas.append(stanza(package, synopsis, body, source))
        sources[" ".join(synopsis.split())] = source or package

    for i in range(40):
        source = f"src{i:02d}"
        add(source, f"{source} main tool", document(source, 0) + "\n\nA second paragraph.")
        add(f"{source}-data", f"{source} data files", document(source, 1), source=source)
    # Another source repeating src03-data's document (case and spaces aside), one another's synopsis.
    add("copycat", "copycat synopsis", document("src03", 1).upper().replace(" ", "  "))
    add("echo", "SRC05   main tool", document("echo", 0))
    add("tiny", "tiny tool", "Too short.")
    path = tmp_path / "Packages"
    path.write_text("\n".join(stanzas), encoding="utf-8")
    return path, sources


def run(args, capsys):
    debian_retrieval.main([str(a) for a in args])
    return json.loads(capsys.readouterr().out)


def read_split(folder, split):
    with open(os.path.join(folder, f"{split}.tsv"), encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))
    assert rows[0] == ["query", "document"]
    return rows[1:]


def key(text):
    return " ".join(text.lower().split())


def test_pairs_are_split_by_source_package_and_deduplicated(packages, tmp_path, capsys):
    path, source_of = packages
    out = tmp_path / "out"
    counts = run([out, "--packages", path, "--test-size", 10, "--dev-size", 5, "--per-source", 2], capsys)
    splits = {split: read_split(out, split) for split in debian_retrieval.SPLITS}
    assert {split: len(rows) for split, rows in splits.items()} == {s: counts[s] for s in debian_retrieval.SPLITS}
    assert counts["test"] == 10 and counts["dev"] in (5, 6)  # whole sources: a source's pairs stay together
    # 83 packages: "tiny" is too short; of src03-data's and copycat's document, and of src05's and echo's
    # synopsis, one is kept.
    assert counts["dropped"] == {"short": 1, "duplicate": 2, "past_per_source": 0}
    assert counts["train"] + counts["dev"] + counts["test"] == 80
    assert counts["sources"] == 43

    splits_of = {}
    for split, rows in splits.items():
        for query, doc in rows:
            assert "\t" not in query + doc and query and doc
            splits_of.setdefault(source_of[query], set()).add(split)
    assert all(len(found) == 1 for found in splits_of.values()), splits_of
    every = [row for rows in splits.values() for row in rows]
    assert len({key(q) for q, _ in every}) == len(every)
    assert len({key(d) for _, d in every}) == len(every)
    # The long text is the description after its synopsis, paragraphs joined on one line.
    assert ["src07 main tool", document("src07", 0) + " A second paragraph."] in every


def test_one_pair_per_source_takes_the_package_named_after_it(packages, tmp_path, capsys):
    path, source_of = packages
    counts = run([tmp_path / "one", "--packages", path, "--test-size", 5, "--dev-size", 5], capsys)
    every = [row for split in debian_retrieval.SPLITS for row in read_split(tmp_path / "one", split)]
    queries = {query for query, _ in every}
    # A source's -data package only where its main package's synopsis was taken by another source:
    # then echo holds "src05 main tool" (up to case); else echo has no pair of its own.
    assert {q for q in queries if q.endswith("data files")} <= {"src05 data files"}
    echo_kept = "src05 data files" in queries
    expected = set(source_of.values()) - {"tiny"} - (set() if echo_kept else {"echo"})
    assert sorted(source_of[query] for query in queries) == sorted(expected)
    assert counts["test"] == 5 and counts["dev"] == 5


def test_the_same_seed_writes_the_same_files_and_another_seed_another_split(packages, tmp_path, capsys):
    path, _ = packages

    def files(folder, seed):
        run([folder, "--packages", path, "--test-size", 10, "--dev-size", 5, "--seed", seed], capsys)
        return {split: (folder / f"{split}.tsv").read_bytes() for split in debian_retrieval.SPLITS}

    first, again, other = files(tmp_path / "a", 0), files(tmp_path / "b", 0), files(tmp_path / "c", 1)
    assert first == again
    assert first["test"] != other["test"]
    assert sum(len(b.splitlines()) for b in first.values()) == sum(len(b.splitlines()) for b in other.values())
    assert not [name for name in os.listdir(tmp_path / "a") if name.endswith(".partial")]


def test_long_descriptions_come_from_translation_en_by_checksum():
    packages = (
        "Package: foo\nSource: foolib (2.0)\nDescription: Foo tool\nDescription-md5: aaa\n\n"
        "Package: bar\nDescription: Bar tool\nDescription-md5: bbb\n\n"
        "Package: foo\nDescription: Foo tool\nDescription-md5: aaa\n"  # the same package in a second list
    )
    translations = (
        "Package: foo\nDescription-md5: old\nDescription-en: Foo tool\n An older text.\n\n"
        "Package: foo\nDescription-md5: aaa\nDescription-en: Foo tool\n Foo does one thing.\n .\n And another.\n\n"
        "Package: bar\nDescription-md5: zzz\nDescription-en: Bar tool\n Bar text.\n"
    )
    assert debian_retrieval.read_pairs(packages, translations) == {
        "foolib": [("foo", "Foo tool", "Foo does one thing. And another.")],
        "bar": [("bar", "Bar tool", "Bar text.")],  # no checksum match: the package's only text
    }


def test_the_retrieval_benchmark_scores_as_scikit_learn_does():
    """benchmarks/retrieval_bench.py's metrics, from each query's rank of its one document."""
    from sklearn.metrics import ndcg_score

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import retrieval_bench

    rng = np.random.default_rng(0)
    n = 60
    # Query i's document is i; scores that rank it first for some queries and far down for others.
    scores = rng.normal(size=(n, n)) + np.diag(rng.uniform(0, 3, n))
    found = retrieval_bench.metrics(retrieval_bench.ranks(scores))
    order = np.argsort(-scores, axis=1)
    rank = np.array([list(order[i]).index(i) + 1 for i in range(n)])
    assert found["ndcg@10"] == pytest.approx(ndcg_score(np.eye(n), scores, k=10), abs=1e-12)
    assert found["recall@1"] == pytest.approx(np.mean(order[:, 0] == np.arange(n)))
    assert found["recall@10"] == pytest.approx(np.mean(rank <= 10))
    assert found["mrr@10"] == pytest.approx(np.mean(np.where(rank <= 10, 1 / rank, 0)))
    # A document scored level with the right one counts as ahead of it.
    assert retrieval_bench.ranks(np.array([[1.0, 1.0], [0.0, 2.0]])).tolist() == [2, 1]


def test_the_rerank_benchmark_ranks_the_relevant_document_where_the_reranker_put_it():
    """benchmarks/rerank_bench.py: a query's rank of its document after its candidates are
    reordered, or its first-stage rank where the candidates missed it."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import rerank_bench

    rng = np.random.default_rng(1)
    n, top = 40, 5
    first = rng.normal(size=(n, n)) + np.diag(rng.uniform(0, 3, n))
    candidates = np.argsort(-first, axis=1, kind="stable")[:, :top]
    base = np.array([list(np.argsort(-first[i], kind="stable")).index(i) + 1 for i in range(n)])
    scores = rng.normal(size=(n, top))
    scores[:3] = 0.5  # level scores keep the first stage's order
    rankings = np.argsort(-scores, axis=1, kind="stable")
    found = rerank_bench.reranked_ranks(candidates, rankings, base)
    for i in range(n):
        row = list(candidates[i])
        if i in row:
            better = sum(s > scores[i, row.index(i)] for s in scores[i])
            level_before = sum(s == scores[i, row.index(i)] for s in scores[i, : row.index(i)])
            assert found[i] == 1 + better + level_before
        else:
            assert found[i] == base[i] > top
    assert 0 < np.sum(found <= top) < n


def test_the_rerank_benchmarks_sentence_transformers_listwise_loss_is_kberts():
    """benchmarks/rerank_bench.py trains sentence-transformers' reranker for `--loss listwise` with
    MultipleNegativesRankingLoss over each group alone: the same softmax cross-entropy over the
    model's own logits of (query, positive) then each (query, negative) as kbert's loss."""
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from kbert.finetuning.reranking import loss_of

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import rerank_bench

    model = CrossEncoder(os.path.join(ROOT, "tests", "fixtures", "hf-tiny"), num_labels=1, device="cpu")
    model.eval()  # no dropout: the loss reads the logits predict gives
    queries = ["how to make tea", "fix a flat tyre", "the city at night"]
    columns = [queries, ["Put the kettle on.", "Patch the tube.", "Lights on the river."]]
    columns += [["Call the vet.", "Bake bread.", "Sing a song."], ["A red car.", "Paint a wall.", "Go to bed."]]
    with torch.no_grad():
        got = float(rerank_bench.st_group_softmax(model)(columns, None))
    pairs = [(q, column[i]) for i, q in enumerate(queries) for column in columns[1:]]
    logits = model.predict(pairs, activation_fn=torch.nn.Identity()).reshape(len(queries), -1)
    assert abs(logits[:, 0] - logits[:, 1]).max() > 1e-4  # the logits differ: the order is checked
    labels = np.zeros(logits.shape, np.float32)
    labels[:, 0] = 1  # each group's first document is the right one
    assert got == pytest.approx(float(loss_of("listwise")(labels, logits.astype(np.float32))), abs=1e-5)


def test_the_forward_benchs_token_count_is_each_trainers_padding(tmp_path):
    """benchmarks/forward_bench.py: the tokens a batch of 4 groups pays for, padded to its longest
    pair (sentence-transformers) and in kbert's runs of like lengths, counted by hand."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import forward_bench

    from conftest import UNCASED_VOCAB
    from kbert.finetuning.reranking import CHUNK_MULTIPLE, LENGTH_CHUNKS

    assert (LENGTH_CHUNKS, CHUNK_MULTIPLE) == (4, 8)  # the hand count below is for these
    # Query "a" (1 token); documents of n words "the"; a pair is 1 + n + 3 tokens, cut to 16.
    sizes = [[2, 20, 4, 9, 1, 3, 5, 2], [1] * 8, [6, 6, 6, 6, 7, 7, 7, 7], [30, 1, 1, 1, 1, 1, 1, 1]]
    with open(tmp_path / "groups.jsonl", "w", encoding="utf-8") as f:
        for row in sizes:
            texts = [" ".join(["the"] * n) for n in row]
            f.write(json.dumps({"query": "a", "document": texts[0], "negatives": texts[1:]}) + "\n")
    found = forward_bench.child_padding(str(tmp_path / "groups.jsonl"), UNCASED_VOCAB, 16, epochs=1)
    lengths = sorted(min(16, n + 4) for row in sizes for n in row)
    assert found["pairs_tokens"] == sum(lengths)
    assert found["sentence_transformers_pays"] == 32 * 16
    # Sorted, 4 runs of 8 pairs: longest 5, 5, 10, 16 tokens; each rounded up to 8.
    assert lengths[7::8] == [5, 5, 10, 16]
    assert found["kbert_pays"] == 8 * (8 + 8 + 16 + 16)
