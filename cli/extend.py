"""`kbert extend MODEL_DIR OUT`: a new model directory, grown from a model (more positions)."""

from __future__ import annotations

from pathlib import Path

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import DIR, MODEL, command


@command(inputs={"model_dir": MODEL}, outputs={"out": DIR})
def extend(
    model_dir: Path = typer.Argument(
        ...,
        help="A kbert model directory (encoder, pretrained or fine-tuned), a .keras file, or a google-research checkpoint.",
    ),
    out: Path = typer.Argument(..., help="The kbert model directory to write: the same kind of model, grown."),
    max_position_embeddings: int | None = typer.Option(
        None,
        "--max-position-embeddings",
        min=1,
        help="Positions of the new model, more than it has: its learned rows are copied again and again "
        "(Longformer's recipe), so texts that fit the old positions give the same outputs. Then continue "
        "pretraining: kbert pretrain --init OUT --max-seq-length N.",
    ),
    lowercase: bool | None = typer.Option(
        None,
        "--lowercase/--no-lowercase",
        help="Uncased vocabulary? Default: what the model records (a google-research checkpoint: its folder name).",
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT if it exists and is not empty."),
):
    """Grow a model into a new model directory: more positions with --max-position-embeddings; prints JSON."""
    from kbert.extend import extend as extend_model

    result = extend_model(
        model_dir, out, max_position_embeddings=max_position_embeddings, do_lower_case=lowercase, overwrite=overwrite
    )
    print_result(result)
