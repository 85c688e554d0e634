"""`kbert pretrain` on JAX and PyTorch in a Python where TensorFlow is not installed.

Each backend runs in one process of its own (TensorFlow blocked by a sitecustomize.py), which calls
the `kbert` command line's entry point several times: a run interrupted by a real signal (SIGTERM on
JAX, SIGINT on PyTorch) and resumed must end with the weights of the run that was never
interrupted, bit for bit, and on JAX a run over two (host) devices must make the update of one
device on the global batch. The model trained on JAX is then read, here, by TensorFlow: `kbert.load`
and `kbert export` take it as it is, and both give the outputs JAX gave.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY, run_kbert
from helpers import largest_difference, saved_weights, without_tensorflow_env

pytestmark = pytest.mark.slow

SAMPLE = os.path.join(os.path.dirname(TINY), "sample_text.txt")
VOCAB = os.path.join(TINY, "vocab.txt")
SHAPE = ["--max-seq-length", "32", "--max-predictions-per-seq", "5"]
STEPS = 24
CONFIG = os.path.join(TINY, "bert_config.json")

# Runs the command line's entry point in this process, as the `kbert` script does: the exit status
# from SystemExit, stderr captured. `stop_after`: a thread sends this process SIGTERM once the
# run's metrics.jsonl holds that many rows (SIGINT with signal_name).
RUNNER = r"""
import contextlib, io, json, os, signal, sys, threading, time

from kbert.cli.main import main


def kbert(*args, stop_after=None, signal_name="SIGTERM"):
    if stop_after:
        metrics = os.path.join(args[list(args).index("--model-dir") + 1], "metrics.jsonl")

        def watch():
            while not (os.path.exists(metrics) and open(metrics).read().count("\n") >= stop_after):
                time.sleep(0.001)
            os.kill(os.getpid(), getattr(signal, signal_name))

        threading.Thread(target=watch, daemon=True).start()
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


spec = json.loads(sys.argv[1])
"""

JAX_SCRIPT = (
    RUNNER
    + r"""
import numpy as np

runs = {}
for name, extra in spec["runs"].items():
    started = time.perf_counter()
    runs[name] = kbert(*extra["args"], stop_after=extra.get("stop_after"), signal_name=extra.get("signal", "SIGTERM"))
    runs[name]["seconds"] = round(time.perf_counter() - started, 1)

# The trained model's outputs on JAX, for TensorFlow to compare with.
import kbert
from kbert.text.packing import pack_texts

model = kbert.load(spec["reference"])
tokenizer = kbert.Tokenizer(os.path.join(spec["reference"], "vocab.txt"))
features = pack_texts(tokenizer, ["the city at night", "rain"], sequence_length=16)
features = {k: np.asarray(v, "int32") for k, v in features.items()}
outputs = model({**features, "masked_lm_positions": np.array([[1, 2], [1, 0]], "int32")})
np.savez(spec["outputs"], **features, **{k: np.asarray(v) for k, v in outputs.items()})
# None: the entries that block them; a module imported would be there instead.
blocked = ("tensorflow", "tensorflow_text", "tf_keras", "tensorflow_hub")
runs["modules"] = sorted(m for m, module in sys.modules.items() if m.split(".")[0] in blocked and module is not None)
print(json.dumps(runs))
"""
)

TORCH_SCRIPT = (
    RUNNER
    + r"""
import keras

from kbert.pretraining.keras_engine import PretrainingModel

# A real SIGINT, raised by the step that `stop_at` names (as it computes its loss): the stop
# comes mid-loop, where the resumed run's fit calls fall on other steps than the uninterrupted run's.
stop_at, compute_loss = None, PretrainingModel.compute_loss


def stopping(self, *args, **kwargs):
    if stop_at is not None and int(keras.ops.convert_to_numpy(self.optimizer.iterations)) + 1 == stop_at:
        signal.raise_signal(signal.SIGINT)
    return compute_loss(self, *args, **kwargs)


PretrainingModel.compute_loss = stopping
runs = {}
for name, extra in spec["runs"].items():
    stop_at = extra.get("stop_at")
    runs[name] = kbert(*extra["args"])
print(json.dumps(runs))
"""
)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Records kbert create-data makes from the sample text (no TensorFlow involved)."""
    out = tmp_path_factory.mktemp("records") / "sample.tfrecord"
    run_kbert(
        "create-data",
        "--input",
        SAMPLE,
        "--vocab",
        VOCAB,
        "--output",
        out,
        *SHAPE,
        "--dupe-factor",
        "2",
        "--workers",
        "1",
        "--seed",
        "3",
    )
    return out


