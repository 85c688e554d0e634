"""One record per fine-tuning task: what `finetune`, `predict` and `evaluate` need to know about
it, in one place.

A `Task` holds plain functions, called with keyword arguments: how to read a data file into
model inputs (`read`), the head to put on the encoder (`build`), the loss (`losses`), the dev
metric that picks the best epoch (`metric`, computed by `score`) and the JSON of each
prediction (`rows`). Adding a task means one new entry in `TASKS` plus its tests. What an
export serves for a task and how `kbert predict --server` reads the server's answers live in
serving/ (heads.py, predict.py), which builds on this module; the library does not import it.

The tasks:
- classify: run_classifier.py's model (dropout + [classes, H] on the pooled output);
- regress: the same with one output and squared error (STS-B);
- tag: one label per word on its first WordPiece (NER, POS);
- squad: run_squad.py's start/end span head, SQuAD v1.1 and v2.0;
- choice: multiple choice as the BERT paper ran SWAG (one score per [CLS], softmax over N endings).
- embed: sentence embeddings on (query, document) pairs, with in-batch negatives
  (kbert.finetuning.ranking); the output is an embedding model, scored by ranking.

classify, regress and tag also read documents longer than the window (`--long-text windows`):
the model runs on overlapping windows (`TaskData.windows` says whose each is), trains on each
window with its document's label (its words' tags), and `score` and `rows` answer once per
document: the mean of the windows' logits (classify, then the softmax) or values (regress),
each word's tag from the window where it has the most context (tag).

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
from collections.abc import Callable

import keras
import numpy as np

from kbert.config import DEFAULT_MAX_SEQ_LENGTH, BertConfig
from kbert.errors import KbertError, option
from kbert.finetuning import encoding, metrics, ranking, readers, squad, squad_decoding
from kbert.finetuning.options import SQUAD_DOC_STRIDE, FinetuneOptions, window_stride
from kbert.finetuning.windows import document_mean
from kbert.model import bert
from kbert.model_dir import EMBEDDING_KEY
from kbert.text.tokenizer import Tokenizer

log = logging.getLogger("kbert")


@dataclasses.dataclass
class TaskData:
    """One file, read and encoded for a task: model inputs, targets, and what scoring needs."""

    features: dict  # input name -> np.int32 array
    targets: dict | None  # output name -> np array, as model.fit takes them; None without labels
    labels: list | None  # the label names (classify, tag); None for the others
    size: int  # examples the model runs on (SQuAD and --long-text windows: windows)
    truncated: int = 0
    raw: object = None  # the examples as read (for scoring and printing)
    extra: object = None  # task-specific (tag: word starts, or each word's window and position; squad: features)
    windows: object = None  # --long-text windows: kbert.finetuning.windows.Windows, each row's document

    @property
    def documents(self) -> int:
        """The examples of the file (documents, however many windows they took)."""
        return self.size if self.windows is None else self.windows.num_documents


def _options_as_given(base, options, *, where):
    return options


def _the_model(model):
    return model


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything about one fine-tuning task. See the module docstring."""

    name: str
    # read_examples(path, *, options, require_labels, training) -> the file's examples
    # (kbert.finetuning.readers' TextExamples, TaggedExamples, ChoiceExamples; SQuAD's list of
    # questions): the rows as read, before any tokenizing, with `len` and `select(first, stop)`.
    read_examples: Callable
    # encode(examples, *, path, preprocessor, labels, options, require_labels, training) -> TaskData;
    # preprocessor: the BertPreprocessor that packs the text (its vocabulary, casing and sequence
    # length); labels: the names to score against (None: the file's, when training).
    encode: Callable
    build: Callable  # build(base_model, *, labels, task_info) -> the task's keras.Model, declaring task_info
    losses: Callable  # losses() -> (loss per output, loss weights or None), for model.compile
    metric: str  # the dev score that picks the best epoch; higher is better
    score: Callable  # score(data, outputs, *, options, do_lower_case) -> metrics dict
    rows: Callable  # rows(data, outputs, *, options, do_lower_case) -> one JSON-ready dict per example
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    windows: bool = False  # reads --long-text windows
    # settle(base, options, *, where) -> options: what the pretrained model decides of the
    # options (embed: the pooling and length it records, unless given).
    settle: Callable = _options_as_given
    # saved(model) -> the model the output directory holds (embed: the encoder, not the ranker).
    saved: Callable = _the_model

    def read(self, path, *, preprocessor, labels, options, require_labels, training) -> TaskData:
        """A whole file, read and encoded (training and scoring; prediction encodes a batch of
        examples at a time, `kbert.finetuning.predict`)."""
        examples = self.read_examples(path, options=options, require_labels=require_labels, training=training)
        data = self.encode(
            examples,
            path=path,
            preprocessor=preprocessor,
            labels=labels,
            options=options,
            require_labels=require_labels,
            training=training,
        )
        log_windows(path, data.windows, preprocessor, options)
        return data


