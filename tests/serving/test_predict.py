"""kbert.serving.predict: which task a served model has, and the small helpers of `kbert predict
--server`. (Local and served predictions printing the same JSON, with a real export and server,
is tests/finetuning/test_predict.py.)"""

from types import SimpleNamespace

import numpy as np
import pytest

from kbert.finetuning.options import FinetuneOptions
from kbert.finetuning.rows import stream_rows
from kbert.finetuning.tasks.base import served_texts_b
from kbert.runtime.errors import KbertError, command_line_names
from kbert.serving.heads import EMBEDDING, SERVED_TASKS
from kbert.serving.predict import served_by, served_rows, served_task

# Signatures as kbert.serving.export writes them, one export per task.
SIGNATURES = {
    "classify": {
        "serving_default": {"inputs": {"text": {}, "text_b": {}}, "outputs": {"label": {}}},
        "classify": {"method_name": "tensorflow/serving/classify"},
    },
    "regress": {
        "serving_default": {"inputs": {"text": {}, "text_b": {}}, "outputs": {"score": {}}},
        "regress": {"method_name": "tensorflow/serving/regress"},
    },
    "tag": {"serving_default": {"inputs": {"text": {}}, "outputs": {"label": {}, "word_label": {}}}},
    "choice": {"serving_default": {"inputs": {"text": {}, "endings": {}}, "outputs": {"label_id": {}}}},
    # A reranker's: a regressor's of pairs without its Regress API.
    "rerank": {"serving_default": {"inputs": {"text": {}, "text_b": {}}, "outputs": {"score": {}}}},
}
ENCODER = {"serving_default": {"inputs": {"text": {}}, "outputs": {"pooled_output": {}, "sequence_output": {}}}}
EMBEDDER = {"serving_default": {"inputs": {"text": {}}, "outputs": {"embedding": {}}}}


def test_each_export_is_recognised_by_its_own_task_only():
    assert sorted(SIGNATURES) == sorted(SERVED_TASKS)
    for export, signatures in SIGNATURES.items():
        assert [task for task in SERVED_TASKS if served_by(task, signatures)] == [export]
        assert served_task(signatures) == export
    # A signature named "classify" whose method is not TF Serving's Classify API is not one.
    assert not served_by("classify", {"classify": {"method_name": "tensorflow/serving/predict"}})
    assert served_task(ENCODER) is None
    assert served_task(EMBEDDER) == EMBEDDING == "embedding"


def test_a_model_kbert_did_not_export_is_refused():
    with pytest.raises(KbertError) as error:
        served_task({"serving_default": {"outputs": {"logits": {}}}})
    assert str(error.value) == (
        "the served model's serving_default has outputs logits; predict_served reads what kbert export "
        "writes (the tasks classify, regress, tag, choice, rerank, encoders and sentence-embedding models): use "
        "Client.predict for other models"
    )
    with command_line_names({"--server", "--input"}), pytest.raises(KbertError) as error:  # `kbert predict --server`
        served_task({"serving_default": {"outputs": {"logits": {}}}})
    assert "outputs logits; kbert predict --server reads what kbert export writes" in str(error.value)


class _Server:
    """A stand-in Client: answers as an export of the task would, and records each request."""

    model_name = "m"

    def __init__(self):
        self.requests = []

    def classify(self, texts, texts_b=None):
        self.requests.append((list(texts), texts_b))
        return [[("neg", 0.25), ("pos", 0.75)] for _ in texts]

    def regress(self, texts, texts_b=None):
        self.requests.append((list(texts), texts_b))
        return [0.1234567 * (i + 1) for i in range(len(texts))]

    def predict_text(self, texts, texts_b=None):
        self.requests.append((list(texts), texts_b))
        return {
            "word_label": np.array([["B-LOC", "O", ""]] * len(texts), dtype=object),
            "pooled_output": np.array([[0.5, -0.25]] * len(texts), dtype=np.float32),
            "embedding": np.array([[0.1, -0.7]] * len(texts), dtype=np.float32),
        }

    def predict(self, inputs):
        self.requests.append(inputs)
        return {"probabilities": np.array([[0.25, 0.5, 0.25]] * len(inputs["text"]), dtype=np.float32)}


