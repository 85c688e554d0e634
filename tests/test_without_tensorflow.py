"""kbert on Keras' JAX and PyTorch backends in a Python where TensorFlow is not installed, as on a
GPU machine that has only JAX or PyTorch.

Keras reads KERAS_BACKEND once, so each backend runs in a Python of its own, with TensorFlow,
tensorflow-text, tf-keras and TensorFlow Hub blocked (`helpers.without_tensorflow_env`): one script
per backend does everything below and prints a JSON report, which the tests read.

- `import kbert`, `kbert --help`, `--version` and every command's --help; `kbert.load` of a kbert
  model directory and a `.keras` file, `kbert.save`, a Hugging Face folder and safetensors file
  opened as a source (`kbert.formats.sources.open_model`, as `kbert finetune` opens one), the tokenizer;
- a command that needs TensorFlow (`export`, `convert from-tf1`) says so in one line;
- a training checkpoint (`kbert.backend.checkpoints`) saved and restored bit for bit;
- `kbert finetune` of every task (on PyTorch: classify), its TensorBoard logs, and on each backend a
  run stopped by SIGTERM mid-epoch then resumed, which must end with the uninterrupted run's weights,
  bit for bit; the model fine-tuned on JAX is then exported by `kbert export` on TensorFlow, in this
  process.
"""

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import FIXTURES, TINY, run_kbert
from helpers import (
    TENSORFLOW_MODULES,
    conll_sentences,
    sentiment_rows,
    swag_rows,
    without_tensorflow_env,
    write_conll,
    write_swag,
    write_tsv,
)

