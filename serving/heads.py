"""What an export serves for each kind of model: its `ServingHead`, the outputs of the Predict
API and, for classifiers and regressors, the Classify or Regress API (`kbert.serving.export`
builds the signatures from it).

`serve_encoder` serves an encoder's outputs; `serving_head(task, model, labels)` gives a
fine-tuned model's head by the task it was fine-tuned for: the task (`kbert.finetuning.tasks`)
picks the head, built here:
- classify: `probabilities`, `label_id`, `label`, and the Classify API;
- regress: `score`, and the Regress API;
- rerank: `score`, each (query, document) pair's, from `text` and `text_b`;
- tag: per-token `label_id`, `label` and `input_mask`, and from text also `word_label`, the
  tag of each whitespace-separated word (as `kbert predict` tags CoNLL words);
- choice: `probabilities` over the endings and `label_id`; it takes `text` and `endings`.
SQuAD models are not served yet (export would need their question/context windows).

`serve_embedding` serves a sentence-embedding model (an encoder whose bert_config.json records
its pooling, `kbert.finetuning.embedding`): `embedding`, each text's vector as `kbert embed` computes it.

Example:
>>> SERVED_TASKS, API_METHODS[CLASSIFY_API]
(('classify', 'regress', 'tag', 'choice', 'rerank'), 'tensorflow/serving/classify')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

import keras
import tensorflow as tf

from kbert.finetuning.tasks import TASKS, get_task
from kbert.finetuning.tasks.classify import CLASSIFY_API, CLASSIFY_METHOD
from kbert.finetuning.tasks.regress import REGRESS_API, REGRESS_METHOD
from kbert.model.embedding_record import embedding_of
from kbert.model.families import encoder_of
from kbert.model.pooling import SentencePooling
from kbert.runtime.errors import KbertError, option
from kbert.text.windows import SlidingWindows, max_context_windows

# TF Serving's Classify and Regress APIs: the signature names an export adds for them, and
# the method names TF Serving requires of them.
API_METHODS = {CLASSIFY_API: CLASSIFY_METHOD, REGRESS_API: REGRESS_METHOD}


class ServingHead(NamedTuple):
    """What an export serves for one kind of model (see `kbert.serving.export`)."""

    outputs: Callable  # int32 features -> dict of the Predict API's outputs
    text_inputs: dict = {"text": 1}  # serving_default's string inputs: name -> rank ([batch] or [batch, N])
    text_outputs: Callable | None = None  # (strings dict, pack, preprocessor) -> outputs; default: pack them
    ids_rank: int = 2  # rank of serve_ids' inputs ([batch, seq]; choice: [batch, choices, seq])
    api: str | None = None  # CLASSIFY_API or REGRESS_API: the extra signature's name
    api_outputs: Callable | None = None  # features -> that signature's outputs
    # (strings dict, pack, preprocessor) -> that signature's outputs; default: api_outputs of the packed text
    api_text_outputs: Callable | None = None


def finite(name, x):
    """Outputs pass through check_numerics: a NaN fails the request instead of being served."""
    return tf.debugging.check_numerics(tf.cast(x, tf.float32), f"non-finite values in output {name}")


def _label_table(labels, n):
    names = [str(label) for label in labels] if labels else [str(i) for i in range(n)]
    if len(names) != n:
        raise KbertError(
            f"bert_config.json lists {len(names)} labels for a head of {n} classes; fine-tune the model again"
        )
    return tf.constant(names)


def serve_encoder(encoder, text_pairs: bool) -> ServingHead:
    """An encoder's (or pretrained model's) head: `pooled_output` (a BERT's), `sequence_output`
    and `input_mask`; `serving_default` takes `text_b` too if `text_pairs`."""

    def outputs(features):
        out = encoder(features, training=False)
        # A ModernBERT has no pooler: its encoder serves sequence_output alone.
        named = [name for name in ("pooled_output", "sequence_output") if name in out]
        return {**{name: finite(name, out[name]) for name in named}, "input_mask": features["input_mask"]}

    return ServingHead(outputs, {"text": 1, "text_b": 1} if text_pairs else {"text": 1})


# What a sentence-embedding model's export serves: its one output, and the kind `kbert predict
# --server` reads from it (`kbert.serving.predict.served_task`).
EMBEDDING = "embedding"


def embedding_model(encoder, pooling: str, normalize: bool) -> keras.Model:
    """`encoder`'s inputs -> {"embedding": [batch, H] float32}: its `sequence_output` pooled
    over real tokens (`kbert.model.pooling.SentencePooling`, the code `kbert embed` runs), then
    L2-normalised if `normalize`. One functional model, so `kbert.serving.optimize` rewrites it
    as any other (each group of texts run on its longest).

    Example:
    >>> import kbert, numpy as np
    >>> config = kbert.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                           intermediate_size=16)
    >>> model = embedding_model(kbert.bert_encoder(config), "mean", normalize=True)
    >>> ids = np.array([[2, 7, 3, 0]], "int32")
    >>> vectors = model({"input_ids": ids, "input_mask": np.sign(ids), "segment_ids": 0 * ids})["embedding"]
    >>> vectors.shape, round(float(np.linalg.norm(vectors)), 5)
    (TensorShape([1, 8]), 1.0)
    """
    # Pooled in float32 whatever the encoder computes in: a bfloat16 sum over a text's tokens
    # would lose the vector's last digits.
    vectors = SentencePooling(pooling, normalize, dtype="float32", name="sentence_pooling")(
        encoder.output["sequence_output"], encoder.input["input_mask"]
    )
    return keras.Model(encoder.input, {EMBEDDING: vectors}, name="sentence_embedding")


def serve_embedding(model, serving, text_pairs: bool | None = None) -> ServingHead:
    """A sentence-embedding model's head: `embedding` [batch, H] float32 for each text, pooled
    and normalised as the model's embedding record says (`embedding_model`), from `text` alone.

    Args:
        model: a kbert model whose config records its pooling (`kbert.model.embedding_record.embedding_of`).
        serving: callable. keras.Model -> the model as the export runs it (`kbert.serving.optimize`).
        text_pairs: bool or None. True is refused: sentence-transformers embeds one text at a time.
    """
    record = embedding_of(model)
    if record is None:
        raise KbertError("the model records no sentence-embedding pooling; export it as an encoder")
    if text_pairs:
        raise KbertError(
            f"a sentence-embedding model embeds one text per request row: leave out "
            f"{option('text_pairs', True, flag='--text-pairs')}"
        )
    served = serving(embedding_model(encoder_of(model), record["pooling"], record.get("normalize", False)))

    def outputs(features):
        return {EMBEDDING: finite(EMBEDDING, served(features)[EMBEDDING])}

    return ServingHead(outputs)


def serve_classifier(model, labels) -> ServingHead:
    """A classifier's head: `probabilities`, `label_id`, `label`, and the Classify API."""
    names = _label_table(labels, model.num_classes)

    def outputs(features):
        probabilities = finite(
            "probabilities", tf.nn.softmax(tf.cast(model(features, training=False)["logits"], tf.float32), axis=-1)
        )
        label_id = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {"probabilities": probabilities, "label_id": label_id, "label": tf.gather(names, label_id)}

    def classify_outputs(features):
        scores = outputs(features)["probabilities"]
        return {"classes": tf.tile(names[None], [tf.shape(scores)[0], 1]), "scores": scores}

    return ServingHead(outputs, api=CLASSIFY_API, api_outputs=classify_outputs)


