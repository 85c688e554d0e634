"""`kbert pretrain`: MLM + NSP pretraining on one device, many GPUs, many machines or a TPU."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Optional

import typer

from kbert.cli.common import print_result
from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.outputs import claim_output


def pretrain_command(
    model_dir: Path = typer.Option(..., "--model-dir", help="Output: a kbert model directory, plus checkpoints/, logs/ (TensorBoard), loss.png."),
    data: str = typer.Option(..., "--data", help="TFRecords from create_pretraining_data.py or kbert create-data (file, glob, or comma-separated)."),
    config: Optional[Path] = typer.Option(None, "--config", help="bert_config.json, to start from scratch (with --vocab)."),
    vocab: Optional[Path] = typer.Option(None, "--vocab", help="vocab.txt, to start from scratch (with --config)."),
    init: Optional[Path] = typer.Option(None, "--init", help="Start from this kbert model directory (e.g. a converted checkpoint)."),
    max_seq_length: int = typer.Option(DEFAULT_MAX_SEQ_LENGTH, help="Must match the records (phase 2: --init + 512)."),
    max_predictions_per_seq: int = typer.Option(20, help="Must match the records."),
    steps: int = typer.Option(10000, help="Total optimizer steps (the learning rate decays to 0 at the last)."),
    batch_size: int = typer.Option(32, help="Global batch size, split over replicas."),
    learning_rate: float = typer.Option(1e-4, help="Peak learning rate."),
    warmup_steps: Optional[int] = typer.Option(None, help="Linear warmup steps (default: 10% of --steps)."),
    save_every: int = typer.Option(1000, help="Checkpoint every N steps."),
    keep_checkpoints: int = typer.Option(3, help="How many recent checkpoints to keep."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --model-dir."),
    eval_data: Optional[str] = typer.Option(None, help="Held-out TFRecords for periodic MLM/NSP accuracy."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate every N steps (default: --save-every)."),
    eval_steps: int = typer.Option(20, help="Batches per evaluation."),
    strategy: str = typer.Option("auto", help="auto|cpu|gpu|mirrored|multi-worker|tpu."),
    tpu: Optional[str] = typer.Option(None, help="TPU name or address, with --strategy tpu."),
    mixed_precision: bool = typer.Option(False, "--mixed-precision", help="bfloat16 on CPU/TPU, float16 with loss scaling on GPU."),
    jit: Optional[bool] = typer.Option(None, "--jit/--no-jit", help="XLA-compile the step (default: on for GPU/TPU, off on CPU)."),
    steps_per_loop: int = typer.Option(10, help="Optimizer steps per compiled call."),
    grad_accum: int = typer.Option(1, help="Micro-batches accumulated per optimizer step."),
    optimizer: str = typer.Option("adamw", help="adamw (the original's) or lamb (large batches)."),
    seed: int = typer.Option(12345, help="Seed for the initial weights, dropout and data order."),
    lowercase: Optional[bool] = typer.Option(None, "--lowercase/--no-lowercase", help="Record the vocabulary's casing (default: from the config, else lowercase)."),
):
    """Pretrain BERT with masked-LM + next-sentence prediction; prints the final metrics as JSON."""
    flags = locals()
    # Here, not at the top: it imports TensorFlow, which `kbert --help` should not wait for.
    from kbert.pretraining.train import PretrainOptions, pretrain
    from kbert.training.strategy import writes_shared_files

    # Every flag but --model-dir, --data, --config, --vocab, --init and --lowercase is the
    # PretrainOptions field of the same name (tests/test_pretraining.py checks that they match).
    options = PretrainOptions(**{field.name: flags[field.name] for field in dataclasses.fields(PretrainOptions)
                                 if field.name in flags})
    # --model-dir is written in place (checkpoints/ grows). The other workers of a multi-worker
    # run write theirs aside, so only the chief locks it.
    claim = claim_output(model_dir, inputs=[init], in_place=True) if writes_shared_files(strategy) \
        else contextlib.nullcontext()
    with claim:
        result = pretrain(str(model_dir), data, config_file=config and str(config), vocab_file=vocab and str(vocab),
                          init=init and str(init), do_lower_case=lowercase, options=options)
    print_result(result)
