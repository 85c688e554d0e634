"""`kbert extend MODEL_DIR OUT`: a new model directory, grown from a model (more positions, more words)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from kbert.cli.common import bytes_progress, print_result
from kbert.cli.frame import DIR, MODEL, TEXT, TEXT_FILES, command
from kbert.formats.sources import ACCEPTED

# Not imported from kbert.extend: `kbert extend --help` would pay for TensorFlow.
DEFAULT_MIN_COUNT = 5


@command(inputs={"model_dir": MODEL, "words": TEXT, "corpus": TEXT_FILES}, outputs={"out": DIR}, tensorflow="backend")
def extend(
    model_dir: Path = typer.Argument(
        ...,
        help=f"The model (encoder, pretrained or fine-tuned): {ACCEPTED}.",
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
    words: Path | None = typer.Option(
        None,
        "--words",
        help="Words to add, one a line, each one word to the model's tokenizer (no spaces or punctuation) and "
        "not in its vocabulary. They take the [unusedN] slots first, then new ids; each new row starts as the "
        "mean of the pieces the word was split into.",
    ),
    corpus: list[str] | None = typer.Option(
        None,
        "--corpus",
        help="Text files or globs (comma-separated or repeated): add the --max-new words that save the most "
        "tokens in them (occurrences × pieces saved, under the model's own tokenizer).",
    ),
    max_new: int | None = typer.Option(None, "--max-new", min=1, help="With --corpus: words to add at most."),
    min_count: int = typer.Option(
        DEFAULT_MIN_COUNT, "--min-count", min=1, help="With --corpus: occurrences a word needs to be chosen."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the words --words/--corpus would add and the tokens they save; write nothing."
    ),
    lowercase: bool | None = typer.Option(
        None,
        "--lowercase/--no-lowercase",
        help="Uncased vocabulary? Default: what the model records (a google-research checkpoint: its folder name).",
    ),
    overwrite: bool = typer.Option(False, help="Replace OUT if it exists and is not empty."),
):
    """Grow a model into a new model directory: more positions, more words, or both; prints JSON."""
    from kbert.extend import choose_words
    from kbert.extend import extend as extend_model
    from kbert.runtime.errors import KbertError

    if dry_run and not words and not corpus:
        raise KbertError(
            "--dry-run shows the words that --words FILE or --corpus FILES --max-new N would add: pass one"
        )
    # The words to add: the same choice for --dry-run and for the model it writes.
    choice = dict(words_file=words, corpus=corpus or (), max_new=max_new, min_count=min_count, do_lower_case=lowercase)
    with corpus_progress() as on_progress:
        if dry_run:
            result = choose_words(model_dir, **choice, on_progress=on_progress)
        else:
            result = extend_model(
                model_dir,
                out,
                max_position_embeddings=max_position_embeddings,
                overwrite=overwrite,
                on_progress=on_progress,
                **choice,
            )
    print_result(result)


@contextlib.contextmanager
def corpus_progress():
    """A callback that shows the corpus count's bytes, rate and time left on a terminal's stderr."""
    progress = bytes_progress("counting words")
    with progress:
        task = progress.add_task("corpus", total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)
