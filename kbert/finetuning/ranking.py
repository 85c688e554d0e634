"""`kbert finetune --task embed`: sentence embeddings trained on (query, document) pairs, and the
ranking `kbert evaluate` scores them by.

Training is sentence-transformers' MultipleNegativesRankingLoss (scale 20, cosine similarity): in
a batch of B pairs, each query's own document is the right answer and the other B - 1 documents
(and every row's hard negative, when the file has a `negative` column) are wrong ones. `PairRanker`
embeds both sides with ONE encoder and the model's pooling, and outputs the logits
`20 * cos(query_i, candidate_j)` [B, B] ([B, 2B] with negatives: the documents, then the
negatives, in batch order, as sentence-transformers concatenates them); `InBatchNegatives` is
the softmax cross-entropy of each query against its own document's column i, averaged over the
batch. Its target is the query's place in its batch, so the batch is the unit of the loss: the
trainer shuffles the pairs and cuts full batches (a file smaller than one batch is one smaller
batch). Identical documents in one batch count as wrong answers for each other's queries, as in
sentence-transformers without its NoDuplicatesBatchSampler.

Scoring ranks each distinct query against every distinct document of the file (`pair_scores`):
rows with the same document text are one document (identical texts have identical vectors,
so counting them apart would let the file's order decide their ranks), and a query's relevant
documents are the documents of every row it is the query of. Negatives are not ranked.
Similarity is the cosine, whatever the model's `normalize` says.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from kbert.config import ENCODER_INPUTS
from kbert.finetuning.metrics import ranking_metrics, top_documents
from kbert.model.bert import BertEncoder
from kbert.model.pooling import SentencePooling

SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss default: cosine * 20
SIDES = ("query", "document", "negative")
_QUERIES_AT_ONCE = 1024  # queries scored against the whole corpus at a time


def side_features(features: dict, side: str) -> dict:
    """The encoder inputs of one side of a pairs file's features ("query_input_ids" -> "input_ids"):
    a BERT's three, a ModernBERT's two (it has no segment ids)."""
    return {name: features[f"{side}_{name}"] for name in ENCODER_INPUTS if f"{side}_{name}" in features}


def unit_vectors(encoder: BertEncoder, pooling: str) -> keras.Model:
    """encoder inputs -> the pooled vector of each text, L2-normalised: what cosine compares."""
    pooled = SentencePooling(pooling, normalize=True, name="cosine_pooling")(
        encoder.output["sequence_output"], encoder.input["input_mask"]
    )
    return keras.Model(encoder.input, pooled)


class PairRanker(keras.Model):
    """In-batch ranking of (query, document[, negative]) pairs with one shared encoder.

    Inputs: `{side}_input_ids`, `{side}_input_mask`, `{side}_segment_ids` int32 [batch, seq] for
    side query, document (and negative). Output: {"logits": float32 [batch, batch] (or
    [batch, 2·batch] with negatives)}, `scale` times the cosine of each query's and each
    candidate's pooled vector. Train it with `InBatchNegatives`.

    Args:
        encoder: `BertEncoder`. Embeds every side (its weights are shared, and trained).
        pooling: str. How token vectors become one vector (`kbert.model.pooling.POOLING_MODES`).
        negatives: bool. Whether batches hold a hard negative per pair.
        scale: float. The logits' factor (sentence-transformers' scale, 20).

    Example:
    >>> import numpy as np, kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> ranker = PairRanker(kbert.bert_encoder(config), "mean")
    >>> ids = np.array([[2, 7, 3], [2, 9, 3]], "int32")
    >>> side = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
    >>> out = ranker({f"{s}_{k}": v for s in ("query", "document") for k, v in side.items()})
    >>> tuple(out["logits"].shape)
    (2, 2)
    """

    def __init__(self, encoder: BertEncoder, pooling: str, *, negatives: bool = False, scale: float = SCALE, **kwargs):
        kwargs.setdefault("name", "pair_ranker")
        sides = SIDES if negatives else SIDES[:2]
        # === Layers ===
        pool = SentencePooling(pooling, normalize=True, name="cosine_pooling")

        # === Functional Model ===
        inputs = {
            f"{side}_{name}": keras.Input(shape=(None,), dtype="int32", name=f"{side}_{name}")
            for side in sides
            for name in ENCODER_INPUTS
            if name in encoder.input
        }
        vectors = []
        for side in sides:
            tokens = encoder(side_features(inputs, side))["sequence_output"]
            # float32 under mixed precision too: the softmax over 20 * cosine needs the digits.
            vectors.append(ops.cast(pool(tokens, inputs[f"{side}_input_mask"]), "float32"))
        candidates = ops.concatenate(vectors[1:], axis=0) if negatives else vectors[1]
        logits = ops.matmul(vectors[0], ops.transpose(candidates)) * scale
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        # === Config ===
        self.encoder, self.pooling, self.negatives, self.scale = encoder, pooling, bool(negatives), float(scale)
        self.embedder = unit_vectors(encoder, pooling)

    @property
    def vocab_file(self):
        return self.encoder.vocab_file

    @property
    def do_lower_case(self):
        return self.encoder.do_lower_case


class InBatchNegatives(keras.losses.Loss):
    """Softmax cross-entropy of each row of `PairRanker`'s logits against its own column: row i's
    target is i, its place in the batch (whatever `y_true` holds), so with the logits of
    `PairRanker` this is sentence-transformers' MultipleNegativesRankingLoss.

    Example:
    >>> logits = np.array([[2.0, 0.0], [1.0, 3.0]], "float32")
    >>> round(float(InBatchNegatives()(np.zeros(2), logits)), 4)  # mean of -log softmax(row)[i]
    0.1269
    """

    def __init__(self, name="in_batch_negatives", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        targets = ops.arange(ops.shape(y_pred)[0])
        return keras.losses.sparse_categorical_crossentropy(targets, y_pred, from_logits=True)


def pair_vectors(embedder: keras.Model, features: dict, batch_size: int, sides=SIDES[:2]) -> dict:
    """{side: float32 [rows, H]}: the unit vectors of each row's query and document (`unit_vectors`
    model), `batch_size` rows at a time, each batch cut to its longest text (padding changes no
    real token's vector)."""
    out = {}
    for side in sides:
        inputs = side_features(features, side)
        lengths = inputs["input_mask"].sum(axis=1)
        parts = []
        for first in range(0, len(lengths), batch_size):
            width = max(int(lengths[first : first + batch_size].max()), 1)
            batch = {name: values[first : first + batch_size, :width] for name, values in inputs.items()}
            parts.append(np.asarray(embedder.predict_on_batch(batch), np.float32))
        out[side] = np.concatenate(parts) if parts else np.zeros((0, embedder.output.shape[-1]), np.float32)
    return out


def pair_scores(queries, documents, vectors: dict) -> dict:
    """The ranking metrics of a pairs file: each distinct query against every distinct document.

    Args:
        queries, documents: lists of str. Each row's query and document.
        vectors: {"query": [rows, H], "document": [rows, H]}, unit length (`pair_vectors`).

    Returns:
        `kbert.finetuning.metrics.ranking_metrics`' recall@1, recall@10, mrr@10, ndcg@10, and
        the number of distinct queries and documents ranked.

    Example:
    >>> vectors = {"query": np.eye(3)[[0, 1, 1]], "document": np.eye(3)[[0, 2, 1]]}
    >>> scores = pair_scores(["a", "b", "b"], ["A", "C", "B"], vectors)  # "b" has two relevant documents
    >>> {k: round(v, 4) for k, v in scores.items()}
    {'recall@1': 0.75, 'recall@10': 1.0, 'mrr@10': 1.0, 'ndcg@10': 0.9599, 'queries': 2, 'documents': 3}
    """
    corpus, first_document = {}, []
    for row, text in enumerate(documents):
        if text not in corpus:
            corpus[text] = len(corpus)
            first_document.append(row)
    asked, first_query, relevant = {}, [], []
    for row, (query, document) in enumerate(zip(queries, documents, strict=True)):
        if query not in asked:
            asked[query] = len(asked)
            first_query.append(row)
            relevant.append(set())
        relevant[asked[query]].add(corpus[document])
    query_vectors = np.asarray(vectors["query"], np.float32)[first_query]
    document_vectors = np.asarray(vectors["document"], np.float32)[first_document]
    ranked = [
        top_documents(query_vectors[first : first + _QUERIES_AT_ONCE] @ document_vectors.T)
        for first in range(0, len(query_vectors), _QUERIES_AT_ONCE)
    ]
    metrics = ranking_metrics(np.concatenate(ranked), relevant)
    return {**metrics, "queries": len(asked), "documents": len(corpus)}
