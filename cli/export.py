"""`kbert export MODEL_DIR EXPORT_BASE`: a SavedModel for TF Serving that takes raw text."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import ANY_MODEL, DIR_IN_PLACE, TEXT, command
from kbert.formats.sources import ACCEPTED
from kbert.runtime.errors import KbertError
from kbert.runtime.files import check_apart


# The serving export writes EXPORT_BASE in place (a new version beside the others); --format tfhub
# replaces it whole, so that branch also refuses a base that holds the model.
# long: one typer option per flag, as --help lists them; the body is a few calls
@command(
    inputs={"model_dir": ANY_MODEL, "calibration": TEXT}, outputs={"export_base": DIR_IN_PLACE}, tensorflow="keras"
)
def export(
    model_dir: Path = typer.Argument(..., help=f"The model (converted, pretrained or fine-tuned): {ACCEPTED}."),
    export_base: Path = typer.Argument(
        ..., help="The directory TF Serving watches (--model_base_path); the export goes to EXPORT_BASE/VERSION."
    ),
    version: int | None = typer.Option(None, "--version", min=0, help="Version number (default: the next free one)."),
    max_seq_length: int | None = typer.Option(
        None, min=3, help="Tokens per request; longer texts are truncated (default: the fine-tuning length, else 128)."
    ),
    name: str | None = typer.Option(None, "--name", help="Model name in models.config (default: EXPORT_BASE's name)."),
    text_pairs: bool | None = typer.Option(
        None,
        "--text-pairs/--single-text",
        help="Whether serving_default takes text_b (default: as the model was fine-tuned: a classifier or regressor "
        "fine-tuned on pairs takes text and text_b, one fine-tuned on single texts text only; one that records "
        "neither, text_b too; other models text only).",
    ),
    precision: str = typer.Option(
        "float32",
        help="float32 (exact), bfloat16 (faster on CPUs with AVX512-BF16 or AMX) or int8 (the encoder's matmuls in int8, "
        "faster on CPUs with VNNI or AMX); both slightly off float32's outputs (the README's Results section; "
        "--calibration measures by how much on your texts).",
    ),
    export_format: str = typer.Option(
        "serving",
        "--format",
        help="serving: a TF Serving version under EXPORT_BASE. tfhub: EXPORT_BASE/encoder and "
        "EXPORT_BASE/preprocessor, TF Hub's BERT SavedModels (hub.KerasLayer, TFSMLayer).",
    ),
    constant_weights: bool = typer.Option(
        False,
        "--constant-weights",
        help="Weights as graph constants, not variables: faster for bfloat16 at batch 1, but the server holds "
        "several times the memory and loads several times slower.",
    ),
    max_windows: int | None = typer.Option(
        None,
        "--max-windows",
        min=1,
        help="For a model fine-tuned with --long-text windows (served whole, in windows): the most windows a "
        "request may take in all; a request that needs more fails with an error saying so (default: 64).",
    ),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        help="For --precision int8 or bfloat16: real texts (one per line, or a CSV, TSV or JSON Lines table with a "
        "text column) on which the export's drift from float32 is measured: the float32 export of the same model is "
        "made in a temporary directory, both are served on the same texts, and the report is printed and recorded "
        "in the export (assets.extra/kbert_drift.json). Without it the drift is not measured.",
    ),
    calibration_texts: int | None = typer.Option(
        None,
        "--calibration-texts",
        min=1,
        help="How many texts of --calibration to use (default: the first 200, or all if fewer); a file with fewer "
        "texts than asked is refused.",
    ),
    max_drift: float | None = typer.Option(
        None,
        "--max-drift",
        min=0.0,
        help="With --calibration: refuse to write an export whose drift passes this. The drift is 0 for float32's "
        "outputs and grows as they part: embedding models and encoders 1 - the smallest cosine to float32's "
        "vectors; classifiers 1 - the share of texts whose label_id agrees with float32's; taggers the same per "
        "real token; regressors the largest absolute error of score.",
    ),
    int8_ranges: str = typer.Option(
        "per-row",
        "--int8-ranges",
        help="How --precision int8 quantizes each dense layer's input: per-row (each token on its own scale, on "
        "every request; no calibration needed) or calibrated (on fixed ranges measured on the --calibration texts "
        "at export, the GELU inside the int8 kernel: fewer ops per request; the second feed-forward matmul stays "
        "per row, where that is more accurate).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing version (tfhub: an existing EXPORT_BASE)."
    ),
):
    """Export a model for TF Serving (serving_default, serve_ids, serve_examples; classify or regress), or in
    TF Hub's BERT format with --format tfhub; prints JSON."""
    from kbert.serving.export import BATCHING_PARAMETERS, MODELS_CONFIG, export_model, exported_signatures
    from kbert.serving.signatures import holds_no_variables, signature_inputs
    from kbert.serving.tfhub import export_tfhub

    if export_format == "tfhub":
        for flag, value in (
            ("--version", version),
            ("--name", name),
            ("--text-pairs/--single-text", text_pairs),
            ("--constant-weights", constant_weights or None),
            ("--max-windows", max_windows),
            ("--calibration", calibration),
            ("--calibration-texts", calibration_texts),
            ("--max-drift", max_drift),
            ("--int8-ranges", None if int8_ranges == "per-row" else int8_ranges),
        ):
            if value is not None:
                raise KbertError(
                    f"{flag} is for TF Serving exports; --format tfhub takes --max-seq-length and --overwrite"
                )
        if precision != "float32":
            raise KbertError(
                "--format tfhub writes float32 (TF Hub encoders are fine-tuned, not served); leave out --precision"
            )
        check_apart(export_base, [model_dir])  # replaced whole
        result = export_tfhub(str(model_dir), str(export_base), max_seq_length=max_seq_length, overwrite=overwrite)
        # The preprocessor's tokenizer is tensorflow_text's ops: loading it without them fails.
        print_result({**result, "load_with": _load_with(result["preprocessor"])})
        return
    if export_format != "serving":
        raise KbertError(f"--format {export_format!r}: choose serving or tfhub")

    # The base is written in place (a new version beside the others, models.config), never replaced.
    path = export_model(
        str(model_dir),
        str(export_base),
        version=version,
        max_seq_length=max_seq_length,
        overwrite=overwrite,
        name=name,
        text_pairs=text_pairs,
        precision=precision,
        constant_weights=constant_weights,
        max_windows=max_windows,
        calibration=calibration,
        calibration_texts=calibration_texts,
        max_drift=max_drift,
        int8_ranges=int8_ranges,
    )
    base = os.path.dirname(path)
    print_result(
        {
            "export": path,
            "version": int(os.path.basename(path)),
            "precision": precision,
            **({"int8_ranges": int8_ranges} if precision == "int8" else {}),
            "constant_weights": holds_no_variables(path),
            "signatures": exported_signatures(path),
            "serving_default_inputs": signature_inputs(path),  # what a client sends: text, and text_b for pairs
            **_windows_info(path),
            **_drift_info(path),
            "model_config_file": os.path.join(base, MODELS_CONFIG),
            "batching_parameters_file": os.path.join(base, BATCHING_PARAMETERS),
            # Its tokenizer is tensorflow_text's ops (TF Serving links them in): plain TensorFlow
            # loads the export only once they are registered.
            "load_with": _load_with(path),
        }
    )


def _load_with(path) -> str:
    """How plain Python loads a SavedModel whose graph holds tensorflow_text's ops."""
    return f"import tensorflow as tf, tensorflow_text; tf.saved_model.load({str(path)!r})"


def _windows_info(path) -> dict:
    """A windows export's long_text, doc_stride and max_windows (nothing for other exports)."""
    import json

    from kbert.serving.export import WINDOWS_INFO

    info_file = os.path.join(path, WINDOWS_INFO)
    if not os.path.exists(info_file):
        return {}
    with open(info_file) as f:
        info = json.load(f)
    return {k: info[k] for k in ("long_text", "doc_stride", "max_windows")}


def _drift_info(path) -> dict:
    """{"drift": the report} of an export measured on calibration texts (nothing for others)."""
    import json

    from kbert.serving.export import DRIFT_INFO

    info_file = os.path.join(path, DRIFT_INFO)
    if not os.path.exists(info_file):
        return {}
    with open(info_file) as f:
        return {"drift": json.load(f)}
