"""rerank: a cross-encoder, one score per (query, document) pair, that reorders a first stage's
candidates (sentence-transformers' CrossEncoder).

It trains on labelled pairs or on groups (a query, its relevant document, its negatives:
`kbert.finetuning.rerank_files`) with `--loss` bce (the default), listwise or margin-mse
(`kbert.finetuning.reranking`). The model is a classifier of one output on the pair; it records
its activation (sigmoid, as a CrossEncoder of one output applies by default), which turns a
logit into the score it prints. Its dev score, and `kbert evaluate`'s, is how it ranks each
query's documents: MAP, MRR@10, NDCG@10 and recall@1, as CrossEncoderRerankingEvaluator
defines them; `evaluate` reads candidate lists and also gives the first stage's. `kbert predict`
and `kbert rerank` read candidate lists, `{"query": ..., "documents": [...]}` per line, and
answer `{"scores": [...], "ranking": [...]}`.

Example:
>>> RERANK.metric, RERANK.head, RERANK.head_outputs
('ndcg@10', 'classifier', 1)
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from kbert.finetuning import encoding, first_stage, rerank_files, reranking
from kbert.finetuning.tasks.base import Task, TaskData, keras_predict
from kbert.finetuning.tasks.regress import REGRESS_API
from kbert.model import families
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import atomic_write_text

DEFAULT_LOSS = "bce"
DEFAULT_ACTIVATION = "sigmoid"
DEFAULT_NEGATIVES = 3  # sentence-transformers' mine_hard_negatives' num_negatives

log = logging.getLogger("kbert")


def ranking_row(scores, top_k: int | None = None) -> dict:
    """A query's answer: its documents' scores, in their order, and their indexes best first
    (the first `top_k` of them); equal scores keep the documents' order.

    >>> ranking_row([0.2, 0.9, 0.2], top_k=2)
    {'scores': [0.2, 0.9, 0.2], 'ranking': [1, 0]}
    """
    scores = np.asarray(scores, np.float64)
    ranking = np.argsort(-scores, kind="stable")[:top_k].tolist()
    return {"scores": [round(float(s), 6) for s in scores], "ranking": ranking}


class Rerank(Task):
    """A score per (query, document) pair, from one model that reads both."""

    name = "rerank"
    metric = "ndcg@10"
    head = "classifier"
    head_outputs = 1
    served = True
    trains_pooler = True
    reranks = True
    own_options = ("loss", "teacher_scores", "mine_negatives", "negatives", "group_by_length")

    # === Reading and encoding ===

    def read_rows(self, path, *, options, require_labels):
        if _holds_candidate_lists(path, options.format):
            return rerank_files.read_candidate_lists(
                path, skip_bad_rows=options.skip_bad_rows, require_positives=require_labels
            )
        teacher = options.teacher_scores if options.loss == "margin-mse" else None
        return rerank_files.read_rerank_examples(
            path, format=options.format, skip_bad_rows=options.skip_bad_rows, teacher_scores=teacher
        )

    def encode(self, examples, *, path, preprocessor, labels, options, require_labels, training):
        if isinstance(examples, rerank_files.CandidateLists):
            # One row per pair, every query's documents in turn: lists differ in length.
            queries = [q for q, documents in zip(examples.queries, examples.documents) for _ in documents]
            documents = [d for row in examples.documents for d in row]
            features, truncated = encoding.encode_texts(preprocessor, queries, documents)
            sizes = [len(row) for row in examples.documents]
            return TaskData(features, None, None, len(queries), truncated, examples, extra=sizes)
        if training and options.loss in ("listwise", "margin-mse") and not examples.grouped:
            raise KbertError(
                f"{option('loss', options.loss)} compares each query's documents with each other; {path} holds "
                f"labelled pairs: give groups (query, document, negative, ...), or use {option('loss', DEFAULT_LOSS)}"
            )
        features, truncated = encoding.encode_choices(preprocessor, examples.queries, examples.groups)
        wanted = examples.teacher if examples.teacher is not None else examples.labels
        targets = {"logits": np.asarray(wanted, np.float32)}
        return TaskData(features, targets, None, len(examples.queries), truncated, examples, trim_batches=True)

    # === Training ===

    def why_no_windows(self):
        return "rerank packs each query with each document as a pair"

    def check_options(self, opts):
        super().check_options(opts)
        if opts.loss == "margin-mse" and opts.teacher_scores is None:
            raise KbertError(
                f"{option('loss', 'margin-mse')} learns a teacher's margins: name the column of its scores "
                f"with {option('teacher_scores')}"
            )
        if opts.negatives is not None and opts.mine_negatives is None:
            raise KbertError(
                f"{option('negatives', opts.negatives)} is how many {option('mine_negatives')} mines; add it, or drop "
                f"{option('negatives')}"
            )
        if opts.mine_negatives is not None and opts.loss == "margin-mse":
            raise KbertError(
                f"{option('loss', 'margin-mse')} learns a teacher's scores, which mined negatives have none of; "
                f"give groups with {option('teacher_scores')}, or another {option('loss')}"
            )
        if opts.teacher_scores is not None and opts.loss != "margin-mse":
            raise KbertError(
                f"{option('teacher_scores', opts.teacher_scores)} is read by {option('loss', 'margin-mse')} only; "
                f"add it, or drop {option('teacher_scores')}"
            )

    def training_file(self, train, output, opts):
        if opts.mine_negatives is None:
            return train
        mined = f"{os.fspath(output)}.mined.jsonl"
        if opts.resume and os.path.exists(mined):  # the negatives the interrupted run trained on
            log.info("%s: the negatives mined before, read again", mined)
            return mined
        pairs = rerank_files.read_rerank_examples(
            train, format=opts.format, skip_bad_rows=opts.skip_bad_rows, positives_only=True
        )
        model = first_stage.open_embedding_model(opts.mine_negatives, "mine_negatives")
        count = opts.negatives or DEFAULT_NEGATIVES
        documents = [group[0] for group in pairs.groups]
        # --batch-size counts groups of 1 + count pairs; embedding is lighter than training, so a step's worth of texts.
        texts_per_batch = opts.batch_size * (1 + count)
        kept, negatives = first_stage.mine_negatives(model, pairs.queries, documents, count, texts_per_batch)
        rows = [
            json.dumps({"query": pairs.queries[row], "document": documents[row], "negatives": found}) + "\n"
            for row, found in zip(kept, negatives)
        ]
        atomic_write_text(mined, "".join(rows))
        log.info("%s: %d negatives mined for each of %d pairs with %s", mined, count, len(kept), opts.mine_negatives)
        return mined

    def check_training_data(self, path, data):
        if isinstance(data.raw, rerank_files.CandidateLists):
            raise KbertError(
                f"{path} holds candidate lists, which kbert evaluate and kbert rerank read; train on labelled "
                f"pairs (query, document, label) or groups (query, document, negative, ...)"
            )

    def build(self, base, *, labels, task_info=None):
        return reranking.GroupScorer(families.classifier(base, 1, task_info=task_info))

    def losses(self, options=None):
        name = (options.loss if options is not None else None) or DEFAULT_LOSS
        return {"logits": reranking.loss_of(name)}, None

    def record(self, opts, max_seq_length, data):
        return {"activation": DEFAULT_ACTIVATION}

    def fingerprint(self, opts):
        return {
            "loss": opts.loss or DEFAULT_LOSS,
            "teacher_scores": opts.teacher_scores,
            "mine_negatives": opts.mine_negatives and os.path.abspath(opts.mine_negatives),
            "negatives": opts.negatives,
        }

    def saved(self, model):
        return model.scorer

    # === Scoring and predicting ===

    def outputs(self, model, data, batch_size, run=keras_predict):
        scorer = getattr(model, "scorer", model)
        logits = pair_logits(scorer, data.features, batch_size, run)
        activation = (getattr(scorer, "task_info", None) or {}).get("activation", DEFAULT_ACTIVATION)
        return {"logits": logits, "scores": reranking.activate(logits, activation).astype(np.float32)}

    def score(self, data, outputs, *, options, do_lower_case):
        if isinstance(data.raw, rerank_files.CandidateLists):
            return candidate_scores(data.raw, _per_query(outputs["scores"], data.extra))
        relevant = [[1 if label > 0 else 0 for label in row] for row in data.raw.labels]
        if data.raw.grouped:
            return {**reranking.rerank_metrics(outputs["scores"], relevant), "queries": len(relevant)}
        # Labelled pairs: a query's documents are the rows it is the query of.
        by_query: dict = {}
        for query, score, rel in zip(data.raw.queries, outputs["scores"][:, 0], relevant):
            by_query.setdefault(query, ([], []))
            by_query[query][0].append(float(score))
            by_query[query][1].append(rel[0])
        scores, relevant = zip(*by_query.values())
        return {**reranking.rerank_metrics(scores, relevant), "queries": len(by_query)}

    def examples_scored(self, data):
        return len(data.raw)

    def rows(self, data, outputs, *, options, do_lower_case):
        if not isinstance(data.raw, rerank_files.CandidateLists):
            return ({"scores": [round(float(s), 6) for s in row]} for row in outputs["scores"])
        return (ranking_row(scores) for scores in _per_query(outputs["scores"], data.extra))

    # === Serving ===

    def serving_head(self, model, labels, heads, record=None):
        return heads.serve_reranker(model, (record or {}).get("activation", DEFAULT_ACTIVATION))

    def served_by(self, signatures):
        # A regressor of pairs serves text, text_b and score too, with the Regress API beside them.
        default = signatures.get("serving_default", {})
        pairs = "text_b" in default.get("inputs", {}) and set(default.get("outputs", {})) == {"score"}
        return pairs and REGRESS_API not in signatures

    def served_answers(self, client, examples, signatures, path):
        if not isinstance(examples, rerank_files.CandidateLists):
            raise KbertError(
                f'{path}: a served reranker reads JSON Lines of {{"query": ..., "documents": [...]}}, one query per line'
            )

        def answer(part, first):
            # Every query's pairs in one request, then split back per query.
            queries = [q for q, documents in zip(part.queries, part.documents) for _ in documents]
            documents = [d for row in part.documents for d in row]
            scores = client.predict_text(queries, documents)["score"]
            return [ranking_row(row) for row in _per_query(scores, [len(row) for row in part.documents])]

        return answer

    # === What a head records ===

    def check_head(self, info, num_classes, kind):
        super().check_head(info, num_classes, kind)
        if num_classes != 1:
            raise KbertError(
                f"task rerank needs a classifier with one output (num_classes=1); this one has {num_classes}"
            )
        activation = info.setdefault("activation", DEFAULT_ACTIVATION)
        if activation not in reranking.ACTIVATIONS:
            raise KbertError(
                f"activation {activation!r}: a reranker's scores are its logits through "
                f"{' or '.join(reranking.ACTIVATIONS)}"
            )


def pair_logits(scorer, features: dict, batch_size: int, run=keras_predict) -> np.ndarray:
    """The scorer's logit of every pair in `features` (int32 [..., seq]: pairs, or groups of
    them), shaped as the features' leading axes.

    Pairs are run shortest first, each run cut to its longest pair rounded up to 16 tokens: padding
    changes no logit, so a batch of short pairs costs what its tokens cost, and a few widths are
    traced. run: (model, features, batch_size) -> outputs (`keras_predict`, or `kbert predict`'s
    batch at a time).
    """
    shape = features["input_ids"].shape
    flat = {name: values.reshape(-1, shape[-1]) for name, values in features.items()}
    lengths = flat["input_mask"].sum(axis=1)
    widths = np.minimum(shape[-1], -(-np.maximum(lengths, 1) // 16) * 16)
    logits = np.zeros(len(lengths), np.float32)
    for width in np.unique(widths):
        rows = np.flatnonzero(widths == width)
        part = {name: values[rows, :width] for name, values in flat.items()}
        logits[rows] = np.asarray(run(scorer, part, batch_size)["logits"], np.float32)[:, 0]
    return logits.reshape(shape[:-1])


def candidate_scores(lists, scores) -> dict:
    """The metrics of reranked candidate lists, and of their first-stage order ("base_"), as
    sentence-transformers' CrossEncoderRerankingEvaluator gives them with its
    `always_rerank_positives=False`: the reranker orders the candidates it was given; the first
    stage's metrics count the relevant documents it did not find as ranked below its last."""
    relevant = [
        [int(d in positive) for d in documents] for documents, positive in zip(lists.documents, lists.positives)
    ]
    result = reranking.rerank_metrics(scores, relevant)
    if lists.ranked:
        base_relevant = [
            found + [1] * max(0, len(positive) - sum(found)) if sum(found) else found
            for found, positive in zip(relevant, lists.positives)
        ]
        base = reranking.rerank_metrics([np.arange(len(row), 0, -1) for row in base_relevant], base_relevant)
        result.update({f"base_{name}": value for name, value in base.items()})
    return {**result, "queries": len(lists), "documents": sum(len(row) for row in lists.documents)}


def _per_query(values, sizes) -> list:
    """A flat array of every query's values, split back into one array per query."""
    return np.split(np.asarray(values), np.cumsum(sizes)[:-1]) if sizes else []


def _holds_candidate_lists(path, format: str) -> bool:
    """Whether a file is candidate lists (JSON Lines whose first object has a "documents" list or
    a "positive" list), not a training file."""
    path = os.fspath(path)
    if format not in ("auto", "jsonl") or (format == "auto" and not path.endswith((".jsonl", ".json"))):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = next((line for line in f if line.strip()), "")
        row = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and (isinstance(row.get("documents"), list) or isinstance(row.get("positive"), list))


RERANK = Rerank()