def serve_regressor(model, labels) -> ServingHead:
    """A regressor's head: `score`, and the Regress API."""

    def outputs(features):
        return {"score": finite("score", model(features, training=False)["logits"][:, 0])}

    def regress_outputs(features):
        return {"outputs": outputs(features)["score"]}

    return ServingHead(outputs, api=REGRESS_API, api_outputs=regress_outputs)


def serve_reranker(model, activation: str) -> ServingHead:
    """A reranker's head: `score`, each (text, text_b) pair's logit through the model's
    activation (sigmoid or identity), as `kbert rerank` scores a (query, document) pair. It has no
    Regress API: a regressor's export has that, and `kbert predict --server` tells them apart by it."""

    def outputs(features):
        logits = tf.cast(model(features, training=False)["logits"][:, 0], tf.float32)
        return {"score": finite("score", tf.sigmoid(logits) if activation == "sigmoid" else logits)}

    return ServingHead(outputs, {"text": 1, "text_b": 1})


def serve_tagger(model, labels, fallback: str) -> ServingHead:
    """A tagger's head: per-token `label_id`, `label` and `input_mask`, and from text `word_label`,
    each word's tag (`fallback` for a word cut off by the sequence length)."""
    names = _label_table(labels, model.num_classes)
    fallback = tf.constant(fallback)

    def outputs(features):
        logits = finite("logits", model(features, training=False)["logits"])
        label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"label_id": label_id, "label": tf.gather(names, label_id), "input_mask": features["input_mask"]}

    def text_outputs(strings, pack, preprocessor):
        # The words are the text's whitespace-separated pieces (a CoNLL file's words), packed as
        # kbert finetune packs them (BertPreprocessor.pack_words); each word's tag is read at its
        # first piece, and a word cut off by the sequence length gets the fallback tag.
        words = tf.strings.split(strings["text"])  # [batch, (words)]
        features, starts, _ = preprocessor.pack_words(words)
        out = outputs(features)
        first = starts.flat_values
        kept = first >= 0
        rows = tf.cast(starts.value_rowids(), tf.int32)
        at = tf.stack([rows, tf.where(kept, first, 0)], axis=1)
        tags = tf.where(kept, tf.gather_nd(out["label"], at), fallback)
        out["word_label"] = starts.with_flat_values(tags).to_tensor("")
        return out

    return ServingHead(outputs, text_outputs=text_outputs)


