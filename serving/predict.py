"""`kbert predict --server`: predictions on a file from a model TF Serving serves (`predict_served`).

The file is read with the task's reader and the server's answers are turned into the task's
JSON (`kbert.finetuning.tasks`), so local and server prediction print the same lines for the
same model. Which task a served model has, the server tells: `served_task` reads it from the
signatures `kbert.serving.export` writes (`served_by`), and `served_rows` asks the server for
that task's rows (each task's `served_by` and `served_answers`). A sentence-embedding model's
rows are those `kbert embed` writes: {"embedding": [...]} per text.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from kbert.finetuning import readers
from kbert.finetuning.embedding import json_vector, one_text_per_row
from kbert.finetuning.options import FinetuneOptions, resolve_options
from kbert.finetuning.predict import pooled_row
from kbert.finetuning.rows import check_start, stream_rows
from kbert.finetuning.tasks import TASKS, get_task
from kbert.finetuning.tasks.base import served_texts_b
from kbert.runtime.errors import KbertError, listing, on_command_line, option
from kbert.runtime.files import require_path
from kbert.serving.client import Client
from kbert.serving.heads import EMBEDDING, SERVED_TASKS

# What `kbert predict --server` reads, for its messages.
_SERVED_KINDS = f"the tasks {', '.join(SERVED_TASKS)}, encoders and sentence-embedding models"


# === Which task a server's model has ===


def served_by(task: str, signatures: dict) -> bool:
    """Whether a server's `signatures` (`Client.metadata()`) are those kbert export writes for a
    `task` model: a classifier's or regressor's Classify or Regress API, a tagger's `word_label`
    output, a multiple-choice model's `endings` input.

    >>> served_by("tag", {"serving_default": {"inputs": {"text": {}}, "outputs": {"word_label": {}}}})
    True
    """
    return task in TASKS and TASKS[task].served_by(signatures)


def served_task(signatures: dict) -> str | None:
    """The task of a model kbert export wrote, from its signatures: None for an encoder,
    EMBEDDING ("embedding") for a sentence-embedding model.

    >>> served_task({"serving_default": {"inputs": {"text": {}, "endings": {}}, "outputs": {}}})
    'choice'
    >>> served_task({"serving_default": {"inputs": {"text": {}}, "outputs": {"embedding": {}}}})
    'embedding'
    """
    for task in SERVED_TASKS:
        if served_by(task, signatures):
            return task
    outputs = set(signatures.get("serving_default", {}).get("outputs", {}))
    if "pooled_output" in outputs:
        return None
    if outputs == {EMBEDDING}:
        return EMBEDDING
    raise KbertError(
        f"the served model's serving_default has outputs {listing(outputs) or 'none'}; {_served_reader()} "
        f"reads what kbert export writes ({_SERVED_KINDS}): use Client.predict for other models"
    )


# === Each task's rows, from the server's answers ===


def _embedding_answers(client):
    def answer(part, first):
        out = client.predict_text(part.texts)
        return [{EMBEDDING: json_vector(row)} for row in out[EMBEDDING]]  # kbert embed's rows

    return answer


def _feature_answers(client, texts_b_allowed):
    def answer(part, first):
        out = client.predict_text(part.texts, part.texts_b if texts_b_allowed else None)
        return [pooled_row(row) for row in out["pooled_output"]]

    return answer


def served_rows(
    task: str | None, client: Client, signatures: dict, path, *, options: FinetuneOptions, start: int = 0
) -> Iterator[dict]:
    """The dicts local `kbert predict` prints for `task` (None: an encoder's features; EMBEDDING:
    the rows `kbert embed` writes, {"embedding": [...]}), from example `start` of `path` on, as
    the served model answers them: the file is read as local prediction (or `kbert embed`) reads
    it, and goes through the same batch loop (`stream_rows`).

    Args:
        task: str or None. What `served_task(signatures)` says.
        client: `kbert.serving.Client`. The served model.
        signatures: dict. Its signatures (`client.metadata()`).
        path: str or PathLike. The input file, in the task's format.
        options: `FinetuneOptions`. batch_size (examples per request), format, skip_bad_rows.
        start: int. The first example to predict.
    """
    if task is None or task == EMBEDDING:  # an encoder's: the file's texts
        examples = readers.read_feature_texts(path, format=options.format, skip_bad_rows=options.skip_bad_rows)
        readers.report_skipped(path, examples)
        if task is None:
            texts_b_allowed = served_texts_b(path, examples.texts_b, signatures, client) is not None
            answer = _feature_answers(client, texts_b_allowed)
        else:
            examples = one_text_per_row(path, examples, _served_reader())
            answer = _embedding_answers(client)
    else:
        if task not in SERVED_TASKS:
            raise KbertError(f"{_served_reader()} reads {_SERVED_KINDS}, not {task!r}")
        served = get_task(task)
        examples = served.read_examples(path, options=options, require_labels=False, training=False)
        answer = served.served_answers(client, examples, signatures, path)
    return stream_rows(examples, answer, options.batch_size, start, with_lines=options.skip_bad_rows)


def served_options(options: FinetuneOptions | None = None, **overrides) -> FinetuneOptions:
    """The options `predict_served` reads (batch_size, format, skip_bad_rows), checked: the
    served model's export fixed its sequence length, so max_seq_length is refused.

    >>> served_options(batch_size=8).batch_size
    8
    >>> served_options(max_seq_length=64)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: max_seq_length applies to a local model; the served model's export fixed it (`kbert export --max-seq-length`)
    """
    opts = resolve_options(options, overrides)  # checks batch_size: one line
    if opts.max_seq_length is not None:
        raise KbertError(
            f"{option('max_seq_length')} applies to a local model; the served model's export fixed it "
            f"(`kbert export --max-seq-length`)"
        )
    return opts


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
    opts = served_options(options, **overrides)
    check_start(start)
    # The file's layout depends on the served model's task, which the server tells; a missing or
    # empty file is wrong whatever the task, so say so (at the call) before asking a server that may be down.
    require_path(input_path, "input file", f"pass {option('input_path', flag='--input')} with the file to predict on")
    if os.path.getsize(input_path) == 0:
        raise KbertError(f"{input_path}: the file is empty; pass a file with one example per row")
    return _predict_served(client, input_path, opts, start)


def _predict_served(client, input_path, opts, start) -> Iterator[dict]:
    # A generator: the server is first asked at the first row, as the file is read.
    signatures = client.metadata()
    yield from served_rows(served_task(signatures), client, signatures, input_path, options=opts, start=start)


def _served_reader() -> str:
    """What reads a served model's answers: the command the user ran, or the function called."""
    return "kbert predict --server" if on_command_line() else "predict_served"
