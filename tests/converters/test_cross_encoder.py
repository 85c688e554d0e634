"""sentence-transformers CrossEncoder folders converted both ways, checked with sentence-transformers itself.

The CrossEncoders are tf1-tiny's Hugging Face copy (hf-tiny) as a BertForSequenceClassification of one
output, built and saved by sentence-transformers with each activation kbert reproduces. `convert
from-hf` (and opening the folder directly) gives a reranker whose `kbert predict` scores are
CrossEncoder.predict's, a document past max_length included; `convert to-hf` of a reranker writes a
folder that CrossEncoder loads with the same activation, max_length and scores. Also: the record of
sentence-transformers before 4, a plain BertForSequenceClassification, and what kbert refuses.
"""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import assert_user_error, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE
from test_embed import HF_TINY

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers reads local folders only

MAX_LENGTH = 32
# Queries of a few words, documents of 1 to 20 and one of 60 words: past MAX_LENGTH, so it is cut.
QUERIES = ["gold fresh", "the dead city", "young camp fire in the morning"]
WORDS = FILLER + POSITIVE + NEGATIVE


def documents(seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(n))) + "." for n in rng.integers(1, 21, size=5)] + [
        " ".join(rng.choice(WORDS, size=60))
    ]


CANDIDATES = [{"query": q, "documents": documents(i)} for i, q in enumerate(QUERIES)]


def torch_activation(name):
    import torch

    return {"sigmoid": torch.nn.Sigmoid, "identity": torch.nn.Identity}[name]()


def tiny_cross_encoder(folder, activation: str, num_labels=1):
    """A CrossEncoder sentence-transformers builds (hf-tiny as a BertForSequenceClassification) and
    saves, with a head whose scores spread (a fresh one's are all near 0)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder(
        HF_TINY,
        num_labels=num_labels,
        max_length=MAX_LENGTH,
        activation_fn=torch_activation(activation),
        device="cpu",
    )
    with torch.no_grad():
        model.model.classifier.weight.normal_(0.0, 0.5)
        model.model.classifier.bias.fill_(0.3)
    model.save(str(folder))
    # hf-tiny's tokenizer.json lacks the ids of vocab.txt's repeated tokens, so kbert reads vocab.txt.
    shutil.copy(os.path.join(HF_TINY, "vocab.txt"), folder)
    return folder


def cross_encoder_scores(folder, expect_activation=None, candidates=CANDIDATES):
    """CrossEncoder.predict's scores of `candidates`, a list per query; checks what it loaded."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu")
    assert model.max_seq_length == MAX_LENGTH
    if expect_activation:
        assert type(model.activation_fn) is type(torch_activation(expect_activation))
    return [model.predict([(row["query"], d) for d in row["documents"]], batch_size=4) for row in candidates]


def kbert_scores(model, tmp_path, candidates=CANDIDATES):
    source = tmp_path / "candidates.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in candidates))
    result = run_kbert("predict", model, "--input", source)
    return [json.loads(line)["scores"] for line in result.stdout.splitlines()]


def largest_difference(ours, theirs):
    assert [len(row) for row in ours] == [len(row) for row in theirs]
    return max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max()) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("activation", ["sigmoid", "identity"])
