"""One record per fine-tuning task: everything `finetune`, `predict`, `evaluate`, `export` and
`predict --server` need to know about it, in one place.

A `Task` holds plain functions: how to read a data file into model inputs (`read`), the head
to put on the encoder (`build`), the loss (`losses`), the dev metric that picks the best epoch
(`metric`, computed by `score`), the JSON of one prediction (`rows`), what an export serves
(`serve`) and how a client turns the server's answers into the same JSON (`served_rows`).
Adding a task means one new entry in `TASKS` plus its tests.

The tasks:
- classify: run_classifier.py's model (dropout + [classes, H] on the pooled output);
- regress: the same with one output and squared error (STS-B);
- tag: one label per word on its first WordPiece (NER, POS);
- squad: run_squad.py's start/end span head, SQuAD v1.1 and v2.0;
- choice: multiple choice as the BERT paper ran SWAG (one score per [CLS], softmax over N endings).

Example:
>>> TASKS["choice"].metric, TASKS["squad"].max_seq_length
('accuracy', 384)
>>> best_metric("classify", {"accuracy": 0.75, "macro_f1": 0.73, "mcc": 0.58})
('accuracy', 0.75)
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.errors import KbertError
from kbert.finetuning import encoding, metrics, readers, squad, squad_decoding
from kbert.finetuning.options import FinetuneOptions
from kbert.model import bert
from kbert.text.tokenizer import UNK, load_vocab

log = logging.getLogger("kbert")

# TF Serving's Classify and Regress APIs: the signature names an export adds for them, and
# the method names TF Serving requires of them.
CLASSIFY_API, REGRESS_API = "classify", "regress"
API_METHODS = {CLASSIFY_API: "tensorflow/serving/classify", REGRESS_API: "tensorflow/serving/regress"}


@dataclasses.dataclass
class TaskData:
    """One file, read and encoded for a task: model inputs, targets, and what scoring needs."""
    features: dict            # input name -> np.int32 array
    targets: dict | None      # output name -> np array, as model.fit takes them; None without labels
    labels: list | None       # the label names (classify, tag); None for the others
    size: int                 # examples the model runs on (SQuAD: windows)
    truncated: int = 0
    raw: object = None        # the examples as read (for scoring and printing)
    extra: object = None      # task-specific (tag: word starts; squad: features)


class ServingHead(NamedTuple):
    """What an export serves for one kind of model (see `kbert.serving.export`)."""
    outputs: Callable             # int32 features -> dict of the Predict API's outputs
    text_inputs: dict = {"text": 1}  # serving_default's string inputs: name -> rank ([batch] or [batch, N])
    text_outputs: Callable | None = None  # (strings dict, pack, preprocessor) -> outputs; default: pack them
    ids_rank: int = 2             # rank of serve_ids' inputs ([batch, seq]; choice: [batch, choices, seq])
    api: str | None = None        # CLASSIFY_API or REGRESS_API: the extra signature's name
    api_outputs: Callable | None = None  # features -> that signature's outputs


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything about one fine-tuning task. See the module docstring."""
    name: str
    read: Callable      # (path, tokenizer, max_seq_length, labels, opts, require_labels, is_training) -> TaskData
    build: Callable     # (base model, label names) -> the task's keras.Model
    losses: Callable    # () -> (loss per output, loss weights or None), for model.compile
    metric: str         # the dev score that picks the best epoch; higher is better
    score: Callable     # (TaskData, outputs, opts, do_lower_case) -> metrics dict
    rows: Callable      # (TaskData, outputs, opts, do_lower_case) -> one JSON-ready dict per example
    serve: Callable | None = None        # (model, label names) -> ServingHead; None: not exportable
    served_by: Callable | None = None    # (a server's signatures) -> whether they are this task's export
    served_rows: Callable | None = None  # (client, signatures, path, opts, first) -> the same dicts as `rows`,
                                         # from example `first` on
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH


def finite(name, x):
    """Outputs pass through check_numerics: a NaN fails the request instead of being served."""
    return tf.debugging.check_numerics(tf.cast(x, tf.float32), f"non-finite values in output {name}")


def _label_table(labels, n):
    names = [str(label) for label in labels] if labels else [str(i) for i in range(n)]
    if len(names) != n:
        raise KbertError(f"bert_config.json lists {len(names)} labels for a head of {n} classes; "
                         f"fine-tune the model again")
    return tf.constant(names)


def _softmax(logits):
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


def _check_known(path, found, labels):
    unseen = sorted(set(found) - set(labels))
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:10]) + (f" and {len(unseen) - 10} more" if len(unseen) > 10 else "")
        raise KbertError(f"{path} has labels the model was never trained on: {shown}; the model knows "
                         f"{', '.join(repr(label) for label in labels)}")


def _has_api(signatures, api):
    return signatures.get(api, {}).get("method_name") == API_METHODS[api]


def _default(signatures):
    return signatures.get("serving_default", {})


def row_batches(n: int, batch_size: int, start: int = 0):
    """(start, stop) of each batch of `n` examples, from example `start` on (where a resumed
    `kbert predict --output` goes on); an error if `start` is past the end.

    >>> list(row_batches(5, 2)), list(row_batches(5, 2, start=3)), list(row_batches(5, 2, start=5))
    ([(0, 2), (2, 4), (4, 5)], [(3, 5)], [])
    """
    if start > n:
        raise KbertError(f"the output to resume already has {start} rows, but the input has only {n} "
                         f"examples: it is not this input's output; pass --overwrite to start again")
    return ((i, min(i + batch_size, n)) for i in range(start, n, batch_size))


def json_floats(values: dict) -> dict:
    """Metrics as printed: floats (numpy's too) rounded to 6 digits, everything else as is.

    >>> json_floats({"accuracy": np.float32(0.8125), "examples": 64})
    {'accuracy': 0.8125, 'examples': 64}
    """
    return {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in values.items()}


def served_texts_b(path, texts_b, signatures, client):
    """None, or texts_b if the served model takes pairs; an error if the file has pairs it cannot take."""
    takes_b = "text_b" in signatures.get("serving_default", {}).get("inputs", {})
    if texts_b is not None and not takes_b:
        if any(texts_b):
            raise KbertError(f"{path} has sentence pairs (text_b), but the served model {client.model_name} "
                             f"takes single texts: give one text per row")
        return None
    return texts_b


# === classify and regress: run_classifier.py ===


def classify_row(labels, probabilities) -> dict:
    """One classification's JSON: the best label and every label's probability.

    >>> classify_row(["neg", "pos"], [0.25, 0.75])
    {'label': 'pos', 'probabilities': {'neg': 0.25, 'pos': 0.75}}
    """
    best = int(np.argmax(probabilities))
    return {"label": labels[best], "probabilities": {label: round(float(p), 6)
                                                     for label, p in zip(labels, probabilities)}}


def _read_texts(task):
    def read(path, tokenizer, max_seq_length, labels, opts, require_labels, is_training):
        examples = readers.read_text_examples(path, task=task, format=opts.format,
                                              skip_bad_rows=opts.skip_bad_rows, require_labels=require_labels)
        readers.report_skipped(path, examples)
        features, truncated = encoding.encode_texts(tokenizer, examples.texts, examples.texts_b, max_seq_length)
        targets = None
        if examples.labels is not None:
            if task == "regress":
                targets = {"logits": np.asarray(examples.labels, dtype=np.float32)}
            else:
                if labels is None:  # training: the file's labels become the classes
                    _refuse_scores(path, examples.labels)
                labels = labels or sorted(set(examples.labels))
                _check_known(path, examples.labels, labels)
                index = {label: i for i, label in enumerate(labels)}
                targets = {"logits": np.asarray([index[label] for label in examples.labels], dtype=np.int32)}
        return TaskData(features, targets, labels, len(examples.texts), truncated, examples)
    return read