SCRIPT = r"""
import contextlib, io, json, os, signal, sys, time
START = time.perf_counter()
job = json.load(open(sys.argv[1]))
report = {"tensorflow_blocked": all(sys.modules.get(m, 0) is None for m in job["blocked"])}

import keras, numpy as np
import kbert
from kbert.cli.main import app, main

report["backend"] = keras.config.backend()


def run(*args):
    started = time.perf_counter()
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "seconds": time.perf_counter() - started}


# === The command line, and what needs TensorFlow ===
import typer
commands = typer.main.get_command(app).commands
helps = {"": run("--help"), "--version": run("--version")}
for name, command in commands.items():
    helps[name] = run(name, "--help")
    for sub in getattr(command, "commands", {}):
        helps[f"{name} {sub}"] = run(name, sub, "--help")
report["help"] = {k: [v["code"], v["stdout"][:60], v["stderr"][-300:], v["seconds"]] for k, v in helps.items()}
report["export"] = run("export", job["model_dir"], os.path.join(job["work"], "export"))
report["from_tf1"] = run("convert", "from-tf1", job["tiny"], os.path.join(job["work"], "converted"))
report["strategy"] = run("finetune", job["model_dir"], "--task", "classify", "--train", job["data"]["classify"],
                         "--output", os.path.join(job["work"], "mirrored"), "--strategy", "mirrored")
os.environ["KERAS_BACKEND"] = "tensorflow"  # what the command line reads: a user who set no backend
report["default_backend"] = run("finetune", job["model_dir"], "--task", "classify", "--train",
                                job["data"]["classify"], "--output", os.path.join(job["work"], "tf"))
os.environ["KERAS_BACKEND"] = report["backend"]
report["tf1_source"] = run("finetune", job["tiny"], "--task", "classify", "--train", job["data"]["classify"],
                           "--output", os.path.join(job["work"], "from-tf1"))

# === kbert.load and kbert.save, the tokenizer ===
model = kbert.load(job["model_dir"])
kbert.save(model, os.path.join(job["work"], "saved"))
again = kbert.load(os.path.join(job["work"], "saved"))
report["save_load"] = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), again.get_weights()))
model.save(os.path.join(job["work"], "model.keras"))
report["keras_file"] = type(kbert.load(os.path.join(job["work"], "model.keras"))).__name__
from kbert.formats.sources import open_model
report["hf"] = [type(open_model(p)).__name__ for p in (job["hf"], job["hf"] + "/model.safetensors")] if "hf" in job else None
report["tokens"] = kbert.Tokenizer(os.path.join(job["model_dir"], "vocab.txt")).tokenize("The city, at the camp.")

# === A training checkpoint, bit for bit ===
from kbert.backend.checkpoints import latest_training_state, restore_training_state, save_training_state
from kbert.backend.checkpoints import random_state_variables
from kbert.training.optimization import BertAdamW, WarmupLinearDecay

def small():
    # Dense layers and dropout (a seed generator): the format is the same for a BERT, which
    # `kbert finetune` below checkpoints, and this one compiles in a moment.
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dropout(0.5), keras.layers.Dense(3)])
    m.compile(optimizer=BertAdamW(WarmupLinearDecay(1e-3, 10, 2), global_clipnorm=1.0),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m

def values(m):
    groups = (m.weights, m.optimizer.variables, random_state_variables(m))
    return [np.asarray(keras.ops.convert_to_numpy(v)) for g in groups for v in g]

rng = np.random.default_rng(0)
trained = small()
trained.fit(rng.normal(size=(8, 4)), rng.integers(0, 3, 8), batch_size=4, epochs=1, verbose=0)
folder = os.path.join(job["work"], "ckpt")
for step in (1, 2, 3):
    save_training_state(folder, step, trained, trained.optimizer, extra={"step": step}, keep=2)
fresh = small()
extra = restore_training_state(latest_training_state(folder), fresh, fresh.optimizer)
before, after = values(trained), values(fresh)
report["checkpoint"] = {
    "extra": extra, "kept": sorted(os.listdir(folder)),
    "identical": len(before) == len(after) and all(np.array_equal(a, b) for a, b in zip(before, after)),
    "iterations": int(keras.ops.convert_to_numpy(fresh.optimizer.iterations)),
    "seeds": len(random_state_variables(fresh)),
}

# === kbert finetune ===
def finetune(task, output, *more):
    return run("finetune", job["model_dir"], "--task", task, "--train", job["data"][task], "--output", output,
               "--epochs", "1", "--batch-size", "8", "--learning-rate", "1e-3", *more)

def saved_task(output):
    config = json.load(open(os.path.join(output, "bert_config.json")))
    return config.get("task") or ("embed" if "embedding" in config else None)

MORE = {
    "squad": ["--max-seq-length", "32", "--doc-stride", "16", "--max-query-length", "8"],
    "embed": ["--max-seq-length", "24", "--pooling", "mean"],
}
report["tasks"] = {}
for task in job["tasks"]:
    output = os.path.join(job["work"], task)
    result = finetune(task, output, *MORE.get(task, ["--max-seq-length", "24"]))
    if result["code"] == 0:
        result["metrics"], result["saved"] = json.loads(result["stdout"]), saved_task(output)
    report["tasks"][task] = result

if job.get("interrupt_at"):
    from kbert.training import progress
    flags = ["--dev", job["data"]["classify_dev"], "--epochs", "2", "--max-seq-length", "24", "--save-every", "2"]
    whole = finetune("classify", os.path.join(job["work"], "whole"), *flags)
    update = progress.Progress.update
    def stop_at(self, step, *args, **kwargs):  # a real SIGTERM, delivered as the step ends
        if step == job["interrupt_at"]:
            signal.raise_signal(signal.SIGTERM)
        return update(self, step, *args, **kwargs)
    progress.Progress.update = stop_at
    report["interrupted"] = finetune("classify", os.path.join(job["work"], "resumed"), *flags)
    progress.Progress.update = update
    report["resumed"] = finetune("classify", os.path.join(job["work"], "resumed"), *flags, "--resume")
    report["resumed"]["metrics"] = json.loads(report["resumed"]["stdout"] or "{}")
    # What the exported model must give: the fine-tuned classifier's probabilities, on JAX.
    from kbert.text.packing import PythonPreprocessor
    tuned = kbert.load(os.path.join(job["work"], "whole"))
    texts = ["the gold city.", "dead dust in the camp.", "a grand young fire"]
    packed, _ = PythonPreprocessor(tuned.vocab_file, tuned.do_lower_case, 24).pack(texts)
    probabilities = keras.ops.softmax(tuned(packed)["logits"], axis=-1)
    report["probe"] = {"texts": texts, "probabilities": keras.ops.convert_to_numpy(probabilities).tolist()}

report["seconds"] = time.perf_counter() - START
report["tensorflow_still_blocked"] = all(sys.modules.get(m, 0) is None for m in job["blocked"])
print(json.dumps(report))
"""

TASKS = ["classify", "regress", "tag", "squad", "choice", "embed"]


