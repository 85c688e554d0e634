"""The scores `kbert evaluate` and `kbert finetune` report, in plain numpy.

Each function matches the reference people compare BERT results with, so a number from
kbert can sit in the same table as one from run_classifier.py or a paper:

- classification_metrics: sklearn's accuracy_score, f1_score(average="macro",
  zero_division=0) and matthews_corrcoef (GLUE reports MCC for CoLA, F1 for MRPC/QQP).
- regression_metrics: scipy's pearsonr and spearmanr (average ranks for ties), and MSE.
- tagging_metrics: conlleval's entity-level precision / recall / F1, as seqeval's
  default mode computes it, for BIO (IOB2), IOB1, IOBES/BILOU and prefix-less IO tags.
- ranking_metrics: recall@1, recall@10, MRR@10 and nDCG@10 of ranked documents, as
  sentence-transformers' InformationRetrievalEvaluator computes them.

Scores are Python floats in [0, 1] (not percent), except pearson, spearman and mcc,
which lie in [-1, 1], and mse, which is >= 0. Where scipy or sklearn would return nan or
warn (a constant input, a class that never occurs), these return 0.0, so a score is
always a number that can be compared to pick the best epoch.
"""

from __future__ import annotations

import numbers

import numpy as np

from kbert.runtime.errors import KbertError

# === Classification ===


def classification_metrics(labels, predictions, label_names=None) -> dict:
    """Accuracy and macro-F1, plus Matthews correlation when there are two classes.

    Args:
        labels: sequence of int class ids or str class names. The true classes.
        predictions: sequence of the same kind and length. The predicted classes.
        label_names: list of str, or None. All classes of the task, in id order: an int
            in `labels`/`predictions` is an index into it, a str one of its names.
            Classes that never occur still count in macro-F1 (with F1 0). When None,
            the classes are the distinct values seen in `labels` and `predictions`.

    Returns:
        dict with "accuracy" and "macro_f1" (sklearn's f1_score(average="macro",
        zero_division=0) over all classes), and "mcc" (sklearn's matthews_corrcoef, 0.0
        when undefined) when there are exactly two classes.

    Raises:
        KbertError: the two sequences differ in length or are empty, or a value is not
            one of `label_names`.

    Example:
    >>> m = classification_metrics([0, 0, 1, 1], [0, 1, 1, 1])
    >>> m["accuracy"], round(m["macro_f1"], 4), round(m["mcc"], 4)
    (0.75, 0.7333, 0.5774)
    >>> classification_metrics(["a", "b"], ["a", "a"], label_names=["a", "b", "c"])
    {'accuracy': 0.5, 'macro_f1': 0.2222222222222222}
    """
    labels, predictions = list(labels), list(predictions)
    _check_lengths(labels, predictions)
    if label_names is None:
        classes = _sorted_classes(labels + predictions)
        index = {name: i for i, name in enumerate(classes)}
        y = np.array([index[v] for v in labels])
        p = np.array([index[v] for v in predictions])
    else:
        classes = list(label_names)
        y = _class_ids(labels, classes, "label")
        p = _class_ids(predictions, classes, "prediction")
    n = len(classes)

    # confusion[i, j]: examples of true class i predicted as class j.
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (y, p), 1)
    tp = np.diag(confusion).astype(np.float64)
    fp = confusion.sum(axis=0) - tp
    fn = confusion.sum(axis=1) - tp
    # F1 = 2tp / (2tp + fp + fn), the same as 2PR/(P+R); a class with no true and no
    # predicted examples has 0/0 and scores 0 (sklearn's zero_division=0).
    denominator = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.zeros(n), where=denominator > 0)

    metrics = {"accuracy": float(np.mean(y == p)), "macro_f1": float(np.mean(f1))}
    if n == 2:
        metrics["mcc"] = _binary_mcc(confusion)
    return metrics