def _refuse_scores(path, labels):
    """Labels that are numbers with fractions (STS-B's 3.800) are scores, not classes: refuse
    to make a class of each value, and point at regress. Whole numbers (1..5 stars) are classes.

    >>> _refuse_scores("train.tsv", ["1", "5", "3"])
    >>> _refuse_scores("train.tsv", ["3.800", "0.500", "5.000"])
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: train.tsv: the labels are numbers with fractions (3 values from 0.5 to 5, e.g. '3.800'): --task classify would make a class of each value; for a score per example use --task regress, for classes label each row with a name or a whole number
    """
    values = []
    for label in labels:
        try:
            values.append(float(label))
        except ValueError:
            return
    fractions = [label for label, value in zip(labels, values) if math.isfinite(value) and not value.is_integer()]
    if fractions:
        raise KbertError(f"{path}: the labels are numbers with fractions ({len(set(labels))} values from "
                         f"{min(values):g} to {max(values):g}, e.g. {fractions[0]!r}): --task classify would make a "
                         f"class of each value; for a score per example use --task regress, for classes label each "
                         f"row with a name or a whole number")


def _serve_classifier(model, labels):
    names = _label_table(labels, model.num_classes)

    def outputs(features):
        probabilities = finite("probabilities", tf.nn.softmax(
            tf.cast(model(features, training=False)["logits"], tf.float32), axis=-1))
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


def _served_texts(task):
    def served_rows(client, signatures, path, opts, first=0):
        examples = readers.read_text_examples(path, task=task, format=opts.format,
                                              skip_bad_rows=opts.skip_bad_rows, require_labels=False)
        readers.report_skipped(path, examples)
        texts_b = served_texts_b(path, examples.texts_b, signatures, client)
        for start, stop in row_batches(len(examples.texts), opts.batch_size, first):
            batch_b = texts_b[start:stop] if texts_b is not None else None
            if task == "regress":
                for value in client.regress(examples.texts[start:stop], batch_b):
                    yield {"prediction": round(float(value), 6)}
            else:
                for row in client.classify(examples.texts[start:stop], batch_b):
                    yield classify_row([label for label, _ in row], [score for _, score in row])
    return served_rows


CLASSIFY = Task(
    name="classify", read=_read_texts("classify"),
    build=lambda base, labels: bert.bert_classifier(base, len(labels)),
    losses=lambda: ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, None),
    metric="accuracy",
    score=lambda data, outputs, opts, lower: metrics.classification_metrics(
        data.targets["logits"].tolist(), outputs["logits"].argmax(-1).tolist(),
        label_names=list(range(len(data.labels)))),
    rows=lambda data, outputs, opts, lower: (classify_row(data.labels, row) for row in _softmax(outputs["logits"])),
    serve=_serve_classifier, served_by=lambda signatures: _has_api(signatures, CLASSIFY_API),
    served_rows=_served_texts("classify"))

REGRESS = Task(
    name="regress", read=_read_texts("regress"),
    build=lambda base, labels: bert.bert_classifier(base, 1),
    losses=lambda: ({"logits": keras.losses.MeanSquaredError()}, None),
    metric="pearson",
    score=lambda data, outputs, opts, lower: metrics.regression_metrics(
        data.targets["logits"].tolist(), outputs["logits"][:, 0].tolist()),
    rows=lambda data, outputs, opts, lower: ({"prediction": round(float(v), 6)} for v in outputs["logits"][:, 0]),
    serve=_serve_regressor, served_by=lambda signatures: _has_api(signatures, REGRESS_API),
    served_rows=_served_texts("regress"))


# === tag: one label per word, on its first WordPiece ===


