"""`kbert predict` and `kbert evaluate`: a model's predictions and metrics on a file.

The file is read with the task's reader and printed as the task's JSON
(`kbert.finetuning.tasks`); an encoder or pretrained model gives extract_features.py's
features instead. `kbert predict --server` prints the same lines from a model TF Serving
serves (`predict_served` in serving/predict.py, which builds on this module).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import keras

from kbert.config import sequence_length
from kbert.errors import KbertError
from kbert.finetuning import encoding, readers
from kbert.finetuning.options import FinetuneOptions, resolve_options
from kbert.finetuning.tasks import get_task, json_floats, predict_outputs
from kbert.model.bert import encoder_of
from kbert.model_dir import model_kind, open_model
from kbert.text.preprocessing import BertPreprocessor
from kbert.text.tokenizer import Tokenizer

log = logging.getLogger("kbert")


def _prepare(model_dir, options, overrides):
    """(model, task or None, options, preprocessor) for a saved model; the preprocessor packs
    to the model's sequence length."""
    opts = resolve_options(options, overrides)  # checks batch_size, max_seq_length, ...: one line each
    model = open_model(model_dir)
    info = getattr(model, "task_info", None) or {}
    # Windows as at fine-tuning time, recorded in the model dir: SQuAD's (stride, question length),
    # and --long-text windows' (absent: truncate) for classify, regress and tag.
    recorded = {k: info[k] for k in ("long_text", "doc_stride", "max_query_length") if k in info}
    opts = dataclasses.replace(opts, **recorded)
    task = get_task(info["task"]) if info.get("task") else None
    length = sequence_length(opts.max_seq_length, model.config.max_position_embeddings, info.get("max_seq_length"))
    return model, task, opts, BertPreprocessor(model.vocab_file, model.do_lower_case, length)


def _read(task, path, preprocessor, labels, opts, require_labels):
    data = task.read(
        path,
        preprocessor=preprocessor,
        labels=labels,
        options=opts,
        require_labels=require_labels,
        training=False,
    )
    if data.truncated:
        log.warning("%s: %d of %d examples were truncated", path, data.truncated, data.size)
    return data


def evaluate(model_dir, input_path, options: FinetuneOptions | None = None, **overrides) -> dict:
    """The task's metrics of the fine-tuned model in `model_dir` on a labelled file.

    Example:
    >>> evaluate("out/mrpc", "dev.tsv")  # doctest: +SKIP
    {'accuracy': 0.84, 'macro_f1': 0.81, 'mcc': 0.63, 'examples': 408}
    """
    model, task, opts, preprocessor = _prepare(model_dir, options, overrides)
    if task is None:
        raise KbertError(
            f"{model_dir} is a{'n' if model_kind(model) == 'encoder' else ''} {model_kind(model)}, "
            f"which has no task to score; evaluate a model with a task head (written by kbert "
            f"finetune, or by kbert.save)"
        )
    labels = model.task_info.get("labels")
    data = _read(task, input_path, preprocessor, labels, opts, require_labels=True)
    if data.size == 0:
        raise KbertError(f"{input_path} has no usable rows to evaluate")
    result = task.score(
        data, predict_outputs(model, data, opts.batch_size), options=opts, do_lower_case=model.do_lower_case
    )
    result["examples"] = len(data.raw) if task.name == "squad" else data.documents  # documents, not windows
    return json_floats({k: v for k, v in result.items() if not isinstance(v, dict)})


def predict(
    model_dir, input_path, layers: list[int] | None = None, options: FinetuneOptions | None = None, **overrides
) -> Iterator[dict]:
    """One JSON-ready dict per input example (see `kbert predict --help`).

    Fine-tuned models give their task's predictions; encoders and pretrained models give
    features (`layers`: per-token values of those layers, as extract_features.py).

    Example:
    >>> next(predict("out/sentiment", "test.tsv"))  # doctest: +SKIP
    {'label': 'pos', 'probabilities': {'neg': 0.031, 'pos': 0.969}}
    """
    # Checked and loaded now, not at the first row: a bad option or path fails at the call.
    model, task, opts, preprocessor = _prepare(model_dir, options, overrides)
    if task is None:
        return _features(model, input_path, preprocessor, layers, opts.batch_size)
    return _task_rows(model, task, input_path, preprocessor, opts)


def _task_rows(model, task, input_path, preprocessor, opts) -> Iterator[dict]:
    data = _read(task, input_path, preprocessor, model.task_info.get("labels"), opts, require_labels=False)
    yield from task.rows(
        data, predict_outputs(model, data, opts.batch_size), options=opts, do_lower_case=model.do_lower_case
    )


def features(model, input_path, max_seq_length, layers=None, batch_size=32) -> Iterator[dict]:
    """extract_features.py's output for an encoder or pretrained model: the pooled embedding
    (`{"pooled_output": [...]}`), or with `layers` the per-token values of those layers (-1 = last)."""
    resolve_options(None, {"batch_size": batch_size, "max_seq_length": max_seq_length})  # one-line checks
    preprocessor = BertPreprocessor(model.vocab_file, model.do_lower_case, max_seq_length)
    return _features(model, input_path, preprocessor, layers, batch_size)


def _features(model, input_path, preprocessor, layers, batch_size) -> Iterator[dict]:
    texts, texts_b = readers.read_lines(input_path)
    inputs, truncated = encoding.encode_texts(preprocessor, texts, texts_b)
    if truncated:
        log.warning(
            "%s: %d of %d lines were truncated to --max-seq-length %d",
            input_path,
            truncated,
            len(texts),
            preprocessor.sequence_length,
        )
    encoder = encoder_of(model)
    if not layers:
        pooled = keras.Model(encoder.input, encoder.output["pooled_output"]).predict(
            inputs, batch_size=batch_size, verbose=0
        )
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
    ids, tokenizer = inputs["input_ids"], Tokenizer(preprocessor.vocab_file, preprocessor.do_lower_case)
    for row in range(len(texts)):
        length = int(inputs["input_mask"][row].sum())
        tokens = tokenizer.convert_ids_to_tokens(ids[row, :length].tolist())
        yield {
            "linex_index": row,
            "features": [
                {
                    "token": token,
                    "layers": [
                        {"index": index, "values": [round(float(v), 6) for v in values[k][row, t]]}
                        for k, index in enumerate(layers)
                    ],
                }
                for t, token in enumerate(tokens)
            ],
        }


def pooled_row(values) -> dict:
    """An encoder's JSON for one text: its pooled output.

    >>> pooled_row([0.5, -0.25])
    {'pooled_output': [0.5, -0.25]}
    """
    return {"pooled_output": [round(float(v), 6) for v in values]}
