"""What every task answers, and the defaults most tasks share: the `Task` a task file subclasses,
and `TaskData`, one file read and encoded for it.

A task's methods are called with keyword arguments by the code they serve: `kbert finetune`
(`kbert.finetuning.train`: read, check, build, losses, score, record), `kbert predict` and
`evaluate` (`kbert.finetuning.predict`: read, encode, outputs, rows), `kbert.save` and
`kbert.load` (`tasks.head_task_info`: what a head records, checked), and `kbert export` and
`kbert predict --server` (serving/: the head an export serves, and how the server's answers
become rows). The TensorFlow graphs an export serves are built by `kbert.serving.heads`, which
an export hands to the task (`heads`), so that reading a task needs no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.finetuning import readers
from kbert.finetuning.encoding import log_truncated
from kbert.finetuning.options import FinetuneOptions, window_stride
from kbert.runtime.errors import KbertError, option

log = logging.getLogger("kbert")


def keras_predict(model, features: dict, batch_size: int) -> dict:
    """`model.predict` over `features`, as numpy float32 by output name: it splits batches across
    a tf.distribute strategy's replicas, as `predict_on_batch` does not."""
    outputs = model.predict(features, batch_size=batch_size, verbose=0)
    return {k: np.asarray(v, dtype=np.float32) for k, v in outputs.items()}


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
    # Training cuts each batch to its longest text (embed, rerank: texts of any length in one file).
    trim_batches: bool = False

    @property
    def documents(self) -> int:
        """The examples of the file (documents, however many windows they took)."""
        return self.size if self.windows is None else self.windows.num_documents

    def packed(self) -> tuple[int, str]:
        """(how many, what): what was packed to the sequence length, as truncation counts it: each
        pair of a group (choice, rerank), else each example."""
        ids = self.features.get("input_ids")
        if ids is not None and ids.ndim == 3:
            return ids.shape[0] * ids.shape[1], "pairs"
        return self.documents, "examples"


