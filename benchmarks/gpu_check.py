"""kbert on an NVIDIA GPU with JAX and PyTorch and no TensorFlow: correct, then as fast as its contenders.

Runs on a machine that has JAX, PyTorch and transformers but neither TensorFlow nor a network
(how to run it there: benchmarks/gpu_check.md). In one run it

1. checks the encoder against google-research/bert's own outputs (tests/fixtures/tf1-tiny's
   expected.npz) on the GPU in float32 at the highest matmul precision, on JAX and on PyTorch,
   with the tiny model's weights from benchmarks/gpu_check_data/ (a .weights.h5 that
   `--make-weights` writes where TensorFlow is);
2. pretrains BERT-base from a random start in bfloat16 with `kbert pretrain` itself (its engine,
   record reader, optimizer, losses and checkpoints; its Python function, which the command calls)
   on JAX and on PyTorch, at batch 256 x 128 and 32 x 512, on records that kbert's
   TensorFlow-free create-data writes from tests/fixtures/sample_text.txt at the start; its own
   sequences/s (the loops after the first, which compiles) is the figure compared;
3. runs `kbert pretrain --mixed-precision-dtype float16` once: a loop, its checkpoint with the
   loss scale, and a --resume that must carry the scale on;
4. trains the contenders on the same batches in the same run: Hugging Face BertForPreTraining
   on PyTorch eager and under torch.compile, and keras-hub's BertMaskedLM on JAX; and, last,
   kbert's model in a plain Keras `fit` (BertPretrainer, its losses and BertAdamW), to tell the
   model's speed from its loop's;

and prints one JSON object (sequences/s after the warm-up steps, each step's loss), written
through benchmarks/record.py unless --smoke, to --output or else into the temp folder (never into
the tracked benchmarks/results/ unless asked). Each run is a process of its own (Keras picks its
backend once per process); a run that fails is reported with its error, the others go on, and
the exit status is 1.

`--smoke` runs everything tiny on the CPU (two layers, a few steps) so that the script is tested
where there is no GPU (tests/test_gpu_check.py); there the runs of one backend share a process,
which spares each the imports a process starts with.

Example:
    python benchmarks/gpu_check.py              # on the GPU machine
    python benchmarks/gpu_check.py --smoke      # anywhere, a minute on a CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "gpu_check_data")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TINY = os.path.join(FIXTURES, "tf1-tiny")
VOCAB = os.path.join(FIXTURES, "vocab-uncased.txt")
WEIGHTS = os.path.join(DATA, "tf1-tiny.weights.h5")

BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
SMOKE = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
# (batch, max_seq_length, max_predictions_per_seq): run_pretraining.py's two phases.
SHAPES = {"full": [(256, 128, 20), (32, 512, 80)], "smoke": [(4, 32, 5)]}
# In the order they run: the ones the aims compare first, so a spent time budget drops the others.
# kbert-pretrain-*: `kbert pretrain` itself (its engine, record reader, optimizer, losses and
# checkpoints), timed as it times itself; kbert-fit-*: kbert's model in a plain Keras `fit`.
RUNS = (
    "kbert-pretrain-jax",
    "keras-hub-jax",
    "hf-torch-compile",
    "kbert-pretrain-jax-float16",
    "hf-torch-eager",
    "kbert-pretrain-torch",
    "kbert-fit-jax",
    "kbert-fit-torch",
)
# The float16 run trains, checkpoints its loss scale and resumes: once, at the first shape.
FIRST_SHAPE_ONLY = ("kbert-pretrain-jax-float16",)
# The aims the speed is measured against: `kbert pretrain` on JAX against each contender, at each shape.
OURS = "kbert-pretrain-jax"
TARGETS = {"keras-hub-jax": 1.2, "hf-torch-compile": 1.0}


# --- records ---


def make_records(folder: str, max_seq_length: int, max_predictions_per_seq: int) -> str:
    """create-data's records of sample_text.txt, by kbert's TensorFlow-free writer."""
    from kbert.pretraining.create_data import create_pretraining_data

    path = os.path.join(folder, f"records-{max_seq_length}.tfrecord")
    create_pretraining_data(
        [os.path.join(FIXTURES, "sample_text.txt")],
        VOCAB,
        path,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        dupe_factor=5,
        workers=1,
    )
    return path


def batches(path, batch, seq, preds):
    from kbert.pretraining.record_reader import numpy_batches

    return numpy_batches([path], batch, seq, preds, seed=0)


def reader_speed(records: str, shape, batches_read: int = 20) -> float:
    """How fast the record reader alone makes batches of `shape`: above a run's sequences/s, the
    run did not wait for its input."""
    batch, seq, preds = shape
    data = batches(records, batch, seq, preds)
    next(data)
    start = time.perf_counter()
    for _ in range(batches_read):
        next(data)
    data.close()
    return round(batch * batches_read / (time.perf_counter() - start), 1)


# --- one run, in its own process ---


def device_name() -> str:
    if os.environ.get("KERAS_BACKEND") == "jax":
        import jax

        return str(jax.devices()[0].device_kind)
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def check_outputs() -> dict:
    """The tiny model's outputs in float32 against google-research/bert's own (expected.npz)."""
    import contextlib

    import keras
    import numpy as np

    from kbert.config import BertConfig
    from kbert.model.bert import BertPretrainer

    keras.mixed_precision.set_global_policy("float32")
    backend = keras.backend.backend()
    precise = contextlib.nullcontext()
    if backend == "jax":
        import jax

        precise = jax.default_matmul_precision("highest")
    else:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    expected = dict(np.load(os.path.join(TINY, "expected.npz")))
    model = BertPretrainer(BertConfig.from_json_file(os.path.join(TINY, "bert_config.json")))
    model.load_weights(WEIGHTS)
    inputs = {k: expected[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
    with precise:
        out = {k: keras.ops.convert_to_numpy(v) for k, v in model(inputs).items()}

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    ours = {
        "sequence_output": out["sequence_output"],
        "pooled_output": out["pooled_output"],
        "mlm_log_probs": log_softmax(out["mlm_logits"].astype(np.float64)),
        "nsp_log_probs": log_softmax(out["nsp_logits"].astype(np.float64)),
    }
    differences = {k: float(np.abs(v - expected[k]).max()) for k, v in ours.items()}
    return {"max_abs_difference": differences, "ok": max(differences.values()) <= 1e-5}


def per_step(running_means: list) -> list:
    """Each step's loss from fit's running mean of the epoch (mean_k·k - mean_(k-1)·(k-1))."""
    sums = [mean * (k + 1) for k, mean in enumerate(running_means)]
    return [round(s - (sums[k - 1] if k else 0.0), 4) for k, s in enumerate(sums)]


def run_kbert_pretrain(size: dict, shape, records: str, steps: int) -> dict:
    """`kbert pretrain --mixed-precision` from a random start, as a user runs it (its Python function,
    which the command calls with the flags): `steps` steps a loop, the default's 10 on the GPU,
    and two loops. Its own figure is the one reported: sequences/s over the loops after the first
    (which compiles), checkpoint writes left out."""
    with tempfile.TemporaryDirectory() as folder:  # --mixed-precision as typed: bfloat16 where the GPU has it
        result, rows, seconds = pretrain_run(folder, size, shape, records, steps, 2 * steps, "auto")
    return {
        "sequences_per_second": result["sequences_per_second"],
        "warmup_seconds": round(seconds[0], 2),
        "loop_seconds": [round(s, 3) for s in seconds],
        "losses": [round(row["loss"], 4) for row in rows],
        "losses_are": f"each loop's mean over its {steps} steps",
        "mixed_precision": result["mixed_precision"],
        "jit": result["jit"],
    }


def run_kbert_pretrain_float16(size: dict, shape, records: str, steps: int) -> dict:
    """`kbert pretrain --mixed-precision-dtype float16`: a loop, its checkpoint, then `--resume`
    with twice the steps. The loss scale and its step counter must come back from the checkpoint:
    the counter goes on from where it stopped unless the scale changed (a step whose gradients
    overflowed halves the scale and restarts the count)."""
    with tempfile.TemporaryDirectory() as folder:
        first, _, _ = pretrain_run(folder, size, shape, records, steps, steps, "float16")
        resumed, rows, _ = pretrain_run(folder, size, shape, records, steps, 2 * steps, "float16", resume=True)
        before, after = loss_scale_at(folder, steps), loss_scale_at(folder, 2 * steps)
    scale_changed = after["dynamic_scale"] != before["dynamic_scale"]
    counted_on = after["step_counter"] == before["step_counter"] + steps
    finite = all(math.isfinite(row["loss"]) for row in rows)
    return {  # no speed: each of its two runs' loops is one compiling call
        "mixed_precision": resumed["mixed_precision"],
        "resumed_from": resumed["resumed_from"],
        "loss_scale": {f"step {steps}": before, f"step {2 * steps}": after},
        "losses": [round(first["loss"], 4)] + [round(row["loss"], 4) for row in rows],
        "ok": resumed["resumed_from"] == steps
        and resumed["step"] == 2 * steps
        and (scale_changed or counted_on)
        and finite,
    }


def pretrain_run(folder: str, size: dict, shape, records: str, loop: int, total: int, dtype: str, resume=False):
    """One `kbert pretrain` run into folder/model (or its --resume): (its result, the loops'
    metrics rows it added, each of those loops' seconds)."""
    from kbert.pretraining.train import METRICS_FILE, pretrain

    batch, seq, preds = shape
    model_dir, config = os.path.join(folder, "model"), os.path.join(folder, "bert_config.json")
    with open(config, "w") as f:
        json.dump(dict(size, max_position_embeddings=512, type_vocab_size=2), f)
    metrics = os.path.join(model_dir, METRICS_FILE)
    logged = sum(1 for _ in open(metrics)) if resume else 0
    start = {} if resume else {"data": records, "config_file": config, "vocab_file": VOCAB}
    flags = {} if resume else dict(max_seq_length=seq, max_predictions_per_seq=preds, batch_size=batch, seed=0)
    result = pretrain(
        model_dir,
        **start,
        **flags,
        steps=total,
        steps_per_loop=loop,
        save_every=loop,
        mixed_precision=True,
        mixed_precision_dtype=dtype,
        resume=resume,
        progress=False,
    )
    with open(metrics) as f:
        rows = [json.loads(line) for line in f][logged:]
    return result, rows, [loop * batch / row["sequences_per_second"] for row in rows]


def loss_scale_at(folder: str, step: int) -> dict:
    """The float16 run's loss scale and step counter in its checkpoint of `step`."""
    import numpy as np

    path = os.path.join(folder, "model", "checkpoints", f"ckpt-{step}")
    with open(os.path.join(path, "manifest.json")) as f:
        rows = json.load(f)["variables"]["optimizer"]
    with np.load(os.path.join(path, "state.npz")) as state:
        return {
            name: float(state[row["key"]])
            for row in rows
            for name in ("dynamic_scale", "step_counter")
            if row["name"].endswith(f"/{name}")
        }


def run_kbert_fit(size: dict, shape, records: str, steps: int, warmup: int) -> dict:
    import keras

    from kbert.config import BertConfig
    from kbert.model.bert import BertPretrainer
    from kbert.pretraining.losses import pretraining_losses
    from kbert.training.optimization import BertAdamW, WarmupLinearDecay

    batch, seq, preds = shape
    keras.mixed_precision.set_global_policy("mixed_bfloat16")

    class Pretraining(keras.Model):
        """The pretrainer with run_pretraining.py's loss, for `fit`."""

        def __init__(self, pretrainer):
            super().__init__()
            self.pretrainer = pretrainer

        def call(self, features, training=False):
            outputs = self.pretrainer(features, training=training)
            return {"mlm_logits": outputs["mlm_logits"], "nsp_logits": outputs["nsp_logits"]}

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return pretraining_losses(y_pred, y)["loss"]

    config = BertConfig(**size, max_position_embeddings=512)
    model = Pretraining(BertPretrainer(config))
    total = warmup + steps
    model.compile(optimizer=BertAdamW(WarmupLinearDecay(1e-4, 10_000, 100), global_clipnorm=1.0))
    return timed_fit(model, batches(records, batch, seq, preds), total, warmup, batch)


def timed_fit(model, data, total: int, warmup: int, batch: int) -> dict:
    """Keras' own `fit` (keras.Model.fit, also for a keras-hub task, whose fit would route numpy
    batches through grain or tf.data), each step's end timed after it finished."""
    import keras

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.means, self.times = [], []

        def on_train_batch_end(self, step, logs=None):
            self.means.append(float(logs["loss"]))  # float(): waits for the step to finish
            self.times.append(time.perf_counter())

    timer, start = Timer(), time.perf_counter()
    keras.Model.fit(model, data, steps_per_epoch=total, epochs=1, verbose=0, callbacks=[timer])
    timed = timer.times[-1] - timer.times[warmup - 1]
    return {
        "sequences_per_second": round(batch * (total - warmup) / timed, 2),
        "warmup_seconds": round(timer.times[warmup - 1] - start, 2),
        "step_seconds": [round(b - a, 3) for a, b in zip(timer.times, timer.times[1:])],
        "losses": per_step(timer.means),
    }


def run_keras_hub(size: dict, shape, records: str, steps: int, warmup: int) -> dict:
    import keras
    import keras_hub

    batch, seq, preds = shape
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=size["vocab_size"],
        num_layers=size["num_hidden_layers"],
        num_heads=size["num_attention_heads"],
        hidden_dim=size["hidden_size"],
        intermediate_dim=size["intermediate_size"],
        max_sequence_length=512,
    )
    model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.01, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
    )

    def masked_lm(data):
        for features, labels in data:
            x = {
                "token_ids": features["input_ids"],
                "padding_mask": features["input_mask"].astype(bool),
                "segment_ids": features["segment_ids"],
                "mask_positions": features["masked_lm_positions"],
            }
            yield x, labels["masked_lm_ids"], labels["masked_lm_weights"]

    result = timed_fit(model, masked_lm(batches(records, batch, seq, preds)), warmup + steps, warmup, batch)
    return dict(result, loss="masked LM only (BertMaskedLM has no next-sentence head)")