def _read_tagged(path, tokenizer, max_seq_length, labels, opts, require_labels, is_training):
    examples = readers.read_tagged_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=require_labels)
    readers.report_skipped(path, examples)
    tags = examples.tags
    if tags is not None and labels is None:
        labels = sorted({tag for sentence in tags for tag in sentence})
    if tags is not None and not require_labels and not {t for sentence in tags for t in sentence} <= set(labels):
        tags = None  # prediction: tags the model does not know are no reason to refuse the words
    label_ids = {label: i for i, label in enumerate(labels or [])}
    features, targets, word_starts, truncated = encoding.encode_tagged(
        tokenizer, examples.words, tags, label_ids, max_seq_length)
    return TaskData(features, {"logits": targets} if tags is not None else None, labels,
                    len(examples.words), truncated, examples, word_starts)


def _fallback_tag(labels):
    """The tag of a word cut off by --max-seq-length: "O" where the tag set has it."""
    return "O" if "O" in labels else labels[0]


def _word_tags(data: TaskData, outputs):
    """One predicted tag per word: the argmax at the word's first WordPiece."""
    best, fallback = outputs["logits"].argmax(-1), _fallback_tag(data.labels)
    return [[data.labels[best[i, p]] if p >= 0 else fallback for p in starts] for i, starts in enumerate(data.extra)]


def _serve_tagger(model, labels):
    names = _label_table(labels, model.num_classes)
    fallback = tf.constant(_fallback_tag([str(label) for label in labels or range(model.num_classes)]))

    def outputs(features):
        logits = finite("logits", model(features, training=False)["logits"])
        label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"label_id": label_id, "label": tf.gather(names, label_id), "input_mask": features["input_mask"]}

    def text_outputs(strings, pack, preprocessor):
        # As encoding.encode_tagged: the words are the text's whitespace-separated pieces (a CoNLL
        # file's words), each tokenized on its own, "[UNK]" for a word with no pieces, the pieces
        # cut at sequence_length - 2; each word's tag is read at its first piece.
        words = tf.strings.split(strings["text"])                     # [batch, (words)]
        pieces = preprocessor.tokenizer(words.flat_values)            # [words, (pieces)]
        count = tf.maximum(pieces.row_lengths(), 1)
        unk = tf.fill([tf.shape(count)[0], 1], load_vocab(preprocessor.vocab_file)[UNK])
        pieces = tf.concat([pieces, unk], axis=1)
        pieces = tf.ragged.boolean_mask(pieces, tf.ragged.range(pieces.row_lengths()) < count[:, None])
        tokens = tf.RaggedTensor.from_row_lengths(pieces, words.row_lengths()).merge_dims(1, 2)
        length = preprocessor.sequence_length
        tokens = tokens[:, :length - 2]
        batch = tf.shape(strings["text"])[0]
        ids = tf.concat([tf.fill([batch, 1], preprocessor.cls_id), tokens,
                         tf.fill([batch, 1], preprocessor.sep_id)], axis=1)
        features = {"input_ids": ids.to_tensor(0, shape=[None, length]),
                    "input_mask": tf.ones_like(ids).to_tensor(0, shape=[None, length]),
                    "segment_ids": tf.zeros_like(ids).to_tensor(0, shape=[None, length])}
        out = outputs(features)
        # Each word's first piece, counted from 1 ([CLS] is 0), within its own sentence.
        before = tf.cumsum(count, exclusive=True)
        sentence_start = tf.gather(tf.concat([before, tf.reduce_sum(count, keepdims=True)], 0), words.row_starts())
        first = before - tf.repeat(sentence_start, words.row_lengths()) + 1
        kept = first < length - 1
        rows = tf.cast(words.value_rowids(), tf.int32)
        at = tf.stack([rows, tf.cast(tf.where(kept, first, 0), tf.int32)], axis=1)
        tags = tf.where(kept, tf.gather_nd(out["label"], at), fallback)
        out["word_label"] = tf.RaggedTensor.from_row_lengths(tags, words.row_lengths()).to_tensor("")
        return out
    return ServingHead(outputs, text_outputs=text_outputs)


