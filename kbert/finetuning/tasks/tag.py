"""tag: one label per word, on its first WordPiece (NER, POS).

It reads CoNLL (`kbert.finetuning.readers.read_tagged_examples`): one word per line, its tag in
the last column, a blank line between sentences. Positions with no label ([CLS], [SEP],
padding, later pieces of a word) take no loss. With `--long-text windows` each word's tag is read
in the window where it has the most context. Its export serves per-token `label_id`, `label`,
`input_mask`, and from text `word_label`, the tag of each whitespace-separated word.

Example:
>>> TAG.metric, TAG.head, TAG.windows
('f1', 'tagger', True)
"""

from __future__ import annotations

import keras
import numpy as np

from kbert.finetuning import encoding, metrics, readers
from kbert.finetuning.options import window_stride
from kbert.finetuning.tasks.base import Task, TaskData, label_names
from kbert.model import families


def fallback_tag(labels):
    """The tag of a word cut off by --max-seq-length: "O" where the tag set has it, else the first.

    >>> fallback_tag(["B-LOC", "O"]), fallback_tag(["B-LOC", "B-PER"])
    ('O', 'B-LOC')
    """
    return "O" if "O" in labels else labels[0]


def word_tags(data: TaskData, outputs):
    """One predicted tag per word: the argmax at the word's first WordPiece (with windows, in
    the window where that piece has the most context)."""
    best, fallback = outputs["logits"].argmax(-1), fallback_tag(data.labels)
    if data.windows is not None:
        window, position = data.extra
        names = [data.labels[i] for i in best[window, position]]
        ends = np.cumsum([len(words) for words in data.raw.words])
        return [names[end - len(words) : end] for end, words in zip(ends, data.raw.words)]
    return [[data.labels[best[i, p]] if p >= 0 else fallback for p in starts] for i, starts in enumerate(data.extra)]


class Tag(Task):
    """A tag per word: the tags are the training file's."""

    name = "tag"
    metric = "f1"
    head = "tagger"
    windows = True
    served = True
    reader = readers.read_tagged_examples

    def encode(self, examples, *, path, preprocessor, labels, options, require_labels, training):
        tags = examples.tags
        if tags is not None and labels is None:
            labels = sorted({tag for sentence in tags for tag in sentence})
        if tags is not None and not require_labels and not {t for sentence in tags for t in sentence} <= set(labels):
            tags = None  # prediction: tags the model does not know are no reason to refuse the words
        label_ids = {label: i for i, label in enumerate(labels or [])}
        windows = None
        if options.long_text == "windows":
            stride = window_stride(options.doc_stride, preprocessor.sequence_length)
            features, targets, windows, places = encoding.encode_tagged_windows(
                preprocessor, examples.words, tags, label_ids, stride
            )
            truncated = 0
        else:
            features, targets, places, truncated = encoding.encode_tagged(preprocessor, examples.words, tags, label_ids)
        return TaskData(
            features,
            {"logits": targets} if tags is not None else None,
            labels,
            len(features["input_ids"]),
            truncated,
            examples,
            places,
            windows,
        )

    def build(self, base, *, labels, task_info=None):
        return families.tagger(base, len(labels), task_info=task_info)

    def losses(self, options=None):
        # -1 marks positions with no label: [CLS], [SEP], padding, and non-first WordPieces.
        return {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)}, None

    def score(self, data, outputs, *, options, do_lower_case):
        return metrics.tagging_metrics(data.raw.tags, word_tags(data, outputs))

    def rows(self, data, outputs, *, options, do_lower_case):
        return ({"words": words, "tags": tags} for words, tags in zip(data.raw.words, word_tags(data, outputs)))

    def check_head(self, info, num_classes, kind):
        info["labels"] = label_names(info, num_classes, kind)

    def serving_head(self, model, labels, heads, record=None):
        fallback = fallback_tag([str(label) for label in labels or range(model.num_classes)])
        return heads.serve_tagger(model, labels, fallback)

    def serving_windows(self, head, model, labels, stride, max_windows, heads):
        return heads.tagger_windows(head, stride, max_windows)

    def served_by(self, signatures):
        return "word_label" in signatures.get("serving_default", {}).get("outputs", {})

    def served_answers(self, client, examples, signatures, path):
        def answer(part, first):
            out = client.predict_text([" ".join(words) for words in part.words])
            return [
                {"words": words, "tags": [str(tag) for tag in tags[: len(words)]]}
                for words, tags in zip(part.words, out["word_label"])
            ]

        return answer


TAG = Tag()
