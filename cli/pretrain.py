"""`kbert pretrain`: MLM + NSP pretraining of a BERT (a ModernBERT's: the masked LM alone) on one
device, many GPUs, many machines or a TPU; on TensorFlow, JAX or PyTorch (KERAS_BACKEND)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from kbert.cli.common import print_result
from kbert.cli.frame import ANY_MODEL, JSON, RECORDS, TEXT, Output, command
from kbert.cli.options import MixedPrecision, MixedPrecisionDtype
from kbert.formats.sources import ACCEPTED
from kbert.pretraining.options import PretrainOptions

# Each flag's default is the PretrainOptions field's: one place says what `kbert pretrain` does by default.
DEFAULTS = PretrainOptions()


# --model-dir is written in place; pretrain() takes its lock, since a multi-worker run's other
# workers write theirs aside and do not lock it.
# long: one typer option per flag, as --help lists them; the body is one call
@command(
    inputs={"data": RECORDS, "eval_data": RECORDS, "config": JSON, "vocab": TEXT, "init": ANY_MODEL},
    outputs={"model_dir": Output("dir-in-place", lock=False)},
    above_zero=("learning_rate",),
    tensorflow="backend",
)
def pretrain_command(
    ctx: typer.Context,
    model_dir: Path = typer.Option(
        ..., "--model-dir", help="Output: a kbert model directory, plus checkpoints/, logs/ (TensorBoard), loss.png."
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="TFRecords from create_pretraining_data.py or kbert create-data (a file, a quoted glob such as 'data/train.tfrecord-*', or comma-separated). Required, except with --resume.",
    ),
    config: Path | None = typer.Option(
        None, "--config", help="bert_config.json, to start from scratch (with --vocab; not with --init)."
    ),
    vocab: Path | None = typer.Option(
        None, "--vocab", help="vocab.txt, to start from scratch (with --config; not with --init)."
    ),
    init: Path | None = typer.Option(
        None,
        "--init",
        help=f"Continue pretraining from this model, e.g. Google's uncased_L-12_H-768_A-12/ or a converted "
        f"ModernBERT: {ACCEPTED}.",
    ),
    max_seq_length: int = typer.Option(
        DEFAULTS.max_seq_length, min=5, help="Must match the records (phase 2: --init + 512)."
    ),
    max_predictions_per_seq: int = typer.Option(
        DEFAULTS.max_predictions_per_seq, min=1, help="Must match the records."
    ),
    steps: int = typer.Option(
        DEFAULTS.steps, min=1, help="Total optimizer steps (the learning rate decays to 0 at the last)."
    ),
    batch_size: int = typer.Option(DEFAULTS.batch_size, min=1, help="Global batch size, split over replicas."),
    learning_rate: float = typer.Option(DEFAULTS.learning_rate, min=0, help="Peak learning rate."),
    warmup_steps: int | None = typer.Option(
        DEFAULTS.warmup_steps, min=0, help="Linear warmup steps (default: 10% of --steps)."
    ),
    save_every: int = typer.Option(DEFAULTS.save_every, min=1, help="Checkpoint every N steps."),
    keep_checkpoints: int = typer.Option(DEFAULTS.keep_checkpoints, min=1, help="How many recent checkpoints to keep."),
    resume: bool = typer.Option(
        DEFAULTS.resume,
        "--resume",
        help="Continue the run in --model-dir from its last checkpoint, with the flags it was started with (recorded in pretrain_run.json). A flag given with another value is refused, except a larger --steps (extends the run) and --save-every, --keep-checkpoints, --steps-per-loop, --eval-data, --eval-every, --eval-steps, --strategy, --tpu, --jit/--no-jit, --grad-accum (where and how fast it runs).",
    ),
    eval_data: str | None = typer.Option(DEFAULTS.eval_data, help="Held-out TFRecords for periodic MLM/NSP accuracy."),
    eval_every: int | None = typer.Option(
        DEFAULTS.eval_every, min=1, help="Evaluate every N steps (default: --save-every)."
    ),
    eval_steps: int = typer.Option(DEFAULTS.eval_steps, min=1, help="Batches per evaluation."),
    strategy: str = typer.Option(
        DEFAULTS.strategy,
        help="auto|cpu|gpu|mirrored|multi-worker|tpu. On JAX, mirrored (and auto, on GPUs or TPUs) spreads each batch over the local devices; PyTorch trains on one; multi-worker is TensorFlow's.",
    ),
    tpu: str | None = typer.Option(DEFAULTS.tpu, help="TPU name or address, with --strategy tpu."),
    mixed_precision: MixedPrecision = DEFAULTS.mixed_precision,
    mixed_precision_dtype: MixedPrecisionDtype = DEFAULTS.mixed_precision_dtype,
    jit: bool | None = typer.Option(
        DEFAULTS.jit,
        "--jit/--no-jit",
        help="XLA-compile the step (default on TensorFlow: on for GPU/TPU, off on CPU; on JAX always on; on PyTorch off, and --jit is torch.compile).",
    ),
    steps_per_loop: int = typer.Option(
        DEFAULTS.steps_per_loop,
        min=1,
        help="Optimizer steps between logs and stop checks (on TensorFlow, one compiled call).",
    ),
    grad_accum: int = typer.Option(
        DEFAULTS.grad_accum, min=1, help="Micro-batches accumulated per optimizer step (TensorFlow)."
    ),
    optimizer: str = typer.Option(DEFAULTS.optimizer, help="adamw (the original's) or lamb (large batches)."),
    seed: int = typer.Option(DEFAULTS.seed, min=0, help="Seed for the initial weights, dropout and data order."),
    lowercase: bool | None = typer.Option(
        None,
        "--lowercase/--no-lowercase",
        help="Record the vocabulary's casing (default: from the config, else lowercase).",
    ),
):
    """Pretrain BERT with masked-LM + next-sentence prediction, or continue a ModernBERT's masked LM
    (--init, on records made from its tokenizer.json); prints the final metrics as JSON.

    SIGTERM or Ctrl-C saves a checkpoint at the step reached; `kbert pretrain --model-dir DIR
    --resume` continues it."""
    flags = locals()
    # Here, not at the top: it imports Keras (and TensorFlow, on its backend), which `kbert --help`
    # should not wait for.
    from kbert.pretraining.train import pretrain

    # Every flag but --model-dir, --data, --config, --vocab, --init and --lowercase is the
    # PretrainOptions field of the same name (tests/pretraining/test_pretrain.py checks that the
    # lists match). Only the flags typed are passed: --resume compares those with the run's.
    # (The source by its name: typer 0.2x brings its own copy of click, with its own enum.)
    typed = {
        field.name: flags[field.name]
        for field in dataclasses.fields(PretrainOptions)
        if field.name in flags and ctx.get_parameter_source(field.name).name == "COMMANDLINE"
    }
    # pretrain() locks --model-dir itself (in a multi-worker run, only the chief does).
    result = pretrain(
        str(model_dir),
        data,
        config_file=config and str(config),
        vocab_file=vocab and str(vocab),
        init=init and str(init),
        do_lower_case=lowercase,
        **typed,
    )
    print_result(result)
