"""`kbert predict` and `kbert evaluate`: a model's predictions and metrics on a file, locally
(`predict`, `evaluate`) or from a model TF Serving serves (`predict_served`).

Both ways read the file with the task's reader and print the task's JSON
(`kbert.finetuning.tasks`), so local and server prediction print the same lines for the same
model. An encoder or pretrained model gives extract_features.py's features instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Iterator

import keras

from kbert.config import sequence_length
from kbert.errors import KbertError, listing
from kbert.finetuning import encoding, readers
from kbert.finetuning.options import FinetuneOptions, resolve_options
from kbert.finetuning.tasks import TASKS, get_task, json_floats, predict_outputs, row_batches, served_texts_b
from kbert.model.bert import BertEncoder
from kbert.files import require_path
from kbert.model_dir import model_kind, open_model
from kbert.serving.client import Client
from kbert.text.tokenizer import Tokenizer

log = logging.getLogger("kbert")


def _prepare(model_dir, options, overrides):
    """(model, task or None, options, tokenizer, sequence length) for a saved model."""
    opts = resolve_options(options, overrides)  # checks batch_size, max_seq_length, ...: one line each
    model = open_model(model_dir)
    info = getattr(model, "task_info", None) or {}
    # SQuAD windows as at fine-tuning time (stride, question length), recorded in the model dir.
    opts = dataclasses.replace(opts, **{k: info[k] for k in ("doc_stride", "max_query_length") if k in info})
    task = get_task(info["task"]) if info.get("task") else None
    length = sequence_length(opts.max_seq_length, model.config.max_position_embeddings, info.get("max_seq_length"))
    return model, task, opts, Tokenizer(model.vocab_file, do_lower_case=model.do_lower_case), length


def _read(task, path, tokenizer, length, labels, opts, require_labels):
    data = task.read(path, tokenizer, length, labels, opts, require_labels, False)
    if data.truncated:
        log.warning("%s: %d of %d examples were truncated", path, data.truncated, data.size)
    return data


def evaluate(model_dir, input_path, options: FinetuneOptions | None = None, **overrides) -> dict:
    """The task's metrics of the fine-tuned model in `model_dir` on a labelled file.

    Example:
    >>> evaluate("out/mrpc", "dev.tsv")  # doctest: +SKIP
    {'accuracy': 0.84, 'macro_f1': 0.81, 'mcc': 0.63, 'examples': 408}
    """
    model, task, opts, tokenizer, length = _prepare(model_dir, options, overrides)
    if task is None:
        raise KbertError(f"{model_dir} is a{'n' if model_kind(model) == 'encoder' else ''} {model_kind(model)}, "
                         f"which has no task to score; evaluate a model with a task head (written by kbert "
                         f"finetune, or by kbert.save)")
    labels = model.task_info.get("labels")
    data = _read(task, input_path, tokenizer, length, labels, opts, require_labels=True)
    if data.size == 0:
        raise KbertError(f"{input_path} has no usable rows to evaluate")
    result = task.score(data, predict_outputs(model, data, opts.batch_size), opts, model.do_lower_case)
    result["examples"] = len(data.raw) if task.name == "squad" else data.size
    return json_floats({k: v for k, v in result.items() if not isinstance(v, dict)})


def predict(model_dir, input_path, layers: list[int] | None = None, options: FinetuneOptions | None = None,
            **overrides) -> Iterator[dict]:
    """One JSON-ready dict per input example (see `kbert predict --help`).

    Fine-tuned models give their task's predictions; encoders and pretrained models give
    features (`layers`: per-token values of those layers, as extract_features.py).

    Example:
    >>> next(predict("out/sentiment", "test.tsv"))  # doctest: +SKIP
    {'label': 'pos', 'probabilities': {'neg': 0.031, 'pos': 0.969}}
    """
    # Checked and loaded now, not at the first row: a bad option or path fails at the call.
    model, task, opts, tokenizer, length = _prepare(model_dir, options, overrides)
    if task is None:
        return features(model, input_path, tokenizer, length, layers, opts.batch_size)
    return _task_rows(model, task, input_path, tokenizer, length, opts)


def _task_rows(model, task, input_path, tokenizer, length, opts) -> Iterator[dict]:
    data = _read(task, input_path, tokenizer, length, model.task_info.get("labels"), opts, require_labels=False)
    yield from task.rows(data, predict_outputs(model, data, opts.batch_size), opts, model.do_lower_case)


def features(model, input_path, tokenizer, max_seq_length, layers=None, batch_size=32) -> Iterator[dict]:
    """extract_features.py's output for an encoder or pretrained model: the pooled embedding
    (`{"pooled_output": [...]}`), or with `layers` the per-token values of those layers (-1 = last)."""
    resolve_options(None, {"batch_size": batch_size, "max_seq_length": max_seq_length})  # one-line checks
    return _features(model, input_path, tokenizer, max_seq_length, layers, batch_size)


def _features(model, input_path, tokenizer, max_seq_length, layers, batch_size) -> Iterator[dict]:
    texts, texts_b = readers.read_lines(input_path)
    inputs, truncated = encoding.encode_texts(tokenizer, texts, texts_b, max_seq_length)
    if truncated:
        log.warning("%s: %d of %d lines were truncated to --max-seq-length %d", input_path, truncated,
                    len(texts), max_seq_length)
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    if not layers:
        pooled = keras.Model(encoder.input, encoder.output["pooled_output"]).predict(
            inputs, batch_size=batch_size, verbose=0)
        for row in pooled:
            yield pooled_row(row)
        return
    n = len(encoder.transformer_layers)
    for index in layers:
        if not -n <= index < n:
            raise KbertError(f"--layers {index}: the model has {n} layers; use -{n}..{n - 1} (-1 = last)")
    outputs = [encoder.transformer_layers[i].output for i in layers]
    values = keras.Model(encoder.input, outputs).predict(inputs, batch_size=batch_size, verbose=0)
    values = values if isinstance(values, list) else [values]
    ids = inputs["input_ids"]
    for row in range(len(texts)):
        length = int(inputs["input_mask"][row].sum())
        tokens = tokenizer.convert_ids_to_tokens(ids[row, :length].tolist())
        yield {"linex_index": row, "features": [
            {"token": token, "layers": [{"index": index, "values": [round(float(v), 6) for v in values[k][row, t]]}
                                        for k, index in enumerate(layers)]}
            for t, token in enumerate(tokens)]}


def pooled_row(values) -> dict:
    """An encoder's JSON for one text: its pooled output.

    >>> pooled_row([0.5, -0.25])
    {'pooled_output': [0.5, -0.25]}
    """
    return {"pooled_output": [round(float(v), 6) for v in values]}


def served_task(signatures: dict) -> str | None:
    """The task of a model kbert export wrote, from its signatures (None for an encoder).

    >>> served_task({"serving_default": {"inputs": {"text": {}, "endings": {}}, "outputs": {}}})
    'choice'
    """
    for task in TASKS.values():
        if task.served_by is not None and task.served_by(signatures):
            return task.name
    outputs = set(signatures.get("serving_default", {}).get("outputs", {}))
    if "pooled_output" in outputs:
        return None
    raise KbertError(f"the served model's serving_default has outputs {listing(outputs) or 'none'}; kbert "
                     f"predict --server reads what kbert export writes (the tasks "
                     f"{', '.join(n for n, t in TASKS.items() if t.served_by)} and encoders): use Client.predict "
                     f"for other models")


def predict_served(client: Client, input_path, options: FinetuneOptions | None = None, start: int = 0,
                   **overrides) -> Iterator[dict]:
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
    return _served_rows(client, input_path, opts, start)


def _served_rows(client, input_path, opts, start) -> Iterator[dict]:
    signatures = client.metadata()
    task = served_task(signatures)
    if task is not None:
        yield from get_task(task).served_rows(client, signatures, input_path, opts, start)
        return
    texts, texts_b = readers.read_lines(input_path)
    texts_b = served_texts_b(input_path, texts_b, signatures, client)
    for first, stop in row_batches(len(texts), opts.batch_size, start):
        out = client.predict_text(texts[first:stop], texts_b[first:stop] if texts_b is not None else None)
        for row in out["pooled_output"]:
            yield pooled_row(row)
