"""regress: classify's model with one output and squared error (STS-B): a score per text or pair.

It reads the rows classify reads, with a number per row for a label. With `--long-text windows`
a document's score is the mean of its windows'. Its export serves `score`, and TF Serving's
Regress API.

Example:
>>> REGRESS.metric, REGRESS.head, REGRESS.head_outputs
('pearson', 'classifier', 1)
"""

from __future__ import annotations

import keras
import numpy as np

from kbert.finetuning import metrics
from kbert.finetuning.tasks.base import served_texts_b
from kbert.finetuning.tasks.classify import Classify, document_gold, document_logits
from kbert.model import families
from kbert.runtime.errors import KbertError

# TF Serving's Regress API: the signature name an export adds for it, and its method name.
REGRESS_API, REGRESS_METHOD = "regress", "tensorflow/serving/regress"


class Regress(Classify):
    """One number per text (or sentence pair), on a classifier head of one output."""

    name = "regress"
    metric = "pearson"
    head_outputs = 1
    scores = True

    def targets(self, path, examples, labels, require_labels):
        return {"logits": np.asarray(examples.labels, dtype=np.float32)}, labels

    def check_training_data(self, path, data):
        pass

    def build(self, base, *, labels, task_info=None):
        return families.classifier(base, 1, task_info=task_info)

    def losses(self, options=None):
        return {"logits": keras.losses.MeanSquaredError()}, None

    def score(self, data, outputs, *, options, do_lower_case):
        return metrics.regression_metrics(document_gold(data).tolist(), document_logits(data, outputs)[:, 0].tolist())

    def rows(self, data, outputs, *, options, do_lower_case):
        return ({"prediction": round(float(v), 6)} for v in document_logits(data, outputs)[:, 0])

    def check_head(self, info, num_classes, kind):
        if info.get("labels") is not None:
            raise KbertError(f"labels apply to classify and tag; a {self.name} model has none: save it without labels")
        info.pop("labels", None)
        if num_classes != 1:
            raise KbertError(
                f"task regress needs a classifier with one output (num_classes=1); this one has {num_classes}"
            )

    def serving_head(self, model, labels, heads, record=None):
        return heads.serve_regressor(model, labels)

    def serving_windows(self, head, model, labels, stride, max_windows, heads):
        return heads.regressor_windows(head, model, labels, stride, max_windows)

    def served_by(self, signatures):
        return signatures.get(REGRESS_API, {}).get("method_name") == REGRESS_METHOD

    def served_answers(self, client, examples, signatures, path):
        texts_b_allowed = served_texts_b(path, examples.texts_b, signatures, client) is not None

        def answer(part, first):
            values = client.regress(part.texts, part.texts_b if texts_b_allowed else None)
            return [{"prediction": round(float(value), 6)} for value in values]

        return answer


REGRESS = Regress()
