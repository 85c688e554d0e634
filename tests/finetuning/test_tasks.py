"""kbert.finetuning.tasks: what each task reads, scores and prints, on hand-worked numbers. (What an export
serves for each task is tests/serving/test_heads.py.)"""

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import TINY
from kbert.finetuning.options import FinetuneOptions
from kbert.finetuning.tasks import TASKS, best_metric, get_task
from kbert.finetuning.tasks.base import TaskData, json_floats
from kbert.runtime.errors import KbertError, command_line_names
from kbert.text.graph_packer import BertPreprocessor

OPTS = FinetuneOptions()
LN2, LN3 = math.log(2), math.log(3)


# === Best epoch ===


@pytest.mark.parametrize(
    "task, scores, expected",
    [
        ("classify", {"accuracy": 0.75, "macro_f1": 0.9, "mcc": 0.5}, ("accuracy", 0.75)),
        ("regress", {"pearson": 0.8, "spearman": 0.9, "mse": 0.1}, ("pearson", 0.8)),
        ("tag", {"precision": 0.5, "recall": 1.0, "f1": 0.6, "accuracy": 0.9}, ("f1", 0.6)),
        ("squad", {"exact_match": 0.7, "f1": 0.8}, ("f1", 0.8)),
    ],
)
def test_best_metric(task, scores, expected):
    name, value = best_metric(task, scores)
    assert (name, value) == expected
    assert type(value) is float


def test_best_metric_converts_numpy_and_rejects_bad_input():
    assert type(best_metric("classify", {"accuracy": np.float32(0.5)})[1]) is float
    with pytest.raises(KbertError, match="unknown task='summarize'"):
        best_metric("summarize", {"f1": 1.0})
    with pytest.raises(KbertError, match="no 'pearson'.*mse"):
        best_metric("regress", {"mse": 0.1})


# === The table of tasks ===


def test_every_task_is_found_by_its_name():
    assert list(TASKS) == ["classify", "regress", "tag", "squad", "choice", "embed", "rerank"]
    for name, task in TASKS.items():
        assert get_task(name) is task and task.name == name
    with pytest.raises(KbertError) as error:
        get_task("ner")
    assert str(error.value) == "unknown task='ner'; use one of classify, regress, tag, squad, choice, embed, rerank"
    with command_line_names({"--task"}), pytest.raises(KbertError) as error:  # as `kbert finetune --task ner`
        get_task("ner")
    assert str(error.value) == "unknown --task ner; use one of classify, regress, tag, squad, choice, embed, rerank"


def test_sequence_lengths_are_the_original_scripts_defaults():
    # run_classifier.py and run_squad.py: --max_seq_length 128 and 384.
    assert {name: task.max_seq_length for name, task in TASKS.items()} == {
        "classify": 128,
        "regress": 128,
        "tag": 128,
        "squad": 384,
        "choice": 128,
        "embed": 128,  # sentence-transformers' own default is the model's; kbert's is the record's, else this
        "rerank": 128,  # a CrossEncoder's is its model's; a converted one records it
    }


# === Scores and printed rows, on hand-worked outputs ===


def test_classify_scores_and_rows():
    task = TASKS["classify"]
    data = TaskData({}, {"logits": np.array([0, 1, 1, 0])}, ["neg", "pos"], 4)
    logits = np.array([[2.0, 0.0], [0.0, LN3], [1.0, 0.0], [0.5, 0.0]], dtype=np.float32)
    scores = task.score(data, {"logits": logits}, options=OPTS, do_lower_case=True)
    assert scores["accuracy"] == 0.75  # predicted 0, 1, 0, 0 against 0, 1, 1, 0
    assert best_metric("classify", scores) == ("accuracy", 0.75)
    rows = list(task.rows(data, {"logits": logits[1:2]}, options=OPTS, do_lower_case=True))
    assert rows == [{"label": "pos", "probabilities": {"neg": 0.25, "pos": 0.75}}]  # softmax(0, ln 3)


