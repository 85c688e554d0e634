"""kbert.finetuning.metrics against hand-worked values, published seqeval/conlleval examples and, where
installed, sklearn and scipy themselves."""

import math
import subprocess
import sys

import numpy as np
import pytest

from kbert.finetuning import metrics
from kbert.finetuning.metrics import classification_metrics, entities, regression_metrics, tagging_metrics
from kbert.runtime.errors import KbertError


def assert_python_floats(scores):
    for name, value in scores.items():
        if isinstance(value, dict):
            assert_python_floats(value)
        elif name != "support":
            assert type(value) is float, (name, type(value))


# === Classification ===


def test_binary_confusion_matrix_by_hand():
    # tp=6, fn=2, fp=1, tn=3.
    labels = [1] * 8 + [0] * 4
    predictions = [1] * 6 + [0] * 2 + [1] * 1 + [0] * 3
    m = classification_metrics(labels, predictions)
    assert m["accuracy"] == pytest.approx(9 / 12)
    # F1(1) = 2*6 / (2*6 + 1 + 2) = 0.8; F1(0) = 2*3 / (2*3 + 2 + 1) = 2/3.
    assert m["macro_f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert m["mcc"] == pytest.approx((6 * 3 - 1 * 2) / math.sqrt(7 * 8 * 4 * 5))
    assert_python_floats(m)


def test_mcc_extremes_and_undefined():
    assert classification_metrics([0, 1, 0, 1], [0, 1, 0, 1])["mcc"] == 1.0
    assert classification_metrics([0, 1, 0, 1], [1, 0, 1, 0])["mcc"] == -1.0
    # One class always predicted: a zero column, MCC undefined -> 0.0 as sklearn.
    assert classification_metrics([0, 1, 0, 1], [1, 1, 1, 1])["mcc"] == 0.0
    # Two label names but only one class ever seen.
    m = classification_metrics(["yes", "yes"], ["yes", "yes"], label_names=["no", "yes"])
    assert m["mcc"] == 0.0 and m["accuracy"] == 1.0


def test_mcc_only_for_two_classes():
    assert "mcc" not in classification_metrics([0, 1, 2], [0, 1, 2])
    assert "mcc" not in classification_metrics([0, 0], [0, 0])  # one class seen, no names
    assert "mcc" in classification_metrics(["a", "b"], ["a", "a"])
    assert "mcc" in classification_metrics([0, 0], [0, 0], label_names=["a", "b"])


def test_macro_f1_counts_a_missing_class_as_zero():
    # Classes 0, 1 predicted perfectly; class 2 never occurs: 0/0 -> F1 0 (zero_division=0).
    m = classification_metrics([0, 1, 1], [0, 1, 1], label_names=["a", "b", "c"])
    assert m["accuracy"] == 1.0
    assert m["macro_f1"] == pytest.approx(2 / 3)
    # Without label_names only seen classes count.
    assert classification_metrics([0, 1, 1], [0, 1, 1])["macro_f1"] == 1.0


def test_macro_f1_with_a_class_never_predicted():
    labels = ["a", "a", "b", "b", "c"]
    predictions = ["a", "a", "b", "a", "b"]
    m = classification_metrics(labels, predictions)
    assert m["accuracy"] == pytest.approx(3 / 5)
    # F1(a) = 2*2/(4+1+0) = 0.8; F1(b) = 2*1/(2+1+1) = 0.5; F1(c) = 0.
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5 + 0.0) / 3)


def test_ids_and_names_index_the_same_classes():
    names = ["neg", "pos", "neutral"]
    by_id = classification_metrics([0, 1, 2, 1], [0, 2, 2, 1], label_names=names)
    by_name = classification_metrics(
        ["neg", "pos", "neutral", "pos"], ["neg", "neutral", "neutral", "pos"], label_names=names
    )
    assert by_id == by_name
    assert by_id["accuracy"] == 0.75


def test_numpy_inputs_give_python_floats():
    m = classification_metrics(np.array([0, 1, 1, 0]), np.array([0, 1, 0, 0]))
    assert m["accuracy"] == 0.75
    assert_python_floats(m)


@pytest.mark.parametrize(
    "labels, predictions, names, fragment",
    [
        ([0, 1], [0], None, "2 labels but 1 predictions"),
        ([], [], None, "empty"),
        (["a", "x"], ["a", "a"], ["a", "b"], "'x' is not one of the label names"),
        ([0, 2], [0, 1], ["a", "b"], "2 is not a class id in 0..1"),
        ([0, "a"], [0, 0], None, "pass label_names"),
    ],
)
def test_classification_bad_input(labels, predictions, names, fragment):
    with pytest.raises(KbertError, match=fragment):
        classification_metrics(labels, predictions, label_names=names)


