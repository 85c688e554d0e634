"""Sentence embeddings: one vector per text, as sentence-transformers computes it.

A sentence-embedding model (all-MiniLM-L6-v2, BGE, E5, GTE: a BERT, then pooling, then maybe
L2 normalisation) records its pooling in bert_config.json's `embedding`, which `kbert convert
from-hf` reads from the sentence-transformers folder. `embed` (and `kbert embed`) tokenizes the
texts, runs the encoder and pools its `sequence_output` with `kbert.model.pooling`; any other
BERT embeds with a pooling given by the caller.

Texts are run in batches of similar length: a chunk's texts are sorted by token count and each
batch is cut to its longest text, so little of the work is padding; the vectors come back in
input order. With `long_text="windows"`, a text longer than the window is read whole, in
overlapping windows: each window is pooled, the document's vector is the mean of its windows'
(then normalised, if the model normalises).
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os

import keras
import numpy as np

from kbert.finetuning import readers
from kbert.finetuning.encoding import encode_text_windows, encode_texts
from kbert.finetuning.options import window_stride
from kbert.finetuning.rows import check_start, stream_rows
from kbert.finetuning.windows import document_mean
from kbert.model.embedding_record import check_pooling, embedding_settings
from kbert.model.families import encoder_of, make_packer
from kbert.model.pooling import SentencePooling, l2_normalize
from kbert.runtime.errors import KbertError, option

log = logging.getLogger("kbert")

LONG_TEXT = ("truncate", "windows")


def check_options(pooling=None, normalize=None, long_text="truncate", doc_stride=None, batch_size=32):
    """One line for an option `embed` cannot take, before any model is opened.

    >>> check_options(long_text="chunks")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: long_text='chunks': give truncate or windows
    """
    check_pooling(pooling, normalize)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise KbertError(f"{option('batch_size', batch_size)}: give the number of texts per batch, 1 or more")
    if long_text not in LONG_TEXT:
        raise KbertError(f"{option('long_text', long_text)}: give truncate or windows")
    if doc_stride is not None and long_text != "windows":
        raise KbertError(
            f"{option('doc_stride', doc_stride)} applies to {option('long_text', 'windows')}; "
            f"add it, or drop {option('doc_stride')}"
        )


class Embedder:
    """A model's sentence vectors, a list of texts at a time (`embed` for one call).

    Args:
        model: a kbert model (any kind: its encoder is used).
        pooling, normalize, max_seq_length: see `embedding_settings`.
        long_text: str. "truncate" (keep a text's first max_seq_length - 2 tokens) or "windows".
        doc_stride: int. With "windows": tokens between two windows' starts (default half a window).
        batch_size: int. Texts (windows) per run of the model.
        where: str. The model's name in messages.

    Attributes:
        settings: `EmbeddingSettings`.
        dimensions: int. Values per vector.
        truncated: int. Texts cut to max_seq_length so far ("truncate").
    """

    def __init__(
        self,
        model,
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_seq_length: int | None = None,
        long_text: str = "truncate",
        doc_stride: int | None = None,
        batch_size: int = 32,
        where=None,
    ):
        check_options(pooling, normalize, long_text, doc_stride, batch_size)
        encoder = encoder_of(model)
        if encoder is None:
            raise KbertError(
                f"{where or 'the model'} is a {type(model).__name__}, not a kbert BERT; embed a model "
                f"kbert loads (kbert.load, or any source kbert embed takes)"
            )
        self.settings = embedding_settings(model, pooling, normalize, max_seq_length, where)
        self.stride = window_stride(doc_stride, self.settings.max_seq_length) if long_text == "windows" else None
        self.batch_size = int(batch_size)
        self.dimensions = encoder.config.hidden_size
        self.truncated = 0
        self.preprocessor = make_packer(model, self.settings.max_seq_length)
        # Pooled, not normalised: with windows, a document's vector is normalised after the mean.
        pooled = SentencePooling(self.settings.pooling, name="sentence_pooling")(
            encoder.output["sequence_output"], encoder.input["input_mask"]
        )
        self.pooler = keras.Model(encoder.input, pooled)

    def __call__(self, texts) -> np.ndarray:
        """float32 [len(texts), dimensions]: each text's vector, in order."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimensions), np.float32)
        if self.stride is None:
            features, truncated = encode_texts(self.preprocessor, texts)
            self.truncated += truncated
            vectors = self._pooled(features)
        else:
            features, windows = encode_text_windows(self.preprocessor, texts, self.stride)
            vectors = document_mean(self._pooled(features), windows)
        if self.settings.normalize:
            vectors = keras.ops.convert_to_numpy(l2_normalize(vectors))
        return np.asarray(vectors, np.float32)

    def _pooled(self, features: dict) -> np.ndarray:
        """The pooled vector of each row of `features`, run longest first in batches cut to
        their longest row (padding changes no real token's vector: masked positions get no
        attention and no weight in the pooling)."""
        lengths = features["input_mask"].sum(axis=1)
        order = np.argsort(-lengths, kind="stable")
        out = np.zeros((len(lengths), self.dimensions), np.float32)
        for first in range(0, len(order), self.batch_size):
            rows = order[first : first + self.batch_size]
            width = int(lengths[rows].max())
            batch = {name: values[rows, :width] for name, values in features.items()}
            out[rows] = np.asarray(self.pooler.predict_on_batch(batch), np.float32)
        return out


def embed(
    model_or_path,
    texts,
    batch_size: int = 32,
    *,
    max_seq_length: int | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
    long_text: str = "truncate",
    doc_stride: int | None = None,
) -> np.ndarray:
    """Sentence vectors: float32 [len(texts), hidden_size], one row per text, in order.

    A sentence-embedding model (converted from sentence-transformers by `kbert convert from-hf`,
    or a sentence-transformers folder itself) pools and normalises as it records, and gives
    the vectors `SentenceTransformer.encode` gives; any other model needs `pooling`.

    Args:
        model_or_path: a kbert model, or any model source kbert reads (a model directory, a
            .keras file, a Hugging Face or sentence-transformers folder, ...).
        texts: list of str. An empty text is embedded as sentence-transformers embeds "":
            [CLS] [SEP].
        batch_size: int. Texts per run of the model.
        max_seq_length: int. Tokens per text, [CLS] and [SEP] included; default: the model's
            recorded length, else 128.
        pooling: str. "cls", "mean", "max" or "mean_sqrt_len"; default: the model's.
        normalize: bool. L2-normalise each vector; default: the model's (False without a record).
        long_text: str. "truncate" (default) or "windows": a longer text is read in windows
            `doc_stride` tokens apart and its vector is the mean of theirs.
        doc_stride: int. With "windows": default half a window.

    Example:
    >>> vectors = kbert.embed("all-MiniLM-L6-v2/", ["A man is eating food.", "A man eats."])  # doctest: +SKIP
    >>> vectors.shape, float(vectors[0] @ vectors[1]) > 0.8  # doctest: +SKIP
    ((2, 384), True)
    """
    if isinstance(texts, (str, bytes)):
        raise KbertError("texts must be a list of texts; for one text, pass [text]")
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise KbertError(f"texts[{bad}] is a {type(texts[bad]).__name__}, not a str; pass a list of texts")
    check_options(pooling, normalize, long_text, doc_stride, batch_size)
    where = os.fspath(model_or_path) if isinstance(model_or_path, (str, os.PathLike)) else None
    embedder = Embedder(
        _open(model_or_path, where),
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        long_text=long_text,
        doc_stride=doc_stride,
        batch_size=batch_size,
        where=where,
    )
    vectors = embedder(texts)
    if embedder.truncated:
        log.warning(
            "%d of %d texts longer than %s were truncated",
            embedder.truncated,
            len(texts),
            option("max_seq_length", embedder.settings.max_seq_length),
        )
    return vectors


# Texts tokenized, run and written together by `embed_file`: sorting a chunk by length makes
# its batches nearly free of padding, and a kill loses at most one chunk's work.
_CHUNK_TEXTS = 256


def read_texts(path) -> list:
    """The texts of an embedding input: a table's text column (CSV, TSV with a header, JSON
    Lines: what `kbert predict` reads, an empty cell being the text ""), or one text per line,
    blank lines skipped.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "in.txt")
    >>> _ = open(path, "w").write("A gripping film.\\n\\nDull. ||| Very.\\n")
    >>> read_texts(path)
    ['A gripping film.', 'Dull. ||| Very.']
    """
    examples = readers.read_feature_texts(path)
    readers.report_skipped(path, examples)
    return list(one_text_per_row(path, examples, "kbert embed").texts)


def one_text_per_row(path, examples, reader: str):
    """A file's `examples` (`readers.read_feature_texts`) as the texts to embed, one per row: a
    plain line whole, a table's text column; `reader` (what embeds them, for the message)
    refuses a table with a second text column."""
    if examples.texts_b is None:
        return examples
    if examples.format == "lines":  # a line is one text, whatever it holds: " ||| " is no pair here
        joined = [f"{a} ||| {b}" if b else a for a, b in zip(examples.texts, examples.texts_b, strict=True)]
        return dataclasses.replace(examples, texts=joined, texts_b=None)
    raise KbertError(
        f"{path}: has a second text column (text_b), but {reader} embeds one text per row; drop the "
        f"column, or put each text in a row of its own"
    )


def embed_file(model_or_path, input_path, start: int = 0, *, batch_size: int = 32, **settings):
    """(vectors, texts): a generator of each text's vector (float32 [dimensions]) for the texts
    of a file (`read_texts`) from text `start` on, in order, a chunk at a time, and the number
    of texts in the file. What `kbert embed` writes; the model, the options and the file are
    checked at the call, before the first vector.

    Args:
        model_or_path: a kbert model or any model source kbert reads.
        input_path: str or PathLike. The texts.
        start: int. The first text to embed (a resumed `kbert embed --output` starts after the rows it has).
        batch_size: int. Texts per run of the model.
        settings: `embed`'s max_seq_length, pooling, normalize, long_text and doc_stride.

    Example:
    >>> vectors, n = embed_file("all-MiniLM-L6-v2/", "texts.txt")  # doctest: +SKIP
    >>> np.stack(list(vectors)).shape  # doctest: +SKIP
    (1000, 384)
    """
    check_start(start)
    check_options(**{k: v for k, v in settings.items() if k != "max_seq_length"}, batch_size=batch_size)
    where = os.fspath(model_or_path) if isinstance(model_or_path, (str, os.PathLike)) else None
    model = _open(model_or_path, where)
    embedder = Embedder(model, batch_size=batch_size, where=where, **settings)
    texts = read_texts(input_path)
    rows = stream_rows(texts, lambda part, first: list(embedder(part)), max(batch_size, _CHUNK_TEXTS), start)

    def vectors():
        yield from rows
        if embedder.truncated:
            log.warning(
                "%s: %d of %d texts longer than %s were truncated",
                os.fspath(input_path),
                embedder.truncated,
                len(texts) - start,
                option("max_seq_length", embedder.settings.max_seq_length),
            )

    return vectors(), len(texts)


def _open(model_or_path, where):
    if where is None:
        return model_or_path
    from kbert.formats.sources import open_model

    return open_model(where)


def json_vector(values) -> list:
    """A float32 vector as JSON numbers that read back to the same float32 values, each as short
    as that allows (`kbert embed --format jsonl`).

    >>> json_vector(np.array([0.1, -2.5, 1e-8], np.float32))
    [0.1, -2.5, 1e-08]
    """
    return [float(str(v)) for v in np.asarray(values, np.float32)]
