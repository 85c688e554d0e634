"""What an export serves for each kind of model: its `ServingHead`, the outputs of the Predict
API and, for classifiers and regressors, the Classify or Regress API (`kbert.serving.export`
builds the signatures from it).

`serve_encoder` serves an encoder's outputs; `serving_head(task, model, labels)` gives a
fine-tuned model's head by the task it was fine-tuned for (`kbert.finetuning.tasks`):
- classify: `probabilities`, `label_id`, `label`, and the Classify API;
- regress: `score`, and the Regress API;
- tag: per-token `label_id`, `label` and `input_mask`, and from text also `word_label`, the
  tag of each whitespace-separated word (as `kbert predict` tags CoNLL words);
- choice: `probabilities` over the endings and `label_id`; it takes `text` and `endings`.
SQuAD models are not served yet (export would need their question/context windows).

Example:
>>> SERVED_TASKS, API_METHODS[CLASSIFY_API]
(('classify', 'regress', 'tag', 'choice'), 'tensorflow/serving/classify')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from kbert.errors import KbertError
from kbert.finetuning.tasks import fallback_tag, get_task

# TF Serving's Classify and Regress APIs: the signature names an export adds for them, and
# the method names TF Serving requires of them.
CLASSIFY_API, REGRESS_API = "classify", "regress"
API_METHODS = {CLASSIFY_API: "tensorflow/serving/classify", REGRESS_API: "tensorflow/serving/regress"}


class ServingHead(NamedTuple):
    """What an export serves for one kind of model (see `kbert.serving.export`)."""

    outputs: Callable  # int32 features -> dict of the Predict API's outputs
    text_inputs: dict = {"text": 1}  # serving_default's string inputs: name -> rank ([batch] or [batch, N])
    text_outputs: Callable | None = None  # (strings dict, pack, preprocessor) -> outputs; default: pack them
    ids_rank: int = 2  # rank of serve_ids' inputs ([batch, seq]; choice: [batch, choices, seq])
    api: str | None = None  # CLASSIFY_API or REGRESS_API: the extra signature's name
    api_outputs: Callable | None = None  # features -> that signature's outputs


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
    """An encoder's (or pretrained model's) head: `pooled_output`, `sequence_output` and
    `input_mask`; `serving_default` takes `text_b` too if `text_pairs`."""

    def outputs(features):
        out = encoder(features, training=False)
        return {
            "pooled_output": finite("pooled_output", out["pooled_output"]),
            "sequence_output": finite("sequence_output", out["sequence_output"]),
            "input_mask": features["input_mask"],
        }

    return ServingHead(outputs, {"text": 1, "text_b": 1} if text_pairs else {"text": 1})


def _serve_classifier(model, labels):
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


def _serve_regressor(model, labels):
    def outputs(features):
        return {"score": finite("score", model(features, training=False)["logits"][:, 0])}

    def regress_outputs(features):
        return {"outputs": outputs(features)["score"]}

    return ServingHead(outputs, api=REGRESS_API, api_outputs=regress_outputs)


def _serve_tagger(model, labels):
    names = _label_table(labels, model.num_classes)
    fallback = tf.constant(fallback_tag([str(label) for label in labels or range(model.num_classes)]))

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


def _serve_choices(model, labels):
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


# Each task export serves, and its head: (model, label names or None) -> ServingHead.
_TASK_HEADS = {
    "classify": _serve_classifier,
    "regress": _serve_regressor,
    "tag": _serve_tagger,
    "choice": _serve_choices,
}
SERVED_TASKS = tuple(_TASK_HEADS)


def require_served(task: str):
    """An error unless export serves `task` models: an unknown task, or squad.

    >>> require_served("squad")
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: kbert export serves ... the classify, regress, tag, choice tasks; a squad model needs ...
    """
    get_task(task)  # an unknown task: the one-line error that lists them
    if task not in _TASK_HEADS:
        raise KbertError(
            f"kbert export serves encoders, pretrained models and the {', '.join(SERVED_TASKS)} "
            f"tasks; a {task} model needs its question/context windows, which export does not "
            f"build yet: serve its encoder or use kbert predict"
        )


def serving_head(task: str, model, labels: list | None) -> ServingHead:
    """The head that serves `model`, fine-tuned for `task`.

    Args:
        task: str. A name in `kbert.finetuning.tasks.TASKS`.
        model: the task's keras.Model (or anything called as one: features -> {"logits": ...}).
        labels: list or None. The label names bert_config.json records; None: the class numbers.

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
    return _TASK_HEADS[task](model, labels)
