"""`kbert vocab`: learn a WordPiece vocab.txt from text, for kbert's tokenizer and create-data."""

from __future__ import annotations

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import FILE, TEXT_FILES, command
from kbert.cli.options import GLOBBED_FILES, MoreInputs, text_inputs

Inputs = text_inputs(f"Text files to learn from: {GLOBBED_FILES}.")


@command(inputs={"input": TEXT_FILES, "more_inputs": TEXT_FILES}, outputs={"output": FILE})
def vocab(
    input: Inputs = ...,
    more_inputs: MoreInputs = None,
    output: str = typer.Option(..., "--output", help="vocab.txt to write."),
    size: int = typer.Option(
        30522, min=1, help="Entries at most, the 5 reserved tokens included (the learner lands within 5% below)."
    ),
    lowercase: bool = typer.Option(
        True, "--lowercase/--no-lowercase", help="Uncased (lower-case, strip accents) or cased vocabulary."
    ),
    overwrite: bool = typer.Option(False, help="Replace OUTPUT if it exists."),
    runner: str = typer.Option(
        "local",
        help="local, or an Apache Beam runner that counts the words (DirectRunner, "
        "DaskRunner, DataflowRunner, FlinkRunner, SparkRunner, ...; pip install 'kbert[beam]').",
    ),
    pipeline_options: str = typer.Option("", help="Beam's own flags as one string, passed to PipelineOptions."),
):
    """Learn a WordPiece vocabulary; prints its size and [UNK] rate on the text as JSON."""
    # Here, not at the top: it imports TensorFlow (the learner is tensorflow-text's), which
    # `kbert --help` should not wait for.
    from kbert.runtime.errors import KbertError
    from kbert.text.vocab_builder import build_vocab

    word_counts = None
    if runner != "local":
        try:
            from kbert.text.vocab_pipeline import beam_word_counts
        except ImportError:
            raise KbertError(f"--runner {runner} needs Apache Beam: pip install 'kbert[beam]'") from None

        def word_counts(files, do_lower_case):
            return beam_word_counts(files, output, do_lower_case, runner=runner, flags=pipeline_options)
    elif pipeline_options:
        raise KbertError("--pipeline-options are Beam's; pass --runner DirectRunner (or another Beam runner) too")
    if "://" in output:
        raise KbertError(
            f"--output {output}: vocab.txt is written on this machine; give a local path "
            f"(and copy it where it is needed)"
        )
    inputs = [*input, *(more_inputs or [])]  # globs expanded by the frame, the same files on every runner
    print_result(
        build_vocab(
            [str(p) for p in inputs],
            output,
            size=size,
            do_lower_case=lowercase,
            overwrite=overwrite,
            word_counts=word_counts,
        )
    )