def serve_choices(model, labels) -> ServingHead:
    """A multiple-choice model's head: `probabilities` over the endings and `label_id`, from
    `text` and `endings`."""

    def outputs(features):
        probabilities = finite(
            "probabilities", tf.nn.softmax(tf.cast(model(features, training=False)["logits"], tf.float32), axis=-1)
        )
        return {"probabilities": probabilities, "label_id": tf.argmax(probabilities, axis=-1, output_type=tf.int32)}

    def text_outputs(strings, pack, preprocessor):
        # Every (context, ending) pair packed as a sentence pair, then back to [batch, choices, seq].
        endings = strings["endings"]
        choices = tf.shape(endings)[1]
        flat = pack(tf.repeat(strings["text"], choices), tf.reshape(endings, [-1]))
        shape = [-1, choices, preprocessor.sequence_length]
        return outputs({name: tf.reshape(value, shape) for name, value in flat.items()})

    return ServingHead(outputs, text_inputs={"text": 1, "endings": 2}, text_outputs=text_outputs, ids_rank=3)


# The tasks export serves.
SERVED_TASKS = tuple(task.name for task in TASKS.values() if task.served)
# This module, as a task's serving hooks take it: they pick the head, built here.
_HEADS = sys.modules[__name__]


def require_served(task: str):
    """An error unless export serves `task` models: an unknown task, or squad.

    >>> require_served("squad")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: kbert export serves ... the classify, regress, tag, choice, rerank tasks; a squad model needs ...
    """
    if not get_task(task).served:  # an unknown task: the one-line error that lists them
        raise KbertError(
            f"kbert export serves encoders, pretrained models and the {', '.join(SERVED_TASKS)} "
            f"tasks; a {task} model needs its question/context windows, which export does not "
            f"build yet: serve its encoder or use kbert predict"
        )


def serving_head(task: str, model, labels: list | None, record: dict | None = None) -> ServingHead:
    """The head that serves `model`, fine-tuned for `task`.

    Args:
        task: str. A name in `kbert.finetuning.tasks.TASKS`.
        model: the task's keras.Model (or anything called as one: features -> {"logits": ...}).
        labels: list or None. The label names bert_config.json records; None: the class numbers.
        record: dict or None. The model's whole task record (what bert_config.json records).

    Raises:
        KbertError: a task export does not serve (`require_served`), or labels that do not
            match the head.

    Example:
    >>> class Sentiment:  # a stand-in classifier: the same logits for any features
    ...     num_classes = 2
    ...     def __call__(self, features, training):
    ...         return {"logits": tf.constant([[0.0, 2.0]])}
    >>> head = serving_head("classify", Sentiment(), ["neg", "pos"])
    >>> head.api, head.outputs({})["label"].numpy()
    ('classify', array([b'pos'], dtype=object))
    """
    require_served(task)
    return get_task(task).serving_head(model, labels, _HEADS, record=record or {})


# === Documents longer than the window (`kbert finetune --long-text windows`) ===

# Windows a request may take in all, unless `kbert export --max-windows` says otherwise.
MAX_WINDOWS = 64
WINDOWS_TASKS = tuple(task.name for task in TASKS.values() if task.windows)


def _checked(features, starts, max_windows: int):
    """`features` once the request is known to take at most `max_windows` windows in all
    (otherwise an InvalidArgumentError that says so): one huge document would otherwise hold
    a server's cores for as long as it takes."""
    needed = tf.size(starts.flat_values)
    message = tf.strings.format(
        "the request needs {} windows and this export allows {} (kbert export --max-windows): split "
        "the request, or export again with a larger --max-windows",
        (needed, max_windows),
    )
    with tf.control_dependencies([tf.debugging.Assert(needed <= max_windows, [message])]):
        return {name: tf.identity(value) for name, value in features.items()}