def test_regress_scores_and_rows():
    task = TASKS["regress"]
    gold, predicted = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0]
    data = TaskData({}, {"logits": np.array(gold, dtype=np.float32)}, None, 4)
    outputs = {"logits": np.array(predicted, dtype=np.float32)[:, None]}
    scores = task.score(data, outputs, options=OPTS, do_lower_case=True)
    assert scores["pearson"] == pytest.approx(np.corrcoef(gold, predicted)[0, 1])
    assert scores["mse"] == pytest.approx((0 + 1 + 1 + 1) / 4)
    assert best_metric("regress", scores)[0] == "pearson"
    rows = task.rows(data, {"logits": np.array([[0.1234567]])}, options=OPTS, do_lower_case=True)
    assert list(rows) == [{"prediction": 0.123457}]


def test_tag_reads_each_word_at_its_first_piece_and_fills_cut_words():
    task = TASKS["tag"]
    labels = ["B-LOC", "B-PER", "O"]
    logits = np.full((1, 6, 3), -5.0, dtype=np.float32)
    logits[0, 1, 0] = logits[0, 2, 1] = logits[0, 3, 2] = 5.0  # pieces 1, 2, 3: B-LOC, B-PER, O
    # Word starts: "paris" at piece 1, "is" at piece 3, "nice" cut off by --max-seq-length (-1).
    raw = SimpleNamespace(words=[["paris", "is", "nice"]], tags=[["B-LOC", "O", "B-PER"]])
    data = TaskData({}, None, labels, 1, raw=raw, extra=[[1, 3, -1]])
    rows = list(task.rows(data, {"logits": logits}, options=OPTS, do_lower_case=True))
    assert rows == [{"words": ["paris", "is", "nice"], "tags": ["B-LOC", "O", "O"]}]  # the cut word: "O"
    scores = task.score(data, {"logits": logits}, options=OPTS, do_lower_case=True)
    # One of two entities found, no false one: precision 1, recall 1/2, F1 2/3.
    assert (scores["precision"], scores["recall"]) == (1.0, 0.5)
    assert best_metric("tag", scores) == ("f1", pytest.approx(2 / 3))
    # A tag set without "O": a cut word gets the first label.
    no_o = TaskData({}, None, ["B-LOC", "B-PER"], 1, raw=raw, extra=[[1, -1, -1]])
    rows = list(task.rows(no_o, {"logits": logits[..., :2]}, options=OPTS, do_lower_case=True))
    assert rows[0]["tags"] == ["B-LOC", "B-LOC", "B-LOC"]