def select_examples(examples, first: int, stop: int):
    """Examples `first` to `stop` of a file's (a readers' examples object, or SQuAD's list).

    >>> select_examples(["q1", "q2", "q3"], 1, 3)
    ['q2', 'q3']
    """
    return examples[first:stop] if isinstance(examples, list) else examples.select(first, stop)


def example_lines(examples) -> list | None:
    """The line each example starts on, or None where the file has no lines (SQuAD's JSON)."""
    return None if isinstance(examples, list) else examples.lines


def _softmax(logits):
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


def _check_known(path, found, labels):
    unseen = sorted(set(found) - set(labels))
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:10]) + (f" and {len(unseen) - 10} more" if len(unseen) > 10 else "")
        raise KbertError(
            f"{path} has labels the model was never trained on: {shown}; the model knows "
            f"{', '.join(repr(label) for label in labels)}"
        )


def json_floats(values: dict) -> dict:
    """Metrics as printed: floats (numpy's too) rounded to 6 digits, everything else as is.

    >>> json_floats({"accuracy": np.float32(0.8125), "examples": 64})
    {'accuracy': 0.8125, 'examples': 64}
    """
    return {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in values.items()}


# === classify and regress: run_classifier.py ===


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


def _refuse_pairs(path, examples, training):
    if examples.texts_b is None:
        return
    if training:
        raise KbertError(
            f"{path} holds sentence pairs (text_b), and {_option('long_text', 'windows')} reads one text per row: "
            f"join the two texts into the text column, or use {_option('long_text', 'truncate')}"
        )
    # A fine-tuned model reads as it was trained to: its windows are no option of predict's.
    raise KbertError(
        f"{path} holds sentence pairs (text_b), and this model reads one text per row (it was fine-tuned with "
        f"{_option('long_text', 'windows')}): join the two texts into the text column"
    )


def log_windows(path, windows, preprocessor, options):
    """Say how the file's documents became windows (nothing without `--long-text windows`)."""
    if windows is None:
        return
    longer = int((windows.counts > 1).sum())
    log.info(
        "%s: %d of %d documents longer than %d tokens became %d windows (stride %d); %d windows in all",
        path,
        longer,
        windows.num_documents,
        preprocessor.sequence_length - 2,
        int(windows.counts[windows.counts > 1].sum()),
        window_stride(options.doc_stride, preprocessor.sequence_length),
        len(windows.document),
    )


def _read_texts(task):
    def read_examples(path, *, options, require_labels, training):
        examples = readers.read_text_examples(
            path, task=task, format=options.format, skip_bad_rows=options.skip_bad_rows, require_labels=require_labels
        )
        readers.report_skipped(path, examples)
        return examples

    return read_examples


