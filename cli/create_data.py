"""`kbert create-data`: pretraining TFRecords from text, as google-research/bert's
create_pretraining_data.py makes them (same features, same algorithm), streamed and in parallel;
from a ModernBERT's tokenizer.json, masked-LM-only records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from kbert.cli.common import bytes_progress, print_result
from kbert.cli.frame import TEXT, TEXT_FILES, Output, command
from kbert.cli.options import GLOBBED_FILES, MoreInputs, text_inputs
from kbert.config import DEFAULT_MAX_SEQ_LENGTH

Inputs = text_inputs(
    f"Text: one sentence per line, a blank line between documents. {GLOBBED_FILES.capitalize()}: the same files "
    "on every runner."
)


# long: one typer option per flag, as --help lists them; the body is a few calls
@command(
    inputs={"input": TEXT_FILES, "more_inputs": TEXT_FILES, "vocab": TEXT},
    outputs={"output": Output("shards", shards_from="shards")},
    above_zero=("masked_lm_prob",),
    tensorflow=False,
)  # its start-up would be seconds of a run of tens of seconds
def create_data(
    input: Inputs = ...,
    more_inputs: MoreInputs = None,
    vocab: Path = typer.Option(
        ...,
        "--vocab",
        help="vocab.txt of the model (or from `kbert vocab`): BERT's records. Or a ModernBERT's tokenizer.json: "
        "masked-LM-only records (no segment ids, no next-sentence labels), for `kbert pretrain --init`.",
    ),
    output: str = typer.Option(
        ..., "--output", help="TFRecord file to write; with --shards N, the prefix of OUTPUT-0000i-of-0000N."
    ),
    max_seq_length: int = typer.Option(
        DEFAULT_MAX_SEQ_LENGTH, min=5, help="Tokens per instance, [CLS] and [SEP]s included."
    ),
    max_predictions_per_seq: int | None = typer.Option(
        None,
        min=1,
        show_default=False,
        help="Masked positions per instance at most. Default: 20 for a vocab.txt; for a tokenizer.json, "
        "max_seq_length x masked_lm_prob rounded, so no instance has more masks than it may hold.",
    ),
    masked_lm_prob: float | None = typer.Option(
        None,
        min=0,
        max=1,
        show_default=False,
        help="Share of tokens to mask. Default: 0.15 for a vocab.txt, 0.3 for a tokenizer.json (ModernBERT's recipe).",
    ),
    dupe_factor: int = typer.Option(10, min=1, help="Passes over the text, each with fresh instances and masks."),
    short_seq_prob: float = typer.Option(0.1, min=0, max=1, help="Probability of a shorter target length."),
    seed: int = typer.Option(12345, min=0, help="Random seed; the output depends on it, not on --workers."),
    whole_word_mask: bool = typer.Option(
        False, "--whole-word-mask", help="Mask all WordPiece pieces of a word together (a vocab.txt only)."
    ),
    lowercase: bool | None = typer.Option(
        None,
        "--lowercase/--no-lowercase",
        show_default=False,
        help="Lower-case and strip accents (uncased vocabularies). Default: --lowercase for a vocab.txt; "
        "a tokenizer.json's own normalizer decides, so it takes neither.",
    ),
    shards: int = typer.Option(1, min=1, help="Output files; records go to them round-robin."),
    workers: int | None = typer.Option(None, min=1, help="Processes making instances (default: the CPUs available)."),
    overwrite: bool = typer.Option(False, help="Replace output files that exist."),
    chunk_docs: int = typer.Option(
        5000,
        min=1,
        help="Documents per chunk at most: the pool random next segments come from, "
        "and the unit of work. Part of what decides the records.",
    ),
    chunk_bytes: int = typer.Option(
        1 << 20, min=1, help="Input bytes after which a chunk closes at the next document end."
    ),
    runner: str = typer.Option(
        "local",
        help="local (this machine's processes, no set-up), or an Apache Beam runner: DirectRunner, "
        "DaskRunner, DataflowRunner, FlinkRunner, SparkRunner, PortableRunner, PrismRunner (pip install 'kbert[beam]').",
    ),
    pipeline_options: str = typer.Option(
        "",
        help="Beam's own flags as one string, passed to PipelineOptions, e.g. "
        '"--direct_num_workers=2 --direct_running_mode=multi_processing".',
    ),
):
    """Make MLM + NSP pretraining records from text with a vocab.txt, or masked-LM-only records with a
    ModernBERT's tokenizer.json; prints a JSON summary with their statistics."""
    flags = locals()
    # Here, not at the top: every kbert command, `kbert --help` and create-data's spawned workers
    # (which import the kbert script again) would otherwise pay for them.
    from rich.progress import TextColumn

    from kbert.pretraining.create_data import create_pretraining_data
    from kbert.pretraining.instances import DataOptions
    from kbert.pretraining.record_kinds import data_options
    from kbert.runtime.errors import KbertError

    inputs = [*input, *(more_inputs or [])]  # globs expanded by the frame, the same files on every runner
    # Each kind of records' defaults (a vocab.txt's, a tokenizer.json's), resolved in one place.
    # (The flags of DataOptions are its fields, by name.)
    given = {field.name: flags[field.name] for field in dataclasses.fields(DataOptions)}
    options, lowercase = data_options(vocab, **given, do_lower_case=lowercase)
    # Where the records go and how the text is cut into work: the same on every runner.
    writing = dict(shards=shards, overwrite=overwrite, chunk_docs=chunk_docs, chunk_bytes=chunk_bytes)
    if runner != "local":
        try:
            from kbert.pretraining.beam_pipeline import run_pipeline
        except ImportError:
            raise KbertError(f"--runner {runner} needs Apache Beam: pip install 'kbert[beam]'") from None
        if workers is not None:
            raise KbertError(
                "--workers is for --runner local; Beam runners take theirs in --pipeline-options "
                "(e.g. --direct_num_workers=2, --num_workers=N on Dataflow)"
            )
        print_result(
            run_pipeline(
                [str(p) for p in inputs],
                vocab,
                output,
                runner=runner,
                flags=pipeline_options,
                do_lower_case=lowercase,
                options=options,
                **writing,
            )
        )
        return
    if pipeline_options:
        raise KbertError("--pipeline-options are Beam's; pass --runner DirectRunner (or another Beam runner) too")

    progress = bytes_progress("create-data", TextColumn("{task.fields[instances]:,} instances"))
    with progress:
        task = progress.add_task("text", total=None, instances=0)

        def on_progress(done, total, instances):
            progress.update(task, completed=done, total=total, instances=instances)

        result = create_pretraining_data(
            inputs,
            vocab,
            output,
            do_lower_case=lowercase,
            **dataclasses.asdict(options),
            workers=workers,
            on_progress=on_progress,
            **writing,
        )
    print_result(result)