def test_choice_scores_and_rows():
    task = TASKS["choice"]
    data = TaskData({}, {"logits": np.array([1, 0])}, None, 2)
    logits = np.array([[0.0, LN2, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)
    assert task.score(data, {"logits": logits}, options=OPTS, do_lower_case=True) == {"accuracy": 0.5}
    assert list(task.rows(data, {"logits": logits[:1]}, options=OPTS, do_lower_case=True)) == [
        {"label": 1, "probabilities": [0.25, 0.5, 0.25]}
    ]  # softmax(0, ln 2, 0)


# === Losses ===


def _log_softmax(logits):
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def test_tag_loss_leaves_out_unlabelled_positions():
    # -1: [CLS], [SEP], padding and non-first pieces; the loss is the mean over labelled positions.
    loss = TASKS["tag"].losses()[0]["logits"]
    logits = np.random.default_rng(0).normal(size=(2, 4, 3)).astype(np.float32)
    targets = np.array([[-1, 2, 0, -1], [-1, 1, -1, -1]])
    log_p = _log_softmax(logits)
    expected = -np.mean([log_p[0, 1, 2], log_p[0, 2, 0], log_p[1, 1, 1]])
    assert float(loss(targets, logits)) == pytest.approx(expected, rel=1e-5)


def test_squad_loss_is_the_mean_of_start_and_end():
    losses, weights = TASKS["squad"].losses()
    assert sorted(losses) == ["end_logits", "start_logits"] and weights == {"start_logits": 0.5, "end_logits": 0.5}


def test_classify_and_regress_losses():
    logits = np.array([[0.0, LN3]], dtype=np.float32)
    classify, _ = TASKS["classify"].losses()
    assert float(classify["logits"](np.array([1]), logits)) == pytest.approx(-math.log(0.75), rel=1e-6)
    regress, _ = TASKS["regress"].losses()
    assert float(regress["logits"](np.array([[1.0], [3.0]]), np.array([[2.0], [1.0]]))) == pytest.approx(2.5)


# === Reading files ===


@pytest.fixture(scope="module")
def preprocessor():
    return BertPreprocessor(f"{TINY}/vocab.txt", do_lower_case=True, sequence_length=16)


def _read(task, path, preprocessor, labels, *, require_labels, training):
    return TASKS[task].read(
        path,
        preprocessor=preprocessor,
        labels=labels,
        options=OPTS,
        require_labels=require_labels,
        training=training,
    )


def test_classify_reads_its_classes_from_the_training_file(tmp_path, preprocessor):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nthe city\tpos\na camp\tneg\nthe fire\tpos\n")
    data = _read("classify", path, preprocessor, None, require_labels=True, training=True)
    assert data.labels == ["neg", "pos"] and data.size == 3
    assert data.targets["logits"].tolist() == [1, 0, 1]
    # Dev data is scored with the training file's classes, in their order.
    data = _read("classify", path, preprocessor, ["pos", "neg"], require_labels=True, training=False)
    assert data.targets["logits"].tolist() == [0, 1, 0]
    with pytest.raises(KbertError, match="never trained on: 'neg'"):
        _read("classify", path, preprocessor, ["pos", "other"], require_labels=True, training=False)


def test_regress_reads_scores(tmp_path, preprocessor):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nthe city\t3.800\na camp\t0.5\n")
    data = _read("regress", path, preprocessor, None, require_labels=True, training=True)
    assert data.labels is None and data.targets["logits"].dtype == np.float32
    assert data.targets["logits"].tolist() == pytest.approx([3.8, 0.5])


def test_tag_prediction_ignores_tags_the_model_does_not_know(tmp_path, preprocessor):
    path = tmp_path / "test.conll"
    path.write_text("the O\ncity B-LOC\n\na B-MISC\ncamp O\n")
    trained = _read("tag", path, preprocessor, None, require_labels=True, training=True)
    assert trained.labels == ["B-LOC", "B-MISC", "O"] and trained.targets is not None
    predicted = _read("tag", path, preprocessor, ["B-LOC", "O"], require_labels=False, training=False)
    assert predicted.targets is None and predicted.labels == ["B-LOC", "O"] and predicted.size == 2


# === Each task's functions take their settings by name ===


def test_a_tasks_functions_refuse_settings_by_position(tmp_path, preprocessor):
    # task.read(path, preprocessor, None, OPTS, True, True) could not be read: which True is which?
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nthe city\tpos\na camp\tneg\n")
    data = _read("classify", path, preprocessor, None, require_labels=True, training=True)
    logits = {"logits": np.zeros((2, 2), dtype=np.float32)}
    for task in TASKS.values():
        with pytest.raises(TypeError):
            task.read(path, preprocessor, None, OPTS, True, True)
        with pytest.raises(TypeError):
            task.build(None, ["neg", "pos"])
        with pytest.raises(TypeError):
            task.score(data, logits, OPTS, True)
        with pytest.raises(TypeError):
            task.rows(data, logits, OPTS, True)


# === Small helpers ===


def test_json_floats_rounds_every_kind_of_float_and_nothing_else():
    values = {"f1": np.float64(2 / 3), "loss": np.float32(0.1), "mcc": 1 / 3, "examples": np.int64(7), "task": "tag"}
    out = json_floats(values)
    assert out == {"f1": 0.666667, "loss": 0.1, "mcc": 0.333333, "examples": 7, "task": "tag"}
    assert [type(v) for v in out.values()] == [float, float, float, np.int64, str]


# === A task is one file ===

REPO = Path(__file__).resolve().parents[2]


def _task_name_comparisons(path):
    """(line, source) of each comparison of something about a task with a task's name."""
    names = set(TASKS)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        constants = {
            c.value
            for side in sides
            for c in ast.walk(side)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        }
        if constants & names and "task" in ast.unparse(node).lower():
            yield node.lineno, ast.unparse(node)


def test_only_the_task_files_branch_on_a_tasks_name():
    found = {}
    for folder in ("kbert", "cli", "serving", "converters"):
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith("kbert/finetuning/tasks/"):
                continue
            comparisons = list(_task_name_comparisons(path))
            if comparisons:
                found[relative] = comparisons
    assert found == {}, "ask the task (kbert.finetuning.tasks) instead of comparing its name"


def test_every_task_is_a_task_with_its_own_file():
    from kbert.finetuning.tasks.base import Task

    for name, task in TASKS.items():
        assert isinstance(task, Task) and task.name == name
        assert type(task).__module__ == f"kbert.finetuning.tasks.{name}"
