"""`kbert finetune`: one small head on a pretrained BERT, trained with `model.fit`, as the paper did.

Tasks:
- classify: `run_classifier.py`'s model (dropout + [classes, H] on the pooled output);
- regress: the same with one output and squared error (STS-B);
- tag: one label per word on its first WordPiece (NER, POS);
- squad: `run_squad.py`'s start/end span head, SQuAD v1.1 and v2.0.

The optimizer is the original's (`optimization.create_optimizer`): AdamW without bias
correction, weight decay 0.01, linear warmup over `warmup_proportion` of the steps, then
linear decay to 0, global-norm clip 1.0. After each epoch the dev set is scored with the
task's metric; the best epoch's weights are what the output directory keeps.

Fine-tuning runs on one device or under MirroredStrategy, where Keras' `model.fit` works
(the multi-worker limitation that made pretraining use its own loop does not arise).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import numpy as np

from kbert.errors import KbertError

log = logging.getLogger("kbert")

TASKS = ("classify", "regress", "tag", "squad")
RESULTS_FILE = "eval_results.json"


@dataclasses.dataclass
class FinetuneOptions:
    """Everything `kbert finetune` takes besides the model, task and files (see its --help)."""
    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 5e-5
    max_seq_length: int | None = None    # default: 128, or 384 for squad (run_squad.py's)
    warmup_proportion: float = 0.1       # run_classifier.py's default
    seed: int = 12345
    mixed_precision: bool = False
    strategy: str = "auto"               # auto | cpu | gpu | mirrored
    patience: int | None = None          # stop after this many epochs without a better dev score
    skip_bad_rows: bool = False
    format: str = "auto"
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    overwrite: bool = False
    progress: bool = True


# --------------------------------------------------------------------------- task data


@dataclasses.dataclass
class TaskData:
    """One file, read and encoded for a task: model inputs, targets, and what scoring needs."""
    features: dict            # name -> np.int32 [N, seq]
    targets: object           # np array or dict of arrays; None without labels
    size: int
    truncated: int = 0
    raw: object = None        # the examples as read (for scoring and printing)
    extra: object = None      # task-specific (tagging: word starts; squad: features)


def _tokenizer(vocab_file, do_lower_case):
    from kbert.text.tokenizer import Tokenizer
    return Tokenizer(vocab_file, do_lower_case=do_lower_case)


def read_task_data(task, path, tokenizer, max_seq_length, labels=None, opts: FinetuneOptions | None = None,
                   require_labels=True, is_training=False) -> tuple[TaskData, list | None]:
    """Read `path` for `task`; returns (TaskData, label names). `labels` fixes the label set
    (from training); unseen labels in `path` are then an error that lists them."""
    from kbert.finetuning import readers
    opts = opts or FinetuneOptions()
    if task in ("classify", "regress"):
        examples = readers.read_text_examples(path, task=task, format=opts.format, skip_bad_rows=opts.skip_bad_rows,
                                         require_labels=require_labels)
        _report_read(path, examples.skipped_rows, examples.replaced_bytes)
        features, truncated = readers.encode_texts(tokenizer, examples.texts, examples.texts_b, max_seq_length)
        targets = None
        if examples.labels is not None:
            if task == "regress":
                targets = np.asarray(examples.labels, dtype=np.float32)
            else:
                if labels is None:
                    labels = sorted(set(examples.labels))
                _check_known(path, examples.labels, labels)
                index = {label: i for i, label in enumerate(labels)}
                targets = np.asarray([index[label] for label in examples.labels], dtype=np.int32)
        return TaskData(features, targets, len(examples.texts), truncated, examples), labels
    if task == "tag":
        examples = readers.read_tagged_examples(path, skip_bad_rows=opts.skip_bad_rows, require_labels=require_labels)
        _report_read(path, examples.skipped_rows, examples.replaced_bytes)
        if examples.tags is not None and labels is None:
            labels = sorted({tag for sentence in examples.tags for tag in sentence})
        label_ids = {label: i for i, label in enumerate(labels or [])}
        features, targets, word_starts, truncated = readers.encode_tagged(
            tokenizer, examples.words, examples.tags, label_ids, max_seq_length)
        return TaskData(features, targets if examples.tags is not None else None, len(examples.words),
                        truncated, examples, word_starts), labels
    if task == "squad":
        from kbert.finetuning import squad
        examples = squad.read_squad(path, is_training=is_training)
        if not examples:
            raise KbertError(f"{path} holds no SQuAD questions; pass a SQuAD v1.1 or v2.0 JSON file")
        arrays, features = squad.squad_features(examples, tokenizer, max_seq_length, opts.doc_stride,
                                                opts.max_query_length, is_training=is_training)
        inputs = {k: arrays[k] for k in ("input_ids", "input_mask", "segment_ids")}
        targets = ({"start_logits": arrays["start_positions"], "end_logits": arrays["end_positions"]}
                   if is_training else None)
        return TaskData(inputs, targets, len(features), 0, examples, features), None
    raise KbertError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")


def _report_read(path, skipped_rows, replaced_bytes):
    if skipped_rows:
        shown = ", ".join(map(str, skipped_rows[:10])) + (f" and {len(skipped_rows) - 10} more"
                                                          if len(skipped_rows) > 10 else "")
        log.warning("%s: skipped %d bad rows (lines %s)", path, len(skipped_rows), shown)
    if replaced_bytes:
        log.warning("%s: replaced %d invalid UTF-8 byte sequences with U+FFFD", path, replaced_bytes)


def _check_known(path, found, labels):
    unseen = sorted(set(found) - set(labels))
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:10]) + (f" and {len(unseen) - 10} more" if len(unseen) > 10 else "")
        raise KbertError(f"{path} has labels the model was never trained on: {shown}; the model knows "
                         f"{', '.join(repr(label) for label in labels)}")


# --------------------------------------------------------------------------- models and losses


def build_task_model(task, base, num_classes):
    from kbert.model import bert
    if task == "classify":
        return bert.bert_classifier(base, num_classes)
    if task == "regress":
        return bert.bert_classifier(base, 1)
    if task == "tag":
        return bert.bert_tagger(base, num_classes)
    return bert.bert_span_predictor(base)


def compile_for_task(model, task, optimizer):
    import keras
    if task == "classify":
        loss = {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
        weights = None
    elif task == "regress":
        loss = {"logits": keras.losses.MeanSquaredError()}
        weights = None
    elif task == "tag":
        # -1 marks positions with no label: [CLS], [SEP], padding, and non-first WordPieces.
        loss = {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)}
        weights = None
    else:
        # run_squad.py: total_loss = (start_loss + end_loss) / 2.
        ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        loss = {"start_logits": ce, "end_logits": ce}
        weights = {"start_logits": 0.5, "end_logits": 0.5}
    model.compile(optimizer=optimizer, loss=loss, loss_weights=weights)


def make_finetune_optimizer(learning_rate, total_steps, warmup_steps):
    """The original's `optimization.create_optimizer` as a Keras optimizer."""
    from kbert.training.optimization import BertAdamW, WarmupLinearDecay
    return BertAdamW(WarmupLinearDecay(learning_rate, total_steps, warmup_steps), weight_decay_rate=0.01,
                     global_clipnorm=1.0)