def run_hf(size: dict, shape, records: str, steps: int, warmup: int, compiled: bool) -> dict:
    import numpy as np
    import torch
    import transformers

    batch, seq, preds = shape
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = transformers.BertConfig(**size, max_position_embeddings=512)
    model = transformers.BertForPreTraining(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    forward = torch.compile(model) if compiled else model

    def step(features, labels):
        mlm = np.full(features["input_ids"].shape, -100, np.int64)
        rows, cols = np.nonzero(labels["masked_lm_weights"] > 0)
        mlm[rows, features["masked_lm_positions"][rows, cols]] = labels["masked_lm_ids"][rows, cols]
        tensors = {
            "input_ids": features["input_ids"],
            "attention_mask": features["input_mask"],
            "token_type_ids": features["segment_ids"],
            "labels": mlm,
            "next_sentence_label": labels["next_sentence_labels"],
        }
        tensors = {
            k: torch.from_numpy(np.asarray(v, np.int64)).to(device, non_blocking=True) for k, v in tensors.items()
        }
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = forward(**tensors).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)  # waits for the step to finish

    data, losses, times = batches(records, batch, seq, preds), [], []
    start = time.perf_counter()
    for _ in range(warmup + steps):
        losses.append(round(step(*next(data)), 4))
        times.append(time.perf_counter())
    return {
        "sequences_per_second": round(batch * steps / (times[-1] - times[warmup - 1]), 2),
        "warmup_seconds": round(times[warmup - 1] - start, 2),
        "step_seconds": [round(b - a, 3) for a, b in zip(times, times[1:])],
        "losses": losses,
    }