class Task:
    """Everything about one fine-tuning task; a task file subclasses it and overrides what differs.

    Attributes:
        name: str. What `--task` takes.
        metric: str. The dev score that picks the best epoch; higher is better.
        max_seq_length: int. Tokens per example unless `--max-seq-length` says otherwise.
        head: str or None. The kind of model its head is (`kbert.model.kinds`); None: the
            task's model is an encoder (embed).
        head_outputs: int or None. The outputs of a head of that kind saved without a task that
            make it this task's (regress: 1); None: any number.
        windows: bool. It reads `--long-text windows`.
        text_pairs: bool. It reads sentence pairs (text_b), and its model records whether it did.
        embeds: bool. Its model's answer is the encoder's pooled vectors (embed): `--pooling`
            and `--normalize` apply, and a model without a task head is scored as one.
        served: bool. `kbert export` serves its models (`serving_head`).
        reads_doc_stride: bool. It reads `--doc-stride` without `--long-text windows` (squad's
            own windows).
        trains_pooler: bool. Its head reads the pooled output, so training trains the pooler
            (a converter's fresh pooler is fresh no more).
        reranks: bool. Its model scores each query's candidate documents (`kbert rerank` runs it).
        own_options: tuple of str. The `FinetuneOptions` fields only this task reads (squad: its
            answer decoding; embed: the pooling): given to another task, they are refused.
        reader: the function of `kbert.finetuning.readers` that reads its files, called as
            `reader(path, skip_bad_rows=..., require_labels=...)`; a task whose reader takes
            other arguments writes its own `read_rows`.
    """

    name: str = ""
    metric: str = ""
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    head: str | None = None
    head_outputs: int | None = None
    windows: bool = False
    text_pairs: bool = False
    embeds: bool = False
    served: bool = False
    reads_doc_stride: bool = False
    trains_pooler: bool = False
    reranks: bool = False
    own_options: tuple = ()
    reader = None

    def __repr__(self):
        return f"<task {self.name}>"

    # === Reading and encoding ===

    def read_examples(self, path, *, options: FinetuneOptions, require_labels: bool, training: bool):
        """The file's examples (kbert.finetuning.readers' TextExamples, TaggedExamples,
        ChoiceExamples; SQuAD's list of questions): the rows as read, before any tokenizing, with
        `len` and `select(first, stop)`. The rows skipped as bad are logged."""
        examples = self.read_rows(path, options=options, require_labels=require_labels)
        readers.report_skipped(path, examples)
        return examples

    def read_rows(self, path, *, options: FinetuneOptions, require_labels: bool):
        """The file's rows, read by the task's reader of `kbert.finetuning.readers`."""
        read = type(self).reader  # a plain function, not a method of the task
        if read is None:
            raise NotImplementedError
        return read(path, skip_bad_rows=options.skip_bad_rows, require_labels=require_labels)

    def encode(
        self, examples, *, path, preprocessor, labels, options: FinetuneOptions, require_labels: bool, training: bool
    ) -> TaskData:
        """`examples` as model inputs. preprocessor: the BertPreprocessor that packs the text (its
        vocabulary, casing and sequence length); labels: the names to score against (None: the
        file's, when training)."""
        raise NotImplementedError

    def read(self, path, *, preprocessor, labels, options, require_labels, training) -> TaskData:
        """A whole file, read and encoded (training and scoring; prediction encodes a batch of
        examples at a time, `kbert.finetuning.predict`)."""
        reading = dict(options=options, require_labels=require_labels, training=training)  # the same for both
        examples = self.read_examples(path, **reading)
        data = self.encode(examples, path=path, preprocessor=preprocessor, labels=labels, **reading)
        log_windows(path, data.windows, preprocessor, options)
        return data

    # === Training ===

    def settle(self, base, options: FinetuneOptions, *, where) -> FinetuneOptions:
        """What the pretrained model decides of the options (embed: the pooling and length it
        records, unless given)."""
        return options

    def check_options(self, opts: FinetuneOptions):
        """What training asks of the options for this task, beyond `FinetuneOptions`' own checks."""
        self.check_options_apply(opts)
        if opts.max_seq_length is not None and opts.max_seq_length < 8:
            raise KbertError(f"{option('max_seq_length')} must be at least 8 to fine-tune, got {opts.max_seq_length}")
        if opts.long_text == "windows" and not self.windows:
            raise KbertError(
                f"{option('long_text', 'windows')} applies to classify, regress and tag; {self.why_no_windows()}: "
                f"drop {option('long_text', 'windows')} for {option('task', self.name)}"
            )
        if opts.doc_stride is not None and opts.long_text != "windows" and not self.reads_doc_stride:
            add = f" (or add {option('long_text', 'windows')})" if self.windows else ""
            raise KbertError(
                f"{option('doc_stride')} applies to {option('task', 'squad')} and to {option('long_text', 'windows')}; "
                f"drop it for {option('task', self.name)}{add}"
            )

    def check_options_apply(self, opts: FinetuneOptions):
        """Refuse an option that another task owns (`own_options`) and this one would ignore: given
        other than its default, it can only be a mistake (a SQuAD option on classify), so it is
        refused in one line rather than run without a word."""
        from kbert.finetuning.tasks import TASKS  # here: that module imports this one

        defaults = FinetuneOptions()
        for other in TASKS.values():
            for name in other.own_options:
                if name not in self.own_options and getattr(opts, name) != getattr(defaults, name):
                    owners = [option("task", task.name) for task in TASKS.values() if name in task.own_options]
                    raise KbertError(
                        f"{option(name)} applies to {' or '.join(owners)}; drop it for {option('task', self.name)}"
                    )

    def why_no_windows(self) -> str:
        """Why the task takes no `--long-text windows` (said when it is given)."""
        return f"{self.name} packs each context with each ending as a pair"

    def training_file(self, train, output, opts: FinetuneOptions):
        """The file training reads: `train`, or one the task writes from it beside `output` (rerank:
        its pairs with mined negatives), which a `--resume` reads again."""
        return train

    def check_training_data(self, path, data: TaskData):
        """A training file's data, checked beyond having rows (classify: two labels)."""

    def build(self, base, *, labels, task_info):
        """The task's keras.Model on `base`, declaring `task_info`."""
        raise NotImplementedError

    def losses(self, options: FinetuneOptions | None = None):
        """(loss per output, loss weights or None), for model.compile; `options` for a task whose
        loss is chosen by a flag (rerank's --loss)."""
        raise NotImplementedError

    def record(self, opts: FinetuneOptions, max_seq_length: int, data: TaskData) -> dict:
        """What the fine-tuned model records besides task, max_seq_length, labels and long_text
        (`kbert.finetuning.tasks.head_task_info`)."""
        return {}

    def fingerprint(self, opts: FinetuneOptions) -> dict:
        """The task's options a `--resume` must match, besides those every task has."""
        return {}

    def saved(self, model):
        """The model the output directory holds (embed: the encoder, not the ranker)."""
        return model

    # === Scoring and predicting ===

    def outputs(self, model, data: TaskData, batch_size: int, run=keras_predict) -> dict:
        """Raw model outputs over `data` (numpy, float32). run: (model, features, batch_size) ->
        outputs, how the model runs (`kbert predict` runs it a batch at a time)."""
        return run(model, data.features, batch_size)

    def score(self, data: TaskData, outputs, *, options, do_lower_case) -> dict:
        """The metrics of `outputs` against `data`'s labels."""
        raise NotImplementedError

    def evaluate(self, model, path, opts: FinetuneOptions, *, preprocessor, packer, where) -> dict:
        """`kbert evaluate`: the metrics of the fine-tuned `model` on a labelled file, with
        `examples`, the examples scored. preprocessor: packs to the model's recorded length;
        packer: sequence_length -> a preprocessor of the model's vocabulary and casing, for a
        task that packs to a length of its own (embed); where: the model's name in messages."""
        data = self.read(
            path,
            preprocessor=preprocessor,
            labels=model.task_info.get("labels"),
            options=opts,
            require_labels=True,
            training=False,
        )
        packed, what = data.packed()
        log_truncated(path, data.truncated, packed, preprocessor.sequence_length, what=what)
        if data.size == 0:
            raise KbertError(f"{path} has no usable rows to evaluate")
        result = self.score(
            data, self.outputs(model, data, opts.batch_size), options=opts, do_lower_case=model.do_lower_case
        )
        result["examples"] = self.examples_scored(data)
        return result

    def examples_scored(self, data: TaskData) -> int:
        """The examples `kbert evaluate` says it scored: documents, however many windows they took."""
        return data.documents

    def best_predictions(self, data: TaskData, outputs, *, options, do_lower_case):
        """What the output directory keeps of the best epoch's dev predictions (squad's
        predictions.json), or None."""
        return None

    def rows(self, data: TaskData, outputs, *, options, do_lower_case):
        """One JSON-ready dict per example."""
        raise NotImplementedError

    # === What a head records (head_task_info in kbert.finetuning.tasks) ===

    def check_head(self, info: dict, num_classes: int, kind: str):
        """`info` (the head's task metadata) checked against a head of `num_classes` outputs,
        with its labels filled in where the task has them."""
        if info.get("labels") is not None:
            raise KbertError(f"labels apply to classify and tag; a {self.name} model has none: save it without labels")
        info.pop("labels", None)

    def encoder_record(self, model, given: dict) -> dict | None:
        """The task metadata of an encoder that is this task's model (embed), or None."""
        return None

    # === Serving (kbert.serving) ===

    def serving_head(self, model, labels, heads, record=None):
        """The `ServingHead` an export serves for a model of this task, built with `heads`
        (`kbert.serving.heads`); record: the model's task record (rerank: its activation)."""
        raise NotImplementedError

    def serving_windows(self, head, model, labels, stride: int, max_windows: int, heads):
        """`head` serving whole documents in windows `stride` tokens apart (`--long-text windows`)."""
        raise NotImplementedError

    def served_by(self, signatures: dict) -> bool:
        """Whether a server's `signatures` are those `kbert export` writes for this task's model."""
        return False

    def served_answers(self, client, examples, signatures: dict, path):
        """answer(part, first) -> the rows of a batch of `examples`, from the served model."""
        raise NotImplementedError