def _served_tags(client, signatures, path, opts, first=0):
    examples = readers.read_tagged_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=False)
    readers.report_skipped(path, examples)
    for start, stop in row_batches(len(examples.words), opts.batch_size, first):
        words = examples.words[start:stop]
        out = client.predict_text([" ".join(w) for w in words])
        for sentence, tags in zip(words, out["word_label"]):
            yield {"words": sentence, "tags": [str(tag) for tag in tags[:len(sentence)]]}


TAG = Task(
    name="tag", read=_read_tagged,
    build=lambda base, labels: bert.bert_tagger(base, len(labels)),
    # -1 marks positions with no label: [CLS], [SEP], padding, and non-first WordPieces.
    losses=lambda: ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)},
                    None),
    metric="f1",
    score=lambda data, outputs, opts, lower: metrics.tagging_metrics(data.raw.tags, _word_tags(data, outputs)),
    rows=lambda data, outputs, opts, lower: ({"words": words, "tags": tags}
                                             for words, tags in zip(data.raw.words, _word_tags(data, outputs))),
    serve=_serve_tagger, served_by=lambda signatures: "word_label" in _default(signatures).get("outputs", {}),
    served_rows=_served_tags)


# === squad: run_squad.py ===


def _read_squad(path, tokenizer, max_seq_length, labels, opts, require_labels, is_training):
    examples = squad.read_squad(path, is_training=is_training)
    if not examples:
        raise KbertError(f"{path} holds no SQuAD questions; pass a SQuAD v1.1 or v2.0 JSON file")
    arrays, features = squad.squad_features(examples, tokenizer, max_seq_length, opts.doc_stride,
                                            opts.max_query_length, is_training=is_training)
    inputs = {k: arrays[k] for k in ("input_ids", "input_mask", "segment_ids")}
    targets = ({"start_logits": arrays["start_positions"], "end_logits": arrays["end_positions"]}
               if is_training else None)
    return TaskData(inputs, targets, None, len(features), 0, examples, features)


def squad_answers(data: TaskData, outputs, opts: FinetuneOptions, do_lower_case=True):
    """(best answer per question id, n-best lists), decoded as run_squad.py writes them."""
    v2 = any(getattr(e, "is_impossible", False) for e in data.raw)
    return squad_decoding.squad_predictions(data.raw, data.extra, outputs["start_logits"], outputs["end_logits"],
                                   n_best_size=opts.n_best_size, max_answer_length=opts.max_answer_length,
                                   do_lower_case=do_lower_case, version_2_with_negative=v2,
                                   null_score_diff_threshold=opts.null_score_diff_threshold)


def _squad_rows(data, outputs, opts, do_lower_case):
    answers, nbest = squad_answers(data, outputs, opts, do_lower_case)
    for example in data.raw:
        best = nbest.get(example.qas_id) or [{}]
        yield {"id": example.qas_id, "answer": answers.get(example.qas_id, ""),
               "probability": round(float(best[0].get("probability", 0.0)), 6)}


def _squad_losses():
    # run_squad.py: total_loss = (start_loss + end_loss) / 2.
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return {"start_logits": ce, "end_logits": ce}, {"start_logits": 0.5, "end_logits": 0.5}


SQUAD = Task(
    name="squad", read=_read_squad,
    build=lambda base, labels: bert.bert_span_predictor(base),
    losses=_squad_losses, metric="f1",
    score=lambda data, outputs, opts, lower: squad.squad_evaluate(data.raw, squad_answers(data, outputs, opts,
                                                                                          lower)[0]),
    rows=_squad_rows, max_seq_length=384)


# === choice: multiple choice (SWAG) ===