# === Regression ===


def test_pearson_and_mse_by_hand():
    m = regression_metrics([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0])
    # Centered: x = (-1.5, -0.5, 0.5, 1.5), y = (-1.75, 0.25, -0.75, 2.25).
    assert m["pearson"] == pytest.approx(5.5 / math.sqrt(5.0 * 8.75))
    assert m["mse"] == pytest.approx((0 + 1 + 1 + 1) / 4)
    assert_python_floats(m)


def test_spearman_with_ties_uses_average_ranks():
    # Ranks: labels (1, 2.5, 2.5, 4), predictions (1, 4, 2.5, 2.5); both centered on 2.5:
    # (-1.5, 0, 0, 1.5) . (-1.5, 1.5, 0, 0) = 2.25 over sqrt(4.5 * 4.5) -> 0.5.
    # (The no-ties shortcut 1 - 6 sum d^2 / (n (n^2 - 1)) would give 0.55.)
    m = regression_metrics([1, 2, 2, 3], [1, 3, 2, 2])
    assert m["spearman"] == pytest.approx(0.5)


def test_average_ranks():
    np.testing.assert_array_equal(metrics._average_ranks(np.array([10.0, 20, 20, 20, 5])), [2, 4, 4, 4, 1])


def test_spearman_is_one_for_any_increasing_function():
    m = regression_metrics([1, 2, 3, 4], [1, 8, 27, 64])
    assert m["spearman"] == pytest.approx(1.0)
    assert m["pearson"] < 0.99
    assert regression_metrics([1, 2, 3], [3, 2, 1])["pearson"] == pytest.approx(-1.0)


def test_constant_input_scores_zero_not_nan():
    m = regression_metrics([0.1, 0.1, 0.1], [1.0, 2.0, 3.0])
    assert m["pearson"] == 0.0 and m["spearman"] == 0.0
    m = regression_metrics([1.0, 2.0, 3.0], [0.7, 0.7, 0.7])
    assert m["pearson"] == 0.0 and m["spearman"] == 0.0
    assert m["mse"] == pytest.approx((0.3**2 + 1.3**2 + 2.3**2) / 3)
    assert regression_metrics([2.0], [3.0]) == {"pearson": 0.0, "spearman": 0.0, "mse": 1.0}


def test_regression_bad_input():
    with pytest.raises(KbertError, match="3 labels but 2 predictions"):
        regression_metrics([1, 2, 3], [1, 2])
    with pytest.raises(KbertError, match="empty"):
        regression_metrics([], [])


# === Tagging: spans ===