def test_a_cross_encoder_converts_both_ways_with_its_scores(tmp_path, activation):
    from kbert.formats.sources import open_model

    folder = tiny_cross_encoder(tmp_path / "ce", activation)
    reference = cross_encoder_scores(folder, activation)
    assert np.ptp(np.concatenate(reference)) > 0.05  # scores that differ, so that equal ones say something

    converted = json.loads(run_kbert("convert", "from-hf", folder, tmp_path / "kbert").stdout)
    record = {"activation": activation, "max_seq_length": MAX_LENGTH}
    assert converted["rerank"] == record and converted["fresh_heads"] == []
    config = json.loads((tmp_path / "kbert" / "bert_config.json").read_text())
    assert (config["kbert_model"], config["num_classes"], config["task"]) == ("classifier", 1, "rerank")
    assert {k: config[k] for k in record} == record
    assert largest_difference(kbert_scores(tmp_path / "kbert", tmp_path), reference) <= 1e-5
    # The folder opened directly is the same reranker.
    assert open_model(folder).task_info == {"task": "rerank", **record}
    assert largest_difference(kbert_scores(folder, tmp_path), reference) <= 1e-5
    assert json.loads(run_kbert("convert", "inspect", folder).stdout)["rerank"] == record

    written = json.loads(run_kbert("convert", "to-hf", tmp_path / "kbert", tmp_path / "back").stdout)
    assert written["architecture"] == "BertForSequenceClassification" and written["rerank"] == record
    assert largest_difference(cross_encoder_scores(tmp_path / "back", activation), reference) <= 1e-5
    again = json.loads(run_kbert("convert", "from-hf", tmp_path / "back", tmp_path / "again").stdout)
    assert again["rerank"] == record


def test_a_kbert_reranker_goes_to_a_cross_encoder(tmp_path):
    """A reranker made in kbert (max_seq_length below its positions, no activation) scores in
    CrossEncoder as in kbert predict."""
    import kbert

    run_kbert("convert", "from-hf", HF_TINY, tmp_path / "encoder")
    info = {"task": "rerank", "max_seq_length": MAX_LENGTH, "activation": "identity"}
    reranker = kbert.bert_classifier(kbert.load(tmp_path / "encoder"), 1, task_info=info)
    reranker.head.output_weights.assign(np.random.default_rng(3).normal(0, 0.5, (1, 64)).astype("float32"))
    kbert.save(reranker, tmp_path / "reranker")
    ours = kbert_scores(tmp_path / "reranker", tmp_path)
    run_kbert("convert", "to-hf", tmp_path / "reranker", tmp_path / "ce")
    assert largest_difference(ours, cross_encoder_scores(tmp_path / "ce", "identity")) <= 1e-5


def test_a_modernbert_cross_encoder_converts_both_ways_with_its_scores(tmp_path):
    import torch
    from sentence_transformers import CrossEncoder
    from test_modernbert import make_hf_folder, train_tokenizer

    make_hf_folder(tmp_path / "hf", train_tokenizer(), "ModernBertForSequenceClassification", 2, 2, 8, num_labels=1)
    model = CrossEncoder(str(tmp_path / "hf"), max_length=MAX_LENGTH, activation_fn=torch.nn.Identity(), device="cpu")
    model.save(str(tmp_path / "ce"))
    # A query past half of max_length too: both texts are cut, as the tokenizer.json cuts them.
    rows = [*CANDIDATES, {"query": " ".join(WORDS[:25]), "documents": [" ".join(WORDS[5:30]), " ".join(WORDS)]}]
    reference = cross_encoder_scores(tmp_path / "ce", "identity", rows)
    assert np.ptp(np.concatenate(reference)) > 0.05

    converted = json.loads(run_kbert("convert", "from-hf", tmp_path / "ce", tmp_path / "kbert").stdout)
    record = {"activation": "identity", "max_seq_length": MAX_LENGTH}
    assert converted["family"] == "modernbert" and converted["rerank"] == record
    assert largest_difference(kbert_scores(tmp_path / "kbert", tmp_path, rows), reference) <= 1e-5
    written = json.loads(run_kbert("convert", "to-hf", tmp_path / "kbert", tmp_path / "back").stdout)
    assert written["architecture"] == "ModernBertForSequenceClassification" and written["rerank"] == record
    assert largest_difference(cross_encoder_scores(tmp_path / "back", "identity", rows), reference) <= 1e-5


