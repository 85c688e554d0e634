"""`kbert predict --server`: predictions on a file from a model TF Serving serves (`predict_served`).

The file is read with the task's reader and the server's answers are turned into the task's
JSON (`kbert.finetuning.tasks`), so local and server prediction print the same lines for the
same model. Which task a served model has, the server tells: `served_task` reads it from the
signatures `kbert.serving.export` writes (`served_by`), and `served_rows` asks the server for
that task's rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from kbert.errors import KbertError, listing
from kbert.files import require_path
from kbert.finetuning import readers
from kbert.finetuning.options import FinetuneOptions, resolve_options
from kbert.finetuning.predict import pooled_row
from kbert.finetuning.tasks import choice_row, classify_row
from kbert.serving.client import Client
from kbert.serving.heads import API_METHODS, CLASSIFY_API, REGRESS_API, SERVED_TASKS


def row_batches(n: int, batch_size: int, start: int = 0):
    """(start, stop) of each batch of `n` examples, from example `start` on (where a resumed
    `kbert predict --output` goes on); an error if `start` is past the end.

    >>> list(row_batches(5, 2)), list(row_batches(5, 2, start=3)), list(row_batches(5, 2, start=5))
    ([(0, 2), (2, 4), (4, 5)], [(3, 5)], [])
    """
    if start > n:
        raise KbertError(
            f"the output to resume already has {start} rows, but the input has only {n} "
            f"examples: it is not this input's output; pass --overwrite to start again"
        )
    return ((i, min(i + batch_size, n)) for i in range(start, n, batch_size))


def served_texts_b(path, texts_b, signatures, client):
    """None, or texts_b if the served model takes pairs; an error if the file has pairs it cannot take."""
    takes_b = "text_b" in signatures.get("serving_default", {}).get("inputs", {})
    if texts_b is not None and not takes_b:
        if any(texts_b):
            raise KbertError(
                f"{path} has sentence pairs (text_b), but the served model {client.model_name} "
                f"takes single texts: give one text per row"
            )
        return None
    return texts_b


# === Which task a server's model has ===


def _has_api(signatures, api):
    return signatures.get(api, {}).get("method_name") == API_METHODS[api]


def served_by(task: str, signatures: dict) -> bool:
    """Whether a server's `signatures` (`Client.metadata()`) are those kbert export writes for a
    `task` model: a classifier's or regressor's Classify or Regress API, a tagger's `word_label`
    output, a multiple-choice model's `endings` input.

    >>> served_by("tag", {"serving_default": {"inputs": {"text": {}}, "outputs": {"word_label": {}}}})
    True
    """
    default = signatures.get("serving_default", {})
    if task == "classify":
        return _has_api(signatures, CLASSIFY_API)
    if task == "regress":
        return _has_api(signatures, REGRESS_API)
    if task == "tag":
        return "word_label" in default.get("outputs", {})
    if task == "choice":
        return "endings" in default.get("inputs", {})
    return False


def served_task(signatures: dict) -> str | None:
    """The task of a model kbert export wrote, from its signatures (None for an encoder).

    >>> served_task({"serving_default": {"inputs": {"text": {}, "endings": {}}, "outputs": {}}})
    'choice'
    """
    for task in SERVED_TASKS:
        if served_by(task, signatures):
            return task
    outputs = set(signatures.get("serving_default", {}).get("outputs", {}))
    if "pooled_output" in outputs:
        return None
    raise KbertError(
        f"the served model's serving_default has outputs {listing(outputs) or 'none'}; kbert "
        f"predict --server reads what kbert export writes (the tasks "
        f"{', '.join(SERVED_TASKS)} and encoders): use Client.predict for other models"
    )


# === Each task's rows, from the server's answers ===


def _served_texts(task, client, signatures, path, opts, start):
    examples = readers.read_text_examples(
        path, task=task, format=opts.format, skip_bad_rows=opts.skip_bad_rows, require_labels=False
    )
    readers.report_skipped(path, examples)
    texts_b = served_texts_b(path, examples.texts_b, signatures, client)
    for first, stop in row_batches(len(examples.texts), opts.batch_size, start):
        batch_b = texts_b[first:stop] if texts_b is not None else None
        if task == "regress":
            for value in client.regress(examples.texts[first:stop], batch_b):
                yield {"prediction": round(float(value), 6)}
        else:
            for row in client.classify(examples.texts[first:stop], batch_b):
                yield classify_row([label for label, _ in row], [score for _, score in row])


def _served_tags(client, signatures, path, opts, start):
    examples = readers.read_tagged_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=False)
    readers.report_skipped(path, examples)
    for first, stop in row_batches(len(examples.words), opts.batch_size, start):
        words = examples.words[first:stop]
        out = client.predict_text([" ".join(w) for w in words])
        for sentence, tags in zip(words, out["word_label"]):
            yield {"words": sentence, "tags": [str(tag) for tag in tags[: len(sentence)]]}


def _served_choices(client, signatures, path, opts, start):
    examples = readers.read_choice_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=False)
    readers.report_skipped(path, examples)
    for first, stop in row_batches(len(examples.contexts), opts.batch_size, start):
        out = client.predict(
            {
                "text": np.asarray(examples.contexts[first:stop], dtype=object),
                "endings": np.asarray(examples.endings[first:stop], dtype=object),
            }
        )
        for row in out["probabilities"]:
            yield choice_row(row)


def _served_features(client, signatures, path, opts, start):
    texts, texts_b = readers.read_lines(path)
    texts_b = served_texts_b(path, texts_b, signatures, client)
    for first, stop in row_batches(len(texts), opts.batch_size, start):
        out = client.predict_text(texts[first:stop], texts_b[first:stop] if texts_b is not None else None)
        for row in out["pooled_output"]:
            yield pooled_row(row)


def served_rows(
    task: str | None, client: Client, signatures: dict, path, *, options: FinetuneOptions, start: int = 0
) -> Iterator[dict]:
    """The dicts local `kbert predict` prints for `task` (None: an encoder's features), from
    example `start` of `path` on, as the served model answers them.

    Args:
        task: str or None. What `served_task(signatures)` says.
        client: `kbert.serving.Client`. The served model.
        signatures: dict. Its signatures (`client.metadata()`).
        path: str or PathLike. The input file, in the task's format.
        options: `FinetuneOptions`. batch_size (examples per request), format, skip_bad_rows.
        start: int. The first example to predict.
    """
    if task is None:
        return _served_features(client, signatures, path, options, start)
    if task in ("classify", "regress"):
        return _served_texts(task, client, signatures, path, options, start)
    if task == "tag":
        return _served_tags(client, signatures, path, options, start)
    if task == "choice":
        return _served_choices(client, signatures, path, options, start)
    raise KbertError(f"kbert predict --server reads the tasks {', '.join(SERVED_TASKS)} and encoders, not {task!r}")


def predict_served(
    client: Client, input_path, options: FinetuneOptions | None = None, start: int = 0, **overrides
) -> Iterator[dict]:
    """One JSON-ready dict per example of `input_path`, as the served model predicts it: the
    same file formats and the same dicts as local `predict` on the model that was exported.

    Args:
        client: `kbert.serving.Client`. The served model; its `retries` and `timeout` decide
            how long a batch waits out a server that is down or restarting.
        input_path: str or PathLike. The input file.
        options: `FinetuneOptions` (batch_size: examples per request; format; skip_bad_rows);
            keyword arguments override single fields.
        start: int. The first example to predict: the ones before it are not sent (a resumed
            `kbert predict --output` starts after the rows it already has).

    Example:
    >>> rows = predict_served(Client("localhost:8500", "sentiment"), "test.tsv")  # doctest: +SKIP
    >>> next(rows)  # doctest: +SKIP
    {'label': 'pos', 'probabilities': {'neg': 0.031, 'pos': 0.969}}
    """
    opts = resolve_options(options, overrides)  # checks batch_size: one line
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise KbertError(f"start {start!r}: give the number of examples to skip, 0 or more")
    # The file's layout depends on the served model's task, which the server tells; a missing or
    # empty file is wrong whatever the task, so say so (at the call) before asking a server that may be down.
    require_path(input_path, "input file", "pass --input with the file to predict on")
    if os.path.getsize(input_path) == 0:
        raise KbertError(f"{input_path}: the file is empty; pass a file with one example per row")
    return _predict_served(client, input_path, opts, start)


def _predict_served(client, input_path, opts, start) -> Iterator[dict]:
    # A generator: the server is first asked at the first row, as the file is read.
    signatures = client.metadata()
    yield from served_rows(served_task(signatures), client, signatures, input_path, options=opts, start=start)
