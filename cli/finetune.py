"""`kbert finetune / predict / evaluate`: fine-tuned heads for classification, regression,
tagging, SQuAD and multiple choice, from the shell.

The library is imported inside each command, not at the top: `kbert --help` and a mistyped
flag should answer at once, without waiting for TensorFlow."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import DIR, FILE_OR_STREAM, MODEL, TEXT, command
from kbert.finetuning.options import FinetuneOptions
from kbert.outputs import is_stream

# Each fine-tuning flag's default is the FinetuneOptions field's.
DEFAULTS = FinetuneOptions()

FORMATS = "auto, csv, tsv, jsonl, or a GLUE layout: mrpc, cola, sst2, stsb, mnli, qnli, qqp, rte"


@command(
    inputs={"model_dir": MODEL, "train": TEXT, "dev": TEXT}, outputs={"output": DIR}, above_zero=("learning_rate",)
)
def finetune(
    model_dir: Path = typer.Argument(
        ...,
        help="The pretrained model: any source kbert reads (a kbert model directory, .keras file, google-research checkpoint, Hugging Face folder, TF Hub SavedModel or keras-hub preset).",
    ),
    task: str = typer.Option(..., "--task", help="classify | regress | tag | squad | choice."),
    train: Path = typer.Option(
        ...,
        "--train",
        help="Training data: CSV/TSV/JSONL with text[,text_b],label; a GLUE TSV; CoNLL (tag); SQuAD JSON (squad); SWAG CSV (choice).",
    ),
    output: Path = typer.Option(..., "--output", help="Output: the fine-tuned kbert model directory."),
    dev: Path | None = typer.Option(
        None, "--dev", help="Dev data, same format: scored after each epoch; the best epoch is kept."
    ),
    epochs: int = typer.Option(DEFAULTS.epochs, min=1, help="Training epochs."),
    batch_size: int = typer.Option(DEFAULTS.batch_size, min=1, help="Global batch size (split over replicas)."),
    learning_rate: float = typer.Option(
        DEFAULTS.learning_rate, min=0, help="Peak learning rate (the paper used 2e-5..5e-5)."
    ),
    max_seq_length: int | None = typer.Option(
        DEFAULTS.max_seq_length,
        min=3,
        help="Tokens per example (per context + ending for choice; default 128, 384 for squad).",
    ),
    warmup_proportion: float = typer.Option(
        DEFAULTS.warmup_proportion, min=0, max=1, help="Share of steps with linear warmup (run_classifier.py's 0.1)."
    ),
    seed: int = typer.Option(DEFAULTS.seed, min=0, help="Seed for the head's initial weights, dropout and data order."),
    mixed_precision: bool = typer.Option(
        DEFAULTS.mixed_precision, "--mixed-precision", help="bfloat16 on CPU, float16 with loss scaling on GPU."
    ),
    strategy: str = typer.Option(DEFAULTS.strategy, help="auto | cpu | gpu | mirrored."),
    patience: int | None = typer.Option(
        DEFAULTS.patience, min=0, help="Early stopping: stop after N epochs without a better dev score."
    ),
    format: str = typer.Option(DEFAULTS.format, "--format", help=f"Data format: {FORMATS}."),
    skip_bad_rows: bool = typer.Option(
        DEFAULTS.skip_bad_rows, "--skip-bad-rows", help="Skip rows with missing or extra columns instead of failing."
    ),
    long_text: str = typer.Option(
        DEFAULTS.long_text,
        "--long-text",
        help="classify, regress, tag: truncate texts past --max-seq-length (the original's way), or windows: read "
        "each document whole in overlapping windows, each trained with its document's label (its words' tags); "
        "predict and evaluate then answer once per document (recorded in the model). Single texts only.",
    ),
    doc_stride: int | None = typer.Option(
        DEFAULTS.doc_stride,
        min=1,
        help="Tokens between the starts of two windows. squad: over long contexts (default 128, run_squad.py's); "
        "--long-text windows: less than --max-seq-length - 2 (default half of that, 63 at 128).",
    ),
    max_query_length: int = typer.Option(DEFAULTS.max_query_length, min=1, help="squad: question tokens kept."),
    n_best_size: int = typer.Option(
        DEFAULTS.n_best_size, min=1, help="squad: candidate spans considered per question."
    ),
    max_answer_length: int = typer.Option(DEFAULTS.max_answer_length, min=1, help="squad: longest answer, in tokens."),
    null_score_diff_threshold: float = typer.Option(
        DEFAULTS.null_score_diff_threshold,
        help="squad v2: predict no answer when null score - best span score exceeds this.",
    ),
    overwrite: bool = typer.Option(
        DEFAULTS.overwrite,
        "--overwrite",
        help="Replace an existing --output directory (or an unfinished run's OUTPUT.partial).",
    ),
    resume: bool = typer.Option(
        DEFAULTS.resume,
        "--resume",
        help="Continue the unfinished run in OUTPUT.partial (killed, preempted or interrupted) from its last checkpoint.",
    ),
    save_every: int = typer.Option(
        DEFAULTS.save_every,
        min=1,
        help="Steps between checkpoints in OUTPUT.partial (one is also written at each epoch's end).",
    ),
):
    """Fine-tune BERT on a labelled file; prints the best epoch's dev metrics as JSON.

    SIGTERM or Ctrl-C saves a checkpoint after the batch in flight; --resume continues from it."""
    from kbert.finetuning.train import finetune as finetune_model

    options = FinetuneOptions(
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        max_seq_length=max_seq_length,
        warmup_proportion=warmup_proportion,
        seed=seed,
        mixed_precision=mixed_precision,
        strategy=strategy,
        patience=patience,
        format=format,
        skip_bad_rows=skip_bad_rows,
        long_text=long_text,
        doc_stride=doc_stride,
        max_query_length=max_query_length,
        n_best_size=n_best_size,
        max_answer_length=max_answer_length,
        null_score_diff_threshold=null_score_diff_threshold,
        overwrite=overwrite,
        resume=resume,
        save_every=save_every,
    )
    result = finetune_model(str(model_dir), task, str(train), str(output), dev=dev and str(dev), options=options)
    print_result(result)


@command(inputs={"model_dir": MODEL, "input": TEXT}, outputs={"output": FILE_OR_STREAM}, above_zero=("timeout",))
def predict(
    model_dir: Path | None = typer.Argument(
        None,
        help="A fine-tuned model (directory or .keras file), or any encoder or pretrained model source kbert reads, for its features. Leave out with --server.",
    ),
    input: Path = typer.Option(
        ...,
        "--input",
        help="Same formats as finetune (labels optional); for encoders, one text per line (a ||| b for pairs).",
    ),
    server: str | None = typer.Option(
        None,
        "--server",
        help="Predict with a model TF Serving serves instead: HOST:PORT (gRPC) or http://HOST:PORT (REST).",
    ),
    model: str | None = typer.Option(None, "--model", help="With --server: the model's name on the server."),
    layers: str | None = typer.Option(
        None, help="Encoders: per-token features of these layers, e.g. -1,-2,-3,-4 (extract_features.py)."
    ),
    batch_size: int = typer.Option(32, min=1, help="Examples per batch (per request with --server)."),
    max_seq_length: int | None = typer.Option(None, min=3, help="Default: the length the model was fine-tuned with."),
    format: str = typer.Option("auto", "--format", help=f"Data format: {FORMATS}."),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Skip malformed rows instead of failing."),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Write the JSON lines to this file instead of stdout: batch by batch to FILE.partial, renamed to FILE at the end; resumable with --resume. - (or /dev/stdout) is stdout.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="With --output: go on from the rows FILE.partial has from a run that did not finish."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="With --output: replace an existing FILE, or (without --resume) drop an unfinished run's rows.",
    ),
    timeout: float = typer.Option(
        60.0, min=0, help="With --server: seconds one request may take, retries while the server is down included."
    ),
    retries: int = typer.Option(
        10,
        min=0,
        help="With --server: times a request is retried while the server is unavailable (back-off 0.1 s doubling to 10 s).",
    ),
):
    """Predict; prints one JSON object per input example (with --output, writes them to FILE and prints a summary)."""

    from kbert.errors import KbertError

    if output is None and (resume or overwrite):
        raise KbertError(f"{'--resume' if resume else '--overwrite'} applies to an --output file; give --output FILE")
    if server is None and model_dir is None:
        raise KbertError(
            "give MODEL_DIR to predict with a local model, or --server HOST:PORT --model NAME "
            "for one that TF Serving serves"
        )
    if server is not None:
        if model_dir is not None:
            raise KbertError(f"give either MODEL_DIR ({model_dir}) or --server ({server}), not both")
        if not model:
            raise KbertError(f"--server {server} needs --model NAME: the name the server serves the model under")
        if layers is not None:
            raise KbertError(
                "--layers applies to a local model (the served model returns its export's outputs); "
                "pass MODEL_DIR instead of --server to get per-layer features"
            )
        if max_seq_length is not None:
            raise KbertError(
                "--max-seq-length applies to a local model; the served model's export fixed it "
                "(kbert export --max-seq-length)"
            )
        from kbert.serving.client import Client
        from kbert.serving.predict import predict_served

        client = Client(server, model, timeout=timeout, retries=retries)

        def rows(start):
            return predict_served(
                client, input, batch_size=batch_size, format=format, skip_bad_rows=skip_bad_rows, start=start
            )
    else:
        if model:
            raise KbertError(f"--model {model} names a served model; use it with --server, or drop it")
        from kbert.finetuning.predict import predict as predict_rows

        wanted = None
        if layers:
            try:
                wanted = [int(x) for x in layers.split(",")]
            except ValueError:
                raise KbertError(f"--layers {layers!r}: give comma-separated layer indexes, e.g. -1,-2") from None

        def rows(start):
            return predict_rows(
                str(model_dir),
                str(input),
                layers=wanted,
                batch_size=batch_size,
                max_seq_length=max_seq_length,
                format=format,
                skip_bad_rows=skip_bad_rows,
                start=start,
            )

    if output is not None and not is_stream(output):
        from kbert.finetuning.output import write_rows

        print_result(write_rows(output, rows, resume=resume, overwrite=overwrite, source=input))
        return
    if output is not None and (resume or overwrite):
        raise KbertError(
            f"--output {output} is a stream, which has no rows to resume or replace; drop "
            f"{'--resume' if resume else '--overwrite'}, or give a file path"
        )
    _print_rows(rows(0), output)


def _print_rows(rows, output):
    """Each row as a JSON line on stdout (or the stream --output names), as it is predicted."""
    import json

    from kbert.errors import Interrupted

    stream = sys.stdout if output is None or str(output) == "-" else open(output, "w", encoding="utf-8")
    printed = 0
    try:
        for row in rows:
            stream.write(json.dumps(row) + "\n")
            printed += 1
        stream.flush()
    except (Interrupted, KeyboardInterrupt) as stop:
        how = str(stop).split(";")[0] if isinstance(stop, Interrupted) else "interrupted"
        code = stop.exit_code if isinstance(stop, Interrupted) else 130
        raise Interrupted(f"{how} after printing {printed} rows", code) from None
    finally:
        if stream is not sys.stdout:
            stream.close()


@command(inputs={"model_dir": MODEL, "input": TEXT})
def evaluate(
    model_dir: Path = typer.Argument(..., help="A model directory written by kbert finetune."),
    input: Path = typer.Option(..., "--input", help="Labelled data in the format the model was trained on."),
    batch_size: int = typer.Option(32, min=1, help="Examples per batch."),
    format: str = typer.Option("auto", "--format", help=f"Data format: {FORMATS}."),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="Skip malformed rows instead of failing."),
):
    """Score a fine-tuned model on labelled data; prints one JSON object of metrics."""
    from kbert.finetuning.predict import evaluate as evaluate_model

    print_result(
        evaluate_model(str(model_dir), str(input), batch_size=batch_size, format=format, skip_bad_rows=skip_bad_rows)
    )
