"""`kbert finetune`: fine-tuned heads for classification, regression, tagging, SQuAD and
multiple choice, from the shell (`kbert predict` and `evaluate` use them: kbert.cli.predict).

The library is imported inside each command, not at the top: `kbert --help` and a mistyped
flag should answer at once, without waiting for TensorFlow."""

from __future__ import annotations

from pathlib import Path

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import ANY_MODEL, DIR, TEXT, command
from kbert.cli.options import DataFormat, MixedPrecision, MixedPrecisionDtype, options_from
from kbert.finetuning.options import FinetuneOptions

# Each fine-tuning flag's default is the FinetuneOptions field's.
DEFAULTS = FinetuneOptions()


# long: one typer option per flag, as --help lists them; the body is one call
@command(
    inputs={"model_dir": ANY_MODEL, "train": TEXT, "dev": TEXT, "mine_negatives": ANY_MODEL},
    outputs={"output": DIR},
    above_zero=("learning_rate",),
    tensorflow="backend",  # on JAX and PyTorch it trains without TensorFlow
)
def finetune(
    model_dir: Path = typer.Argument(
        ...,
        help="The pretrained model: any source kbert reads (a kbert model directory, .keras file, google-research checkpoint, Hugging Face folder, TF Hub SavedModel or keras-hub preset).",
    ),
    task: str = typer.Option(
        ...,
        "--task",
        help="classify | regress | tag | squad | choice | embed (sentence embeddings from pairs: in-batch negatives, "
        "sentence-transformers' MultipleNegativesRankingLoss; the output is an embedding model) | rerank (a "
        "cross-encoder: a score per query-document pair).",
    ),
    train: Path = typer.Option(
        ...,
        "--train",
        help="Training data: CSV/TSV/JSONL with text[,text_b],label; a GLUE TSV; CoNLL (tag); SQuAD JSON (squad); SWAG CSV (choice); pairs with query, document[, negative] columns, or those first two (three) columns without a header (embed); "
        "with a header, query, document, label (labels 0 to 1) or query, document, negative[, negative_2, ...] (rerank).",
    ),
    output: Path = typer.Option(..., "--output", help="Output: the fine-tuned kbert model directory."),
    dev: Path | None = typer.Option(
        None, "--dev", help="Dev data, same format: scored after each epoch; the best epoch is kept."
    ),
    epochs: int = typer.Option(DEFAULTS.epochs, min=1, help="Training epochs."),
    batch_size: int = typer.Option(DEFAULTS.batch_size, min=1, help="Global batch size (split over replicas)."),
    learning_rate: float = typer.Option(
        DEFAULTS.learning_rate, min=0, help="Peak learning rate (the paper used 2e-5..5e-5)."
    ),
    max_seq_length: int | None = typer.Option(
        DEFAULTS.max_seq_length,
        min=3,
        help="Tokens per example (per context + ending for choice; default 128, 384 for squad).",
    ),
    warmup_proportion: float = typer.Option(
        DEFAULTS.warmup_proportion, min=0, max=1, help="Share of steps with linear warmup (run_classifier.py's 0.1)."
    ),
    seed: int = typer.Option(DEFAULTS.seed, min=0, help="Seed for the head's initial weights, dropout and data order."),
    mixed_precision: MixedPrecision = DEFAULTS.mixed_precision,
    mixed_precision_dtype: MixedPrecisionDtype = DEFAULTS.mixed_precision_dtype,
    strategy: str = typer.Option(
        DEFAULTS.strategy,
        help="auto | cpu | gpu | mirrored (TensorFlow's strategies; on JAX and PyTorch only auto, the default device).",
    ),
    patience: int | None = typer.Option(
        DEFAULTS.patience, min=0, help="Early stopping: stop after N epochs without a better dev score."
    ),
    format: DataFormat = DEFAULTS.format,
    skip_bad_rows: bool = typer.Option(
        DEFAULTS.skip_bad_rows, "--skip-bad-rows", help="Skip rows with missing or extra columns instead of failing."
    ),
    long_text: str = typer.Option(
        DEFAULTS.long_text,
        "--long-text",
        help="classify, regress, tag: truncate texts past --max-seq-length (the original's way), or windows: read "
        "each document whole in overlapping windows, each trained with its document's label (its words' tags); "
        "predict and evaluate then answer once per document (recorded in the model). Single texts only.",
    ),
    doc_stride: int | None = typer.Option(
        DEFAULTS.doc_stride,
        min=1,
        help="Tokens between the starts of two windows. squad: over long contexts (default 128, run_squad.py's); "
        "--long-text windows: less than --max-seq-length - 2 (default half of that, 63 at 128).",
    ),
    max_query_length: int = typer.Option(DEFAULTS.max_query_length, min=1, help="squad: question tokens kept."),
    n_best_size: int = typer.Option(
        DEFAULTS.n_best_size, min=1, help="squad: candidate spans considered per question."
    ),
    max_answer_length: int = typer.Option(DEFAULTS.max_answer_length, min=1, help="squad: longest answer, in tokens."),
    null_score_diff_threshold: float = typer.Option(
        DEFAULTS.null_score_diff_threshold,
        help="squad v2: predict no answer when null score - best span score exceeds this.",
    ),
    overwrite: bool = typer.Option(
        DEFAULTS.overwrite,
        "--overwrite",
        help="Replace an existing --output directory (or an unfinished run's OUTPUT.partial).",
    ),
    resume: bool = typer.Option(
        DEFAULTS.resume,
        "--resume",
        help="Continue the unfinished run in OUTPUT.partial (killed, preempted or interrupted) from its last checkpoint.",
    ),
    save_every: int = typer.Option(
        DEFAULTS.save_every,
        min=1,
        help="Steps between checkpoints in OUTPUT.partial (one is also written at each epoch's end).",
    ),
    pooling: str | None = typer.Option(
        DEFAULTS.pooling,
        help="embed: cls | mean | max | mean_sqrt_len, how token vectors become a sentence vector; default the "
        "model's embedding record (needed for a model without one, such as a plain BERT).",
    ),
    normalize: bool | None = typer.Option(
        DEFAULTS.normalize,
        "--normalize/--no-normalize",
        help="embed: whether the saved model's vectors are unit length; default the model's record, else no. "
        "Training compares cosines either way.",
    ),
    loss: str | None = typer.Option(
        DEFAULTS.loss,
        "--loss",
        help="rerank: bce (the default: each pair's label, sentence-transformers' BinaryCrossEntropyLoss), listwise "
        "(softmax over each query's group, its document first) or margin-mse (a teacher's margins, from "
        "--teacher-scores). listwise and margin-mse read groups.",
    ),
    teacher_scores: str | None = typer.Option(
        DEFAULTS.teacher_scores,
        "--teacher-scores",
        metavar="COLUMN",
        help="rerank with --loss margin-mse: the column holding a teacher's score of each document of the group "
        "(its document, then its negatives), as numbers separated by spaces or commas, or a JSON list.",
    ),
    mine_negatives: Path | None = typer.Option(
        DEFAULTS.mine_negatives,
        "--mine-negatives",
        metavar="EMBED_MODEL",
        help="rerank: train on (query, document) pairs with hard negatives this sentence-embedding model finds among "
        "the file's documents (not the query's own, nor near-duplicates of its document); written beside --output "
        "as OUTPUT.mined.jsonl, a groups file a later run can train on.",
    ),
    negatives: int | None = typer.Option(
        DEFAULTS.negatives, "--negatives", min=1, help="With --mine-negatives: negatives per pair (default 3)."
    ),
    group_by_length: bool = typer.Option(
        DEFAULTS.group_by_length,
        "--group-by-length",
        help="embed, rerank: batches of texts of like lengths (the shuffled rows of 50 batches at a time sorted "
        "by length, those batches shuffled), so that each batch, cut to its longest text, carries less padding.",
    ),
):
    """Fine-tune BERT on a labelled file (or on query-document pairs); prints the best epoch's dev metrics as JSON.

    SIGTERM or Ctrl-C saves a checkpoint after the batch in flight; --resume continues from it."""
    # Every flag but MODEL_DIR, --task, --train, --output and --dev is the FinetuneOptions field of
    # the same name.
    options = options_from(FinetuneOptions, locals())
    from kbert.finetuning.train import finetune as finetune_model
    from kbert.training.interruption import ignore_stops

    result = finetune_model(str(model_dir), task, str(train), str(output), dev=dev and str(dev), options=options)
    # Finished is finished: a Ctrl-C from here to the exit (printing, TensorFlow's teardown) is no stop.
    ignore_stops()
    print_result(result)