def _squad(n: int) -> dict:
    """Questions whose answer is the place word of a short context."""
    places = ["city", "camp", "desert", "highway", "cabin"]
    paragraphs = []
    for i in range(n):
        context = f"he was at the {places[i % 5]} in the morning ."
        answer = {"text": places[i % 5], "answer_start": context.index(places[i % 5])}
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": "where ?", "answers": [answer]}]})
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def _data(folder) -> dict:
    """Small files of each task over the tiny checkpoint's vocabulary."""
    folder.mkdir()
    (folder / "squad.json").write_text(json.dumps(_squad(16)))
    pairs = [(text, f"the {text}") for text, _ in sentiment_rows(16, 3)]
    return {
        "classify": str(write_tsv(folder / "classify.tsv", sentiment_rows(32, 0))),
        "classify_dev": str(write_tsv(folder / "classify_dev.tsv", sentiment_rows(16, 1))),
        "regress": str(
            write_tsv(folder / "regress.tsv", [(t, 1.0 if y == "pos" else 0.0) for t, y in sentiment_rows(16, 2)])
        ),
        "tag": str(write_conll(folder / "tag.conll", conll_sentences(16, 0))),
        "choice": str(write_swag(folder / "choice.csv", swag_rows(16, 0))),
        "squad": str(folder / "squad.json"),
        "embed": str(write_tsv(folder / "pairs.tsv", pairs, header=("query", "document"))),
    }


