"""`kbert embed MODEL --input FILE`: one sentence vector per text, in input order."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from kbert.cli.common import print_result, print_rows
from kbert.cli.frame import ANY_MODEL, FILE_OR_STREAM, TEXT, command
from kbert.cli.options import OverwriteRows, ResumeRows
from kbert.formats.sources import ACCEPTED
from kbert.runtime.files import is_stream

OUTPUT_FORMATS = ("jsonl", "npy")


# long: one typer option per flag, as --help lists them, then the output's format
@command(inputs={"model_dir": ANY_MODEL, "input": TEXT}, outputs={"output": FILE_OR_STREAM}, tensorflow="backend")
def embed(
    model_dir: Path = typer.Argument(
        ...,
        help=f"A sentence-embedding model (converted from sentence-transformers by kbert convert from-hf, or the "
        f"sentence-transformers folder itself), or any BERT with --pooling: {ACCEPTED}.",
    ),
    input: Path = typer.Option(
        ...,
        "--input",
        help='The texts: one per line (blank lines skipped), or a CSV/TSV/JSONL table\'s "text" column, as predict '
        'reads it (an empty cell is the text "", embedded as sentence-transformers embeds it).',
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        help="Write the vectors to this file instead of stdout. jsonl: batch by batch to FILE.partial, renamed to "
        "FILE at the end; resumable with --resume. - (or /dev/stdout) is stdout.",
    ),
    format: str = typer.Option(
        "jsonl",
        "--format",
        help='jsonl: one JSON object per text, its vector as "embedding". npy: one float32 array [texts, dimensions] '
        "(needs --output).",
    ),
    batch_size: int = typer.Option(32, min=1, help="Texts per batch (texts of similar length run together)."),
    max_seq_length: int | None = typer.Option(
        None, min=3, help="Tokens per text, [CLS] and [SEP] included. Default: the model's, else 128."
    ),
    long_text: str = typer.Option(
        "truncate",
        "--long-text",
        help="truncate: keep each text's first tokens. windows: read a longer text whole, in overlapping "
        "windows, and average their vectors (then normalise, if the model does).",
    ),
    doc_stride: int | None = typer.Option(
        None, min=1, help="--long-text windows: tokens between two windows' starts. Default: half a window."
    ),
    pooling: str | None = typer.Option(
        None,
        "--pooling",
        help="cls | mean | max | mean_sqrt_len. Default: the model's (a sentence-transformers model records it); "
        "needed for any other BERT.",
    ),
    normalize: bool | None = typer.Option(
        None,
        "--normalize/--no-normalize",
        help="L2-normalise each vector. Default: the model's (no, for a model with no pooling recorded).",
    ),
    resume: ResumeRows = False,
    overwrite: OverwriteRows = False,
):
    """Embed texts with a sentence-embedding model; prints one JSON vector per text (with --output, writes
    them to FILE and prints a summary)."""
    from kbert.runtime.errors import KbertError

    if format not in OUTPUT_FORMATS:
        raise KbertError(f"--format {format}: give jsonl or npy")
    if output is None and (resume or overwrite):
        raise KbertError(f"{'--resume' if resume else '--overwrite'} applies to an --output file; give --output FILE")
    if format == "npy" and (output is None or is_stream(output)):
        raise KbertError("--format npy writes one array to a file: give --output FILE.npy")
    if format == "npy" and resume:
        raise KbertError("--resume applies to --format jsonl; an npy file is written whole at the end, so run again")
    if output is not None and is_stream(output) and (resume or overwrite):
        raise KbertError(
            f"--output {output} is a stream, which has no rows to resume or replace; drop "
            f"{'--resume' if resume else '--overwrite'}, or give a file path"
        )
    from kbert.finetuning.embedding import embed_file, json_vector

    settings = dict(
        batch_size=batch_size,
        max_seq_length=max_seq_length,
        pooling=pooling,
        normalize=normalize,
        long_text=long_text,
        doc_stride=doc_stride,
    )
    if format == "npy":
        path = os.path.realpath(output) if os.path.islink(output) else os.fspath(output)  # a link is written through
        if os.path.exists(path) and not overwrite:
            raise KbertError(f"{path} exists; pass --overwrite to replace it, or choose another --output")
        vectors, _ = embed_file(str(model_dir), str(input), **settings)
        print_result(_save_npy(path, vectors))
        return

    def rows(start):
        vectors, _ = embed_file(str(model_dir), str(input), start, **settings)
        return ({"embedding": json_vector(vector)} for vector in vectors)

    if output is not None and not is_stream(output):
        from kbert.finetuning.output import model_identity, write_rows

        # What shapes a vector besides the text: a resume with any other is refused.
        made_by = {"model": model_identity(model_dir), **{k: v for k, v in settings.items() if k != "batch_size"}}
        print_result(write_rows(output, rows, resume=resume, overwrite=overwrite, source=input, made_by=made_by))
        return
    print_rows(rows(0), output)


def _save_npy(path: str, vectors) -> dict:
    """Write the vectors as one float32 array, atomically: FILE is the whole array or untouched."""
    import numpy as np

    from kbert.runtime.files import sweep_stale_temporaries, temporary_name

    array = np.stack(list(vectors))  # an input has at least one text (readers refuse an empty file)
    sweep_stale_temporaries(path)
    temp = temporary_name(path)
    try:
        with open(temp, "xb") as f:
            np.save(f, array.astype(np.float32, copy=False))
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return {"output": path, "rows": int(array.shape[0]), "dimensions": int(array.shape[1])}
