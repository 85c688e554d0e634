"""classify: run_classifier.py's model, dropout + [classes, H] on the pooled output.

It reads one text, or a pair, per row (CSV, TSV, JSON Lines, GLUE's TSVs:
`kbert.finetuning.readers.read_text_examples`), with a label per row: the file's labels become
the classes. Documents longer than the window (`--long-text windows`) are read in overlapping
windows: each window trains with its document's label, and the answer per document is the
softmax of the mean of its windows' logits. Its export serves `probabilities`, `label_id` and
`label`, and TF Serving's Classify API.

Example:
>>> CLASSIFY.metric, CLASSIFY.max_seq_length, CLASSIFY.head
('accuracy', 128, 'classifier')
"""

from __future__ import annotations

import math

import keras
import numpy as np

from kbert.finetuning import encoding, metrics, readers
from kbert.finetuning.options import window_stride
from kbert.finetuning.tasks.base import (
    Task,
    TaskData,
    check_known,
    finetune_option,
    label_names,
    served_texts_b,
    softmax,
)
from kbert.finetuning.windows import document_mean
from kbert.model import families
from kbert.runtime.errors import KbertError

# TF Serving's Classify API: the signature name an export adds for it, and the method name TF
# Serving requires of it.
CLASSIFY_API, CLASSIFY_METHOD = "classify", "tensorflow/serving/classify"


def classify_row(labels, probabilities) -> dict:
    """One classification's JSON: the best label and every label's probability.

    >>> classify_row(["neg", "pos"], [0.25, 0.75])
    {'label': 'pos', 'probabilities': {'neg': 0.25, 'pos': 0.75}}
    """
    best = int(np.argmax(probabilities))
    return {
        "label": labels[best],
        "probabilities": {label: round(float(p), 6) for label, p in zip(labels, probabilities)},
    }


def refuse_pairs(path, examples, training):
    """An error for sentence pairs in a file read in windows: windows read one text per row."""
    if examples.texts_b is None:
        return
    if training:
        raise KbertError(
            f"{path} holds sentence pairs (text_b), and {finetune_option('long_text', 'windows')} reads one text "
            f"per row: join the two texts into the text column, or use {finetune_option('long_text', 'truncate')}"
        )
    # A fine-tuned model reads as it was trained to: its windows are no option of predict's.
    raise KbertError(
        f"{path} holds sentence pairs (text_b), and this model reads one text per row (it was fine-tuned with "
        f"{finetune_option('long_text', 'windows')}): join the two texts into the text column"
    )


def refuse_scores(path, labels):
    """Labels that are numbers with fractions (STS-B's 3.800) are scores, not classes: refuse
    to make a class of each value, and point at regress. Whole numbers (1..5 stars) are classes.

    >>> refuse_scores("train.tsv", ["1", "5", "3"])
    >>> refuse_scores("train.tsv", ["3.800", "0.500", "5.000"])
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: train.tsv: the labels are numbers with fractions (3 values from 0.5 to 5, e.g. '3.800'): task='classify' would make a class of each value; for a score per example use task='regress', for classes label each row with a name or a whole number
    """
    values = []
    for label in labels:
        try:
            values.append(float(label))
        except ValueError:
            return
    fractions = [label for label, value in zip(labels, values) if math.isfinite(value) and not value.is_integer()]
    if fractions:
        raise KbertError(
            f"{path}: the labels are numbers with fractions ({len(set(labels))} values from "
            f"{min(values):g} to {max(values):g}, e.g. {fractions[0]!r}): {finetune_option('task', 'classify')} "
            f"would make a class of each value; for a score per example use {finetune_option('task', 'regress')}, "
            f"for classes label each row with a name or a whole number"
        )


def document_gold(data: TaskData):
    """The labels (values) to score against: one per document."""
    gold = data.targets["logits"]
    return gold if data.windows is None else gold[data.windows.first_window]


def document_logits(data: TaskData, outputs):
    """The model's logits (values) per document: the mean over its windows, with windows."""
    logits = outputs["logits"]
    return logits if data.windows is None else document_mean(logits, data.windows)