def _run(work, backend: str, tiny_model_dir, **job) -> dict:
    job = dict(
        job,
        model_dir=str(tiny_model_dir),
        tiny=TINY,
        work=str(work),
        data=_data(work / "data"),
        blocked=list(TENSORFLOW_MODULES),
    )
    (work / "job.json").write_text(json.dumps(job))
    (work / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(work / "script.py"), str(work / "job.json")],
        capture_output=True,
        text=True,
        # JAX keeps what XLA compiled, by program: the three classify runs compile one program.
        env=dict(
            without_tensorflow_env(work, backend),
            JAX_COMPILATION_CACHE_DIR=str(work / "xla-cache"),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("jax")
    hf = f"{FIXTURES}/hf-tiny"
    return work, _run(work, "jax", tiny_model_dir, tasks=TASKS, interrupt_at=5, hf=hf)


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("torch")
    return work, _run(work, "torch", tiny_model_dir, tasks=["classify"], interrupt_at=5)


@pytest.fixture(params=["jax", "torch"])
def report(request):
    return request.getfixturevalue(f"{request.param}_run")[1]


def test_tensorflow_is_never_imported(report):
    assert report["backend"] in ("jax", "torch")
    assert report["tensorflow_blocked"] and report["tensorflow_still_blocked"]


def test_the_command_line_answers_without_tensorflow(report):
    helps = report["help"]
    assert len(helps) > 15  # --help, --version, and every command's and convert's subcommands'
    for name, (code, stdout, stderr, _) in helps.items():
        assert code == 0 and stdout and "Traceback" not in stderr, (name, stderr)
    assert helps["--version"][1].startswith("kbert ")


def test_what_needs_tensorflow_says_so_in_one_line(report):
    for name, command in (("export", "kbert export"), ("from_tf1", "kbert convert from-tf1")):
        result = report[name]
        lines = result["stderr"].strip().splitlines()
        assert result["code"] == 1 and len(lines) == 1, (name, result["stderr"])
        assert lines[0].startswith(f"kbert: error: {command} needs TensorFlow"), lines[0]
        assert "pip install tensorflow" in lines[0]
    # Fine-tuning on Keras' TensorFlow backend (the default) where TensorFlow is missing; a
    # tf.distribute strategy on another backend.
    for name, words in (
        ("default_backend", "tensorflow is not installed: pip install tensorflow tensorflow-text, or run it with "
         "KERAS_BACKEND=jax (or torch)"),
        ("strategy", f"--strategy mirrored picks a TensorFlow strategy; on Keras' {report['backend']} backend"),
    ):  # fmt: skip
        lines = report[name]["stderr"].strip().splitlines()
        assert report[name]["code"] == 1 and len(lines) == 1 and words in lines[0], (name, lines)
    # A google-research checkpoint is TensorFlow's file: fine-tuning from one says how to go on.
    result = report["tf1_source"]
    lines = result["stderr"].strip().splitlines()
    assert result["code"] == 1 and len(lines) == 1, result["stderr"]
    assert "a google-research checkpoint is read with TensorFlow" in lines[0] and "kbert convert from-tf1" in lines[0]


def test_models_load_and_save_without_tensorflow(report):
    assert report["save_load"] and report["keras_file"] == "BertPretrainer"
    assert report["tokens"] == ["the", "city", ",", "at", "the", "camp", "."]


def test_a_hugging_face_folder_and_file_open_on_jax_without_tensorflow(jax_run):
    assert jax_run[1]["hf"] == ["BertPretrainer", "BertPretrainer"]


def test_a_training_checkpoint_round_trips_bit_for_bit(report):
    checkpoint = report["checkpoint"]
    assert checkpoint["identical"] and checkpoint["extra"] == {"step": 3}
    assert checkpoint["kept"] == ["ckpt-2", "ckpt-3"]
    assert checkpoint["iterations"] == 2 and checkpoint["seeds"] >= 1  # two batches; dropout's generator


def test_every_task_fine_tunes(report):
    for task, result in report["tasks"].items():
        assert result["code"] == 0, (task, result["stderr"][-2000:])
        assert result["saved"] == task and result["metrics"]["epoch"] == 1, (task, result)
    expected = TASKS if report["backend"] == "jax" else ["classify"]
    assert sorted(report["tasks"]) == sorted(expected)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_run_stopped_by_sigterm_resumes_to_the_same_weights(backend, request):
    work, report = request.getfixturevalue(f"{backend}_run")
    stopped = report["interrupted"]
    assert stopped["code"] == 143, stopped["stderr"]
    assert "interrupted at step 5" in stopped["stderr"] and "--resume" in stopped["stderr"]
    assert report["resumed"]["code"] == 0, report["resumed"]["stderr"]
    assert report["resumed"]["metrics"]["resumed_from_step"] == 5
    whole, resumed = _weights(work / "whole"), _weights(work / "resumed")
    assert len(whole) > 40 and whole.keys() == resumed.keys()
    different = [k for k in whole if not np.array_equal(whole[k], resumed[k])]
    assert not different, different[:5]
    # The best epoch, its dev metrics and the dev history are the uninterrupted run's too.
    results = [json.loads((work / run / "eval_results.json").read_text()) for run in ("whole", "resumed")]
    del results[1]["best"]["resumed_from_step"]
    for result in results:
        del result["best"]["train_examples_per_second"]
    assert results[0] == results[1]


def test_the_jax_run_writes_tensorboard_logs(jax_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work, _ = jax_run
    dev = EventAccumulator(str(work / "whole" / "logs" / "dev"))
    dev.Reload()
    assert [e.step for e in dev.Scalars("dev_accuracy")] == [1, 2]
    fit = EventAccumulator(str(work / "whole" / "logs" / "fit" / "train"))
    fit.Reload()
    assert [e.step for e in fit.Scalars("epoch_loss")] == [0, 1]


def test_a_model_fine_tuned_on_jax_exports_on_tensorflow(jax_run, tmp_path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    work, report = jax_run
    run_kbert("export", work / "whole", tmp_path / "export")
    served = tf.saved_model.load(str(tmp_path / "export" / "1")).signatures["serving_default"]
    out = served(text=tf.constant(report["probe"]["texts"]))
    np.testing.assert_allclose(out["probabilities"].numpy(), np.asarray(report["probe"]["probabilities"]), atol=1e-5)


def _weights(model_dir) -> dict:
    found = {}
    with h5py.File(model_dir / "model.weights.h5", "r") as f:
        f.visititems(lambda name, item: found.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return found


def test_a_run_resumes_on_the_kind_of_backend_it_started_on(tmp_path):
    import keras

    from kbert.finetuning.train import _RunCheckpoints
    from kbert.runtime.errors import KbertError

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    fingerprint = {"task": "classify", "epochs": 1}
    run = tmp_path / "out.partial"
    run.mkdir()
    state = {"step": 3, "fingerprint": fingerprint, "best_weights": None, "tracker": {}, "backend": "jax"}
    (run / "state.json").write_text(json.dumps(state))
    with pytest.raises(KbertError, match="started on Keras' jax backend.*resume it with KERAS_BACKEND=jax"):
        _RunCheckpoints(str(run), model, None, fingerprint, steps_per_epoch=4, save_every=2).resume()
