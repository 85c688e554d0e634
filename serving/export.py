"""`export_model`: a kbert model directory -> a TF Serving SavedModel that takes raw text.

`EXPORT_BASE/<version>/` holds the SavedModel (`saved_model.pb`, `variables/`,
`assets/vocab.txt`, `assets.extra/tf_serving_warmup_requests`); `EXPORT_BASE/models.config`
and `EXPORT_BASE/batching_parameters.txt` are the files `tensorflow_model_server` reads
(`kbert.serving.models_config` writes them). Tokenization runs inside the graph
(`BertPreprocessor`, the original tokenizer's ids), so a client sends strings and needs
neither kbert nor the vocabulary.

Three signatures for TF Serving's Predict API (`tensorflow/serving/predict`), with the same outputs:

- `serving_default`: string `text` [batch] (and `text_b` for sentence-pair models);
- `serve_ids`: int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq], already tokenized;
- `serve_examples`: serialized `tf.Example`s [batch] named `examples`, with bytes features
  `text` (and `text_b`).

And one for TF Serving's Classify or Regress API, which check the method name and the keys:
classifiers get `classify` (`tensorflow/serving/classify`: `inputs` serialized tf.Examples as
above -> `classes` [batch, C] label strings and `scores` [batch, C]); regressors get `regress`
(`tensorflow/serving/regress`: `inputs` -> `outputs` [batch]).

Outputs by model (each task's head in `kbert.serving.heads`): encoders and pretrained
models `pooled_output`, `sequence_output`, `input_mask`; classifiers `probabilities`,
`label_id`, `label`; regressors `score`; taggers per-token `label_id`, `label` and
`input_mask`, and from `serving_default`/`serve_examples` also `word_label` [batch, words]: the
tag of each whitespace-separated word of `text` (on its first WordPiece, as `kbert predict`
tags CoNLL words; "" past a sentence's words). Multiple-choice models take `text` [batch] and
`endings` [batch, choices] strings (`serve_ids`: [batch, choices, seq] ids; `serve_examples`:
a bytes feature `endings` with one value per ending) and give `probabilities` [batch, choices]
and `label_id`. A sentence-embedding model (its bert_config.json records its pooling) gives
`embedding` [batch, H]: each text's vector, as `kbert embed` computes it. Floats are float32 and pass through
`tf.debugging.check_numerics`, so a NaN fails the request instead of being served.

A model fine-tuned with `--long-text windows` is served whole: the text signatures cut each
document into its windows in the graph and answer once per document, with the same keys
(`kbert.serving.heads.serve_windows`), at most `max_windows` windows per request; `serve_ids`
answers per window.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re

import keras
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from kbert.backend.tensorflow_compat import write_export_archive
from kbert.config import sequence_length
from kbert.finetuning.options import window_stride
from kbert.finetuning.tasks import get_task, head_task
from kbert.formats.sources import open_model
from kbert.model.embedding_record import embedding_of
from kbert.model.families import encoder_of, graph_packer, ids_file
from kbert.model.kinds import HEAD_KINDS, model_kind
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import atomic_output_dir, writes
from kbert.serving.drift import BATCH as DRIFT_BATCH
from kbert.serving.drift import check_drift, measure_drift, read_calibration
from kbert.serving.heads import (
    API_METHODS,
    MAX_WINDOWS,
    ServingHead,
    require_served,
    serve_embedding,
    serve_encoder,
    serve_windows,
    serving_head,
)
from kbert.serving.int8 import VNNI_FLAGS, cpu_int8_instructions, require_int8_matmul

# Names of this module from before their code moved, which `kbert export` imports from here.
from kbert.serving.models_config import (  # noqa: F401
    BATCHING_PARAMETERS,
    MODELS_CONFIG,
    configured_name,
    write_batching_parameters,
    write_models_config,
)
from kbert.serving.optimize import measure_int8_ranges, optimize
from kbert.serving.signatures import (
    exported_signatures,  # noqa: F401
    set_method_name,
)

log = logging.getLogger("kbert")

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
PRECISIONS = ("float32", "bfloat16", "int8")
# How an int8 export quantizes each dense layer's input (`export_model`'s int8_ranges).
INT8_RANGES = ("per-row", "calibrated")
# Representative warmup requests: TF Serving runs them at load so that the first real request
# does not pay for graph set-up; one per batch shape that a client typically sends.
WARMUP_TEXTS = (
    ["Hello, world!"],
    ["The quick brown fox jumps over the lazy dog.", "A second sentence in the same batch."],
    [" ".join(["a long request that will be truncated"] * 100)],
)


def _next_version(export_base: str) -> int:
    versions = (
        [int(name) for name in os.listdir(export_base) if re.fullmatch(r"\d+", name)]
        if os.path.isdir(export_base)
        else []
    )
    return max(versions, default=0) + 1


def _serving_head(
    model, task_info, text_pairs, constant_weights=False, int8=False, windows=None, calibrate=None
) -> ServingHead:
    """How to serve `model`: encoders serve their outputs, fine-tuned models their task's head
    (`kbert.serving.heads`), whole documents in windows if `windows` is (stride, max_windows)
    (`serve_windows`). Either way the model runs as `kbert.serving.optimize` rewrites it
    (on each batch's longest text, Q, K and V as one matmul, LayerNorms in few ops), with its
    weights as graph constants if `constant_weights` and its dense layers in int8 if `int8`:
    on input ranges measured by `calibrate` (the served model -> its ranges) if given, else per row."""

    def serving(m):
        ranges = calibrate(m) if calibrate is not None else None
        return optimize(m, constant_weights=constant_weights, int8=int8, int8_ranges=ranges)

    if model_kind(model) not in HEAD_KINDS:  # an encoder, or a pretrained model
        if embedding_of(model) is not None:  # a sentence-embedding model serves its vectors
            return serve_embedding(model, serving, text_pairs)
        return serve_encoder(serving(encoder_of(model)), bool(text_pairs))
    task = task_info.get("task")
    if task is None:  # a head saved without fine-tuning metadata: its kind says which task
        task = head_task(model_kind(model), getattr(model, "num_classes", 0)).name
    require_served(task)  # before the model is rewritten for serving
    served = serving(model)
    head = serving_head(task, served, task_info.get("labels"), task_info)
    if windows is not None:
        if text_pairs:
            raise KbertError(
                "this model reads long documents in windows, one text each (long_text windows): leave out "
                f"{option('text_pairs', True, flag='--text-pairs')}; join a pair into one text"
            )
        return serve_windows(task, head, served, task_info.get("labels"), *windows)
    if get_task(task).text_pairs:
        # finetune records "text_pairs"; directories from before it did may get pairs.
        pairs = bool(task_info.get("text_pairs", True)) if text_pairs is None else text_pairs
        head = head._replace(text_inputs={"text": 1, "text_b": 1} if pairs else {"text": 1})
    return head


def _warmup_requests(path: str, name: str, text_inputs: dict, fits=lambda texts: True):
    """A TFRecord of PredictionLog protos: `serving_default` requests TF Serving replays at load
    (those that `fits`: a warmup request the model refuses would stop it from loading)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for texts in filter(fits, WARMUP_TEXTS):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=name, signature_name="serving_default")
            )
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts, dtype=tf.string))
            for extra, rank in list(text_inputs.items())[1:]:  # text_b: one more text; endings: a list
                value = (
                    [["ends here.", "goes on and on."]] * len(texts)
                    if rank == 2
                    else ["And its second text."] * len(texts)
                )
                request.inputs[extra].CopyFrom(tf.make_tensor_proto(value, dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


WINDOWS_INFO = os.path.join("assets.extra", "kbert_windows.json")


def _fits_windows(preprocessor, stride, max_windows):
    """Whether a warmup request's texts take at most `max_windows` windows."""

    def fits(texts):
        _, starts = preprocessor.pack_windows(tf.constant(texts), stride)
        return int(tf.size(starts.flat_values)) <= max_windows

    return fits


def _write_windows_info(path, length, stride, max_windows):
    """What a windows export serves, for whoever reads the export: windows of `length` tokens
    `stride` apart, at most `max_windows` per request (TF Serving ignores the file)."""
    info = {"long_text": "windows", "max_seq_length": length, "doc_stride": stride, "max_windows": max_windows}
    with open(os.path.join(path, WINDOWS_INFO), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


@writes("export_base", inputs=("model_dir", "calibration"), in_place=True)
def export_model(
    model_dir,
    export_base,
    version: int | None = None,
    max_seq_length: int | None = None,
    overwrite: bool = False,
    name: str | None = None,
    text_pairs: bool | None = None,
    precision: str = "float32",
    constant_weights: bool = False,
    max_windows: int | None = None,
    calibration=None,
    calibration_texts: int | None = None,
    max_drift: float | None = None,
    int8_ranges: str = "per-row",
) -> str:
    """Export a kbert model directory for TF Serving; returns the path of `EXPORT_BASE/<version>`.

    The version directory is built in a temporary directory inside `export_base` and renamed
    into place, so TF Serving (which only loads all-digit names) never sees a half-written one.

    Args:
        model_dir: str. A kbert model directory (converted, pretrained or fine-tuned), or a
            google-research checkpoint directory (converted on the fly).
        export_base: str. The directory TF Serving watches (`--model_base_path`).
        version: int. The version number; default: one more than the highest there, or 1.
        max_seq_length: int. Tokens per request (longer texts are truncated); default: the
            length the model was fine-tuned with, else 128, capped at max_position_embeddings.
        overwrite: bool. Replace an existing version directory.
        name: str. The model name in models.config; default: the base name of `export_base`.
        text_pairs: bool. Whether `serving_default` takes `text_b`; default: as the model was
            fine-tuned (`kbert finetune` records `text_pairs`): a classifier or regressor
            fine-tuned on pairs takes `text_b` (an empty one is a single text, as in
            run_classifier.py), one fine-tuned on single texts takes `text` only, one saved
            without the record takes `text_b` too; other models take `text` only.
        precision: str. "float32" (the trained model's numbers); "bfloat16": weights and
            matmuls in bfloat16: faster on CPUs with AVX512-BF16 or AMX, with outputs slightly off
            float32's (softmax and LayerNorm statistics stay in float32; the outputs are float32);
            or "int8": the encoder's dense layers as oneDNN int8 matmuls (`kbert.serving.int8`),
            fast on CPUs with VNNI (AVX512-VNNI, AVX-VNNI or AMX), the rest float32. Speed and
            differences measured in docs/performance.md and docs/serving.md.
        constant_weights: bool. Put the weights in the graph as constants instead of variables
            (up to `kbert.serving.optimize.CONSTANT_WEIGHTS_MAX_BYTES`): oneDNN then keeps their
            reordered layout, faster for a bfloat16 export at batch 1, but the serving process
            holds several times the memory and loads slower; a float32 export got slower on
            texts of varied lengths. Measured in docs/performance.md; see docs/serving.md.
        max_windows: int. For a model fine-tuned with `--long-text windows`, which the export
            serves whole documents in windows: the most windows a request may take in all
            (default MAX_WINDOWS); a request that needs more fails with an error that says so.
            Ignored, with a warning, for other models.
        calibration: str. A file of real texts (one per line, or a CSV, TSV or JSON Lines table
            with a `text` column) on which an int8 or bfloat16 export's drift from float32 is
            measured (`kbert.serving.drift`): the float32 export of the same model is made in a
            temporary directory and both are served on the same texts. The report is recorded
            in the export (DRIFT_INFO). Without it, the drift is not measured.
        calibration_texts: int. How many texts of `calibration` to use (default: up to
            `kbert.serving.drift.CALIBRATION_TEXTS`); a file with fewer is refused.
        max_drift: float. Refuse to write the export if its drift passes this
            (`kbert.serving.drift.DRIFT_IS` says what the drift is for each kind of model).
        int8_ranges: str. How int8 quantizes each dense layer's input: "per-row" (each token on
            its own scale, every request), or "calibrated": on ranges measured on `calibration`
            (`_calibrated_ranges`; docs/serving.md).

    Example:
    >>> path = export_model("out/classifier", "exports/sentiment")  # doctest: +SKIP
    >>> path  # doctest: +SKIP
    '/abs/exports/sentiment/1'
    """
    # --- setup: where the version goes, checked before the model is opened ---
    model_dir, export_base = os.fspath(model_dir), os.path.abspath(os.fspath(export_base))
    if precision not in PRECISIONS:
        raise KbertError(f"{option('precision', precision)}: choose {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
    path, version, name = _version_dir(export_base, version, overwrite, name)
    if max_windows is not None and max_windows < 1:
        raise KbertError(f"{option('max_windows', max_windows)}: a request needs at least 1 window; give 1 or more")
    int8 = precision == "int8"
    if int8:
        require_int8_matmul()
    calibration_set = _calibration_set(precision, calibration, calibration_texts, max_drift, int8_ranges)

    # --- the model, in the export's precision, and how it is served ---
    model = _open_in_precision(model_dir, "float32" if int8 else precision)  # int8 quantizes the float32 model
    task_info = getattr(model, "task_info", None) or {}
    # A sentence-embedding model's texts keep the tokens its record says, as in kbert embed.
    recorded = task_info.get("max_seq_length") or (embedding_of(model) or {}).get("max_seq_length")
    length = sequence_length(max_seq_length, model.config.max_position_embeddings, recorded)
    if length < 3:
        raise KbertError(f"{option('max_seq_length', length)} must be at least 3 ([CLS] x [SEP])")
    preprocessor = graph_packer(model, length)
    windows = None
    if task_info.get("long_text") == "windows" and not hasattr(preprocessor, "pack_windows"):
        raise KbertError(
            f"{model_dir} reads long documents in windows (long_text windows), which its tokenizer cannot cut "
            f"inside the graph yet; serve it with `kbert predict`, or fine-tune it with "
            f"{option('long_text', 'truncate')} to export it"
        )
    if task_info.get("long_text") == "windows":
        # Whole documents, in the windows the model was fine-tuned on (kbert.serving.heads.serve_windows).
        windows = (window_stride(task_info.get("doc_stride"), length), max_windows or MAX_WINDOWS)
    elif max_windows is not None:  # it would go unread: a mistake, refused as every such option is
        raise KbertError(
            f"{option('max_windows')} applies to models fine-tuned with `kbert finetune --long-text windows`; "
            f"{model_dir} truncates long texts: drop {option('max_windows')}"
        )
    calibrate = _calibrated_ranges(int8_ranges, preprocessor, calibration_set)
    head = _serving_head(model, task_info, text_pairs, constant_weights, int8, windows, calibrate)
    if calibration_set is not None:
        _check_calibration_fits(head, calibration, calibration_set)
    _warn_without_int8_instructions(int8)  # after the checks above: a refusal stays one line

    # --- the signatures ---
    archive = _archive(head, preprocessor, ids_file(model), windows, _id_names(preprocessor))

    # --- finish: the version directory, renamed into place whole, and TF Serving's files ---
    os.makedirs(export_base, exist_ok=True)
    with atomic_output_dir(path, overwrite=overwrite) as tmp:
        write_export_archive(archive, tmp)  # each signature traced once
        if head.api:
            set_method_name(tmp, head.api, API_METHODS[head.api])
        fits = (lambda texts: True) if windows is None else _fits_windows(preprocessor, *windows)
        _warmup_requests(os.path.join(tmp, WARMUP_FILE), name, head.text_inputs, fits)
        if windows is not None:
            _write_windows_info(tmp, length, *windows)
        if calibration_set is not None:
            # int8 quantizes the float32 model it opened: that model is the reference as it is.
            reference = model if int8 else _open_in_precision(model_dir, "float32")
            reference_archive = _float32_archive(reference, task_info, text_pairs, windows, length)
            ranges = int8_ranges if int8 else None
            _record_drift(tmp, reference_archive, precision, calibration, calibration_set, max_drift, ranges)
    write_models_config(export_base, name, version)
    write_batching_parameters(export_base)
    return path


def _id_names(preprocessor) -> list:
    """serve_ids' input names: the keys of a first call's features (which also builds the
    preprocessor, so that ExportArchive may track it)."""
    return list(preprocessor((tf.constant(["warm up"]), tf.constant(["b"]))))


def _calibration_set(precision: str, calibration, count, max_drift, int8_ranges="per-row"):
    """The calibration texts (texts, texts_b), checked against the options, or None without
    --calibration."""
    _check_int8_ranges(int8_ranges, precision, calibration)
    if max_drift is not None and max_drift < 0:
        raise KbertError(f"{option('max_drift', max_drift)}: a drift is 0 or more; give 0 or a positive limit")
    if calibration is None:
        for name, value in (("max_drift", max_drift), ("calibration_texts", count)):
            if value is not None:
                raise KbertError(
                    f"{option(name)} applies to the drift measured on {option('calibration')}: pass a file of "
                    f"real texts with {option('calibration')}, or drop {option(name)}"
                )
        return None
    if precision == "float32":
        raise KbertError(
            f"{option('calibration')} measures an int8 or bfloat16 export's drift from float32; a float32 "
            f"export is float32: pass {option('precision', 'int8')} (or bfloat16), or drop {option('calibration')}"
        )
    if count is not None and count < 1:
        raise KbertError(f"{option('calibration_texts', count)}: use 1 text or more")
    return read_calibration(os.fspath(calibration), count)


def _check_calibration_fits(head: ServingHead, calibration, texts):
    """Refuse calibration texts the export's serving_default cannot take as they are."""
    if "endings" in head.text_inputs:
        raise KbertError(
            f"a multiple-choice export takes endings with each text, which a calibration file does not "
            f"hold: leave out {option('calibration')}"
        )
    if texts[1] is not None and "text_b" not in head.text_inputs:
        raise KbertError(
            f"{calibration} holds sentence pairs (text_b), and this export takes one text per row: pass a file "
            f"of single texts to {option('calibration')}"
        )


def _float32_archive(model, task_info, text_pairs, windows, length):
    """The archive of `model`'s float32 export with the same options: the drift's reference."""
    preprocessor = graph_packer(model, length)
    head = _serving_head(model, task_info, text_pairs, windows=windows)
    return _archive(head, preprocessor, ids_file(model), windows, _id_names(preprocessor))


DRIFT_INFO = os.path.join("assets.extra", "kbert_drift.json")


def _record_drift(path: str, reference_archive, precision: str, calibration, texts, max_drift, int8_ranges=None):
    """Measure the export written at `path` against the float32 `reference_archive` (written to
    a temporary directory, removed after), record the report at DRIFT_INFO (TF Serving ignores
    the file), and refuse a drift past `max_drift`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kbert-float32-reference-") as reference:
        write_export_archive(reference_archive, reference)
        report = measure_drift(reference, path, *texts)
    info = {
        "precision": precision,
        **({"int8_ranges": int8_ranges} if int8_ranges else {}),
        "reference": "float32",
        "calibration": os.path.abspath(os.fspath(calibration)),
        **report,
        "max_drift": max_drift,
    }
    check_drift(info, max_drift, precision)
    with open(os.path.join(path, DRIFT_INFO), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


def _version_dir(export_base: str, version: int | None, overwrite: bool, name: str | None):
    """(EXPORT_BASE/<version>, version, model name), checked: a directory base, a free version
    (the next one by default), a name TF Serving takes."""
    if os.path.isfile(export_base):
        raise KbertError(f"{export_base} is a file; EXPORT_BASE must be a directory (TF Serving's --model_base_path)")
    if version is None:
        version = _next_version(export_base)
    if version < 0:
        raise KbertError(f"{option('version', version)}: TF Serving versions are non-negative integers")
    path = os.path.join(export_base, str(version))
    if os.path.exists(path) and not overwrite:
        raise KbertError(
            f"{path} already exists; pass {option('version')} with a new number, leave it out for "
            f"the next free one ({_next_version(export_base)}), or pass {option('overwrite', True)}"
        )
    name = name or configured_name(export_base) or os.path.basename(export_base)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise KbertError(f"model name {name!r} must be letters, digits, '_', '-' or '.'; pass {option('name')}")
    return path, version, name


def _check_int8_ranges(int8_ranges: str, precision: str, calibration):
    if int8_ranges not in INT8_RANGES:
        raise KbertError(f"{option('int8_ranges', int8_ranges)}: choose {' or '.join(INT8_RANGES)}")
    if int8_ranges == "calibrated" and precision != "int8":
        raise KbertError(
            f"{option('int8_ranges', 'calibrated')} sets how int8 quantizes: pass {option('precision', 'int8')}, "
            f"or drop {option('int8_ranges')}"
        )
    if int8_ranges == "calibrated" and calibration is None:
        raise KbertError(
            f"{option('int8_ranges', 'calibrated')} measures its ranges on real texts: pass a file of them with "
            f"{option('calibration')}"
        )


def _calibrated_ranges(int8_ranges: str, preprocessor, texts):
    """None for per-row int8 (or no int8); for "calibrated", the function that measures a served
    model's int8 input ranges on the calibration texts (`_measured_int8_ranges`): fixed ranges,
    the GELU inside the int8 kernel, fewer ops per request; the second feed-forward matmul, whose
    input is a GELU's output, stays per row, as it is more accurate there
    (`kbert.serving.optimize.measure_int8_ranges`)."""
    if int8_ranges != "calibrated":
        return None
    return functools.partial(_measured_int8_ranges, preprocessor=preprocessor, texts=texts)


def _measured_int8_ranges(served_model, preprocessor, texts) -> dict:
    """The int8 input ranges of `served_model` on the calibration texts (texts, texts_b), packed
    by the export's own preprocessor, BATCH texts a call, shortest first (as the export groups)."""
    texts, texts_b = texts
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]) + (len(texts_b[i]) if texts_b else 0))
    batches = []
    for start in range(0, len(order), DRIFT_BATCH):
        part = order[start : start + DRIFT_BATCH]
        inputs = tf.constant([texts[i] for i in part])
        if texts_b:
            inputs = (inputs, tf.constant([texts_b[i] for i in part]))
        batches.append({k: v.numpy() for k, v in preprocessor(inputs).items()})
    return measure_int8_ranges(served_model, batches)


def _warn_without_int8_instructions(int8: bool):
    """For an int8 export, a warning on a CPU without int8 dot products, where its matmuls run slowly."""
    if int8 and not cpu_int8_instructions():
        log.warning(
            "this CPU has no int8 dot-product instructions (%s): int8 matmuls run at a fraction of their "
            "speed here; the export is made for CPUs that have them (to serve on one without, start the "
            "server with TF_ENABLE_ONEDNN_OPTS=1, as the README's Serving section says)",
            ", ".join(VNNI_FLAGS),
        )


def _open_in_precision(model_dir, policy: str):
    """The model, opened once (its vocabulary, casing and task come with it), with `policy` as
    its variables' dtype as well as its compute's."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        return open_model(model_dir)
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _archive(head: ServingHead, preprocessor, vocab_file: str, windows, id_names):
    """A `keras.export.ExportArchive` holding the tokenizer's tables and the signatures: serving_default,
    serve_ids, serve_examples, and the head's Classify or Regress API signature if it has one."""

    # Packing is traced once per input form and shared by every signature that packs text: the
    # tokenizer's graph is large, and tracing it for each signature made exports much slower.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def pack_single(text):
        return preprocessor(text)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def pack_pair(text, text_b):
        # A row whose text_b has no tokens is packed as a single text, as run_classifier.py does.
        return preprocessor((text, text_b))

    def pack(text, text_b=None):
        return pack_single(text) if text_b is None else pack_pair(text, text_b)

    # The same for documents packed in windows: every text signature of a windows model calls these.
    packer = _WindowPackingTracedOnce(preprocessor) if windows else preprocessor

    archive = keras.export.ExportArchive()
    # The model's variables are not tracked here: add_endpoint saves every variable the signatures
    # use, and tracking the model as well saved each weight a second time (Keras' own variables
    # beside the tf.Variables they wrap), which made a BERT-base export twice its size.
    archive.track(preprocessor)  # its tokenizer's vocabulary lookup table
    # The tokenizer's table is built from the vocabulary in memory (the exact load_vocab
    # semantics: stripped lines, the last id of a repeated token). This id -> token table
    # reads the vocabulary from the SavedModel's assets, which puts vocab.txt there for clients
    # (a ModernBERT's tokenizer.json: a table of its lines, there for the same reason).
    archive.track(
        tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                vocab_file,
                tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER,
                tf.string,
                tf.lookup.TextFileIndex.WHOLE_LINE,
            ),
            default_value="[UNK]",
        )
    )
    _add_signatures(archive, head, pack, packer, id_names)
    return archive