def _run(script, tmp_path, backend, spec, timeout=600):
    env = without_tensorflow_env(tmp_path, backend)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # two CPU devices for JAX's DataParallel
    # Runs of the same model compile the same step: compiled once, read from the cache after.
    env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax-cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pretrain(model_dir, records, *extra, config=CONFIG):
    start = ["--data", records] + ([] if "--init" in extra else ["--config", config, "--vocab", VOCAB])
    start = [] if "--resume" in extra else start
    args = ["pretrain", "--model-dir", model_dir, *start, *SHAPE, "--batch-size", "8", "--learning-rate", "1e-3"]
    return [str(a) for a in args + list(extra)]


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory, records):
    work = tmp_path_factory.mktemp("jax")
    (work / "tf-run" / "checkpoints").mkdir(parents=True)
    (work / "tf-run" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    no_dropout = work / "bert_config.json"
    config = json.load(open(CONFIG))
    no_dropout.write_text(json.dumps(dict(config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)))
    run = ["--steps", str(STEPS), "--save-every", "8", "--steps-per-loop", "4", "--eval-steps", "2"]
    spec = {
        "runs": {
            "reference": {"args": _pretrain(work / "reference", records, *run, "--eval-data", records)},
            "interrupted": {
                "args": _pretrain(work / "resumed", records, *run),
                "stop_after": 2,
            },
            "resumed": {"args": _pretrain(work / "resumed", records, "--resume")},
            "ctrl-c": {"args": _pretrain(work / "ctrl-c", records, *run), "stop_after": 1, "signal": "SIGINT"},
            # Dropout off: the same update on one device and on two, whatever each draws.
            "one device": {
                "args": _pretrain(work / "one", records, "--steps", "2", "--strategy", "cpu", config=no_dropout)
            },
            "two devices": {
                "args": _pretrain(work / "two", records, "--steps", "2", "--strategy", "mirrored", config=no_dropout)
            },
            # Continued pretraining from the model the reference run wrote (the same step: compiled already).
            "init": {"args": _pretrain(work / "init", records, *run, "--init", work / "reference")},
            "multi-worker": {"args": _pretrain(work / "mw", records, "--strategy", "multi-worker")},
            "grad-accum": {"args": _pretrain(work / "ga", records, "--grad-accum", "2")},
            "tpu": {"args": _pretrain(work / "tpu", records, "--strategy", "tpu")},
            "gpu": {"args": _pretrain(work / "gpu", records, "--strategy", "gpu")},
            # The records' shape, checked by kbert's own reader: TensorFlow's words.
            "other shape": {"args": _pretrain(work / "os", records, "--max-seq-length", "64")},
            # A run whose checkpoints TensorFlow's loop wrote (its `checkpoint` state file).
            "tensorflow's run": {"args": ["pretrain", "--model-dir", str(work / "tf-run"), "--resume"]},
        },
        "reference": str(work / "reference"),
        "outputs": str(work / "outputs.npz"),
    }
    runs = _run(JAX_SCRIPT, work, "jax", spec)
    return work, runs


def test_a_jax_run_stopped_by_sigterm_resumes_to_the_uninterrupted_weights(jax_runs):
    work, runs = jax_runs
    assert runs["modules"] == []  # no TensorFlow module was imported
    assert runs["reference"]["code"] == 0, runs["reference"]["stderr"][-2000:]
    interrupted = runs["interrupted"]
    assert interrupted["code"] == 143, interrupted["stderr"][-2000:]
    last = interrupted["stderr"].strip().splitlines()[-1]
    step = int(last.split("interrupted at step ")[1].split(":")[0])
    assert 0 < step < STEPS
    assert last == (
        f"kbert: interrupted at step {step}: checkpoint saved; continue with "
        f"`kbert pretrain --model-dir {work / 'resumed'} --resume`"
    )
    assert runs["resumed"]["code"] == 0, runs["resumed"]["stderr"][-2000:]
    result = json.loads(runs["resumed"]["stdout"])
    assert result["step"] == STEPS and result["resumed_from"] == step and result["backend"] == "jax"
    assert largest_difference(saved_weights(work / "resumed"), saved_weights(work / "reference")) == 0.0
    # Each step logged once, the held-out rows at each save, the TensorBoard scalars readable.
    rows = [json.loads(line) for line in open(work / "resumed" / "metrics.jsonl")]
    steps = [r["step"] for r in rows if "split" not in r]  # a chunk the signal cut short ends at an odd step
    assert steps == sorted(set(steps)) and steps[-1] == STEPS and step in steps
    events = EventAccumulator(str(work / "reference" / "logs" / "train"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("loss")}
    assert sorted(logged) == list(range(4, STEPS + 1, 4))
    reference_rows = [json.loads(line) for line in open(work / "reference" / "metrics.jsonl")]
    assert [r["step"] for r in reference_rows if "split" in r] == list(range(8, STEPS + 1, 8))  # held-out scores
    assert logged[STEPS] == np.float32(reference_rows[-2]["loss"])
    assert (work / "reference" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(work / "reference" / "checkpoints")) == ["ckpt-16", "ckpt-24", "ckpt-8"]


def test_ctrl_c_saves_and_exits_130(jax_runs):
    work, runs = jax_runs
    assert runs["ctrl-c"]["code"] == 130, runs["ctrl-c"]["stderr"][-2000:]
    last = runs["ctrl-c"]["stderr"].strip().splitlines()[-1]
    step = int(last.split("interrupted at step ")[1].split(":")[0])
    assert last.endswith(f"checkpoint saved; continue with `kbert pretrain --model-dir {work / 'ctrl-c'} --resume`")
    saved = os.listdir(work / "ctrl-c" / "checkpoints")
    assert f"ckpt-{step}" in saved and max(int(name[5:]) for name in saved) == step < STEPS


def test_a_jax_run_continues_from_a_model_with_init(jax_runs):
    work, runs = jax_runs
    assert runs["init"]["code"] == 0, runs["init"]["stderr"][-2000:]
    first = [json.loads(line) for line in open(work / "reference" / "metrics.jsonl")][0]
    continued = [json.loads(line) for line in open(work / "init" / "metrics.jsonl")][0]
    assert continued["step"] == first["step"] == 4
    assert continued["loss"] < first["loss"] - 0.5  # it starts where the reference run ended, not from scratch


def test_two_jax_devices_make_the_update_of_one(jax_runs):
    work, runs = jax_runs
    one, two = (json.loads(runs[name]["stdout"]) for name in ("one device", "two devices"))
    assert (one["replicas"], two["replicas"]) == (1, 2)
    start = saved_weights(work / "one")
    assert largest_difference(saved_weights(work / "two"), start) < 1e-5
    assert abs(one["loss"] - two["loss"]) < 1e-5


def test_what_jax_cannot_do_is_one_line(jax_runs, records):
    work, runs = jax_runs
    for name, words in (
        ("multi-worker", "--strategy multi-worker (tf.distribute over several machines) runs on TensorFlow only"),
        ("grad-accum", "--grad-accum 2 runs on TensorFlow only"),
        ("tpu", "--strategy tpu: JAX sees no TPU here; run on a Cloud TPU VM with jax[tpu] installed"),
        ("gpu", "--strategy gpu: JAX sees no GPU here; install jax[cuda12] or use --strategy cpu"),
        (
            "other shape",
            f"{records}: records have max_seq_length 32 and max_predictions_per_seq 5, but the flags say 64",
        ),
        (
            "tensorflow's run",
            f"--resume: the checkpoints in {work / 'tf-run' / 'checkpoints'} were written on TensorFlow",
        ),
    ):
        assert runs[name]["code"] == 1
        assert runs[name]["stderr"].startswith(f"kbert: error: {words}"), runs[name]["stderr"]
        assert len(runs[name]["stderr"].strip().splitlines()) == 1
    assert not any(os.path.exists(work / name) for name in ("mw", "ga", "os", "tpu", "gpu"))  # nothing written
    assert os.listdir(work / "tf-run") == ["checkpoints"]


def test_tensorflow_refuses_to_resume_a_jax_run(jax_runs):
    work, _ = jax_runs
    result = run_kbert("pretrain", "--model-dir", work / "reference", "--resume", "--steps", "30", check=False)
    assert result.returncode == 1
    assert result.stderr == (
        f"kbert: error: --resume: the checkpoints in {work / 'reference' / 'checkpoints'} were written on JAX or "
        "PyTorch; resume with the KERAS_BACKEND the run started on\n"
    )


def test_a_model_pretrained_on_jax_loads_and_exports_on_tensorflow(jax_runs, tmp_path):
    import tensorflow as tf

    import kbert

    work, _ = jax_runs
    on_jax = dict(np.load(work / "outputs.npz"))
    ids = {k: on_jax[k] for k in ("input_ids", "input_mask", "segment_ids")}
    model = kbert.load(work / "reference")
    outputs = model({**ids, "masked_lm_positions": np.array([[1, 2], [1, 0]], "int32")})
    for key in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(np.asarray(outputs[key]), on_jax[key], atol=1e-5, rtol=0)
    exported = json.loads(run_kbert("export", work / "reference", tmp_path / "export").stdout)["export"]
    serve = tf.saved_model.load(exported).signatures["serve_ids"]
    served = serve(**{k: tf.constant(v, serve.structured_input_signature[1][k].dtype) for k, v in ids.items()})
    np.testing.assert_allclose(served["pooled_output"].numpy(), on_jax["pooled_output"], atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory, records):
    work = tmp_path_factory.mktemp("torch")
    # Four steps a loop: the stop at step 6 falls inside the second; the last loop, 9-12, is whole in both runs.
    run = ["--steps", "12", "--save-every", "4", "--steps-per-loop", "4", "--eval-data", records, "--eval-steps", "1"]
    spec = {
        "runs": {
            "run": {
                "args": _pretrain(
                    work / "bert",
                    records,
                    "--steps",
                    "4",
                    "--save-every",
                    "2",
                    "--eval-data",
                    records,
                    "--eval-steps",
                    "1",
                )
            },
            "mirrored": {"args": _pretrain(work / "m", records, "--strategy", "mirrored")},
            "bfloat16": {"args": _pretrain(work / "bf16", records, "--steps", "2", "--mixed-precision")},
            "reference": {"args": _pretrain(work / "reference", records, *run)},
            "interrupted": {"args": _pretrain(work / "resumed", records, *run), "stop_at": 6},
            "resumed": {"args": _pretrain(work / "resumed", records, "--resume")},
        }
    }
    return work, _run(TORCH_SCRIPT, work, "torch", spec)


def test_pytorch_pretrains_without_tensorflow(torch_runs):
    tmp_path, runs = torch_runs
    assert runs["run"]["code"] == 0, runs["run"]["stderr"][-2000:]
    result = json.loads(runs["run"]["stdout"])
    assert result["step"] == 4 and result["backend"] == "torch" and set(result["eval"]) >= {"loss", "mlm_accuracy"}
    assert 4 < result["loss"] < 12  # MLM over 300 words + NSP, from a random start
    assert sorted(os.listdir(tmp_path / "bert" / "checkpoints")) == ["ckpt-2", "ckpt-4"]
    assert len(saved_weights(tmp_path / "bert")) >= 40
    bf16 = json.loads(runs["bfloat16"]["stdout"])
    assert bf16["mixed_precision"] == "mixed_bfloat16" and 4 < bf16["loss"] < 12
    dtypes = {a.dtype.name for a in saved_weights(tmp_path / "bf16").values()}
    assert "float32" in dtypes and "bfloat16" not in dtypes  # the variables stay float32
    assert runs["mirrored"]["code"] == 1
    assert runs["mirrored"]["stderr"] == (
        "kbert: error: --strategy mirrored is not available on PyTorch, where kbert trains on one device; "
        "use --strategy auto, or KERAS_BACKEND=jax or tensorflow to train on several\n"
    )


def test_a_pytorch_run_stopped_by_sigint_resumes_to_the_uninterrupted_weights(torch_runs):
    work, runs = torch_runs
    assert runs["reference"]["code"] == 0, runs["reference"]["stderr"][-2000:]
    interrupted = runs["interrupted"]
    assert interrupted["code"] == 130, interrupted["stderr"][-2000:]
    last = interrupted["stderr"].strip().splitlines()[-1]
    step = int(last.split("interrupted at step ")[1].split(":")[0])
    assert step in (6, 7)  # the step the signal came in, or the next: inside a loop of four
    assert last.endswith(f"checkpoint saved; continue with `kbert pretrain --model-dir {work / 'resumed'} --resume`")
    assert runs["resumed"]["code"] == 0, runs["resumed"]["stderr"][-2000:]
    result = json.loads(runs["resumed"]["stdout"])
    assert result["step"] == 12 and result["resumed_from"] == step and result["backend"] == "torch"
    # Dropout is on: the same masks, the same batches, the same optimizer state, bit for bit.
    assert json.load(open(CONFIG))["hidden_dropout_prob"] > 0
    assert largest_difference(saved_weights(work / "resumed"), saved_weights(work / "reference")) == 0.0
    reference, resumed = (json.loads(runs[name]["stdout"]) for name in ("reference", "resumed"))
    assert resumed["loss"] == reference["loss"] and resumed["eval"] == reference["eval"]