def _targets_for_fit(task, targets):
    if task == "squad":
        return targets
    return {"logits": targets}


# --------------------------------------------------------------------------- scoring


def predict_outputs(model, data: TaskData, batch_size):
    """Raw model outputs over `data` (numpy, float32)."""
    outputs = model.predict(data.features, batch_size=batch_size, verbose=0)
    return {k: np.asarray(v, dtype=np.float32) for k, v in outputs.items()}


def score(task, data: TaskData, outputs, labels, opts: FinetuneOptions, do_lower_case=True):
    """The task's metrics for `outputs` on `data` (which must carry labels)."""
    from kbert.finetuning import metrics
    if task == "classify":
        return metrics.classification_metrics(data.targets.tolist(), outputs["logits"].argmax(-1).tolist(),
                                              label_names=list(range(len(labels))))
    if task == "regress":
        return metrics.regression_metrics(data.targets.tolist(), outputs["logits"][:, 0].tolist())
    if task == "tag":
        gold = data.raw.tags
        return metrics.tagging_metrics(gold, tag_predictions(data, outputs, labels))
    from kbert.finetuning import squad
    predictions, _ = squad_answers(data, outputs, opts, do_lower_case)
    return squad.squad_evaluate(data.raw, predictions)


def tag_predictions(data: TaskData, outputs, labels):
    """One predicted tag per word: the argmax at the word's first WordPiece ("O" if truncated away)."""
    best = outputs["logits"].argmax(-1)
    fallback = "O" if "O" in labels else labels[0]
    return [[labels[best[i, p]] if p >= 0 else fallback for p in starts] for i, starts in enumerate(data.extra)]