def test_served_rows_are_the_local_rows_from_the_servers_answers(tmp_path):
    options = FinetuneOptions(batch_size=2)
    tsv = tmp_path / "in.tsv"
    tsv.write_text("text\ttext_b\na\tb\nc\td\ne\tf\n")
    server = _Server()
    rows = list(served_rows("classify", server, SIGNATURES["classify"], tsv, options=options, start=1))
    assert rows == [{"label": "pos", "probabilities": {"neg": 0.25, "pos": 0.75}}] * 2
    assert server.requests == [(["c", "e"], ["d", "f"])]  # from example 1 on, pairs kept
    rows = list(served_rows("regress", _Server(), SIGNATURES["regress"], tsv, options=options))
    assert rows == [{"prediction": 0.123457}, {"prediction": 0.246913}, {"prediction": 0.123457}]

    conll = tmp_path / "in.conll"
    conll.write_text("paris\nis\n\nrome\n")
    rows = list(served_rows("tag", _Server(), SIGNATURES["tag"], conll, options=options))
    assert rows == [{"words": ["paris", "is"], "tags": ["B-LOC", "O"]}, {"words": ["rome"], "tags": ["B-LOC"]}]

    lines = tmp_path / "in.txt"
    lines.write_text("gold glorious.\n")
    assert list(served_rows(None, _Server(), ENCODER, lines, options=options)) == [{"pooled_output": [0.5, -0.25]}]

    # An embedding model: kbert embed's rows (float32 values as their shortest decimals), a line whole.
    lines.write_text("gold glorious.\ndead ||| dust.\n")
    server = _Server()
    rows = list(served_rows(EMBEDDING, server, EMBEDDER, lines, options=options))
    assert rows == [{"embedding": [0.1, -0.7]}] * 2
    assert server.requests == [(["gold glorious.", "dead ||| dust."], None)]


def test_served_embeddings_take_one_text_per_row(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("text\ttext_b\ngold.\tdust.\n")
    with pytest.raises(KbertError) as error:
        list(served_rows(EMBEDDING, _Server(), EMBEDDER, pairs, options=FinetuneOptions()))
    assert str(error.value) == (
        f"{pairs}: has a second text column (text_b), but predict_served embeds one text per row; drop the "
        "column, or put each text in a row of its own"
    )


def test_served_rows_take_options_by_name():
    with pytest.raises(TypeError):
        served_rows("classify", _Server(), SIGNATURES["classify"], "in.tsv", FinetuneOptions())


def test_served_pairs_need_a_model_that_takes_them():
    client = SimpleNamespace(model_name="sst2")
    single, pairs = SIGNATURES["tag"], SIGNATURES["classify"]
    assert served_texts_b("in.tsv", ["b1", "b2"], pairs, client) == ["b1", "b2"]
    assert served_texts_b("in.tsv", None, single, client) is None
    assert served_texts_b("in.tsv", ["", ""], single, client) is None  # an empty text_b column is no pair
    with pytest.raises(KbertError) as error:
        served_texts_b("in.tsv", ["", "b2"], single, client)
    assert str(error.value) == (
        "in.tsv has sentence pairs (text_b), but the served model sst2 takes single texts: give one text per row"
    )


def test_resuming_past_the_end_is_refused():
    examples = ["a", "b", "c", "d"]  # four SQuAD-like examples: a list

    def answer(part, first):
        return [{"n": first + i} for i in range(len(part))]

    assert list(stream_rows(examples, answer, 3, start=4)) == []
    assert list(stream_rows(examples, answer, 3, start=2)) == [{"n": 2}, {"n": 3}]
    with pytest.raises(KbertError, match="already has 5 rows, but the input has only 4 examples"):
        stream_rows(examples, answer, 3, start=5)
