"""choice: multiple choice as the BERT paper ran SWAG: one score per [CLS], softmax over N endings.

It reads SWAG's CSV (`kbert.finetuning.readers.read_choice_examples`); each context is packed
with each ending as a sentence pair. Its export serves `probabilities` over the endings and
`label_id`, from `text` and `endings`.

Example:
>>> CHOICE.metric, CHOICE.head
('accuracy', 'multiple_choice')
"""

from __future__ import annotations

import keras
import numpy as np

from kbert.finetuning import encoding, readers
from kbert.finetuning.tasks.base import Task, TaskData, softmax
from kbert.model import bert


def choice_row(probabilities) -> dict:
    """One multiple-choice answer's JSON: the best ending's index and every ending's probability.

    >>> choice_row([0.1, 0.7, 0.2])
    {'label': 1, 'probabilities': [0.1, 0.7, 0.2]}
    """
    return {"label": int(np.argmax(probabilities)), "probabilities": [round(float(p), 6) for p in probabilities]}


class Choice(Task):
    """The ending that follows a context, out of N."""

    name = "choice"
    metric = "accuracy"
    head = "multiple_choice"
    served = True
    reader = readers.read_choice_examples
    trains_pooler = True

    def encode(self, examples, *, path, preprocessor, labels, options, require_labels, training):
        features, truncated = encoding.encode_choices(preprocessor, examples.contexts, examples.endings)
        targets = None if examples.labels is None else {"logits": np.asarray(examples.labels, dtype=np.int32)}
        return TaskData(features, targets, None, len(examples.contexts), truncated, examples)

    def build(self, base, *, labels, task_info=None):
        return bert.bert_multiple_choice(base, task_info=task_info)

    def losses(self, options=None):
        return {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, None

    def score(self, data, outputs, *, options, do_lower_case):
        return {"accuracy": float(np.mean(outputs["logits"].argmax(-1) == data.targets["logits"]))}

    def rows(self, data, outputs, *, options, do_lower_case):
        return (choice_row(row) for row in softmax(outputs["logits"]))

    def serving_head(self, model, labels, heads, record=None):
        return heads.serve_choices(model, labels)

    def served_by(self, signatures):
        return "endings" in signatures.get("serving_default", {}).get("inputs", {})

    def served_answers(self, client, examples, signatures, path):
        def answer(part, first):
            out = client.predict(
                {"text": np.asarray(part.contexts, dtype=object), "endings": np.asarray(part.endings, dtype=object)}
            )
            return [choice_row(row) for row in out["probabilities"]]

        return answer


CHOICE = Choice()
