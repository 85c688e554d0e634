"""The first stage of retrieve-then-rerank, with a sentence-embedding model: each query's nearest
documents by cosine (`kbert rerank --candidates-from`), and hard negatives mined the same way for
a reranker's training pairs (`kbert finetune --task rerank --mine-negatives`).

Mining follows sentence-transformers' `mine_hard_negatives`: the corpus is the file's distinct
documents, each query's candidates are its nearest ones, and a candidate is skipped when it is one
of the query's own documents or a near-duplicate of its document (cosine at least
`NEAR_DUPLICATE`: the same text reworded, which would teach the reranker to reject a right answer).

Example:
>>> import numpy as np
>>> nearest_indexes(np.eye(3)[[2, 0]], np.eye(3), k=2).tolist()
[[2, 0], [0, 1]]
"""

from __future__ import annotations

import logging
import os

import numpy as np

from kbert.finetuning.embedding import embed
from kbert.finetuning.metrics import top_documents
from kbert.model.embedding_record import embedding_of
from kbert.runtime.errors import KbertError, option

log = logging.getLogger("kbert")

# A candidate this close (cosine) to a query's document is that document reworded: never a negative.
NEAR_DUPLICATE = 0.98
_QUERIES_AT_ONCE = 1024


def open_embedding_model(path, flag: str):
    """The sentence-embedding model at `path`; a one-line error for any other model."""
    from kbert.formats.sources import open_model

    model = open_model(path)
    if embedding_of(model) is None:
        raise KbertError(
            f"{option(flag, os.fspath(path))}: not a sentence-embedding model (it records no pooling); give one "
            f"{option('task', 'embed', command='finetune')} wrote, or a sentence-transformers folder"
        )
    return model


def unit_vectors(model, texts, batch_size: int) -> np.ndarray:
    """Each text's vector from the embedding model, L2-normalised (cosine is then a dot product)."""
    vectors = np.asarray(embed(model, texts, batch_size=batch_size), np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def nearest_indexes(query_vectors, document_vectors, k: int) -> np.ndarray:
    """int [queries, min(k, documents)]: each query's `k` nearest documents by dot product, best
    first, equal scores in index order."""
    parts = [
        top_documents(query_vectors[first : first + _QUERIES_AT_ONCE] @ document_vectors.T, k)
        for first in range(0, len(query_vectors), _QUERIES_AT_ONCE)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.int64)


def candidates(model, queries, corpus, k: int, batch_size: int = 32) -> np.ndarray:
    """Each query's `k` nearest corpus texts (their indexes, best first) by the embedding model."""
    return nearest_indexes(unit_vectors(model, queries, batch_size), unit_vectors(model, corpus, batch_size), k)


def mine_negatives(model, queries, documents, count: int, batch_size: int = 32) -> tuple[list, list]:
    """Hard negatives for (query, document) pairs: for each row, the `count` documents of the file
    nearest its query that are neither one of its query's documents nor a near-duplicate of its
    own. Returns (rows kept, their negatives): a row with fewer than `count` such documents is
    left out, as sentence-transformers leaves it out."""
    corpus = list(dict.fromkeys(documents))
    index = {text: i for i, text in enumerate(corpus)}
    own: dict = {}
    for query, document in zip(queries, documents):
        own.setdefault(query, set()).add(index[document])
    distinct = list(own)
    document_vectors = unit_vectors(model, corpus, batch_size)
    query_vectors = unit_vectors(model, distinct, batch_size)
    # Enough candidates for the skipped ones: the query's own documents and a few near-duplicates.
    depth = min(len(corpus), count + max(len(v) for v in own.values()) + 16)
    ranked = dict(zip(distinct, nearest_indexes(query_vectors, document_vectors, depth)))
    kept, negatives = [], []
    for row, (query, document) in enumerate(zip(queries, documents)):
        positive = document_vectors[index[document]]
        found = [
            corpus[c]
            for c in ranked[query]
            if c not in own[query] and float(document_vectors[c] @ positive) < NEAR_DUPLICATE
        ][:count]
        if len(found) == count:
            kept.append(row)
            negatives.append(found)
    if len(kept) < len(queries):
        log.warning(
            "%d of %d pairs have fewer than %d documents to mine as negatives and are left out",
            len(queries) - len(kept),
            len(queries),
            count,
        )
    if not kept:
        raise KbertError(
            f"no pair has {count} documents to mine as negatives; give more pairs, or a smaller {option('negatives')}"
        )
    return kept, negatives