def json_floats(values: dict) -> dict:
    """Metrics as printed: floats (numpy's too) rounded to 6 digits, everything else as is.

    >>> json_floats({"accuracy": np.float32(0.8125), "examples": 64})
    {'accuracy': 0.8125, 'examples': 64}
    """
    return {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in values.items()}


def softmax(logits):
    """The softmax over the last axis, in numpy.

    >>> softmax(np.array([0.0, 0.0]))
    array([0.5, 0.5])
    """
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


def check_known(path, found, labels):
    """An error naming the labels of a file (`found`) that the model was never trained on."""
    unseen = sorted(set(found) - set(labels))
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:10]) + (f" and {len(unseen) - 10} more" if len(unseen) > 10 else "")
        raise KbertError(
            f"{path} has labels the model was never trained on: {shown}; the model knows "
            f"{', '.join(repr(label) for label in labels)}"
        )


def finetune_option(name, value):
    """`kbert finetune`'s flags, as a message names them: predict, evaluate and export read a
    model that recorded them.

    >>> finetune_option("task", "regress")
    "task='regress'"
    """
    return option(name, value, command="finetune")


def label_names(info: dict, num_classes: int, kind: str) -> list:
    """A head's label names: the recorded ones, checked (one name per output), or the class
    ids "0".."N-1", which is what a head trained by `model.fit` on integer labels predicts.

    >>> label_names({}, 2, "classifier")
    ['0', '1']
    """
    names = info.get("labels")
    names = [str(i) for i in range(num_classes)] if names is None else names
    if isinstance(names, (str, bytes)) or not all(isinstance(n, (str, int)) and not isinstance(n, bool) for n in names):
        raise KbertError(
            f"labels must be a list of label names (str), one per output, e.g. "
            f"{[str(i) for i in range(num_classes)]}; got {names!r}"[:300]
        )
    names = [str(n) for n in names]
    if len(names) != num_classes or len(set(names)) != len(names):
        raise KbertError(
            f"labels {names[:8]}{'...' if len(names) > 8 else ''}: the {kind} has {num_classes} "
            f"outputs, so give {num_classes} different label names, in output order"
        )
    return names


