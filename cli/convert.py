"""`kbert convert`: google-research/bert checkpoints, Hugging Face BERTs, TF Hub encoders and
keras-hub presets into kbert model directories and back."""

from __future__ import annotations

from pathlib import Path

import typer

import kbert
from kbert.cli.common import print_result
from kbert.cli.frame import (
    ANY_MODEL,
    DIR,
    HF_MODEL,
    JSON,
    KERAS_HUB_PRESET,
    MODEL,
    MODEL_OR_RUN,
    TEXT,
    TF1_CHECKPOINT,
    TFHUB_MODEL,
    command,
)
from kbert.cli.options import OutModelDir
from kbert.formats.sources import ACCEPTED as SOURCES

# The converters are imported inside each command, not here: they import TensorFlow, which
# `kbert --help` should not wait for.

FRESH_HEADS_HELP = (
    "Also write heads a converter created (random weights, listed in the model's fresh_heads); "
    "by default only trained weights are written."
)

app = typer.Typer(
    help="Move checkpoints between google-research/bert's TF1 format, Hugging Face "
    "safetensors, TF Hub SavedModels, keras-hub presets and kbert.",
    no_args_is_help=True,
)


@app.command("from-tf1")
@command(inputs={"src": TF1_CHECKPOINT, "config": JSON, "vocab": TEXT}, outputs={"out_model_dir": DIR})
def from_tf1(
    src: Path = typer.Argument(
        ..., help="Checkpoint directory (bert_config.json, vocab.txt, *.ckpt) or prefix like DIR/model.ckpt-20000."
    ),
    out_model_dir: OutModelDir = ...,
    config: Path | None = typer.Option(None, help="bert_config.json, if not beside the checkpoint."),
    vocab: Path | None = typer.Option(None, help="vocab.txt, if not beside the checkpoint."),
    lowercase: bool | None = typer.Option(
        None,
        "--lowercase/--no-lowercase",
        help="Uncased vocabulary? Default: guessed from the folder name (uncased/cased), else lowercase.",
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT_MODEL_DIR if it exists and is not empty."),
):
    """Convert a google-research/bert checkpoint into a kbert model directory."""
    from kbert.converters.tf1 import convert_tf1_checkpoint

    model, report = convert_tf1_checkpoint(
        src, config_file=config and str(config), vocab_file=vocab and str(vocab), do_lower_case=lowercase
    )
    save_converted(
        model,
        report,
        out_model_dir,
        overwrite,
        named=("checkpoint",),
        details=("skipped_optimizer_state", "global_step"),
    )


@app.command("to-tf1")
@command(inputs={"model_dir": MODEL}, outputs={"out_dir": DIR})
def to_tf1(
    model_dir: Path = typer.Argument(..., help=f"The model: {SOURCES}."),
    out_dir: Path = typer.Argument(..., help="Directory for bert_config.json, vocab.txt and bert_model.ckpt.*"),
    overwrite: bool = typer.Option(False, help="Replace OUT_DIR if it exists and is not empty."),
    include_fresh_heads: bool = typer.Option(False, "--include-fresh-heads", help=FRESH_HEADS_HELP),
):
    """Write a kbert model as a checkpoint the original google-research/bert code loads (a classifier
    with run_classifier.py's output_weights and output_bias); heads a converter created are left out."""
    from kbert.converters import save_tf1_checkpoint
    from kbert.converters.loading import heads_left_out, parameters_of
    from kbert.converters.tf1 import CKPT_PREFIX
    from kbert.formats.sources import open_model

    model = open_model(model_dir)
    left_out = heads_left_out(model, include_fresh_heads)
    save_tf1_checkpoint(model, out_dir, overwrite=overwrite, include_fresh_heads=include_fresh_heads)
    print_result(
        {
            "checkpoint": str(out_dir / CKPT_PREFIX),
            "parameters": parameters_of(model, left_out),
            "left_out_fresh_heads": list(left_out),
            "do_lower_case": model.do_lower_case,
        }
    )


@app.command("from-hf")
@command(inputs={"src": HF_MODEL}, outputs={"out_model_dir": DIR}, tensorflow="backend")
def from_hf(
    src: Path = typer.Argument(
        ...,
        help="Hugging Face BERT or ModernBERT directory (config.json, model.safetensors, vocab.txt or tokenizer.json), or its model.safetensors.",
    ),
    out_model_dir: OutModelDir = ...,
    lowercase: bool | None = typer.Option(
        None,
        "--lowercase/--no-lowercase",
        help="Uncased vocabulary? Default: do_lower_case from tokenizer_config.json, else lowercase.",
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT_MODEL_DIR if it exists and is not empty."),
):
    """Convert a Hugging Face BERT or ModernBERT (Ettin's encoders too; safetensors only; pickles are
    refused) into a kbert model directory; a sentence-transformers folder's pooling and normalisation
    are recorded for kbert embed, and a CrossEncoder of one output becomes a reranker (task rerank)."""
    from kbert.converters.hf import convert_hf_model

    model, report = convert_hf_model(src, do_lower_case=lowercase)
    save_converted(
        model, report, out_model_dir, overwrite, named=("source",), details=("skipped", "dtypes", "vocab_from")
    )


@app.command("to-hf")
@command(inputs={"model_dir": ANY_MODEL}, outputs={"out_dir": DIR}, tensorflow="backend")
def to_hf(
    model_dir: Path = typer.Argument(
        ...,
        help=f"The model (an encoder, a pretrainer, or a classifier or regressor: BertForSequenceClassification): {SOURCES}.",
    ),
    out_dir: Path = typer.Argument(
        ..., help="Directory for config.json, model.safetensors, vocab.txt, tokenizer_config.json."
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT_DIR if it exists and is not empty."),
    include_fresh_heads: bool = typer.Option(False, "--include-fresh-heads", help=FRESH_HEADS_HELP),
):
    """Write a kbert model as a Hugging Face BERT or ModernBERT that transformers' from_pretrained loads (a classifier
    as BertForSequenceClassification with its labels; a sentence-embedding model as a sentence-transformers
    folder too, a reranker as a CrossEncoder); heads a converter created are left out."""
    from kbert.converters.hf import WEIGHTS_FILE, save_hf_model
    from kbert.formats.sources import open_model

    model = open_model(model_dir)
    written = save_hf_model(model, out_dir, overwrite=overwrite, include_fresh_heads=include_fresh_heads)
    print_result(
        {
            "model": str(out_dir / WEIGHTS_FILE),
            "architecture": written["architecture"],
            "parameters": written["parameters"],
            "left_out_fresh_heads": written["left_out"],
            **({"do_lower_case": model.do_lower_case} if hasattr(model, "do_lower_case") else {}),
            # Written as a sentence-transformers folder too (modules.json, 1_Pooling, ...).
            **({"embedding": written["embedding"]} if written.get("embedding") else {}),
            # Written as a sentence-transformers CrossEncoder folder too (its activation and max_length).
            **({"rerank": written["rerank"]} if written.get("rerank") else {}),
        }
    )


@app.command("from-tfhub")
@command(inputs={"src": TFHUB_MODEL, "preprocessor": TFHUB_MODEL}, outputs={"out_model_dir": DIR})
def from_tfhub(
    src: Path = typer.Argument(
        ...,
        help="A TF Hub BERT encoder SavedModel directory (Model Garden's export_tfhub, or kbert export --format tfhub).",
    ),
    out_model_dir: OutModelDir = ...,
    preprocessor: Path | None = typer.Option(
        None, help="Its preprocessor SavedModel: the vocabulary and casing are read from there."
    ),
    lowercase: bool | None = typer.Option(
        None, "--lowercase/--no-lowercase", help="Uncased vocabulary? Default: what the SavedModels record."
    ),
    hidden_act: str | None = typer.Option(
        None, help="Override the activation: gelu_tanh (Model Garden's gelu) or gelu (exact erf)."
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT_MODEL_DIR if it exists and is not empty."),
):
    """Convert a TF Hub BERT encoder (read from its files, not run) into a kbert model directory."""
    from kbert.converters.tfhub import convert_tfhub_encoder

    model, report = convert_tfhub_encoder(
        src, preprocessor=preprocessor, do_lower_case=lowercase, hidden_act=hidden_act
    )
    save_converted(
        model,
        report,
        out_model_dir,
        overwrite,
        named=("source", "names"),
        details=("skipped", "hidden_act", "vocab_from"),
    )


@app.command("to-keras-hub")
@command(inputs={"model_dir": MODEL}, outputs={"out": DIR}, tensorflow="backend")
def to_keras_hub(
    model_dir: Path = typer.Argument(..., help=f"The model (encoder, pretraining model or classifier): {SOURCES}."),
    out: Path = typer.Argument(..., help="keras-hub preset directory to write."),
    overwrite: bool = typer.Option(False, help="Replace OUT if it exists and is not empty."),
):
    """Write a kbert model as a keras-hub BERT preset (BertBackbone.from_preset loads it); reports keras-hub's GELU difference."""
    from kbert.converters.keras_hub import save_keras_hub_preset

    result = save_keras_hub_preset(model_dir, out, overwrite=overwrite)
    print_result(result)


@app.command("from-keras-hub")
@command(inputs={"src": KERAS_HUB_PRESET}, outputs={"out_model_dir": DIR}, tensorflow="backend")
def from_keras_hub(
    src: Path = typer.Argument(..., help="A keras-hub BERT preset directory (as save_to_preset writes it)."),
    out_model_dir: OutModelDir = ...,
    lowercase: bool | None = typer.Option(
        None, "--lowercase/--no-lowercase", help="Uncased vocabulary? Default: the preset tokenizer's lowercase."
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT_MODEL_DIR if it exists and is not empty."),
):
    """Convert a keras-hub BertBackbone preset into a kbert model directory, exactly (hidden_act gelu_tanh)."""
    from kbert.converters.keras_hub import convert_keras_hub_preset

    model, report = convert_keras_hub_preset(src, do_lower_case=lowercase)
    save_converted(
        model, report, out_model_dir, overwrite, named=("source",), details=("hidden_act", "mlm_max_abs_difference")
    )


@app.command("inspect")
@command(inputs={"src": MODEL_OR_RUN}, tensorflow="backend")
def inspect_(
    src: Path = typer.Argument(
        ..., help=f"Any model kbert reads ({SOURCES}), or the folder of an unfinished pretrain or finetune run."
    ),
):
    """Show what a checkpoint or model directory holds: config, parameters, heads, optimizer slots, step."""
    from kbert.converters.inspect import describe

    print_result(describe(src))


def save_converted(model, report: dict, out_model_dir, overwrite: bool, named=(), details=()):
    """Save a converted model as a kbert model directory and print what the conversion did: where
    it came from (`named`), what was loaded and made fresh, the converter's `details`, the casing
    and where it was read, and a sentence-transformers folder's pooling."""
    kbert.save(model, out_model_dir, overwrite=overwrite)  # the model declares its vocabulary and casing
    if report.get("family") == "modernbert":  # a byte-level BPE: no casing to report
        print_result(
            {
                "model_dir": str(out_model_dir),
                **{k: report[k] for k in named},
                "family": report["family"],
                "architecture": report["architecture"],
                "parameters": int(model.count_params()),
                "weights_loaded": report["loaded"],
                "fresh_heads": report["fresh_heads"],
                "dtypes": report["dtypes"],
                **({"embedding": report["embedding"]} if report.get("embedding") else {}),
                **({"rerank": report["rerank"]} if report.get("rerank") else {}),
            }
        )
        return
    print_result(
        {
            "model_dir": str(out_model_dir),
            **{k: report[k] for k in named},
            "parameters": int(model.count_params()),
            "weights_loaded": report["loaded"],
            "fresh_heads": report["fresh_heads"],
            **{k: report[k] for k in details if k in report},
            "do_lower_case": model.do_lower_case,
            **{k: report[k] for k in ("do_lower_case_from",) if k in report},
            # A sentence-transformers folder's pooling and normalisation, which kbert embed uses.
            **({"embedding": report["embedding"]} if report.get("embedding") else {}),
            # A CrossEncoder's activation and max_length, which kbert predict and rerank use.
            **({"rerank": report["rerank"]} if report.get("rerank") else {}),
        }
    )
