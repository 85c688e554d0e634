"""`kbert rerank`: each query's candidate documents scored by a reranker and ordered, from the shell.

The library is imported inside the command, not at the top: `kbert --help` and a mistyped flag
should answer at once, without waiting for TensorFlow."""

from __future__ import annotations

from pathlib import Path

import typer

from kbert.cli.common import put_rows
from kbert.cli.frame import ANY_MODEL, FILE_OR_STREAM, TEXT, command
from kbert.cli.options import JsonRowsOutput, OverwriteRows, ResumeRows, SkipMalformedRows


@command(
    inputs={"model_dir": ANY_MODEL, "input": TEXT, "candidates_from": ANY_MODEL, "corpus": TEXT},
    outputs={"output": FILE_OR_STREAM},
    tensorflow="backend",
)
def rerank(
    model_dir: Path = typer.Argument(
        ...,
        help="A reranker: a model fine-tuned with kbert finetune --task rerank, or a sentence-transformers "
        "CrossEncoder (converted by kbert convert from-hf, or its folder).",
    ),
    input: Path = typer.Option(
        ...,
        "--input",
        help='JSON Lines, one object per query with "query" (a string) and "documents" (a list of strings: what '
        "a first stage found).",
    ),
    output: JsonRowsOutput = None,
    top_k: int | None = typer.Option(
        None, "--top-k", min=1, help="The document indexes each ranking keeps, best first. Default: all."
    ),
    batch_size: int = typer.Option(32, min=1, help="Query-document pairs per batch (across queries)."),
    max_seq_length: int | None = typer.Option(
        None, min=3, help="Tokens per pair. Default: the length the model was trained with."
    ),
    candidates_from: Path | None = typer.Option(
        None,
        "--candidates-from",
        metavar="EMBED_MODEL",
        help="Find each query's candidates first with this sentence-embedding model, in --corpus: the input's rows "
        'then need only "query", and each answer starts with "candidates", the corpus texts\' indexes (0-based, '
        "blank lines not counted) that its scores and ranking follow.",
    ),
    corpus: Path | None = typer.Option(
        None,
        "--corpus",
        help="With --candidates-from: the documents, one per line (blank lines skipped), or a table's text column.",
    ),
    k: int | None = typer.Option(
        None, "--k", min=1, help="With --candidates-from: candidates per query (default 100)."
    ),
    skip_bad_rows: SkipMalformedRows = False,
    resume: ResumeRows = False,
    overwrite: OverwriteRows = False,
):
    """Rerank each query's documents; prints one JSON object per query: "scores" in the documents' order, and
    "ranking", the document indexes best first (with --output, writes them to FILE and prints a summary)."""
    from kbert.runtime.errors import KbertError, option

    if output is None and (resume or overwrite):
        flag = option("resume" if resume else "overwrite")
        raise KbertError(f"{flag} applies to an {option('output')} file; give {option('output')} FILE")
    from kbert.finetuning.predict import rerank_file

    reading = dict(batch_size=batch_size, max_seq_length=max_seq_length, skip_bad_rows=skip_bad_rows)

    first_stage = dict(candidates_from=candidates_from and str(candidates_from), corpus=corpus and str(corpus), k=k)

    def rows(start):
        return rerank_file(str(model_dir), str(input), top_k=top_k, start=start, **first_stage, **reading)

    def made_by():
        from kbert.finetuning.output import model_identity

        first = {"candidates_from": candidates_from and model_identity(candidates_from), "k": k}
        corpus_path = corpus and str(corpus.resolve())
        shaping = {"max_seq_length": max_seq_length, "skip_bad_rows": skip_bad_rows}
        return {"model": model_identity(model_dir), "top_k": top_k, **first, "corpus": corpus_path, **shaping}

    put_rows(rows, output, resume=resume, overwrite=overwrite, source=input, made_by=made_by)
