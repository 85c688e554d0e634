"""`kbert vocab`: learn a WordPiece vocab.txt from text, for kbert's tokenizer and create-data."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kbert.cli.common import print_result


def vocab(
    input: List[Path] = typer.Option(..., "--input", help="Text files to learn from. Repeat --input, or list more files after it (--input data/*.txt)."),
    more_inputs: Optional[List[Path]] = typer.Argument(None, metavar="FILE", help="More input files.", show_default=False),
    output: Path = typer.Option(..., "--output", help="vocab.txt to write."),
    size: int = typer.Option(30522, help="Entries at most, the 5 reserved tokens included (the learner lands within 5% below)."),
    lowercase: bool = typer.Option(True, "--lowercase/--no-lowercase", help="Uncased (lower-case, strip accents) or cased vocabulary."),
    overwrite: bool = typer.Option(False, help="Replace OUTPUT if it exists."),
):
    """Learn a WordPiece vocabulary; prints its size and [UNK] rate on the text as JSON."""
    # Here, not at the top: it imports TensorFlow (the learner is tensorflow-text's), which
    # `kbert --help` should not wait for.
    from kbert.text.vocab_builder import build_vocab

    print_result(build_vocab([*input, *(more_inputs or [])], output, size=size, do_lower_case=lowercase,
                             overwrite=overwrite))
