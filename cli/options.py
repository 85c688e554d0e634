"""The options several commands share, declared once so that each command says the same in --help,
and the one way a command hands its flags to the options dataclass of the same field names.

A shared option is an `Annotated` type: the command gives it its default, e.g.
`format: DataFormat = "auto"`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

FORMATS = "auto, csv, tsv, jsonl, or a GLUE layout: mrpc, cola, sst2, stsb, mnli, qnli, qqp, rte"

# The labelled or plain-text data of `kbert finetune`, `predict` and `evaluate`.
DataFormat = Annotated[str, typer.Option("--format", help=f"Data format: {FORMATS}.")]
SkipMalformedRows = Annotated[bool, typer.Option("--skip-bad-rows", help="Skip malformed rows instead of failing.")]

# The text files of the commands that read plain text (`kbert vocab`, `kbert create-data`): --input,
# then the files after it; the frame expands the globs, the same way on every runner.
GLOBBED_FILES = (
    "files or globs, quoted or not, comma-separated or repeated, or more files after it (--input data/*.txt)"
)
MoreInputs = Annotated[list[str] | None, typer.Argument(metavar="FILE", help="More input files.", show_default=False)]


def text_inputs(help: str):
    """The --input of a command that reads plain text, `help` saying what the text is."""
    return Annotated[list[str], typer.Option("--input", help=help)]


# The training precision of `kbert pretrain` and `kbert finetune`.
MixedPrecision = Annotated[
    bool,
    typer.Option(
        "--mixed-precision",
        help="Compute in 16 bits, keep the variables in float32: bfloat16, or float16 with loss scaling on GPUs "
        "older than the A100 (see --mixed-precision-dtype).",
    ),
]
MixedPrecisionDtype = Annotated[
    str,
    typer.Option(
        help="auto|bfloat16|float16: the 16-bit type of --mixed-precision, which naming one turns on (auto: "
        "bfloat16, or float16 with loss scaling on GPUs older than the A100).",
    ),
]


# The rows that `kbert predict`, `kbert rerank` and `kbert embed` write to --output.
JsonRowsOutput = Annotated[
    Path | None,
    typer.Option(
        "--output",
        help="Write the JSON lines to this file instead of stdout: batch by batch to FILE.partial, renamed to FILE "
        "at the end; resumable with --resume. - (or /dev/stdout) is stdout.",
    ),
]
ResumeRows = Annotated[
    bool,
    typer.Option(
        "--resume", help="With --output: go on from the rows FILE.partial has from a run that did not finish."
    ),
]
OverwriteRows = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="With --output: replace an existing FILE, or (without --resume) drop an unfinished run's rows.",
    ),
]

# What `kbert convert from-*` writes.
OutModelDir = Annotated[Path, typer.Argument(help="kbert model directory to write.")]


def options_from(options_class, flags: dict):
    """An options dataclass built from a command's flags (its `locals()`): each field that is a flag
    takes the flag's value, so a flag is declared once, in the signature, and never listed again;
    a field that is no flag keeps its default.

    Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Options:
    ...     epochs: int = 3
    ...     seed: int = 0
    ...     progress: bool = True
    >>> options_from(Options, {"epochs": 5, "seed": 1, "model_dir": "m"})
    Options(epochs=5, seed=1, progress=True)
    """
    fields = dataclasses.fields(options_class)
    return options_class(**{field.name: flags[field.name] for field in fields if field.name in flags})
