"""`kbert predict` and `kbert evaluate`: a model's predictions and metrics on a file.

The file is read with the task's reader and printed as the task's JSON
(`kbert.finetuning.tasks`); an encoder or pretrained model gives extract_features.py's
features instead, and a sentence-embedding model (one with an embedding record, as `kbert
finetune --task embed` and `kbert convert from-hf` of a sentence-transformers model write) its
sentence vectors, the numbers `kbert embed` writes; `evaluate` ranks a pairs file with it.
`kbert predict --server` prints the same lines from a model TF Serving serves (`predict_served` in
serving/predict.py, which builds on this module).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterator

import keras
import numpy as np

from kbert.config import sequence_length
from kbert.finetuning import encoding, readers
from kbert.finetuning.embedding import Embedder, json_vector, one_text_per_row
from kbert.finetuning.options import FinetuneOptions, resolve_options
from kbert.finetuning.rerank_files import CandidateLists, read_candidate_lists
from kbert.finetuning.rows import check_start, stream_rows
from kbert.finetuning.tasks import TASKS, get_task
from kbert.finetuning.tasks.base import json_floats, windows_summary
from kbert.formats.model_dir import model_kind
from kbert.formats.sources import open_model
from kbert.model.embedding_record import embedding_of
from kbert.model.families import encoder_of, make_packer
from kbert.runtime.errors import KbertError, option
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
    return model, task, opts, make_packer(model, length)


def evaluate(
    model_dir, input_path, options: FinetuneOptions | None = None, *, task: str | None = None, **overrides
) -> dict:
    """The task's metrics of the fine-tuned model in `model_dir` on a labelled file.

    A sentence-embedding model (or, with `task="embed"`, any model without a task head, pooled
    as `pooling` says) is scored on a pairs file: each distinct query ranked against every
    distinct document of the file (`kbert.finetuning.ranking`), giving recall@1, recall@10,
    mrr@10 and ndcg@10.

    Example:
    >>> evaluate("out/mrpc", "dev.tsv")  # doctest: +SKIP
    {'accuracy': 0.84, 'macro_f1': 0.81, 'mcc': 0.63, 'examples': 408}
    >>> evaluate("out/minilm", "pairs.tsv")  # doctest: +SKIP
    {'recall@1': 0.62, 'recall@10': 0.93, 'mrr@10': 0.72, 'ndcg@10': 0.77, 'queries': 500, 'documents': 500, ...}
    """
    model, model_task, opts, preprocessor = _prepare(model_dir, options, overrides)
    task = _scored_task(model_dir, model, model_task, task)
    if task is None or not task.embeds:  # an embedding model's ranking takes a pooling; a task head's, none
        if opts.pooling is not None:
            raise KbertError(
                f"{option('pooling')} applies to embedding models (and {option('task', 'embed')}); {model_dir} is "
                f"fine-tuned for {task.name if task else 'no task'}: drop it"
            )
        if task is None:
            raise KbertError(
                f"{model_dir} is a{'n' if model_kind(model) == 'encoder' else ''} {model_kind(model)}, "
                f"which has no task to score; evaluate a model with a task head (written by kbert "
                f"finetune, or by kbert.save)"
            )
    packer = functools.partial(make_packer, model)
    result = task.evaluate(
        model, input_path, opts, preprocessor=preprocessor, packer=packer, where=os.fspath(model_dir)
    )
    return json_floats({k: v for k, v in result.items() if not isinstance(v, dict)})


def _scored_task(model_dir, model, model_task, task: str | None):
    """The task `evaluate` scores: the model's; or embed, for a model with an embedding record or
    when asked of a model without a task head."""
    if task is None:
        if model_task is None and embedding_of(model) is not None:
            return next(task for task in TASKS.values() if task.embeds)
        return model_task
    wanted = get_task(task)
    if model_task is not None and model_task.name != wanted.name:
        raise KbertError(
            f"{model_dir} is fine-tuned for {model_task.name}, not {wanted.name}: drop {option('task', task)}"
        )
    if model_task is None and not wanted.embeds:
        raise KbertError(
            f"{option('task', task)}: {model_dir} has no {task} head to score; a model without a task head is scored "
            f"as an embedding model only ({option('task', 'embed')})"
        )
    return wanted


def predict(
    model_dir,
    input_path,
    layers: list[int] | None = None,
    options: FinetuneOptions | None = None,
    start: int = 0,
    **overrides,
) -> Iterator[dict]:
    """One JSON-ready dict per input example (see `kbert predict --help`), a batch at a time.

    Fine-tuned models give their task's predictions; encoders and pretrained models give
    features (`layers`: per-token values of those layers, as extract_features.py). The file is
    read once; each batch of `batch_size` examples (documents, with `--long-text windows`) is
    then tokenized, run and yielded before the next, so memory holds one batch's outputs and a
    consumer (`kbert predict --output`) keeps every finished row.

    Args:
        model_dir: str or PathLike. Any model source `kbert predict` opens.
        input_path: str or PathLike. The file, in the task's format.
        layers: list of int, a comma-separated string of them ("-1,-2"), or None. Encoders: the
            layers whose per-token values to give (-1 = last).
        options: `FinetuneOptions` (batch_size, max_seq_length, format, skip_bad_rows);
            keyword arguments override single fields.
        start: int. The first example to predict: the ones before it are read, not run (a
            resumed `kbert predict --output` starts after the rows it has).

    Example:
    >>> next(predict("out/sentiment", "test.tsv"))  # doctest: +SKIP
    {'label': 'pos', 'probabilities': {'neg': 0.031, 'pos': 0.969}}
    """
    # Checked and loaded now, not at the first row: a bad option or path fails at the call.
    check_start(start)
    layers = layer_indexes(layers)
    model, task, opts, preprocessor = _prepare(model_dir, options, overrides)
    tally = _Tally()
    if layers and task is not None and not task.embeds:  # a task's head answers; the layers would go unread
        raise KbertError(
            f"{option('layers')} applies to encoders and pretrained models (per-token features); "
            f"{os.fspath(model_dir)} is fine-tuned for {task.name}: drop {option('layers')}"
        )
    if task is not None and task.embeds:  # an embedding model: its vectors, or with `layers` per-token features
        task = None
    if task is None and not layers and embedding_of(model) is not None:
        examples = readers.read_feature_texts(input_path, format=opts.format, skip_bad_rows=opts.skip_bad_rows)
        readers.report_skipped(input_path, examples)
        examples = one_text_per_row(input_path, examples, "an embedding model")
        embedder = Embedder(
            model, max_seq_length=opts.max_seq_length, batch_size=opts.batch_size, where=os.fspath(model_dir)
        )
        preprocessor = embedder.preprocessor
        answer = _embedding_answers(embedder, tally)
    elif task is None:
        examples = readers.read_feature_texts(input_path, format=opts.format, skip_bad_rows=opts.skip_bad_rows)
        readers.report_skipped(input_path, examples)
        answer = _feature_answers(model, preprocessor, layers, tally, opts.batch_size)
    else:
        examples = task.read_examples(input_path, options=opts, require_labels=False, training=False)
        answer = _task_answers(model, task, input_path, preprocessor, opts, tally)
    rows = stream_rows(examples, answer, _chunk(opts.batch_size, layers), start, with_lines=opts.skip_bad_rows)
    return tally.report_after(rows, input_path, preprocessor, opts)


def rerank(
    model_or_path, query: str, documents, *, top_k: int | None = None, batch_size: int = 32, max_seq_length=None
) -> dict:
    """A query's documents scored by a reranker and ordered: `{"scores": [...], "ranking": [...]}`,
    the scores in the documents' order, the ranking their indexes best first (the first `top_k`).

    Args:
        model_or_path: a reranker (fine-tuned with `--task rerank`, or a sentence-transformers
            CrossEncoder, converted or its folder), as a kbert model or any source kbert reads.
        query: str.
        documents: list of str.
        top_k: int or None. The indexes the ranking keeps (None: every document's).
        batch_size: int. Pairs per run of the model.
        max_seq_length: int. Tokens per pair; default the model's.

    Example:
    >>> kbert.rerank("out/reranker", "how to make tea", ["Call the vet.", "Put the kettle on."])  # doctest: +SKIP
    {'scores': [0.003, 0.981], 'ranking': [1, 0]}
    """
    opts = resolve_options(None, {"batch_size": batch_size, "max_seq_length": max_seq_length})
    check_top_k(top_k)
    model = model_or_path if isinstance(model_or_path, keras.Model) else open_model(model_or_path)
    task = _reranking_task(model, "the model" if isinstance(model_or_path, keras.Model) else model_or_path)
    if isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
        raise KbertError("documents: give a list of str, the texts to rerank")
    if not documents:
        return {"scores": [], "ranking": []}
    length = sequence_length(
        max_seq_length, model.config.max_position_embeddings, model.task_info.get("max_seq_length")
    )
    examples = CandidateLists([query], [list(documents)], None, skipped_rows=[], replaced_bytes=0, lines=[1])
    data = task.encode(
        examples,
        path="documents",
        preprocessor=make_packer(model, length),
        labels=None,
        options=opts,
        require_labels=False,
        training=False,
    )
    outputs = task.outputs(model, data, batch_size, run=predict_batches)
    row = next(iter(task.rows(data, outputs, options=opts, do_lower_case=None)))
    return {**row, "ranking": row["ranking"][:top_k]}


def rerank_file(
    model_dir,
    input_path,
    top_k: int | None = None,
    options: FinetuneOptions | None = None,
    start: int = 0,
    *,
    candidates_from=None,
    corpus=None,
    k: int | None = None,
    **overrides,
) -> Iterator[dict]:
    """What `kbert rerank` prints: for each line of a JSON Lines file, `{"query": ...,
    "documents": [...]}`, the answer `rerank` gives, a batch of queries at a time.

    Args:
        model_dir: str or PathLike. A reranker (see `rerank`).
        input_path: str or PathLike. The candidate lists.
        top_k: int or None. The indexes each ranking keeps (None: every document's).
        options: `FinetuneOptions` (batch_size: pairs per run of the model; max_seq_length;
            skip_bad_rows); keyword arguments override single fields.
        start: int. The first query to answer (a resumed `kbert rerank --output`).
        candidates_from: str or PathLike, or None. A sentence-embedding model that finds each
            query's candidates in `corpus` first (the rows then need only "query"); each answer
            then starts with "candidates", the corpus texts' indexes in its order.
        corpus: str or PathLike. The documents `candidates_from` searches: one per line (blank
            lines skipped), or a table's text column, as `kbert embed` reads texts.
        k: int. The candidates it finds per query (default 100).

    Example:
    >>> next(rerank_file("out/reranker", "candidates.jsonl", top_k=3))  # doctest: +SKIP
    {'scores': [0.02, 0.97, 0.41, 0.003], 'ranking': [1, 2, 0]}
    """
    check_start(start)
    check_top_k(top_k)
    model, task, opts, preprocessor = _prepare(model_dir, options, overrides)
    task = _reranking_task(model, model_dir)
    if (candidates_from is None) != (corpus is None):
        raise KbertError(
            f"{option('candidates_from')} and {option('corpus')} go together: a first-stage model and the documents "
            f"it searches"
        )
    if candidates_from is None and k is not None:
        raise KbertError(
            f"{option('k', k)} is how many candidates {option('candidates_from')} finds; add it, or drop it"
        )
    if candidates_from is not None:
        examples, found = _first_stage_candidates(input_path, candidates_from, corpus, k or FIRST_STAGE_K, opts)
    else:
        examples = task.read_examples(input_path, options=opts, require_labels=False, training=False)
    if not isinstance(examples, CandidateLists):
        raise KbertError(
            f'{os.fspath(input_path)}: kbert rerank reads JSON Lines of {{"query": ..., "documents": [...]}}, '
            f"one query per line"
        )
    tally = _Tally()
    answer = _task_answers(model, task, input_path, preprocessor, opts, tally)
    if candidates_from is not None:
        answer = _with_candidates(answer, found)
    rows = stream_rows(examples, answer, _chunk(opts.batch_size), start, with_lines=opts.skip_bad_rows)
    return (
        {**row, "ranking": row["ranking"][:top_k]} for row in tally.report_after(rows, input_path, preprocessor, opts)
    )


# The candidates `rerank_file`'s first stage finds per query unless told otherwise.
FIRST_STAGE_K = 100


def _first_stage_candidates(input_path, candidates_from, corpus, k, opts) -> tuple[CandidateLists, list]:
    """The input's queries, each with its `k` nearest corpus texts by the embedding model: (the
    candidate lists, each list's corpus indexes)."""
    from kbert.finetuning import first_stage
    from kbert.finetuning.embedding import read_texts

    check_top_k(k, "k")
    queries = read_candidate_lists(input_path, skip_bad_rows=opts.skip_bad_rows, queries_only=True)
    readers.report_skipped(input_path, queries)
    model = first_stage.open_embedding_model(candidates_from, "candidates_from")
    texts = read_texts(corpus)
    found = first_stage.candidates(model, queries.queries, texts, k, opts.batch_size).tolist()
    return dataclasses.replace(queries, documents=[[texts[i] for i in row] for row in found]), found


def _with_candidates(answer, candidates):
    """Each row of `answer` led by its query's candidates (their corpus indexes)."""

    def with_candidates(part, first):
        rows = answer(part, first)
        return [{"candidates": candidates[first + i], **row} for i, row in enumerate(rows)]

    return with_candidates


def check_top_k(top_k, name: str = "top_k"):
    """`top_k` is None or a whole number of documents, 1 or more.

    >>> check_top_k(0)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: top_k=0: give a number of documents, 1 or more
    """
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise KbertError(f"{option(name, top_k)}: give a number of documents, 1 or more")


def _reranking_task(model, where):
    """The reranking task of a reranker; a one-line error for any other model."""
    info = getattr(model, "task_info", None) or {}
    task = get_task(info["task"]) if info.get("task") else None
    if task is None or not task.reranks:
        raise KbertError(
            f"{os.fspath(where)} is {'fine-tuned for ' + task.name if task else 'not fine-tuned'}, not a "
            f"reranker; give a model fine-tuned with {option('task', 'rerank', command='finetune')} or a "
            f"sentence-transformers CrossEncoder"
        )
    return task


def layer_indexes(layers) -> list[int] | None:
    """`predict`'s `layers` as a list of layer indexes: given as one, or as `kbert predict --layers`
    takes them, comma-separated; None for none.

    >>> layer_indexes("-1,-2"), layer_indexes([0, 1]), layer_indexes("")
    ([-1, -2], [0, 1], None)
    >>> layer_indexes("last")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: layers='last': give comma-separated layer indexes, e.g. -1,-2
    """
    if not layers:
        return None
    if not isinstance(layers, str):
        return list(layers)
    try:
        return [int(x) for x in layers.split(",")]
    except ValueError:
        raise KbertError(f"{option('layers', layers)}: give comma-separated layer indexes, e.g. -1,-2") from None


# Examples tokenized, run and written together: a few batches, as tokenizing costs about as much
# for one batch as for several, and a kill loses at most one chunk's work. Per-token features
# (`layers`) are large, so they go a batch at a time.
_CHUNK_EXAMPLES = 256


def _chunk(batch_size: int, layers=None) -> int:
    return batch_size if layers else max(batch_size, _CHUNK_EXAMPLES)


@dataclasses.dataclass
class _Tally:
    """What a file's batches had in common to report, once, when the last is done."""

    packed: int = 0  # what truncation counts (`TaskData.packed`)
    what: str = "examples"
    truncated: int = 0
    windows: list = dataclasses.field(default_factory=list)  # each batch's document window counts

    def add(self, data):
        count, self.what = data.packed()
        self.packed += count
        self.truncated += data.truncated
        if data.windows is not None:
            self.windows.append(data.windows.counts)

    def report_after(self, rows, path, preprocessor, opts) -> Iterator[dict]:
        yield from rows
        encoding.log_truncated(path, self.truncated, self.packed, preprocessor.sequence_length, what=self.what)
        if self.windows:
            summary = windows_summary(path, np.concatenate(self.windows), preprocessor.sequence_length - 2)
            log.info("%s", summary)


def predict_batches(model, features: dict, batch_size: int) -> dict:
    """A model's outputs over `features` (numpy, float32), `batch_size` rows per call: a dict
    by output name ("output" for a model of one unnamed output; "output_0", ... for several)."""
    n = len(next(iter(features.values())))
    parts = []
    for first in range(0, n, batch_size):
        outputs = model.predict_on_batch({k: v[first : first + batch_size] for k, v in features.items()})
        if isinstance(outputs, (list, tuple)):  # a model of several unnamed outputs: output_0, output_1, ...
            outputs = {f"output_{k}": v for k, v in enumerate(outputs)}
        outputs = outputs if isinstance(outputs, dict) else {"output": outputs}
        parts.append({k: np.asarray(v, dtype=np.float32) for k, v in outputs.items()})
    if not parts:
        return {}
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}


def _task_answers(model, task, input_path, preprocessor, opts, tally):
    labels = model.task_info.get("labels")

    def answer(part, first):
        data = task.encode(
            part,
            path=input_path,
            preprocessor=preprocessor,
            labels=labels,
            options=opts,
            require_labels=False,
            training=False,
        )
        tally.add(data)
        outputs = task.outputs(model, data, opts.batch_size, run=predict_batches)
        return list(task.rows(data, outputs, options=opts, do_lower_case=model.do_lower_case))

    return answer


def features(model, input_path, max_seq_length, layers=None, batch_size=32) -> Iterator[dict]:
    """extract_features.py's output for an encoder or pretrained model: the pooled embedding
    (`{"pooled_output": [...]}`), or with `layers` the per-token values of those layers (-1 = last)."""
    resolve_options(None, {"batch_size": batch_size, "max_seq_length": max_seq_length})  # one-line checks
    preprocessor = make_packer(model, max_seq_length)
    examples = readers.read_feature_texts(input_path)
    tally = _Tally()
    rows = stream_rows(
        examples, _feature_answers(model, preprocessor, layers, tally, batch_size), _chunk(batch_size, layers)
    )
    return tally.report_after(rows, input_path, preprocessor, None)


def _feature_answers(model, preprocessor, layers, tally, batch_size):
    encoder = encoder_of(model)
    if not hasattr(encoder, "transformer_layers"):  # a ModernBERT: no pooler, no per-layer outputs here
        raise KbertError(
            f"a {type(encoder).__name__} has no pooled output and gives no per-layer features; for one "
            f"vector per text use kbert embed with {option('pooling')} cls or mean"
        )
    if layers:
        n = len(encoder.transformer_layers)
        for index in layers:
            if not -n <= index < n:
                raise KbertError(f"{option('layers')} {index}: the model has {n} layers; use -{n}..{n - 1} (-1 = last)")
        outputs = [encoder.transformer_layers[i].output for i in layers]
    else:
        outputs = encoder.output["pooled_output"]
    extractor = keras.Model(encoder.input, outputs)
    tokenizer = Tokenizer(preprocessor.vocab_file, preprocessor.do_lower_case)

    def answer(part, first):
        inputs, truncated = encoding.encode_texts(preprocessor, part.texts, part.texts_b)
        tally.packed += len(part.texts)
        tally.truncated += truncated
        values = predict_batches(extractor, inputs, batch_size)
        if not layers:
            return [pooled_row(row) for row in values["output"]]
        values = [values["output"]] if len(values) == 1 else [values[f"output_{k}"] for k in range(len(layers))]
        return [_token_features(inputs, values, layers, tokenizer, row, first) for row in range(len(part.texts))]

    return answer


def _embedding_answers(embedder, tally):
    def answer(part, first):
        truncated = embedder.truncated
        vectors = embedder(part.texts)
        tally.packed += len(part.texts)
        tally.truncated += embedder.truncated - truncated
        return [{"embedding": json_vector(vector)} for vector in vectors]

    return answer


def _token_features(inputs, values, layers, tokenizer, row, first) -> dict:
    length = int(inputs["input_mask"][row].sum())
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][row, :length].tolist())
    return {
        "linex_index": first + row,  # the example's index in the file, as extract_features.py's unique_id
        "features": [
            {
                "token": token,
                "layers": [
                    {"index": index, "values": [round(float(v), 6) for v in np.asarray(values[k])[row, t]]}
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