def squad_answers(data: TaskData, outputs, opts: FinetuneOptions, do_lower_case=True):
    from kbert.finetuning import squad
    v2 = any(getattr(e, "is_impossible", False) for e in data.raw)
    return squad.squad_predictions(data.raw, data.extra, outputs["start_logits"], outputs["end_logits"],
                                   n_best_size=opts.n_best_size, max_answer_length=opts.max_answer_length,
                                   do_lower_case=do_lower_case, version_2_with_negative=v2,
                                   null_score_diff_threshold=opts.null_score_diff_threshold)


def _json_floats(metrics):
    return {k: (round(float(v), 6) if isinstance(v, (float, np.floating)) else v) for k, v in metrics.items()}


# --------------------------------------------------------------------------- the fine-tuning run


def load_base_model(model_dir):
    """A kbert model directory, or a google-research checkpoint directory (converted on the fly)."""
    from kbert.files import require_path
    from kbert.model_dir import is_model_dir, load
    model_dir = os.fspath(model_dir)
    require_path(model_dir, "model directory", "pass a kbert model directory or a google-research checkpoint")
    if is_model_dir(model_dir):
        return load(model_dir)
    from kbert.converters import load_tf1_checkpoint
    return load_tf1_checkpoint(model_dir)


def finetune(model_dir, task, train, output, dev=None, options: FinetuneOptions | None = None, **overrides):
    """Fine-tune the model in `model_dir` on `train`; write the best epoch to `output`.

    Args:
        model_dir: str. A kbert model directory (converted or pretrained) or a google-research
            checkpoint directory.
        task: str. classify | regress | tag | squad.
        train, dev: str. Data files (see `kbert finetune --help` for the formats).
        output: str. The fine-tuned kbert model directory: bert_config.json (with task, labels,
            max_seq_length), vocab.txt, model.weights.h5, eval_results.json, logs/.
        options: `FinetuneOptions`; keyword arguments override single fields.

    Returns: the dev metrics of the best epoch (train metrics without --dev), with `epoch`.

    Example:
    >>> kbert.finetuning.train.finetune("uncased_L-12_H-768_A-12", "classify", "train.tsv", "out/mrpc",
    ...                           dev="dev.tsv", epochs=3)  # doctest: +SKIP
    """
    import keras
    import tensorflow as tf

    from kbert.files import atomic_output_dir, check_output_dir
    from kbert.model_dir import save
    from kbert.training.strategy import make_strategy

    opts = dataclasses.replace(options or FinetuneOptions(), **overrides)
    if task not in TASKS:
        raise KbertError(f"unknown --task {task!r}; use one of {', '.join(TASKS)}")
    _check_options(opts)
    strategy = make_strategy(opts.strategy)
    check_output_dir(os.fspath(output), opts.overwrite)
    # --- data ---
    base_probe = _model_config(model_dir)
    default_length = min(384 if task == "squad" else 128, base_probe["max_position_embeddings"])
    max_seq_length = opts.max_seq_length or default_length
    if max_seq_length > base_probe["max_position_embeddings"]:
        raise KbertError(f"--max-seq-length {max_seq_length} exceeds the model's max_position_embeddings "
                         f"{base_probe['max_position_embeddings']}; lower it")
    tokenizer = _tokenizer(base_probe["vocab_file"], base_probe["do_lower_case"])
    train_data, labels = read_task_data(task, train, tokenizer, max_seq_length, opts=opts, is_training=True)
    if train_data.size == 0:
        raise KbertError(f"{train} has no usable rows; check the file (or --skip-bad-rows dropped them all)")
    if task == "classify" and len(labels) < 2:
        raise KbertError(f"{train} has only one label ({labels[0]!r}); classification needs at least two")
    if train_data.truncated:
        log.warning("%s: %d of %d examples longer than --max-seq-length %d were truncated", train,
                    train_data.truncated, train_data.size, max_seq_length)
    dev_data = None
    if dev:
        dev_data, _ = read_task_data(task, dev, tokenizer, max_seq_length, labels=labels, opts=opts,
                                     is_training=False)
        if dev_data.truncated:
            log.warning("%s: %d of %d examples were truncated", dev, dev_data.truncated, dev_data.size)

    replicas = strategy.num_replicas_in_sync
    log.info("%s: %d training examples%s, %d replica%s", task, train_data.size,
             f", {len(labels)} labels" if labels else "", replicas, "s" if replicas > 1 else "")
    if opts.batch_size % replicas:
        raise KbertError(f"--batch-size {opts.batch_size} must divide evenly over {replicas} replicas; "
                         f"use a multiple of {replicas}")

    # --- model ---
    if opts.mixed_precision:
        gpu = bool(tf.config.list_logical_devices("GPU"))
        keras.mixed_precision.set_global_policy("mixed_float16" if gpu else "mixed_bfloat16")
    keras.utils.set_random_seed(opts.seed)
    steps_per_epoch = max(1, train_data.size // opts.batch_size)
    total_steps = steps_per_epoch * opts.epochs
    with strategy.scope():
        base = load_base_model(model_dir)
        model = build_task_model(task, base, len(labels) if labels else 1)
        task_info = {"task": task, "max_seq_length": max_seq_length}
        if labels is not None:
            task_info["labels"] = labels
        if task == "squad":
            task_info.update(doc_stride=opts.doc_stride, max_query_length=opts.max_query_length)
        if task in ("classify", "regress"):
            # Whether inputs are sentence pairs: the export's serving signature takes text_b only then.
            task_info["text_pairs"] = train_data.raw.texts_b is not None
        model.task_info = task_info
        compile_for_task(model, task, make_finetune_optimizer(
            opts.learning_rate, total_steps, int(total_steps * opts.warmup_proportion)))

    dataset = tf.data.Dataset.from_tensor_slices((train_data.features, _targets_for_fit(task, train_data.targets)))
    # As run_classifier.py: shuffle, and drop the last partial batch so every step has the same shape.
    dataset = dataset.shuffle(min(train_data.size, 100_000), seed=opts.seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(opts.batch_size, drop_remainder=train_data.size >= opts.batch_size)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)

    logs_dir = os.path.join(os.fspath(output) + ".partial-logs")
    tracker = _BestEpoch(task, dev_data, labels, opts, base_probe["do_lower_case"], logs_dir,
                         train_data.size, total_steps)
    callbacks = [tracker, keras.callbacks.TensorBoard(os.path.join(logs_dir, "fit"), update_freq="epoch")]
    start = time.perf_counter()
    model.fit(dataset, epochs=opts.epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=callbacks)
    elapsed = time.perf_counter() - start

    # --- keep the best epoch ---
    if tracker.best_weights is not None:
        model.set_weights(tracker.best_weights)
    result = dict(tracker.best_metrics or {})
    result["epoch"] = tracker.best_epoch
    result["train_examples_per_second"] = round(train_data.size * tracker.epochs_run / max(elapsed, 1e-9), 2)
    with atomic_output_dir(os.fspath(output), overwrite=opts.overwrite) as tmp:
        save(model, tmp, vocab_file=base_probe["vocab_file"], do_lower_case=base_probe["do_lower_case"],
             overwrite=True)
        with open(os.path.join(tmp, RESULTS_FILE), "w") as f:
            json.dump({"best": result, "history": tracker.history}, f, indent=2)
        if tracker.best_predictions is not None:
            from kbert.finetuning.squad import write_predictions_json
            write_predictions_json(tracker.best_predictions, os.path.join(tmp, "predictions.json"))
        if os.path.isdir(logs_dir):
            os.replace(logs_dir, os.path.join(tmp, "logs"))
    return _json_floats(result)


def _model_config(model_dir):
    """vocab file, casing and max positions of a model directory or TF1 checkpoint, without loading it."""
    from kbert.config import BertConfig
    from kbert.files import require_path
    from kbert.model_dir import CONFIG_FILE, VOCAB_FILE
    model_dir = os.fspath(model_dir)
    require_path(model_dir, "model directory", "pass a kbert model directory or a google-research checkpoint")
    config = BertConfig.from_json_file(os.path.join(model_dir, CONFIG_FILE))
    vocab = os.path.join(model_dir, VOCAB_FILE)
    require_path(vocab, "vocab file", "the model directory needs its vocab.txt")
    return {"vocab_file": vocab, "do_lower_case": bool(config.extras.get("do_lower_case", True)),
            "max_position_embeddings": config.max_position_embeddings}


def _check_options(opts: FinetuneOptions):
    for name in ("epochs", "batch_size"):
        if getattr(opts, name) < 1:
            raise KbertError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(opts, name)}")
    if not 0.0 <= opts.warmup_proportion < 1.0:
        raise KbertError(f"--warmup-proportion must be in [0, 1), got {opts.warmup_proportion}")
    if opts.learning_rate <= 0:
        raise KbertError(f"--learning-rate must be positive, got {opts.learning_rate}")
    if opts.max_seq_length is not None and opts.max_seq_length < 8:
        raise KbertError(f"--max-seq-length must be at least 8, got {opts.max_seq_length}")
    if opts.strategy not in ("auto", "cpu", "gpu", "mirrored"):
        raise KbertError(f"--strategy {opts.strategy!r}: fine-tuning runs on auto, cpu, gpu or mirrored")


