"""`kbert predict / evaluate`: a fine-tuned model's predictions and scores, an encoder's features,
or the predictions of a model TF Serving serves (`--server`), from the shell.

The library is imported inside each command, not at the top: `kbert --help` and a mistyped
flag should answer at once, without waiting for TensorFlow."""

from __future__ import annotations

from pathlib import Path

import typer

from kbert.cli.common import print_result, put_rows
from kbert.cli.frame import ANY_MODEL, FILE_OR_STREAM, TEXT, command
from kbert.cli.options import DataFormat, JsonRowsOutput, OverwriteRows, ResumeRows, SkipMalformedRows


# long: one typer option per flag, as --help lists them, then the choice of a local or a served model
@command(
    inputs={"model_dir": ANY_MODEL, "input": TEXT},
    outputs={"output": FILE_OR_STREAM},
    above_zero=("timeout",),
    tensorflow="backend",
)
def predict(
    model_dir: Path | None = typer.Argument(
        None,
        help="A fine-tuned model (directory or .keras file), or any encoder or pretrained model source kbert reads, for its features; a sentence-embedding model gives each text's embedding, as kbert embed does. Leave out with --server.",
    ),
    input: Path = typer.Option(
        ...,
        "--input",
        help="Same formats as finetune (labels optional); for encoders, one text per line (a ||| b for pairs).",
    ),
    server: str | None = typer.Option(
        None,
        "--server",
        help="Predict with a model TF Serving serves instead: HOST:PORT (gRPC) or http://HOST:PORT (REST). Needs TensorFlow.",
    ),
    model: str | None = typer.Option(None, "--model", help="With --server: the model's name on the server."),
    layers: str | None = typer.Option(
        None, help="Encoders: per-token features of these layers, e.g. -1,-2,-3,-4 (extract_features.py)."
    ),
    batch_size: int = typer.Option(32, min=1, help="Examples per batch (per request with --server)."),
    max_seq_length: int | None = typer.Option(None, min=3, help="Default: the length the model was fine-tuned with."),
    format: DataFormat = "auto",
    skip_bad_rows: SkipMalformedRows = False,
    output: JsonRowsOutput = None,
    resume: ResumeRows = False,
    overwrite: OverwriteRows = False,
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

    from kbert.runtime.errors import KbertError

    if output is None and (resume or overwrite):
        raise KbertError(f"{'--resume' if resume else '--overwrite'} applies to an --output file; give --output FILE")
    if server is None and model_dir is None:
        raise KbertError(
            "give MODEL_DIR to predict with a local model, or --server HOST:PORT --model NAME "
            "for one that TF Serving serves"
        )
    # How the input is read and batched: the same for a local and a served model.
    reading = dict(batch_size=batch_size, max_seq_length=max_seq_length, format=format, skip_bad_rows=skip_bad_rows)
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
        from kbert.cli.common import import_tensorflow_quietly

        # The served model's heads and requests are TensorFlow's (kbert.serving), whatever the backend.
        import_tensorflow_quietly("kbert predict --server")
        from kbert.serving.client import Client
        from kbert.serving.predict import predict_served, served_options

        options = served_options(**reading)
        client = Client(server, model, timeout=timeout, retries=retries)

        def rows(start):
            return predict_served(client, input, options, start=start)
    else:
        if model:
            raise KbertError(f"--model {model} names a served model; use it with --server, or drop it")
        from kbert.finetuning.predict import predict as predict_rows

        def rows(start):
            return predict_rows(str(model_dir), str(input), layers=layers, start=start, **reading)

    def made_by():
        from kbert.finetuning.output import model_identity

        served = {"server": server, "model": model} if server is not None else None
        return {
            "model": served or model_identity(model_dir),
            "layers": layers,
            "max_seq_length": max_seq_length,
            "format": format,
            "skip_bad_rows": skip_bad_rows,
        }

    put_rows(rows, output, resume=resume, overwrite=overwrite, source=input, made_by=made_by)


@command(inputs={"model_dir": ANY_MODEL, "input": TEXT}, tensorflow="backend")
def evaluate(
    model_dir: Path = typer.Argument(
        ...,
        help="A model directory written by kbert finetune, or a sentence-embedding model (any source kbert reads).",
    ),
    input: Path = typer.Option(
        ...,
        "--input",
        help="Labelled data in the format the model was trained on; embedding models: pairs (query, document), "
        'each query ranked against every document of the file; rerankers: JSON Lines with "query", "documents" '
        '(in a first stage\'s order) and "positive" (the relevant ones), scored before and after reranking.',
    ),
    task: str | None = typer.Option(
        None,
        "--task",
        help="embed: score a model without a task head as an embedding model (one with an embedding record needs no "
        "flag). A fine-tuned model is scored for its own task (rerank: MAP, MRR@10, NDCG@10, recall@1).",
    ),
    pooling: str | None = typer.Option(
        None, help="embed: cls | mean | max | mean_sqrt_len; default the model's embedding record."
    ),
    batch_size: int = typer.Option(32, min=1, help="Examples per batch."),
    format: DataFormat = "auto",
    skip_bad_rows: SkipMalformedRows = False,
):
    """Score a fine-tuned model on labelled data; prints one JSON object of metrics (embedding models: recall@1,
    recall@10, mrr@10, ndcg@10)."""
    from kbert.finetuning.predict import evaluate as evaluate_model

    reading = dict(batch_size=batch_size, format=format, skip_bad_rows=skip_bad_rows)
    print_result(evaluate_model(str(model_dir), str(input), task=task, pooling=pooling, **reading))