def run_one(args, run: str) -> dict:
    size = SMOKE if args.smoke else BASE
    shape = tuple(args.shape)
    report = {"device": device_name()}
    if run.startswith("kbert"):
        if args.check_outputs:  # once a process
            report["outputs"], args.check_outputs = check_outputs(), False
        if run.startswith("kbert-fit"):
            report.update(run_kbert_fit(size, shape, args.records, args.steps, args.warmup))
        elif run.endswith("float16"):
            report.update(run_kbert_pretrain_float16(size, shape, args.records, args.steps))
        else:
            report.update(run_kbert_pretrain(size, shape, args.records, args.steps))
    elif run == "keras-hub-jax":
        report.update(run_keras_hub(size, shape, args.records, args.steps, args.warmup))
    else:
        report.update(run_hf(size, shape, args.records, args.steps, args.warmup, run == "hf-torch-compile"))
    return report


def run_in_this_process(args) -> dict:
    """Each of the comma-separated `--run`s, in turn: {run: its report, or its error's last line}."""
    reports = {}
    for run in args.run.split(","):
        try:
            reports[run] = run_one(args, run)
        except Exception as error:  # as Python's own last line for it; the next run goes on
            traceback.print_exc()
            reports[run] = {"error": traceback.format_exception_only(error)[-1].strip()}
    return reports