def choice_row(probabilities) -> dict:
    """One multiple-choice answer's JSON: the best ending's index and every ending's probability.

    >>> choice_row([0.1, 0.7, 0.2])
    {'label': 1, 'probabilities': [0.1, 0.7, 0.2]}
    """
    return {"label": int(np.argmax(probabilities)), "probabilities": [round(float(p), 6) for p in probabilities]}


def _read_choices(path, tokenizer, max_seq_length, labels, opts, require_labels, is_training):
    examples = readers.read_choice_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=require_labels)
    readers.report_skipped(path, examples)
    features, truncated = encoding.encode_choices(tokenizer, examples.contexts, examples.endings, max_seq_length)
    targets = None if examples.labels is None else {"logits": np.asarray(examples.labels, dtype=np.int32)}
    return TaskData(features, targets, None, len(examples.contexts), truncated, examples)


def _serve_choices(model, labels):
    def outputs(features):
        probabilities = finite("probabilities", tf.nn.softmax(
            tf.cast(model(features, training=False)["logits"], tf.float32), axis=-1))
        return {"probabilities": probabilities, "label_id": tf.argmax(probabilities, axis=-1, output_type=tf.int32)}

    def text_outputs(strings, pack, preprocessor):
        # Every (context, ending) pair packed as a sentence pair, then back to [batch, choices, seq].
        endings = strings["endings"]
        choices = tf.shape(endings)[1]
        flat = pack(tf.repeat(strings["text"], choices), tf.reshape(endings, [-1]))
        shape = [-1, choices, preprocessor.sequence_length]
        return outputs({name: tf.reshape(value, shape) for name, value in flat.items()})
    return ServingHead(outputs, text_inputs={"text": 1, "endings": 2}, text_outputs=text_outputs, ids_rank=3)


def _served_choices(client, signatures, path, opts, first=0):
    examples = readers.read_choice_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=False)
    readers.report_skipped(path, examples)
    for start, stop in row_batches(len(examples.contexts), opts.batch_size, first):
        out = client.predict({"text": np.asarray(examples.contexts[start:stop], dtype=object),
                              "endings": np.asarray(examples.endings[start:stop], dtype=object)})
        for row in out["probabilities"]:
            yield choice_row(row)


CHOICE = Task(
    name="choice", read=_read_choices,
    build=lambda base, labels: bert.bert_multiple_choice(base),
    losses=lambda: ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, None),
    metric="accuracy",
    score=lambda data, outputs, opts, lower: {"accuracy": float(np.mean(
        outputs["logits"].argmax(-1) == data.targets["logits"]))},
    rows=lambda data, outputs, opts, lower: (choice_row(row) for row in _softmax(outputs["logits"])),
    serve=_serve_choices, served_by=lambda signatures: "endings" in _default(signatures).get("inputs", {}),
    served_rows=_served_choices)


TASKS = {task.name: task for task in (CLASSIFY, REGRESS, TAG, SQUAD, CHOICE)}


def get_task(name: str) -> Task:
    """The task called `name`, or a one-line error listing them."""
    if name not in TASKS:
        raise KbertError(f"unknown --task {name!r}; use one of {', '.join(TASKS)}")
    return TASKS[name]


def best_metric(task: str, scores: dict) -> tuple[str, float]:
    """The name and value of the score that picks the best epoch; higher is better.

    Args:
        task: str. A name in `TASKS`.
        scores: dict. What the task's `score` returned.

    Raises:
        KbertError: an unknown task, or `scores` lacks that task's metric.
    """
    name = get_task(task).metric
    if name not in scores:
        raise KbertError(f"the {task} metrics have no {name!r} to pick the best epoch by; "
                         f"they have {', '.join(sorted(scores)) or 'nothing'}")
    return name, float(scores[name])


def predict_outputs(model, data: TaskData, batch_size) -> dict:
    """Raw model outputs over `data` (numpy, float32)."""
    outputs = model.predict(data.features, batch_size=batch_size, verbose=0)
    return {k: np.asarray(v, dtype=np.float32) for k, v in outputs.items()}