def _encode_texts(task):
    def encode(examples, *, path, preprocessor, labels, options, require_labels, training):
        windows = None
        if options.long_text == "windows":
            _refuse_pairs(path, examples, training)
            stride = window_stride(options.doc_stride, preprocessor.sequence_length)
            features, windows = encoding.encode_text_windows(preprocessor, examples.texts, stride)
            truncated = 0
        else:
            features, truncated = encoding.encode_texts(preprocessor, examples.texts, examples.texts_b)
        targets = None
        if examples.labels is not None:
            if task == "regress":
                targets = {"logits": np.asarray(examples.labels, dtype=np.float32)}
            else:
                if labels is None:  # training: the file's labels become the classes
                    _refuse_scores(path, examples.labels)
                labels = labels or sorted(set(examples.labels))
                if require_labels:
                    _check_known(path, examples.labels, labels)
                if set(examples.labels) <= set(labels):  # prediction: unknown labels are no reason to refuse
                    index = {label: i for i, label in enumerate(labels)}
                    targets = {"logits": np.asarray([index[label] for label in examples.labels], dtype=np.int32)}
        if windows is not None and targets is not None:  # each window trains on its document's label
            targets = {name: values[windows.document] for name, values in targets.items()}
        size = len(features["input_ids"])
        return TaskData(features, targets, labels, size, truncated, examples, windows=windows)

    return encode


def _document_gold(data: TaskData):
    """The labels (values) to score against: one per document."""
    gold = data.targets["logits"]
    return gold if data.windows is None else gold[data.windows.first_window]


def _document_logits(data: TaskData, outputs):
    """The model's logits (values) per document: the mean over its windows, with windows."""
    logits = outputs["logits"]
    return logits if data.windows is None else document_mean(logits, data.windows)