def _binary_mcc(confusion):
    (tn, fp), (fn, tp) = confusion.astype(np.float64)
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    # A row or column of zeros (one class never true, or never predicted) leaves MCC
    # undefined; sklearn returns 0.0 there, and so do we.
    if denominator == 0:
        return 0.0
    return float((tp * tn - fp * fn) / denominator)


def _sorted_classes(values):
    try:
        return sorted(set(values))
    except TypeError:
        raise KbertError(
            "labels and predictions mix class ids and class names; pass label_names to say which id is which name"
        ) from None


def _class_ids(values, classes, what):
    index = {name: i for i, name in enumerate(classes)}
    ids = []
    for v in values:
        if isinstance(v, str):
            if v not in index:
                raise KbertError(f"{what} {v!r} is not one of the label names {classes}")
            ids.append(index[v])
        elif isinstance(v, numbers.Integral) and 0 <= v < len(classes):
            ids.append(int(v))
        else:
            raise KbertError(
                f"{what} {v!r} is not a class id in 0..{len(classes) - 1} nor one of the label names {classes}"
            )
    return np.array(ids, dtype=np.int64)


def _check_lengths(labels, predictions):
    if len(labels) != len(predictions):
        raise KbertError(f"{len(labels)} labels but {len(predictions)} predictions; each example needs one of each")
    if not labels:
        raise KbertError("no examples to score; the evaluation set is empty")


# === Regression ===


def regression_metrics(labels, predictions) -> dict:
    """Pearson and Spearman correlation and mean squared error, as for STS-B.

    Args:
        labels: sequence of float. The true scores.
        predictions: sequence of float, the same length. The predicted scores.

    Returns:
        dict with "pearson" (scipy's pearsonr), "spearman" (scipy's spearmanr: Pearson
        of the ranks, tied values sharing their average rank) and "mse". A correlation
        with a constant side (scipy: nan and a warning) is 0.0 here: a model that
        predicts one number for everything has shown no correlation.

    Raises:
        KbertError: the two sequences differ in length or are empty.

    Example:
    >>> m = regression_metrics([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0])
    >>> round(m["pearson"], 4), round(m["spearman"], 4), m["mse"]
    (0.8315, 0.8, 0.75)
    >>> regression_metrics([1.0, 2.0, 3.0], [2.5, 2.5, 2.5])["pearson"]
    0.0
    """
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    _check_lengths(y.tolist(), p.tolist())
    return {
        "pearson": _pearson(y, p),
        "spearman": _pearson(_average_ranks(y), _average_ranks(p)),
        "mse": float(np.mean((p - y) ** 2)),
    }


def _pearson(x, y):
    # Tested for constancy by equality, not by a zero standard deviation: the mean of
    # [0.1, 0.1, 0.1] is not exactly 0.1, which would leave rounding noise to correlate.
    if np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    x, y = x - x.mean(), y - y.mean()
    r = np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y))
    return float(np.clip(r, -1.0, 1.0))