def _add_signatures(archive, head: ServingHead, pack, packer, id_names):
    """The export's signatures, each calling the head's outputs on text packed by `pack` (single
    texts and pairs) or `packer` (documents in windows)."""
    outputs = head.outputs
    names = list(head.text_inputs)  # "text", then "text_b" or "endings" (see the task's ServingHead)

    def text_outputs(strings):
        if head.text_outputs is not None:
            return head.text_outputs(strings, pack, packer)
        return outputs(pack(strings["text"], strings.get("text_b")))

    # serving_default takes the head's string inputs, in order; their names are the TensorSpecs'.
    if len(names) == 1:

        def serve_text(text):
            return text_outputs({names[0]: text})
    else:

        def serve_text(text, second):
            return text_outputs({names[0]: text, names[1]: second})

    text_signature = [tf.TensorSpec([None] * rank, tf.string, name=name) for name, rank in head.text_inputs.items()]

    if len(id_names) == 3:

        def serve_ids(input_ids, input_mask, segment_ids):
            return outputs({"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids})
    else:  # a model without segment ids (ModernBERT)

        def serve_ids(input_ids, input_mask):
            return outputs({"input_ids": input_ids, "input_mask": input_mask})

    def parse_examples(examples):
        # One bytes feature per input: `text` required, a second text "" when absent, and a
        # list input (endings) with one value per item.
        spec = {
            name: tf.io.RaggedFeature(tf.string)
            if rank == 2
            else tf.io.FixedLenFeature([], tf.string, default_value=None if name == "text" else "")
            for name, rank in head.text_inputs.items()
        }
        strings = tf.io.parse_example(examples, spec)
        return {
            name: value.to_tensor("") if isinstance(value, tf.RaggedTensor) else value
            for name, value in strings.items()
        }

    def serve_examples(examples):
        return text_outputs(parse_examples(examples))

    def serve_api(inputs):
        strings = parse_examples(inputs)
        if head.api_text_outputs is not None:
            return head.api_text_outputs(strings, pack, packer)
        return head.api_outputs(pack(strings["text"], strings.get("text_b")))

    archive.add_endpoint("serving_default", serve_text, text_signature)
    archive.add_endpoint(
        "serve_ids",
        serve_ids,
        [tf.TensorSpec([None] * head.ids_rank, tf.int32, name=n) for n in id_names],
    )
    archive.add_endpoint("serve_examples", serve_examples, [tf.TensorSpec([None], tf.string, name="examples")])
    if head.api:
        archive.add_endpoint(head.api, serve_api, [tf.TensorSpec([None], tf.string, name="inputs")])


class _WindowPackingTracedOnce:
    """`preprocessor` with its window packing as tf.functions: traced once for all the signatures
    that call them, instead of once each.

    Every other attribute is the preprocessor's own.
    """

    def __init__(self, preprocessor):
        self._preprocessor = preprocessor
        self.pack_windows = tf.function(preprocessor.pack_windows)
        self.pack_word_windows = tf.function(preprocessor.pack_word_windows)

    def __getattr__(self, name):
        return getattr(self._preprocessor, name)