def _keras_callback_base():
    import keras
    return keras.callbacks.Callback


class _BestEpoch(_keras_callback_base()):
    """After each epoch: score dev with the task's metric, keep the best weights, stop early,
    drive the progress bar and write the dev metrics to TensorBoard."""

    def __init__(self, task, dev_data, labels, opts, do_lower_case, logs_dir, train_size, total_steps):
        super().__init__()
        from kbert.finetuning.metrics import best_metric
        from kbert.training.progress import Progress
        self.task, self.dev_data, self.labels, self.opts = task, dev_data, labels, opts
        self.do_lower_case, self.logs_dir = do_lower_case, logs_dir
        self.best_metric = best_metric
        self.best_value, self.best_epoch, self.best_weights = -float("inf"), 0, None
        self.best_metrics, self.best_predictions, self.history = None, None, []
        self.epochs_run, self.stale = 0, 0
        self.progress = Progress(total_steps, enabled=opts.progress, sequences_per_step=opts.batch_size,
                                 description=f"finetune {task}")
        self.step, self.started, self.batch_size = 0, None, opts.batch_size
        self.writer = None

    def on_train_begin(self, logs=None):
        self.progress.__enter__()
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        rate = self.step * self.batch_size / max(time.perf_counter() - self.started, 1e-9)
        self.progress.update(self.step, {"loss": float((logs or {}).get("loss", float("nan"))),
                                         "sequences_per_second": rate})

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf
        self.epochs_run = epoch + 1
        row = {"epoch": epoch + 1, "loss": float((logs or {}).get("loss", float("nan")))}
        if self.dev_data is not None:
            outputs = predict_outputs(self.model, self.dev_data, self.opts.batch_size)
            metrics = score(self.task, self.dev_data, outputs, self.labels, self.opts, self.do_lower_case)
            name, value = self.best_metric(self.task, metrics)
            row.update({f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
        else:
            metrics, name, value = {"loss": row["loss"]}, "loss", -row["loss"]
        self.history.append(_json_floats(row))
        self.progress.log(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()
                                                             if isinstance(v, float)))
        if self.writer is None:
            self.writer = tf.summary.create_file_writer(os.path.join(self.logs_dir, "dev"))
        with self.writer.as_default():
            for k, v in row.items():
                if k != "epoch" and isinstance(v, float):
                    tf.summary.scalar(k, v, step=epoch + 1)
        self.writer.flush()
        if value > self.best_value:
            self.best_value, self.best_epoch, self.stale = value, epoch + 1, 0
            self.best_weights = self.model.get_weights()
            self.best_metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            if self.task == "squad" and self.dev_data is not None:
                self.best_predictions, _ = squad_answers(self.dev_data, outputs, self.opts, self.do_lower_case)
        else:
            self.stale += 1
            if self.opts.patience is not None and self.stale >= self.opts.patience:
                self.progress.log(f"early stop: no better dev {name} for {self.stale} epochs "
                                  f"(best {self.best_value:.4f} at epoch {self.best_epoch})")
                self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.progress.__exit__(None, None, None)


# --------------------------------------------------------------------------- predict / evaluate


def _with_saved_squad_windows(model, opts: FinetuneOptions) -> FinetuneOptions:
    """SQuAD windows as at fine-tuning time (stride, question length), recorded in the model dir."""
    info = getattr(model, "task_info", None) or {}
    keep = {k: info[k] for k in ("doc_stride", "max_query_length") if k in info}
    return dataclasses.replace(opts, **keep)


def _task_of(model, requested_length=None):
    """(task, labels, sequence length) of a loaded model; the length defaults to the one it was
    fine-tuned with (128 for other models, capped at max_position_embeddings)."""
    info = getattr(model, "task_info", None) or {}
    limit = model.config.max_position_embeddings
    length = requested_length or min(info.get("max_seq_length", 128), limit)
    if length > limit:
        raise KbertError(f"--max-seq-length {length} exceeds the model's max_position_embeddings {limit}; "
                         f"lower it")
    return info.get("task"), info.get("labels"), length


def evaluate(model_dir, input_path, options: FinetuneOptions | None = None, **overrides) -> dict:
    """The task's metrics of the fine-tuned model in `model_dir` on a labelled file."""
    from kbert.model_dir import load
    opts = dataclasses.replace(options or FinetuneOptions(), **overrides)
    model = load(model_dir)
    opts = _with_saved_squad_windows(model, opts)
    task, labels, max_seq_length = _task_of(model, opts.max_seq_length)
    if task is None:
        raise KbertError(f"{model_dir} is not a fine-tuned model (no task in bert_config.json); "
                         f"evaluate a directory written by kbert finetune")
    tokenizer = _tokenizer(model.vocab_file, model.do_lower_case)
    data, _ = read_task_data(task, input_path, tokenizer, max_seq_length, labels=labels,
                             opts=opts, is_training=False)
    if data.size == 0:
        raise KbertError(f"{input_path} has no usable rows to evaluate")
    if data.truncated:
        log.warning("%s: %d of %d examples were truncated", input_path, data.truncated, data.size)
    outputs = predict_outputs(model, data, opts.batch_size)
    result = score(task, data, outputs, labels, opts, model.do_lower_case)
    result["examples"] = len(data.raw) if task == "squad" else data.size
    return _json_floats({k: v for k, v in result.items() if not isinstance(v, dict)})


def predict(model_dir, input_path, layers: list[int] | None = None, options: FinetuneOptions | None = None,
            **overrides):
    """Yield one JSON-ready dict per input example (see `kbert predict --help`)."""
    from kbert.model_dir import load
    opts = dataclasses.replace(options or FinetuneOptions(), **overrides)
    model = load(model_dir)
    opts = _with_saved_squad_windows(model, opts)
    task, labels, max_seq_length = _task_of(model, opts.max_seq_length)
    tokenizer = _tokenizer(model.vocab_file, model.do_lower_case)
    if task is None:
        yield from _features(model, input_path, tokenizer, max_seq_length, layers, opts)
        return
    data, _ = read_task_data(task, input_path, tokenizer, max_seq_length, labels=labels, opts=opts,
                             require_labels=False, is_training=False)
    if data.truncated:
        log.warning("%s: %d of %d examples were truncated", input_path, data.truncated, data.size)
    outputs = predict_outputs(model, data, opts.batch_size)
    if task == "classify":
        logits = outputs["logits"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        for row in probs:
            yield {"label": labels[int(row.argmax())],
                   "probabilities": {label: round(float(p), 6) for label, p in zip(labels, row)}}
    elif task == "regress":
        for value in outputs["logits"][:, 0]:
            yield {"prediction": round(float(value), 6)}
    elif task == "tag":
        for words, tags in zip(data.raw.words, tag_predictions(data, outputs, labels)):
            yield {"words": words, "tags": tags}
    else:
        answers, nbest = squad_answers(data, outputs, opts, model.do_lower_case)
        for example in data.raw:
            best = nbest.get(example.qas_id) or [{}]
            yield {"id": example.qas_id, "answer": answers.get(example.qas_id, ""),
                   "probability": round(float(best[0].get("probability", 0.0)), 6)}


def _features(model, input_path, tokenizer, max_seq_length, layers, opts):
    """extract_features.py's output for an encoder or pretrained model: the pooled embedding, or
    with `layers` the per-token values of those layers (-1 = last)."""
    import keras
    from kbert.finetuning import readers
    from kbert.model.bert import BertEncoder
    texts, texts_b = read_lines(input_path)
    features, truncated = readers.encode_texts(tokenizer, texts, texts_b, max_seq_length)
    if truncated:
        log.warning("%s: %d of %d lines were truncated to --max-seq-length %d", input_path, truncated,
                    len(texts), max_seq_length)
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    if not layers:
        pooled = keras.Model(encoder.input, encoder.output["pooled_output"]).predict(
            features, batch_size=opts.batch_size, verbose=0)
        for row in pooled:
            yield {"pooled_output": [round(float(v), 6) for v in row]}
        return
    n = len(encoder.transformer_layers)
    for index in layers:
        if not -n <= index < n:
            raise KbertError(f"--layers {index}: the model has {n} layers; use -{n}..{n - 1} (-1 = last)")
    outputs = [encoder.transformer_layers[i].output for i in layers]
    values = keras.Model(encoder.input, outputs).predict(features, batch_size=opts.batch_size, verbose=0)
    values = values if isinstance(values, list) else [values]
    ids = features["input_ids"]
    for row in range(len(texts)):
        length = int(features["input_mask"][row].sum())
        tokens = tokenizer.convert_ids_to_tokens(ids[row, :length].tolist())
        yield {"linex_index": row, "features": [
            {"token": token, "layers": [{"index": index, "values": [round(float(v), 6) for v in values[k][row, t]]}
                                        for k, index in enumerate(layers)]}
            for t, token in enumerate(tokens)]}


def read_lines(path):
    """extract_features.py's input: one text per line, `text_a ||| text_b` for pairs."""
    from kbert.files import require_path
    require_path(path, "input file", "pass a text file with one input per line")
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise KbertError(f"{path} is empty; put one text per line (text_a ||| text_b for pairs)")
    pairs = [line.split(" ||| ", 1) for line in lines]
    texts = [p[0] for p in pairs]
    texts_b = [p[1] if len(p) > 1 else "" for p in pairs] if any(len(p) > 1 for p in pairs) else None
    return texts, texts_b