def _average_ranks(x):
    """Ranks 1..n; a run of equal values each gets the mean of the ranks it spans."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Start of each run of equal values in sorted order, and one past the last.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    run_rank = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


# === Tagging ===


def tagging_metrics(gold_tags, predicted_tags) -> dict:
    """Entity-level precision, recall and F1 as conlleval computes them, plus token accuracy.

    An entity is (type, sentence, first token, last token); a predicted entity counts
    only when the gold has one with exactly that type and those boundaries. Tags are
    "O", or a prefix and a type: "B-PER". Spans are read as conlleval reads them (and
    seqeval by default), so one function serves every common scheme:

    - B- always starts an entity; S- (U-) is a one-token entity.
    - I- continues an entity of its type; after "O", after a different type, or after
      an entity that was closed, it starts one (the lenient rule that makes IOB1 work).
    - E- (L-) continues like I- and closes the entity after it.
    - a tag without one of these prefixes, e.g. "PER" in IO tagging, is read as "I-PER".

    Entities never cross a sentence boundary.

    Args:
        gold_tags: list of sentences, each a list of str tags. The true tags.
        predicted_tags: list of sentences, each the same length as its gold sentence.

    Returns:
        dict with "precision", "recall", "f1" over all entities (micro-averaged, 0.0
        when their denominator is 0), "accuracy" (the fraction of tokens whose tag
        string is exactly the gold one) and "per_type": {type: {"precision", "recall",
        "f1", "support"}}, for every type in either side, with support the number of
        gold entities of that type.

    Raises:
        KbertError: the sentence counts or a sentence's lengths differ, or there are
            no tokens.

    Example:
    >>> gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    >>> pred = [["B-PER", "O", "O", "B-LOC"]]  # PER ends one token early
    >>> m = tagging_metrics(gold, pred)
    >>> m["precision"], m["recall"], m["f1"], m["accuracy"]
    (0.5, 0.5, 0.5, 0.75)
    >>> m["per_type"]["LOC"]
    {'precision': 1.0, 'recall': 1.0, 'f1': 1.0, 'support': 1}
    """
    gold_tags, predicted_tags = list(gold_tags), list(predicted_tags)
    if len(gold_tags) != len(predicted_tags):
        raise KbertError(
            f"{len(gold_tags)} gold sentences but {len(predicted_tags)} predicted; each sentence needs one of each"
        )
    gold, predicted = set(), set()
    tokens = correct_tokens = 0
    for i, (gold_sentence, predicted_sentence) in enumerate(zip(gold_tags, predicted_tags)):
        gold_sentence, predicted_sentence = list(gold_sentence), list(predicted_sentence)
        if len(gold_sentence) != len(predicted_sentence):
            raise KbertError(
                f"sentence {i} has {len(gold_sentence)} gold tags but "
                f"{len(predicted_sentence)} predicted; they must match token "
                "for token"
            )
        gold.update((kind, i, start, end) for kind, start, end in entities(gold_sentence))
        predicted.update((kind, i, start, end) for kind, start, end in entities(predicted_sentence))
        tokens += len(gold_sentence)
        correct_tokens += sum(g == p for g, p in zip(gold_sentence, predicted_sentence))
    if tokens == 0:
        raise KbertError("no tokens to score; the evaluation set is empty")

    metrics = _precision_recall_f1(len(gold & predicted), len(predicted), len(gold))
    metrics["accuracy"] = correct_tokens / tokens
    metrics["per_type"] = {}
    for kind in sorted({e[0] for e in gold | predicted}):
        gold_of_kind = {e for e in gold if e[0] == kind}
        predicted_of_kind = {e for e in predicted if e[0] == kind}
        scores = _precision_recall_f1(len(gold_of_kind & predicted_of_kind), len(predicted_of_kind), len(gold_of_kind))
        scores["support"] = len(gold_of_kind)
        metrics["per_type"][kind] = scores
    return metrics


def entities(tags) -> list[tuple[str, int, int]]:
    """The (type, first, last) token spans in one sentence's tags, read as conlleval does.

    See `tagging_metrics` for the rules.

    Args:
        tags: list of str. One sentence's tags.

    Returns:
        list of (type, first token index, last token index), in order.

    Example:
    >>> entities(["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC"])  # IOB1
    [('PER', 0, 1), ('LOC', 3, 4), ('LOC', 5, 5)]
    >>> entities(["S-PER", "B-ORG", "E-ORG", "E-ORG"])  # IOBES; a stray E- starts anew
    [('PER', 0, 0), ('ORG', 1, 2), ('ORG', 3, 3)]
    """
    spans = []
    open_type = None  # the type of the entity the previous token left open, if any
    closes = False  # whether the previous token (E- or S-) closed its entity
    start = 0
    for i, tag in enumerate(list(tags) + ["O"]):  # a final "O" closes the last entity
        prefix, kind = _split_tag(tag)
        if open_type is not None and (closes or prefix in "BSO" or kind != open_type):
            spans.append((open_type, start, i - 1))
            open_type = None
        if prefix != "O" and open_type is None:
            open_type, start = kind, i
        closes = prefix in "ES"
    return spans


# BILOU's Last and Unit are IOBES's End and Single.
_PREFIXES = {"B": "B", "I": "I", "E": "E", "S": "S", "L": "E", "U": "S"}


def _split_tag(tag):
    """("B", "PER") for "B-PER"; ("O", "") for "O"; ("I", "PER") for a bare "PER"."""
    if tag == "O":
        return "O", ""
    prefix, dash, kind = tag.partition("-")
    if dash and prefix in _PREFIXES and kind:
        return _PREFIXES[prefix], kind
    return "I", tag


def _precision_recall_f1(correct, predicted, gold):
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


# === Ranking ===

# The cut-offs of the ranking metrics: the first hit, and the first page of ten.
RANKING_DEPTH = 10


def top_documents(scores, k: int = RANKING_DEPTH) -> np.ndarray:
    """int [queries, min(k, documents)]: each query's `k` best documents, best first; documents
    of equal score in index order (as sentence-transformers' InformationRetrievalEvaluator
    breaks ties, by corpus id).

    >>> top_documents([[0.1, 0.9, 0.5, 0.9]], k=3).tolist()
    [[1, 3, 2]]
    """
    scores = np.asarray(scores, dtype=np.float64)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def ranking_metrics(ranked, relevant) -> dict:
    """recall@1, recall@10, MRR@10 and nDCG@10 of ranked documents, averaged over queries.

    With R a query's relevant documents and `ranked` its documents best first:
    recall@k = |R among the first k| / |R|; MRR@10 = 1 / the rank of the first relevant
    document in the first 10 (0 if none is); nDCG@10 = DCG / ideal DCG, where DCG sums
    1 / log2(rank + 1) over the relevant documents in the first 10 and the ideal puts all of
    R (at most 10) first. These are the definitions of sentence-transformers'
    InformationRetrievalEvaluator and the MS MARCO and BEIR tables.

    Args:
        ranked: int [queries, k] (k at least 10, or every document when there are fewer):
            document indexes, best first (`top_documents`).
        relevant: sequence of sets of int. Each query's relevant documents, at least one.

    Returns:
        dict: "recall@1", "recall@10", "mrr@10", "ndcg@10", floats in [0, 1].

    Raises:
        KbertError: no queries, a query with no relevant document, or lengths that differ.

    Example:
    >>> m = ranking_metrics([[2, 0, 1], [0, 1, 2]], [{0}, {0, 2}])
    >>> {k: round(v, 4) for k, v in m.items()}
    {'recall@1': 0.25, 'recall@10': 1.0, 'mrr@10': 0.75, 'ndcg@10': 0.7753}
    """
    ranked = [np.asarray(row).tolist()[:RANKING_DEPTH] for row in ranked]
    relevant = [set(r) for r in relevant]
    if len(ranked) != len(relevant):
        raise KbertError(f"{len(ranked)} rankings but {len(relevant)} sets of relevant documents; give one per query")
    if not ranked:
        raise KbertError("no queries to score; the evaluation set is empty")
    if not all(relevant):
        raise KbertError("every query needs at least one relevant document to score its ranking")
    discount = 1.0 / np.log2(np.arange(2, RANKING_DEPTH + 2))  # rank 1 .. 10
    totals = np.zeros(4)
    for row, wanted in zip(ranked, relevant):
        hits = np.array([doc in wanted for doc in row], dtype=np.float64)
        first = int(np.argmax(hits)) if hits.any() else None
        ideal = discount[: min(len(wanted), RANKING_DEPTH)].sum()
        totals += (
            hits[:1].sum() / len(wanted),
            hits.sum() / len(wanted),
            0.0 if first is None else 1.0 / (first + 1),
            float(hits @ discount[: len(hits)]) / ideal,
        )
    recall_1, recall_10, mrr, ndcg = (totals / len(ranked)).tolist()
    return {"recall@1": recall_1, "recall@10": recall_10, "mrr@10": mrr, "ndcg@10": ndcg}