@pytest.mark.parametrize(
    "tags, spans",
    [
        # BIO (IOB2)
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
        (["B-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),
        # conlleval's lenient rule: I- after O or after another type starts an entity.
        (["O", "I-PER", "I-PER"], [("PER", 1, 2)]),
        (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
        # IOB1: B- only between two entities of one type.
        (["I-PER", "I-PER", "B-PER", "O", "I-LOC"], [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]),
        # IOBES
        (["B-PER", "E-PER", "S-LOC", "B-ORG", "I-ORG", "E-ORG"], [("PER", 0, 1), ("LOC", 2, 2), ("ORG", 3, 5)]),
        (["B-PER", "E-PER", "I-PER"], [("PER", 0, 1), ("PER", 2, 2)]),  # E- closes
        (["B-PER", "S-PER", "E-PER"], [("PER", 0, 0), ("PER", 1, 1), ("PER", 2, 2)]),
        # BILOU
        (["B-PER", "L-PER", "U-LOC", "O"], [("PER", 0, 1), ("LOC", 2, 2)]),
        # IO: bare tags are I- tags.
        (["PER", "PER", "O", "LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
        # Types may contain "-"; a bare one keeps all of it.
        (["B-ORG-GPE", "I-ORG-GPE", "ORG-GPE"], [("ORG-GPE", 0, 2)]),
        (["O", "O"], []),
        ([], []),
    ],
)
def test_entities(tags, spans):
    assert entities(tags) == spans


# === Tagging: scores ===


def test_seqeval_readme_example():
    # seqeval's README: f1 0.50, accuracy 0.80; MISC p=r=f=0 support 1, PER 1.00 support 1.
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    m = tagging_metrics(gold, pred)
    assert (m["precision"], m["recall"], m["f1"], m["accuracy"]) == (0.5, 0.5, 0.5, 0.8)
    assert m["per_type"] == {
        "MISC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1},
    }
    assert_python_floats(m)


@pytest.mark.parametrize(
    "pred,precision",
    [
        (["B-PER", "I-PER", "I-PER", "B-LOC"], 1 / 2),  # PER one token too long
        (["O", "B-PER", "O", "B-LOC"], 1 / 2),  # PER starts late
        (["B-PER", "B-PER", "O", "B-LOC"], 1 / 3),  # PER split in two: 3 predicted, 1 right
    ],
)
def test_boundary_errors_count_as_wrong(pred, precision):
    gold = ["B-PER", "I-PER", "O", "B-LOC"]
    m = tagging_metrics([gold], [pred])
    assert m["precision"] == pytest.approx(precision)
    assert m["recall"] == 0.5
    assert m["per_type"]["PER"]["f1"] == 0.0
    assert m["per_type"]["LOC"]["f1"] == 1.0


def test_type_mismatch():
    m = tagging_metrics([["B-PER", "I-PER", "O"]], [["B-ORG", "I-ORG", "O"]])
    assert (m["precision"], m["recall"], m["f1"]) == (0.0, 0.0, 0.0)
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert m["per_type"]["PER"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert m["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}


def test_micro_average_over_types():
    gold = ["B-PER", "O", "B-PER", "O", "B-PER", "O", "B-LOC"]
    pred = ["B-PER", "O", "B-PER", "O", "O", "O", "B-ORG"]
    m = tagging_metrics([gold], [pred])
    # 2 right of 3 predicted and 4 gold.
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(1 / 2)
    assert m["f1"] == pytest.approx(4 / 7)
    assert m["accuracy"] == pytest.approx(5 / 7)
    assert m["per_type"]["PER"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert sorted(m["per_type"]) == ["LOC", "ORG", "PER"]


def test_entities_stop_at_sentence_ends():
    # Joined, "B-PER" + "I-PER" would be one entity; per sentence they are two.
    gold = [["O", "B-PER"], ["I-PER", "O"]]
    m = tagging_metrics(gold, gold)
    assert m["f1"] == 1.0
    assert m["per_type"]["PER"]["support"] == 2
    # Predicting the joined entity in either sentence is not enough.
    m = tagging_metrics(gold, [["O", "B-PER"], ["O", "O"]])
    assert (m["precision"], m["recall"]) == (1.0, 0.5)


def test_token_accuracy_compares_whole_tags():
    # Same entity either way, but a different tag string.
    m = tagging_metrics([["I-PER"]], [["B-PER"]])
    assert m["f1"] == 1.0
    assert m["accuracy"] == 0.0


def test_no_entities_anywhere():
    m = tagging_metrics([["O", "O"], ["O"]], [["O", "O"], ["O"]])
    assert m == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0, "per_type": {}}
    m = tagging_metrics([["B-PER", "O"]], [["O", "O"]])
    assert (m["precision"], m["recall"], m["f1"], m["accuracy"]) == (0.0, 0.0, 0.0, 0.5)


@pytest.mark.parametrize(
    "gold, pred, fragment",
    [
        ([["O"]], [["O"], ["O"]], "1 gold sentences but 2 predicted"),
        ([["O", "O"]], [["O"]], "sentence 0 has 2 gold tags but 1 predicted"),
        ([], [], "empty"),
        ([[]], [[]], "empty"),
    ],
)
def test_tagging_bad_input(gold, pred, fragment):
    with pytest.raises(KbertError, match=fragment):
        tagging_metrics(gold, pred)


# === The module itself ===


def test_import_does_not_load_tensorflow():
    # The CLI imports metrics for `evaluate`'s report; it must not pay TensorFlow's start-up.
    code = "import sys, kbert.finetuning.metrics; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# === Against sklearn and scipy (the test extra's) ===


def test_against_sklearn():
    from sklearn import metrics as sklearn_metrics

    rng = np.random.default_rng(0)
    for classes in (2, 3, 5):
        labels = rng.integers(0, classes, 50)
        predictions = rng.integers(0, classes, 50)
        m = classification_metrics(labels, predictions, label_names=[str(c) for c in range(classes)])
        assert m["accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(labels, predictions))
        assert m["macro_f1"] == pytest.approx(
            sklearn_metrics.f1_score(labels, predictions, labels=list(range(classes)), average="macro", zero_division=0)
        )
        if classes == 2:
            assert m["mcc"] == pytest.approx(sklearn_metrics.matthews_corrcoef(labels, predictions))


def test_against_scipy():
    from scipy import stats

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, 40).astype(float)  # many ties
    predictions = labels + rng.normal(0, 2, 40).round()
    m = regression_metrics(labels, predictions)
    assert m["pearson"] == pytest.approx(stats.pearsonr(labels, predictions)[0])
    assert m["spearman"] == pytest.approx(stats.spearmanr(labels, predictions)[0])