def log_windows(path, windows, preprocessor, options):
    """Say how the file's documents became windows (nothing without `--long-text windows`)."""
    if windows is None:
        return
    stride = window_stride(options.doc_stride, preprocessor.sequence_length)
    log.info("%s", windows_summary(path, windows.counts, preprocessor.sequence_length - 2, stride))


def windows_summary(path, counts, tokens: int, stride: int | None = None) -> str:
    """How a file's documents (`counts`: each one's windows) became windows of `tokens` tokens.

    >>> windows_summary("a.tsv", np.array([1, 3, 1, 2]), 14, stride=7)
    'a.tsv: 2 of 4 documents longer than 14 tokens became 5 windows (stride 7); 7 windows in all'
    >>> windows_summary("a.tsv", np.array([1, 1]), 14)
    'a.tsv: none of 2 documents is longer than 14 tokens: one window each'
    """
    longer = counts > 1
    if not longer.any():
        return f"{path}: none of {len(counts)} documents is longer than {tokens} tokens: one window each"
    strided = f" (stride {stride})" if stride is not None else ""
    return (
        f"{path}: {int(longer.sum())} of {len(counts)} documents longer than {tokens} tokens became "
        f"{int(counts[longer].sum())} windows{strided}; {int(counts.sum())} windows in all"
    )


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
