"""embed: sentence embeddings on (query, document) pairs, with in-batch negatives.

It reads pairs (columns query, document[, negative]: `kbert.finetuning.readers.read_pair_examples`)
and trains the encoder so that each query's vector is closest to its document's among the
batch's (`kbert.finetuning.ranking`: scaled cosine, cross-entropy). The output is an embedding
model: the encoder, its pooling, normalisation and length recorded in bert_config.json's
`embedding` (`kbert.model.embedding_record`), scored by ranking each query against every
document of a file (recall@1, recall@10, mrr@10, ndcg@10).

Example:
>>> EMBED.metric, EMBED.head, EMBED.embeds
('ndcg@10', None, True)
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from kbert.finetuning import encoding, ranking, readers
from kbert.finetuning.tasks.base import Task, TaskData
from kbert.model import families
from kbert.model.embedding_record import EMBEDDING_KEY, embedding_of, embedding_settings
from kbert.runtime.errors import KbertError, option

log = logging.getLogger("kbert")

# The command that writes an embedding model, as messages about a saved model name it (whatever
# the running command).
WRITTEN_BY = "kbert finetune --task embed"


def cut_to_longest(encoded: dict, multiple: int = 8) -> dict:
    """One side's inputs cut to its longest text (rounded up to `multiple` tokens, within the
    padded length): padding changes no vector (attention and pooling skip it), and a side of
    short texts (queries of a few words) then costs what its words cost rather than the whole
    --max-seq-length. The length is the file's, so every batch has one shape (one trace).

    >>> mask = np.array([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]] * 2)
    >>> cut_to_longest({"input_mask": mask})["input_mask"].shape
    (2, 8)
    """
    padded = encoded["input_mask"].shape[1]
    longest = int(encoded["input_mask"].sum(axis=1).max(initial=0))
    length = min(padded, max(multiple, -(-longest // multiple) * multiple))
    return {name: values[:, :length] for name, values in encoded.items()}


class Embed(Task):
    """A sentence-embedding model: one vector per text, close for a query and its document."""

    name = "embed"
    metric = "ndcg@10"
    embeds = True
    own_options = ("pooling", "normalize", "group_by_length")

    # === Reading and encoding ===

    def read_rows(self, path, *, options, require_labels):
        return readers.read_pair_examples(path, format=options.format, skip_bad_rows=options.skip_bad_rows)

    def encode(self, examples, *, path, preprocessor, labels, options, require_labels, training):
        features, truncated, texts = {}, 0, 0
        for side, side_texts in zip(ranking.SIDES, (examples.queries, examples.documents, examples.negatives)):
            if side_texts is None:
                continue
            encoded, cut = encoding.encode_texts(preprocessor, side_texts)
            encoded = cut_to_longest(encoded)
            features.update({f"{side}_{name}": values for name, values in encoded.items()})
            truncated, texts = truncated + cut, texts + len(side_texts)
        if truncated:  # texts, not rows: TaskData.truncated counts examples
            log.warning(
                "%s: %d of %d texts longer than %s were truncated",
                path,
                truncated,
                texts,
                option("max_seq_length", preprocessor.sequence_length),
            )
        # InBatchNegatives reads each query's place in its batch; model.fit wants a target per row.
        targets = {"logits": np.zeros(len(examples), np.int32)}
        return TaskData(features, targets, None, len(examples), 0, examples, trim_batches=True)

    # === Training ===

    def settle(self, base, options, *, where):
        """The pooling, normalisation and length of the sentence vectors: the ones given, over the
        base model's embedding record (a model with none needs a pooling)."""
        settings = embedding_settings(base, options.pooling, options.normalize, options.max_seq_length, where)
        recorded = (embedding_of(base) or {}).get("max_seq_length")
        if recorded is not None and recorded != settings.max_seq_length:
            # As sentence-transformers saves the max_seq_length it trained with: said, as it changes what
            # every later command reads.
            log.warning(
                "%s embeds texts of up to %d tokens; the fine-tuned model records %s, its training length, so "
                "kbert embed, predict, evaluate and export keep %d tokens of a text unless given another %s",
                where,
                recorded,
                option("max_seq_length", settings.max_seq_length),
                settings.max_seq_length,
                option("max_seq_length"),
            )
        return dataclasses.replace(
            options, pooling=settings.pooling, normalize=settings.normalize, max_seq_length=settings.max_seq_length
        )

    def build(self, base, *, labels, task_info=None):
        embedding = task_info[EMBEDDING_KEY]
        ranker = ranking.PairRanker(
            families.encoder_of(base), embedding["pooling"], negatives=task_info.get("negatives", False)
        )
        ranker.embedding = dict(embedding)
        return ranker

    def losses(self, options=None):
        return {"logits": ranking.InBatchNegatives()}, None

    def record(self, opts, max_seq_length, data):
        # How the encoder's vectors are pooled, and whether batches hold hard negatives.
        return {
            EMBEDDING_KEY: {"pooling": opts.pooling, "normalize": opts.normalize, "max_seq_length": max_seq_length},
            "negatives": data.raw.negatives is not None,
        }

    def fingerprint(self, opts):
        return {"pooling": opts.pooling, "normalize": opts.normalize}

    def saved(self, ranker):
        """The ranker's encoder as an embedding model: its pooling, normalisation and length recorded
        (bert_config.json's embedding, as kbert convert from-hf records a sentence-transformers
        model's), its task embed."""
        encoder = ranker.encoder
        # A copy of the config (a BERT's or a ModernBERT's), the record added to its extras.
        extras = {**encoder.config.extras, EMBEDDING_KEY: dict(ranker.embedding)}
        encoder.config = dataclasses.replace(encoder.config, extras=extras)
        encoder.task_info = {"task": self.name}
        encoder.fresh_heads = tuple(getattr(ranker, "fresh_heads", ()))
        return encoder

    # === Scoring and predicting ===

    def outputs(self, model, data, batch_size, run=None):
        # A PairRanker's logits compare the rows of one batch with each other: each row's query
        # and document vectors instead.
        return ranking.pair_vectors(model.embedder, data.features, batch_size)

    def score(self, data, outputs, *, options, do_lower_case):
        return ranking.pair_scores(data.raw.queries, data.raw.documents, outputs)

    def rows(self, data, outputs, *, options, do_lower_case):
        raise KbertError("an embedding model gives one vector per text, not one answer per pair: use kbert embed")

    def evaluate(self, model, path, opts, *, preprocessor, packer, where) -> dict:
        """A model's ranking of a pairs file: each distinct query against every distinct
        document, with its vectors pooled as the model records (or as `opts.pooling` says)."""
        if opts.pooling is None and embedding_of(model) is None:  # ranking compares cosines: no normalize to choose
            raise KbertError(
                f"{where} records no sentence-embedding pooling (fine-tuning with "
                f"{option('task', 'embed', command='finetune')} and kbert convert from-hf record one); pass "
                f"{option('pooling')} cls|mean|max|mean_sqrt_len to rank with one"
            )
        settings = embedding_settings(model, opts.pooling, None, opts.max_seq_length, where)
        preprocessor = packer(settings.max_seq_length)
        data = self.read(
            path, preprocessor=preprocessor, labels=None, options=opts, require_labels=True, training=False
        )
        embedder = ranking.unit_vectors(families.encoder_of(model), settings.pooling)
        vectors = ranking.pair_vectors(embedder, data.features, opts.batch_size)
        result = self.score(data, vectors, options=opts, do_lower_case=model.do_lower_case)
        result["examples"] = data.size
        return result

    # === What its model records ===

    def encoder_record(self, model, given):
        """Whether an encoder is what `kbert finetune --task embed` writes: its task embed (given,
        declared, or in its config), with the embedding record that says how to pool its vectors."""
        declared = (getattr(model, "task_info", None) or {}).get("task") or model.config.extras.get("task")
        if given.get("task", declared) != self.name or set(given) - {"task"}:
            return None
        if EMBEDDING_KEY not in model.config.extras:
            raise KbertError(
                "task embed needs the sentence-embedding record (bert_config.json's embedding: pooling, normalize), "
                f"which {WRITTEN_BY} writes; save the encoder without a task"
            )
        return {"task": self.name}


EMBED = Embed()