# --- the whole check, in the parent process ---


def backend_of(run: str) -> str:
    return "torch" if "torch" in run else "jax"


def spawn(runs: list, shape, records: str, args, check_outputs: bool, timeout: float) -> dict:
    """The `runs` (of one backend) in one new process: {run: its report, or its error}."""
    backend = backend_of(runs[0])
    command = [sys.executable, os.path.abspath(__file__), "--run", ",".join(runs), "--records", records]
    command += ["--shape", *map(str, shape), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    command += ["--smoke"] * args.smoke + ["--check-outputs"] * check_outputs
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    if args.smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict.fromkeys(runs, {"error": f"did not finish in {timeout:.0f} s"})
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return dict.fromkeys(runs, {"error": lines[-1] if lines else f"exit status {done.returncode}"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(runs: dict, shapes) -> dict:
    """`kbert pretrain` on JAX's sequences/s over each contender's, at each shape, and whether it meets the aim."""
    out = {}
    for batch, seq, _ in shapes:
        ours = runs.get(f"{OURS} {batch}x{seq}", {}).get("sequences_per_second")
        for contender, aim in TARGETS.items():
            theirs = runs.get(f"{contender} {batch}x{seq}", {}).get("sequences_per_second")
            if ours and theirs:
                ratio = ours / theirs
                out[f"{OURS}/{contender} {batch}x{seq}"] = {
                    "ratio": round(ratio, 3),
                    "aim": aim,
                    "met": ratio >= aim,
                }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models, a few steps, on the CPU")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 10; 3 with --smoke)")
    parser.add_argument("--warmup", type=int, help="steps before the timing starts (default 3; 1 with --smoke)")
    parser.add_argument(
        "--runs", default=",".join(RUNS), help=f"which runs, comma-separated (default: {','.join(RUNS)})"
    )
    parser.add_argument("--timeout", type=int, default=240, help="seconds each run may take (default 240)")
    parser.add_argument(
        "--budget", type=int, default=480, help="seconds for all runs; the runs left when it is spent are skipped"
    )
    parser.add_argument(
        "--output",
        help="where to write the JSON (default: DATE-MACHINE-NAME.json in the temp folder, outside the checkout; "
        "pass benchmarks/results/... to record a run there)",
    )
    parser.add_argument(
        "--make-weights", action="store_true", help="write the tiny model's .weights.h5 (needs TensorFlow)"
    )
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    parser.add_argument("--shape", type=int, nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--check-outputs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)  # kbert from this checkout, as on a machine where it is not installed
    args.steps = args.steps or (3 if args.smoke else 10)
    args.warmup = max(1, args.warmup or (1 if args.smoke else 3))
    if args.make_weights:
        return make_weights()
    if args.run:
        print(json.dumps(run_in_this_process(args)), flush=True)
        return 0
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        parser.error(f"unknown run {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}")
    shapes = SHAPES["smoke" if args.smoke else "full"]
    report = {"model": "smoke" if args.smoke else "bert-base", "steps": args.steps, "warmup": args.warmup, "runs": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        records = {}
        for shape in shapes:
            records[shape] = make_records(folder, shape[1], shape[2])
            report[f"reader_sequences_per_second {shape[0]}x{shape[1]}"] = reader_speed(records[shape], shape)
        chosen = [run for run in RUNS if run in args.runs.split(",")]
        # On the GPU each run has a process (and its memory) to itself; --smoke gives each backend one.
        if args.smoke:
            groups = [g for g in ([run for run in chosen if backend_of(run) == b] for b in ("jax", "torch")) if g]
        else:
            groups = [[run] for run in chosen]
        checked = set()  # the backends whose encoder was checked against the original's outputs
        for runs_of_backend in groups:
            for shape in shapes:
                group = [run for run in runs_of_backend if shape == shapes[0] or run not in FIRST_SHAPE_ONLY]
                if not group:
                    continue
                names = [f"{run} {shape[0]}x{shape[1]}" for run in group]
                left = args.budget - (time.perf_counter() - started)
                if left < 30:
                    for name in names:
                        report["runs"][name] = {"error": f"not run: the --budget of {args.budget} s was spent"}
                    continue
                check = backend_of(group[0]) not in checked and any(run.startswith("kbert") for run in group)
                checked |= {backend_of(group[0])} if check else set()
                timeout = min(args.timeout * len(group), left)
                results = spawn(group, shape, records[shape], args, check, timeout)
                report["runs"].update(zip(names, (results[run] for run in group)))
    report["ratios"] = ratios(report["runs"], shapes)
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_report(report, args)
    failed = failed_runs(report["runs"])
    if failed:  # the report says why; the exit status says that it did not all run
        print(f"gpu_check: {len(failed)} of {len(report['runs'])} runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def failed_runs(runs: dict) -> list:
    """The runs that ended in an error; those the --budget left out were not run, and did not fail.

    >>> failed_runs({"a": {"sequences_per_second": 9.5}, "b": {"error": "ValueError: x"},
    ...              "c": {"error": "not run: the --budget of 0 s was spent"}})
    ['b']
    """
    return [name for name, run in runs.items() if "error" in run and not run["error"].startswith("not run:")]


def write_report(report: dict, args):
    """Print the report; write it (with the date, machine and code) to --output, by default into the
    temp folder: a check run from the checkout leaves the tracked benchmarks/results/ as it was."""
    if args.smoke and not args.output:
        print(json.dumps(report, indent=1))
        return
    sys.path.insert(0, HERE)
    try:
        import record
    except ImportError:
        print(json.dumps(report, indent=1))
        return
    gpus = {r.get("device") for r in report["runs"].values() if r.get("device")}
    report["machine"] = {"accelerator": ", ".join(sorted(gpus))}
    name = "gpu-check-smoke" if args.smoke else "gpu-check"
    today = datetime.date.today().isoformat()
    output = args.output or os.path.join(tempfile.gettempdir(), f"{today}-{record.machine_name()}-{name}.json")
    record.emit(report, name, output)


def make_weights() -> int:
    """benchmarks/gpu_check_data/tf1-tiny.weights.h5: tf1-tiny's checkpoint through kbert's converter."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    sys.path.insert(0, ROOT)
    from kbert.converters.tf1 import load_tf1_checkpoint

    os.makedirs(DATA, exist_ok=True)
    model = load_tf1_checkpoint(TINY)
    partial = os.path.join(DATA, "partial.weights.h5")
    model.save_weights(partial)
    os.replace(partial, WEIGHTS)
    print(WEIGHTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