def _document_mean(values, starts):
    """The mean of each document's windows' rows, summed in float64 as
    `kbert.finetuning.windows.document_mean` sums them (one window: its row, bit for bit)."""
    document = tf.cast(starts.value_rowids(), tf.int32)
    total = tf.math.unsorted_segment_sum(tf.cast(values, tf.float64), document, tf.cast(starts.nrows(), tf.int32))
    count = tf.cast(starts.row_lengths(), tf.float64)
    return tf.cast(total / tf.reshape(count, [-1] + [1] * (values.shape.rank - 1)), tf.float32)


def serve_windows(task: str, head: ServingHead, model, labels, stride: int, max_windows: int) -> ServingHead:
    """`head` (the task's, `serving_head`) serving whole documents in windows: the text
    signatures pack each document into the windows it was fine-tuned on
    (`BertPreprocessor.pack_windows`), run the model on all of the request's windows, and answer
    once per document with the head's output keys, as `kbert predict` does: classify the softmax
    of the mean of its windows' logits, regress the mean score, tag each word's tag from its
    max-context window (`kbert.text.windows.max_context_windows`), and per token the first
    window's outputs (the truncated document's). serve_ids stays per window. A request of more
    than `max_windows` windows in all fails (`_checked`)."""
    if not get_task(task).windows:
        raise KbertError(f"long_text windows applies to {', '.join(WINDOWS_TASKS)}; a {task} model has none")
    return get_task(task).serving_windows(head, model, labels, stride, max_windows, _HEADS)


def tagger_windows(head: ServingHead, stride: int, max_windows: int) -> ServingHead:
    """A tagger's `head` serving whole documents: each word's tag from its max-context window,
    per token the first window's outputs."""

    def tag_text_outputs(strings, pack, preprocessor):
        words = tf.strings.split(strings["text"])  # [batch, (words)]
        features, starts, first = preprocessor.pack_word_windows(words, stride)
        out = head.outputs(_checked(features, starts, max_windows))
        lengths = tf.reduce_sum(features["input_mask"], axis=1) - 2  # less [CLS] and [SEP]
        windows = SlidingWindows(starts.row_lengths(), starts.value_rowids(), starts.flat_values, lengths)
        window, index = max_context_windows(windows, (first.value_rowids(), first.flat_values))
        tags = tf.gather_nd(out["label"], tf.stack([window, index + 1], axis=1))  # [CLS] is position 0
        firsts = tf.cast(starts.row_starts(), tf.int32)  # each document's first window
        documents = {k: tf.gather(out[k], firsts) for k in ("label_id", "label", "input_mask")}
        return {**documents, "word_label": first.with_flat_values(tags).to_tensor("")}

    return head._replace(text_inputs={"text": 1}, text_outputs=tag_text_outputs)


def _document_logits(model, stride: int, max_windows: int):
    """(strings, preprocessor) -> each document's logits: the mean of its windows'."""

    def document_logits(strings, preprocessor):
        features, starts = preprocessor.pack_windows(strings["text"], stride)
        logits = tf.cast(model(_checked(features, starts, max_windows), training=False)["logits"], tf.float32)
        return _document_mean(logits, starts)

    return document_logits


def classifier_windows(head: ServingHead, model, labels, stride: int, max_windows: int) -> ServingHead:
    """A classifier's `head` serving whole documents: the softmax of the mean of a document's
    windows' logits."""
    document_logits = _document_logits(model, stride, max_windows)
    names = _label_table(labels, model.num_classes)

    def probabilities(strings, preprocessor):
        return finite("probabilities", tf.nn.softmax(document_logits(strings, preprocessor), axis=-1))

    def text_outputs(strings, pack, preprocessor):
        p = probabilities(strings, preprocessor)
        label_id = tf.argmax(p, axis=-1, output_type=tf.int32)
        return {"probabilities": p, "label_id": label_id, "label": tf.gather(names, label_id)}

    def api_text_outputs(strings, pack, preprocessor):
        p = probabilities(strings, preprocessor)
        return {"classes": tf.tile(names[None], [tf.shape(p)[0], 1]), "scores": p}

    return head._replace(text_inputs={"text": 1}, text_outputs=text_outputs, api_text_outputs=api_text_outputs)


def regressor_windows(head: ServingHead, model, labels, stride: int, max_windows: int) -> ServingHead:
    """A regressor's `head` serving whole documents: the mean of a document's windows' scores."""
    document_logits = _document_logits(model, stride, max_windows)

    def text_outputs(strings, pack, preprocessor):
        return {"score": finite("score", document_logits(strings, preprocessor)[:, 0])}

    def api_text_outputs(strings, pack, preprocessor):
        return {"outputs": text_outputs(strings, pack, preprocessor)["score"]}

    return head._replace(text_inputs={"text": 1}, text_outputs=text_outputs, api_text_outputs=api_text_outputs)