def _as_before_4(folder, activation_fn):
    """The folder as sentence-transformers before 4 saved it: config.json's
    sbert_ce_default_activation_function, no modules.json or sentence-transformers configs."""
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        os.remove(folder / name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sbert_ce_default_activation_function": activation_fn}))


def test_the_record_of_sentence_transformers_before_4(tmp_path):
    folder = tiny_cross_encoder(tmp_path / "ce", "sigmoid")
    _as_before_4(folder, "torch.nn.modules.linear.Identity")
    reference = cross_encoder_scores(folder, "identity")
    converted = json.loads(run_kbert("convert", "from-hf", folder, tmp_path / "kbert").stdout)
    assert converted["rerank"] == {"activation": "identity", "max_seq_length": MAX_LENGTH}
    assert largest_difference(kbert_scores(tmp_path / "kbert", tmp_path), reference) <= 1e-5


def test_max_length_past_the_positions_is_the_positions(tmp_path):
    folder = tiny_cross_encoder(tmp_path / "ce", "sigmoid")
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "model_max_length": 512}))
    assert json.loads(run_kbert("convert", "inspect", folder).stdout)["rerank"]["max_seq_length"] == 64


def test_a_plain_sequence_classifier_is_refused_as_before(tmp_path):
    """BertForSequenceClassification of one output without a CrossEncoder's record is no reranker."""
    folder = tiny_cross_encoder(tmp_path / "ce", "sigmoid")
    _as_before_4(folder, None)
    result = run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False)
    assert_user_error(result, "unknown weights (classifier.bias, classifier.weight)", "fine-tuned task model")


def _activation_fn(name):
    def change(folder):
        path = folder / "config_sentence_transformers.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "activation_fn": name}))

    return change


def _legacy_activation_fn(name):
    return lambda folder: _as_before_4(folder, name)


def _modules(folder):
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize(
    "change,said",
    [
        (_activation_fn("torch.nn.modules.activation.Tanh"), "'torch.nn.modules.activation.Tanh', which kbert cannot"),
        (_legacy_activation_fn("my_package.Softplus"), "'my_package.Softplus', which kbert cannot reproduce"),
        (_modules, "a CrossEncoder of modules Transformer -> Dense"),
    ],
    ids=["activation-unknown", "legacy-activation-unknown", "more-modules"],
)
def test_what_kbert_cannot_reproduce_is_one_line_naming_it(tmp_path, change, said):
    folder = tiny_cross_encoder(tmp_path / "ce", "sigmoid")
    change(folder)
    before = sorted(os.listdir(tmp_path))
    assert_user_error(run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False), said)
    assert sorted(os.listdir(tmp_path)) == before
    assert_user_error(run_kbert("convert", "inspect", folder, check=False), said)


def test_a_cross_encoder_of_two_outputs_is_refused(tmp_path):
    folder = tiny_cross_encoder(tmp_path / "ce", "identity", num_labels=2)
    result = run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False)
    assert_user_error(result, "a CrossEncoder of 2 outputs", "one output")
    assert not (tmp_path / "out").exists()


def test_evaluate_of_a_cross_encoder_is_cross_encoder_reranking_evaluators(tmp_path):
    """`kbert evaluate` of a CrossEncoder folder prints the metrics CrossEncoderRerankingEvaluator
    gives the same CrossEncoder on the same candidate lists, before and after reranking (with
    always_rerank_positives=False: the reranker orders what the first stage found)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    folder = tiny_cross_encoder(tmp_path / "ce", "sigmoid")
    rng = np.random.default_rng(3)
    samples = []
    for i in range(12):
        found = documents(10 + i)
        positive = [found[j] for j in sorted(rng.choice(len(found), size=1 + i % 2, replace=False))]
        if i == 0:  # a relevant document the first stage did not find
            positive = ["a document nobody found."]
        samples.append({"query": QUERIES[i % 3], "documents": found, "positive": positive})
    path = tmp_path / "candidates.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    expected = CrossEncoderRerankingEvaluator(samples, always_rerank_positives=False, write_csv=False)(
        CrossEncoder(str(folder), device="cpu")
    )
    got = json.loads(run_kbert("evaluate", folder, "--input", path).stdout)
    for name in ("map", "mrr@10", "ndcg@10", "base_map", "base_mrr@10", "base_ndcg@10"):
        assert got[name] == pytest.approx(expected[name], abs=1e-5), name
    assert got["queries"] == 12