def _refuse_scores(path, labels):
    """Labels that are numbers with fractions (STS-B's 3.800) are scores, not classes: refuse
    to make a class of each value, and point at regress. Whole numbers (1..5 stars) are classes.

    >>> _refuse_scores("train.tsv", ["1", "5", "3"])
    >>> _refuse_scores("train.tsv", ["3.800", "0.500", "5.000"])
    Traceback (most recent call last):
    ...
    kbert.errors.KbertError: train.tsv: the labels are numbers with fractions (3 values from 0.5 to 5, e.g. '3.800'): task='classify' would make a class of each value; for a score per example use task='regress', for classes label each row with a name or a whole number
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
            f"{min(values):g} to {max(values):g}, e.g. {fractions[0]!r}): {_option('task', 'classify')} would make "
            f"a class of each value; for a score per example use {_option('task', 'regress')}, for classes label "
            f"each row with a name or a whole number"
        )


def _build_classifier(base, *, labels, task_info=None):
    return bert.bert_classifier(base, len(labels), task_info=task_info)


def _classify_score(data, outputs, *, options, do_lower_case):
    return metrics.classification_metrics(
        _document_gold(data).tolist(),
        _document_logits(data, outputs).argmax(-1).tolist(),
        label_names=list(range(len(data.labels))),
    )


def _classify_rows(data, outputs, *, options, do_lower_case):
    return (classify_row(data.labels, row) for row in _softmax(_document_logits(data, outputs)))


CLASSIFY = Task(
    name="classify",
    read_examples=_read_texts("classify"),
    encode=_encode_texts("classify"),
    build=_build_classifier,
    losses=lambda: ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, None),
    metric="accuracy",
    score=_classify_score,
    rows=_classify_rows,
    windows=True,
)


def _build_regressor(base, *, labels, task_info=None):
    return bert.bert_classifier(base, 1, task_info=task_info)


def _regress_score(data, outputs, *, options, do_lower_case):
    return metrics.regression_metrics(_document_gold(data).tolist(), _document_logits(data, outputs)[:, 0].tolist())


def _regress_rows(data, outputs, *, options, do_lower_case):
    return ({"prediction": round(float(v), 6)} for v in _document_logits(data, outputs)[:, 0])


REGRESS = Task(
    name="regress",
    read_examples=_read_texts("regress"),
    encode=_encode_texts("regress"),
    build=_build_regressor,
    losses=lambda: ({"logits": keras.losses.MeanSquaredError()}, None),
    metric="pearson",
    score=_regress_score,
    rows=_regress_rows,
    windows=True,
)


# === tag: one label per word, on its first WordPiece ===


def _read_tagged(path, *, options, require_labels, training):
    examples = readers.read_tagged_examples(path, skip_bad_rows=options.skip_bad_rows, require_labels=require_labels)
    readers.report_skipped(path, examples)
    return examples


def _encode_tagged(examples, *, path, preprocessor, labels, options, require_labels, training):
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


def fallback_tag(labels):
    """The tag of a word cut off by --max-seq-length: "O" where the tag set has it, else the first.

    >>> fallback_tag(["B-LOC", "O"]), fallback_tag(["B-LOC", "B-PER"])
    ('O', 'B-LOC')
    """
    return "O" if "O" in labels else labels[0]


def _word_tags(data: TaskData, outputs):
    """One predicted tag per word: the argmax at the word's first WordPiece (with windows, in
    the window where that piece has the most context)."""
    best, fallback = outputs["logits"].argmax(-1), fallback_tag(data.labels)
    if data.windows is not None:
        window, position = data.extra
        names = [data.labels[i] for i in best[window, position]]
        ends = np.cumsum([len(words) for words in data.raw.words])
        return [names[end - len(words) : end] for end, words in zip(ends, data.raw.words)]
    return [[data.labels[best[i, p]] if p >= 0 else fallback for p in starts] for i, starts in enumerate(data.extra)]


def _build_tagger(base, *, labels, task_info=None):
    return bert.bert_tagger(base, len(labels), task_info=task_info)


def _tag_score(data, outputs, *, options, do_lower_case):
    return metrics.tagging_metrics(data.raw.tags, _word_tags(data, outputs))


def _tag_rows(data, outputs, *, options, do_lower_case):
    return ({"words": words, "tags": tags} for words, tags in zip(data.raw.words, _word_tags(data, outputs)))


TAG = Task(
    name="tag",
    read_examples=_read_tagged,
    encode=_encode_tagged,
    build=_build_tagger,
    # -1 marks positions with no label: [CLS], [SEP], padding, and non-first WordPieces.
    losses=lambda: ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)}, None),
    metric="f1",
    score=_tag_score,
    rows=_tag_rows,
    windows=True,
)


# === squad: run_squad.py ===


def _read_squad(path, *, options, require_labels, training):
    examples = squad.read_squad(path, is_training=training)
    if not examples:
        raise KbertError(f"{path} holds no SQuAD questions; pass a SQuAD v1.1 or v2.0 JSON file")
    return examples


def _encode_squad(examples, *, path, preprocessor, labels, options, require_labels, training):
    # run_squad.py's windows stay in Python: they map answers between characters and pieces.
    tokenizer = Tokenizer(preprocessor.vocab_file, do_lower_case=preprocessor.do_lower_case)
    arrays, features = squad.squad_features(
        examples,
        tokenizer,
        preprocessor.sequence_length,
        options.doc_stride or SQUAD_DOC_STRIDE,
        options.max_query_length,
        is_training=training,
    )
    inputs = {k: arrays[k] for k in ("input_ids", "input_mask", "segment_ids")}
    targets = {"start_logits": arrays["start_positions"], "end_logits": arrays["end_positions"]} if training else None
    return TaskData(inputs, targets, None, len(features), 0, examples, features)


def squad_answers(data: TaskData, outputs, *, options: FinetuneOptions, do_lower_case=True):
    """(best answer per question id, n-best lists), decoded as run_squad.py writes them."""
    v2 = any(getattr(e, "is_impossible", False) for e in data.raw)
    return squad_decoding.squad_predictions(
        data.raw,
        data.extra,
        outputs["start_logits"],
        outputs["end_logits"],
        n_best_size=options.n_best_size,
        max_answer_length=options.max_answer_length,
        do_lower_case=do_lower_case,
        version_2_with_negative=v2,
        null_score_diff_threshold=options.null_score_diff_threshold,
    )


def _build_span_predictor(base, *, labels, task_info=None):
    return bert.bert_span_predictor(base, task_info=task_info)


def _squad_score(data, outputs, *, options, do_lower_case):
    answers, _ = squad_answers(data, outputs, options=options, do_lower_case=do_lower_case)
    return squad.squad_evaluate(data.raw, answers)


def _squad_rows(data, outputs, *, options, do_lower_case):
    answers, nbest = squad_answers(data, outputs, options=options, do_lower_case=do_lower_case)
    for example in data.raw:
        best = nbest.get(example.qas_id) or [{}]
        yield {
            "id": example.qas_id,
            "answer": answers.get(example.qas_id, ""),
            "probability": round(float(best[0].get("probability", 0.0)), 6),
        }


def _squad_losses():
    # run_squad.py: total_loss = (start_loss + end_loss) / 2.
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return {"start_logits": ce, "end_logits": ce}, {"start_logits": 0.5, "end_logits": 0.5}


SQUAD = Task(
    name="squad",
    read_examples=_read_squad,
    encode=_encode_squad,
    build=_build_span_predictor,
    losses=_squad_losses,
    metric="f1",
    score=_squad_score,
    rows=_squad_rows,
    max_seq_length=384,
)


# === choice: multiple choice (SWAG) ===


def choice_row(probabilities) -> dict:
    """One multiple-choice answer's JSON: the best ending's index and every ending's probability.

    >>> choice_row([0.1, 0.7, 0.2])
    {'label': 1, 'probabilities': [0.1, 0.7, 0.2]}
    """
    return {"label": int(np.argmax(probabilities)), "probabilities": [round(float(p), 6) for p in probabilities]}


def _read_choices(path, *, options, require_labels, training):
    examples = readers.read_choice_examples(path, skip_bad_rows=options.skip_bad_rows, require_labels=require_labels)
    readers.report_skipped(path, examples)
    return examples


def _encode_choices(examples, *, path, preprocessor, labels, options, require_labels, training):
    features, truncated = encoding.encode_choices(preprocessor, examples.contexts, examples.endings)
    targets = None if examples.labels is None else {"logits": np.asarray(examples.labels, dtype=np.int32)}
    return TaskData(features, targets, None, len(examples.contexts), truncated, examples)


def _build_multiple_choice(base, *, labels, task_info=None):
    return bert.bert_multiple_choice(base, task_info=task_info)


def _choice_score(data, outputs, *, options, do_lower_case):
    return {"accuracy": float(np.mean(outputs["logits"].argmax(-1) == data.targets["logits"]))}


def _choice_rows(data, outputs, *, options, do_lower_case):
    return (choice_row(row) for row in _softmax(outputs["logits"]))


CHOICE = Task(
    name="choice",
    read_examples=_read_choices,
    encode=_encode_choices,
    build=_build_multiple_choice,
    losses=lambda: ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, None),
    metric="accuracy",
    score=_choice_score,
    rows=_choice_rows,
)


# === embed: sentence embeddings on (query, document) pairs, in-batch negatives ===


def _read_pairs(path, *, options, require_labels, training):
    examples = readers.read_pair_examples(path, format=options.format, skip_bad_rows=options.skip_bad_rows)
    readers.report_skipped(path, examples)
    return examples


def _encode_pairs(examples, *, path, preprocessor, labels, options, require_labels, training):
    features, truncated, texts = {}, 0, 0
    for side, side_texts in zip(ranking.SIDES, (examples.queries, examples.documents, examples.negatives)):
        if side_texts is None:
            continue
        encoded, cut = encoding.encode_texts(preprocessor, side_texts)
        encoded = _cut_to_longest(encoded)
        features.update({f"{side}_{name}": values for name, values in encoded.items()})
        truncated, texts = truncated + cut, texts + len(side_texts)
    if truncated:  # texts, not rows: TaskData.truncated counts examples
        log.warning(
            "%s: %d of %d texts longer than %s were truncated",
            path,
            truncated,
            texts,
            option("max_seq_length", preprocessor.sequence_length),
        )
    # InBatchNegatives reads each query's place in its batch; model.fit wants a target per row.
    targets = {"logits": np.zeros(len(examples), np.int32)}
    return TaskData(features, targets, None, len(examples), 0, examples)


def _cut_to_longest(encoded: dict, multiple: int = 8) -> dict:
    """One side's inputs cut to its longest text (rounded up to `multiple` tokens, within the
    padded length): padding changes no vector (attention and pooling skip it), and a side of
    short texts (queries of a few words) then costs what its words cost rather than the whole
    --max-seq-length. The length is the file's, so every batch has one shape (one trace).

    >>> mask = np.array([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]] * 2)
    >>> _cut_to_longest({"input_mask": mask})["input_mask"].shape
    (2, 8)
    """
    padded = encoded["input_mask"].shape[1]
    longest = int(encoded["input_mask"].sum(axis=1).max(initial=0))
    length = min(padded, max(multiple, -(-longest // multiple) * multiple))
    return {name: values[:, :length] for name, values in encoded.items()}


def _settle_embedding(base, options, *, where):
    """The pooling, normalisation and length of the sentence vectors: the ones given, over the
    base model's embedding record (a model with none needs a pooling)."""
    from kbert.embedding import embedding_settings

    settings = embedding_settings(base, options.pooling, options.normalize, options.max_seq_length, where)
    return dataclasses.replace(
        options, pooling=settings.pooling, normalize=settings.normalize, max_seq_length=settings.max_seq_length
    )


