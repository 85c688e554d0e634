"""Rerankers (cross-encoders): one score per (query, document) pair, read by one model that sees
both texts, and the ranking metrics that judge how it reorders a first stage's candidates.

A reranker is a classifier head of one output on a pair of texts ([CLS] query [SEP] document
[SEP]), as sentence-transformers' CrossEncoder and every ms-marco-MiniLM-style model are: its
logit, through the model's activation (sigmoid, or none), is the pair's score. Training reads a
query with its group of documents at once (`GroupScorer`, [queries, documents, tokens] in,
[queries, documents] logits out), so that a loss can compare one query's documents with each
other:

- bce: sigmoid cross-entropy of each pair's logit against its label in [0, 1], averaged over the
  pairs (sentence-transformers' BinaryCrossEntropyLoss);
- listwise: softmax cross-entropy over each query's group, its first document the right one
  (`ListwiseSoftmax`);
- margin-mse: squared error between the model's margins (the first document's logit less each
  other's) and a teacher's (`MarginMSE`, sentence-transformers' MarginMSELoss).

The metrics are those of sentence-transformers' CrossEncoderRerankingEvaluator (MAP, MRR@10,
NDCG@10, with scikit-learn's handling of tied scores), plus recall@1, for the candidates'
first-stage order and for the reranked order (`rerank_metrics`).

Example:
>>> m = rerank_metrics([[0.1, 0.9, 0.3]], [[0, 1, 0]])
>>> {k: round(v, 4) for k, v in m.items()}
{'map': 1.0, 'mrr@10': 1.0, 'ndcg@10': 1.0, 'recall@1': 1.0}
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from kbert import backend
from kbert.finetuning.metrics import RANKING_DEPTH
from kbert.model.bert import FoldChoices, UnfoldChoices
from kbert.runtime.errors import KbertError

# What turns a logit into the score a reranker prints: sentence-transformers' CrossEncoder
# default for one output is the sigmoid; ms-marco-MiniLM-style models record none (identity).
ACTIVATIONS = ("sigmoid", "identity")


def activate(logits, activation: str) -> np.ndarray:
    """A reranker's scores from its logits.

    >>> activate(np.array([0.0, 2.0]), "sigmoid").round(4).tolist(), activate(np.array([2.0]), "identity").tolist()
    ([0.5, 0.8808], [2.0])
    """
    logits = np.asarray(logits, np.float64)
    if activation == "identity":
        return logits
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    raise KbertError(f"unknown reranker activation {activation!r}; use one of {', '.join(ACTIVATIONS)}")


# === Training ===

# A training batch's pairs run through the scorer in this many runs of like lengths, each cut to
# its own longest pair (at a multiple of `CHUNK_MULTIPLE` tokens). A batch holds whole groups, and
# most groups hold one long document: cut as one, every pair of the batch would pay for it.
LENGTH_CHUNKS = 4
CHUNK_MULTIPLE = 8


class ScoreInLengthChunks(keras.layers.Layer):
    """The scorer's logits [pairs, 1] of pairs [pairs, seq], computed in `chunks` runs: the pairs
    sorted by length, split into `chunks` runs of (nearly) equal size, each cut to its longest pair,
    and the logits put back in the pairs' order. Padding changes no logit, so this is the scorer's
    output on the whole batch, at the cost of each run's own lengths.

    A run's width depends on the batch's values, which a step compiled whole cannot have (XLA, on
    JAX: `kbert.backend.COMPILES_STEPS`); there `chunks` is 1, the whole batch in one run.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> classifier = kbert.bert_classifier(config, 1)
    >>> mask = np.array([[1] * n + [0] * (24 - n) for n in (20, 3, 9, 5)], "int32")
    >>> pairs = {"input_ids": mask * 7, "input_mask": mask, "segment_ids": np.zeros_like(mask)}
    >>> whole = keras.ops.convert_to_numpy(classifier(pairs)["logits"])
    >>> chunked = keras.ops.convert_to_numpy(ScoreInLengthChunks(classifier, chunks=3)(pairs))
    >>> bool(np.abs(chunked - whole).max() < 1e-5)
    True
    """

    def __init__(self, scorer, chunks: int, **kwargs):
        super().__init__(**kwargs)
        self.scorer = scorer
        self.chunks = chunks

    def call(self, pairs):
        if self.chunks == 1:
            return self.scorer(pairs)["logits"]
        mask = pairs["input_mask"]
        lengths = ops.sum(ops.cast(mask, "int32"), axis=-1)
        order = ops.argsort(lengths)
        count = ops.shape(lengths)[0]
        logits = []
        for chunk in range(self.chunks):
            rows = order[chunk * count // self.chunks : (chunk + 1) * count // self.chunks]
            longest = ops.max(ops.take(lengths, rows), initial=1)
            width = ops.minimum(ops.shape(mask)[-1], (longest + CHUNK_MULTIPLE - 1) // CHUNK_MULTIPLE * CHUNK_MULTIPLE)
            logits.append(
                self.scorer({name: ops.take(x, rows, axis=0)[:, :width] for name, x in pairs.items()})["logits"]
            )
        return ops.take(ops.concatenate(logits, axis=0), ops.argsort(order), axis=0)

    def compute_output_spec(self, pairs):
        return keras.KerasTensor((pairs["input_ids"].shape[0], 1), dtype=self.scorer.output["logits"].dtype)


class GroupScorer(keras.Model):
    """A reranker's logits for a query's group of documents at once.

    Inputs: the scorer's encoder inputs, each int32 [queries, documents, seq] (each pair packed
    as [CLS] query [SEP] document [SEP]). Output: {"logits": float32 [queries, documents]}.

    Args:
        scorer: a classifier of one output (`kbert.model.families.classifier(base, 1)`): it scores
            every pair, and is the model a run saves.
        chunks: how many runs of like lengths a batch's pairs are scored in (`ScoreInLengthChunks`);
            by default `LENGTH_CHUNKS`, or 1 where Keras' steps are compiled whole.

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> scorer = GroupScorer(kbert.bert_classifier(config, 1))
    >>> ids = np.array([[[2, 7, 3, 9, 3], [2, 7, 3, 5, 3], [2, 7, 3, 6, 3]]], dtype="int32")
    >>> out = scorer({"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    >>> tuple(out["logits"].shape)
    (1, 3)
    """

    def __init__(self, scorer, chunks: int | None = None, **kwargs):
        kwargs.setdefault("name", "group_scorer")
        if chunks is None:
            chunks = 1 if backend.COMPILES_STEPS else LENGTH_CHUNKS
        # === Functional Model ===
        inputs = {name: keras.Input(shape=(None, None), dtype="int32", name=name) for name in scorer.input}
        # Every pair is one sequence to the scorer: [queries·documents, seq].
        flat = {name: FoldChoices(name=f"fold_{name}")(tensor) for name, tensor in inputs.items()}
        pair_logits = ScoreInLengthChunks(scorer, chunks, name="score_in_length_chunks")(flat)
        logits = UnfoldChoices(name="unfold_groups")(pair_logits, inputs["input_ids"])
        super().__init__(inputs=inputs, outputs={"logits": ops.cast(logits, "float32")}, **kwargs)

        # === Config ===
        self.scorer = scorer

    @property
    def vocab_file(self):
        return self.scorer.vocab_file

    @property
    def do_lower_case(self):
        return self.scorer.do_lower_case


class ListwiseSoftmax(keras.losses.Loss):
    """Softmax cross-entropy over each query's group: y_true [queries, documents] marks the right
    document with 1 (the group's first, as the files give it), y_pred the logits."""

    def __init__(self, name="listwise_softmax", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "float32")
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        return -ops.sum(y_true * log_probs, axis=-1) / ops.maximum(ops.sum(y_true, axis=-1), 1.0)


class MarginMSE(keras.losses.Loss):
    """Squared error between margins: the model's (logit of the group's first document less each
    other's) and the teacher's (its score of the first less its score of each other), averaged
    over the other documents, as sentence-transformers' MarginMSELoss. y_true: the teacher's
    scores [queries, documents]; y_pred: the logits."""

    def __init__(self, name="margin_mse", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        y_true, y_pred = ops.cast(y_true, "float32"), ops.cast(y_pred, "float32")
        teacher = y_true[:, :1] - y_true[:, 1:]
        student = y_pred[:, :1] - y_pred[:, 1:]
        return ops.mean(ops.square(student - teacher), axis=-1)


def loss_of(name: str) -> keras.losses.Loss:
    """The Keras loss of `--loss NAME` over [queries, documents] logits."""
    if name == "bce":
        return keras.losses.BinaryCrossentropy(from_logits=True)
    if name == "listwise":
        return ListwiseSoftmax()
    return MarginMSE()


# === Metrics ===


def rerank_metrics(scores, relevant, k: int = RANKING_DEPTH) -> dict:
    """MAP, MRR@k, NDCG@k and recall@1 of each query's documents ordered by score, averaged over
    queries: sentence-transformers' CrossEncoderRerankingEvaluator's definitions (its MRR reads
    the order of `numpy.argsort(scores)[::-1]`; NDCG and average precision are scikit-learn's,
    which average over tied scores), and recall@1 as `kbert.finetuning.metrics.ranking_metrics`
    has it (the relevant share of the first document). A query with no relevant document scores 0.

    Args:
        scores: sequence of float sequences. Each query's documents' scores (higher first).
        relevant: sequence of 0/1 sequences. Which of each query's documents are relevant.
        k: int. The cut-off of MRR and NDCG.

    Example:
    >>> m = rerank_metrics([[0.9, 0.8, 0.1], [0.2, 0.1]], [[0, 1, 0], [0, 0]])
    >>> {k: round(v, 4) for k, v in m.items()}
    {'map': 0.25, 'mrr@10': 0.25, 'ndcg@10': 0.3155, 'recall@1': 0.0}
    """
    if len(scores) != len(relevant):
        raise KbertError(f"{len(scores)} score lists but {len(relevant)} relevance lists; give one per query")
    if not len(scores):
        raise KbertError("no queries to score; the evaluation set is empty")
    totals = np.zeros(4)
    for row_scores, row_relevant in zip(scores, relevant):
        y_pred = np.asarray(row_scores, np.float64)
        y_true = np.asarray(row_relevant, np.float64)
        if y_true.sum() == 0:
            continue
        order = np.argsort(y_pred)[::-1]
        hits = np.flatnonzero(y_true[order][:k])
        mrr = 1.0 / (hits[0] + 1) if len(hits) else 0.0
        recall_1 = y_true[order[0]] / y_true.sum()
        totals += (average_precision(y_true, y_pred), mrr, ndcg(y_true, y_pred, k), recall_1)
    average = (totals / len(scores)).tolist()
    return {"map": average[0], f"mrr@{k}": average[1], f"ndcg@{k}": average[2], "recall@1": average[3]}


def average_precision(y_true, y_pred) -> float:
    """scikit-learn's average_precision_score for one query: the precision at each distinct score,
    weighted by the recall gained there (tied documents enter together).

    >>> average_precision(np.array([1, 0, 1]), np.array([0.9, 0.5, 0.5]))
    0.8333333333333333
    """
    order = np.argsort(-y_pred, kind="stable")
    y_true, y_pred = y_true[order], y_pred[order]
    last_of_score = np.r_[np.flatnonzero(np.diff(y_pred)), len(y_pred) - 1]  # each distinct score's last place
    true_positives = np.cumsum(y_true)[last_of_score]
    precision = true_positives / (last_of_score + 1)
    recall_gained = np.diff(np.r_[0.0, true_positives]) / y_true.sum()
    return float(np.sum(precision * recall_gained))


def ndcg(y_true, y_pred, k: int) -> float:
    """scikit-learn's ndcg_score for one query at cut-off k (ignore_ties=False): tied documents
    share the mean of their gains over the places they take; the ideal puts the gains in order.

    >>> round(ndcg(np.array([0, 1, 0]), np.array([0.9, 0.8, 0.1]), 10), 4)
    0.6309
    """
    discount = 1.0 / np.log2(np.arange(len(y_true)) + 2)
    discount[k:] = 0.0
    ideal = float(np.sort(y_true)[::-1] @ discount)
    if ideal == 0:
        return 0.0
    values, inverse, counts = np.unique(-y_pred, return_inverse=True, return_counts=True)
    gains = np.zeros(len(values))
    np.add.at(gains, inverse, y_true)
    place_ends = np.cumsum(counts)
    discount_sums = np.cumsum(discount)[place_ends - 1] - np.r_[0.0, np.cumsum(discount)[place_ends[:-1] - 1]]
    return float(np.sum(gains / counts * discount_sums)) / ideal
