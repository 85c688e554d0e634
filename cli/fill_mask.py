"""`kbert fill-mask MODEL_DIR "text with [MASK]"`: the top-k tokens for each mask, the quick
eyeball check of a pretrained BERT."""

from __future__ import annotations

from pathlib import Path

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import ANY_MODEL, command
from kbert.formats.sources import ACCEPTED


@command(inputs={"model_dir": ANY_MODEL}, tensorflow="backend")
def fill_mask_command(
    model_dir: Path = typer.Argument(..., help=f"A model with a trained MLM head: {ACCEPTED}."),
    text: str = typer.Argument(..., help='Text with one or more [MASK], e.g. "the capital of france is [MASK]."'),
    top_k: int = typer.Option(5, min=1, help="Predictions per mask."),
):
    """Predict the tokens behind each [MASK]; prints one JSON object."""
    # Here, not at the top: it imports TensorFlow, which `kbert --help` should not wait for.
    from kbert.pretraining.fill_mask import fill_mask

    print_result(fill_mask(str(model_dir), text, top_k=top_k))