class Classify(Task):
    """One label per text (or sentence pair): the classes are the training file's labels."""

    name = "classify"
    metric = "accuracy"
    head = "classifier"
    windows = True
    text_pairs = True
    served = True
    trains_pooler = True
    # Labels are class names; regress reads them as numbers.
    scores = False

    # === Reading and encoding ===

    def read_rows(self, path, *, options, require_labels):
        return readers.read_text_examples(
            path,
            scores=self.scores,
            format=options.format,
            skip_bad_rows=options.skip_bad_rows,
            require_labels=require_labels,
        )

    def encode(self, examples, *, path, preprocessor, labels, options, require_labels, training):
        windows = None
        if options.long_text == "windows":
            refuse_pairs(path, examples, training)
            stride = window_stride(options.doc_stride, preprocessor.sequence_length)
            features, windows = encoding.encode_text_windows(preprocessor, examples.texts, stride)
            truncated = 0
        else:
            features, truncated = encoding.encode_texts(preprocessor, examples.texts, examples.texts_b)
        targets = None
        if examples.labels is not None:
            targets, labels = self.targets(path, examples, labels, require_labels)
        if windows is not None and targets is not None:  # each window trains on its document's label
            targets = {name: values[windows.document] for name, values in targets.items()}
        size = len(features["input_ids"])
        return TaskData(features, targets, labels, size, truncated, examples, windows=windows)

    def targets(self, path, examples, labels, require_labels):
        """(targets, label names) of a file with labels: each row's class index."""
        if labels is None:  # training: the file's labels become the classes
            refuse_scores(path, examples.labels)
        labels = labels or sorted(set(examples.labels))
        if require_labels:
            check_known(path, examples.labels, labels)
        targets = None
        if set(examples.labels) <= set(labels):  # prediction: unknown labels are no reason to refuse
            index = {label: i for i, label in enumerate(labels)}
            targets = {"logits": np.asarray([index[label] for label in examples.labels], dtype=np.int32)}
        return targets, labels

    # === Training ===

    def check_training_data(self, path, data):
        if len(data.labels) < 2:
            raise KbertError(f"{path} has only one label ({data.labels[0]!r}); classification needs at least two")

    def build(self, base, *, labels, task_info=None):
        return families.classifier(base, len(labels), task_info=task_info)

    def losses(self, options=None):
        return {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, None

    def record(self, opts, max_seq_length, data):
        # Whether inputs are sentence pairs: the export's serving signature takes text_b only then.
        return {"text_pairs": data.raw.texts_b is not None}

    # === Scoring and predicting ===

    def score(self, data, outputs, *, options, do_lower_case):
        return metrics.classification_metrics(
            document_gold(data).tolist(),
            document_logits(data, outputs).argmax(-1).tolist(),
            label_names=list(range(len(data.labels))),
        )

    def rows(self, data, outputs, *, options, do_lower_case):
        return (classify_row(data.labels, row) for row in softmax(document_logits(data, outputs)))

    # === What a head records ===

    def check_head(self, info, num_classes, kind):
        if num_classes < 2:
            raise KbertError(
                f'a classifier with {num_classes} output is a regressor: save it with task="regress", '
                f"or build it with num_classes=2 or more"
            )
        info["labels"] = label_names(info, num_classes, kind)

    # === Serving ===

    def serving_head(self, model, labels, heads, record=None):
        return heads.serve_classifier(model, labels)

    def serving_windows(self, head, model, labels, stride, max_windows, heads):
        return heads.classifier_windows(head, model, labels, stride, max_windows)

    def served_by(self, signatures):
        return signatures.get(CLASSIFY_API, {}).get("method_name") == CLASSIFY_METHOD

    def served_answers(self, client, examples, signatures, path):
        texts_b_allowed = served_texts_b(path, examples.texts_b, signatures, client) is not None

        def answer(part, first):
            rows = client.classify(part.texts, part.texts_b if texts_b_allowed else None)
            return [classify_row([label for label, _ in row], [score for _, score in row]) for row in rows]

        return answer


CLASSIFY = Classify()