def _build_ranker(base, *, labels, task_info=None):
    embedding = task_info[EMBEDDING_KEY]
    ranker = ranking.PairRanker(
        bert.encoder_of(base), embedding["pooling"], negatives=task_info.get("negatives", False)
    )
    ranker.embedding = dict(embedding)
    return ranker


def _embedding_model(ranker):
    """The ranker's encoder as an embedding model: its pooling, normalisation and length recorded
    (bert_config.json's embedding, as kbert convert from-hf records a sentence-transformers
    model's), its task embed."""
    encoder = ranker.encoder
    config = BertConfig.from_dict(encoder.config.to_dict())
    config.extras[EMBEDDING_KEY] = dict(ranker.embedding)
    encoder.config = config
    encoder.task_info = {"task": "embed"}
    encoder.fresh_heads = tuple(getattr(ranker, "fresh_heads", ()))
    return encoder


def _pair_score(data, outputs, *, options, do_lower_case):
    return ranking.pair_scores(data.raw.queries, data.raw.documents, outputs)


def _no_pair_rows(data, outputs, *, options, do_lower_case):
    raise KbertError("an embedding model gives one vector per text, not one answer per pair: use kbert embed")


EMBED = Task(
    name="embed",
    read_examples=_read_pairs,
    encode=_encode_pairs,
    build=_build_ranker,
    losses=lambda: ({"logits": ranking.InBatchNegatives()}, None),
    metric="ndcg@10",
    score=_pair_score,
    rows=_no_pair_rows,
    settle=_settle_embedding,
    saved=_embedding_model,
)


TASKS = {task.name: task for task in (CLASSIFY, REGRESS, TAG, SQUAD, CHOICE, EMBED)}


def get_task(name: str) -> Task:
    """The task called `name`, or a one-line error listing them."""
    if name not in TASKS:
        raise KbertError(f"unknown {_option('task', name)}; use one of {', '.join(TASKS)}")
    return TASKS[name]


def _option(name, value):
    # `kbert finetune`'s flags: predict, evaluate and export read a model that recorded them.
    return option(name, value, command="finetune")


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
        raise KbertError(
            f"the {task} metrics have no {name!r} to pick the best epoch by; "
            f"they have {', '.join(sorted(scores)) or 'nothing'}"
        )
    return name, float(scores[name])


def predict_outputs(model, data: TaskData, batch_size) -> dict:
    """Raw model outputs over `data` (numpy, float32): for a `PairRanker`, whose logits compare
    the rows of one batch with each other, each row's query and document vectors."""
    if isinstance(model, ranking.PairRanker):
        return ranking.pair_vectors(model.embedder, data.features, batch_size)
    outputs = model.predict(data.features, batch_size=batch_size, verbose=0)
    return {k: np.asarray(v, dtype=np.float32) for k, v in outputs.items()}
