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
  process;
- inference: `predict` and `evaluate` of each model it fine-tuned, `embed`, `fill-mask`, `extend`,
  `convert to-hf/from-hf/to-keras-hub/from-keras-hub` and `convert inspect`, each printing and writing
  what the same command prints and writes on TensorFlow here (float32, 1e-5), and `predict --output`
  stopped by SIGTERM then resumed.

With TensorFlow installed and Keras on JAX or PyTorch, predict, evaluate and to-tf1 give TensorFlow's
answers, and export builds its SavedModel on TensorFlow's backend.
"""

import json
import os
import re
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
    sentiment_texts,
    swag_rows,
    without_tensorflow_env,
    write_conll,
    write_swag,
    write_tsv,
)
from kbert.converters.safetensors_file import SafetensorsFile

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
report["inspect_tf1"] = run("convert", "inspect", job["tiny"])
report["predict_server"] = run("predict", "--server", "localhost:1", "--model", "m", "--input", job["data"]["texts"])
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

# === Inference: the commands that make no TensorFlow artefact ===
# Each is run as given, "{out}" standing for an output path of its own; the test runs the same
# commands on TensorFlow and compares.
report["inference"] = {}
import re
def with_outputs(args, name):
    where = lambda m: os.path.join(job["work"], "inference", m.group(1) or name)
    return [re.sub(r"\{out(?::(\w+))?\}", where, a) for a in args]
for name, args in job["inference"].items():
    report["inference"][name] = dict(run(*with_outputs(args, name)), args=args)

# predict --output stopped by SIGTERM after its first chunk of rows, then --resume.
import kbert.finetuning.predict as predict_module
predict_batches = predict_module.predict_batches
calls = []
def stop_at_second(*args, **kwargs):  # a real SIGTERM, once the first chunk's rows are written
    calls.append(1)
    if len(calls) == 2:
        signal.raise_signal(signal.SIGTERM)
    return predict_batches(*args, **kwargs)
out = os.path.join(job["work"], "resumed.jsonl")
predict_module.predict_batches = stop_at_second
report["stopped_predict"] = run(*job["resume"], "--output", out)
predict_module.predict_batches = predict_batches
report["stopped_rows"] = sum(1 for _ in open(out + ".partial")) if os.path.exists(out + ".partial") else None
report["resumed_predict"] = dict(run(*job["resume"], "--output", out, "--resume"), out=out, args=job["resume"])

report["seconds"] = time.perf_counter() - START
report["tensorflow_still_blocked"] = all(sys.modules.get(m, 0) is None for m in job["blocked"])
print(json.dumps(report))
"""

TASKS = ["classify", "regress", "tag", "squad", "choice", "embed", "rerank"]


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
    # Each query's document, and another's as its negative: groups of pairs of unlike lengths.
    groups = [(query, document, pairs[i - 1][1] + " and more") for i, (query, document) in enumerate(pairs)]
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
        "rerank": str(write_tsv(folder / "groups.tsv", groups, header=("query", "document", "negative"))),
        "texts": str(write_lines(folder / "texts.txt", sentiment_texts(300, 4)[0])),
    }


def write_lines(path, texts):
    path.write_text("".join(text + "\n" for text in texts))
    return path


def _inference(work, data: dict, model_dir, tasks: list) -> dict:
    """The commands the script runs after fine-tuning, by name: predict and evaluate of each model it
    fine-tuned, and on the tiny model embed, fill-mask, the converters and inspect. "{out}" is an
    output path of the command's own, "{out:NAME}" command NAME's."""
    runs = {}
    for task in tasks:
        runs[f"predict_{task}"] = ["predict", str(work / task), "--input", data[task]]
        runs[f"evaluate_{task}"] = ["evaluate", str(work / task), "--input", data[task]]
    model_dir = str(model_dir)
    more = {
        "evaluate_as_embedding": ["evaluate", model_dir, "--input", data["embed"], "--task", "embed", "--pooling", "mean"],
        "embed": ["embed", model_dir, "--input", data["texts"], "--pooling", "mean", "--output", "{out}.jsonl"],
        "features": ["predict", model_dir, "--input", data["classify_dev"], "--layers", "-1,-2"],
        "fill_mask": ["fill-mask", model_dir, "the [MASK] city at the [MASK] ."],
        "to_hf": ["convert", "to-hf", model_dir, "{out}"],
        "from_hf": ["convert", "from-hf", f"{FIXTURES}/hf-tiny", "{out}"],
        "predict_converted": ["predict", "{out:from_hf}", "--input", data["classify_dev"]],
        "extend": ["extend", model_dir, "{out}", "--max-position-embeddings", "96"],
        "inspect": ["convert", "inspect", model_dir],
        "inspect_hf": ["convert", "inspect", f"{FIXTURES}/hf-tiny"],
        "to_keras_hub": ["convert", "to-keras-hub", model_dir, "{out}"],
        "from_keras_hub": ["convert", "from-keras-hub", "{out:to_keras_hub}", "{out}"],
    }  # fmt: skip
    return {**runs, **more}


def _run(work, backend: str, tiny_model_dir, **job) -> dict:
    data = _data(work / "data")
    job = dict(
        job,
        model_dir=str(tiny_model_dir),
        tiny=TINY,
        work=str(work),
        data=data,
        blocked=list(TENSORFLOW_MODULES),
        inference=_inference(work, data, tiny_model_dir, job["tasks"]),
        resume=["predict", str(tiny_model_dir), "--input", data["texts"]],
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
    # A reranker too: on PyTorch its batches run in chunks of like lengths (on JAX, whole).
    return work, _run(work, "torch", tiny_model_dir, tasks=["classify", "rerank"], interrupt_at=5)


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
    for name, command in (
        ("export", "kbert export"),
        ("from_tf1", "kbert convert from-tf1"),
        ("predict_server", "kbert predict --server"),
    ):
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
    # convert inspect reads a kbert model directory without TensorFlow (compared below), a checkpoint with it.
    result = report["inspect_tf1"]
    lines = result["stderr"].strip().splitlines()
    assert result["code"] == 1 and len(lines) == 1, result["stderr"]
    assert "a google-research checkpoint is read with TensorFlow, and tensorflow is not installed" in lines[0]


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
    expected = TASKS if report["backend"] == "jax" else ["classify", "rerank"]
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
    return _h5_arrays(model_dir / "model.weights.h5")


def _h5_arrays(path) -> dict:
    found = {}
    with h5py.File(path, "r") as f:
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


# === Inference on JAX and PyTorch: TensorFlow's answers ===

# What two runs of one command write differently whatever the backend: keras-hub's save time, and
# in a preset's configs Keras' layer names, numbered by how many of the kind the process has made.
_DIFFERS_BY_RUN = {"date_saved"}
_DIFFERS_BY_PROCESS = {"name"}


@pytest.fixture(params=["jax", "torch"])
def backend_run(request):
    return request.getfixturevalue(f"{request.param}_run")


def _outputs(args: list, name: str, folder) -> list:
    """`args` with its "{out}" and "{out:NAME}" placeholders pointing into `folder`."""
    return [re.sub(r"\{out(?::(\w+))?\}", lambda m: os.path.join(folder, m.group(1) or name), a) for a in args]


def _differences(ours, theirs, where="", ignored=_DIFFERS_BY_RUN) -> list:
    """Where two JSON values differ: numbers by more than 1e-5 (float32), anything else at all
    (but the `ignored` keys)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.keys() != theirs.keys():
            return [f"{where}: keys {sorted(ours)} != {sorted(theirs)}"]
        keys = [k for k in ours if k not in ignored]
        return [d for k in keys for d in _differences(ours[k], theirs[k], f"{where}.{k}", ignored)]
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{where}: {len(ours)} items != {len(theirs)}"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs)) for d in _differences(a, b, f"{where}[{i}]", ignored)]
    numbers = (int, float)
    if isinstance(ours, numbers) and isinstance(theirs, numbers) and not isinstance(ours, bool):
        return [] if abs(ours - theirs) <= 1e-5 else [f"{where}: {ours} != {theirs}"]
    return [] if ours == theirs else [f"{where}: {ours!r} != {theirs!r}"]


def _json_lines(text: str, folder=None) -> list:
    """JSON lines, with `folder` (where the command wrote) named OUT."""
    text = text.replace(str(folder), "OUT") if folder else text
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _file_differences(ours, theirs) -> list:
    """Where two files differ: weights (.h5, .safetensors) by more than 1e-5, JSON as `_differences`
    says, anything else byte for byte."""
    where = os.path.basename(ours)
    if ours.endswith(".h5"):
        a, b = _h5_arrays(ours), _h5_arrays(theirs)
        if a.keys() != b.keys():
            return [f"{where}: weights {sorted(a.keys() ^ b.keys())[:5]}"]
        # A head the converter created (bert_config.json's fresh_heads) holds random weights, on any backend.
        config = os.path.join(os.path.dirname(ours), "bert_config.json")
        fresh = json.load(open(config)).get("fresh_heads", []) if os.path.isfile(config) else []
        compared = [k for k in a if not any(f"/{head}_head/" in k for head in fresh)]
        return [
            f"{where}/{k}"
            for k in compared
            if a[k].shape != b[k].shape or not np.allclose(a[k], b[k], rtol=0, atol=1e-5)
        ]
    if ours.endswith(".safetensors"):
        a, b = SafetensorsFile(ours), SafetensorsFile(theirs)
        if a.shapes != b.shapes:
            return [f"{where}: shapes differ"]
        return [f"{where}/{k}" for k in a.shapes if not np.allclose(a.read(k), b.read(k), rtol=0, atol=1e-5)]
    if ours.endswith((".json", ".jsonl")):
        read = json.load if ours.endswith(".json") else lambda f: _json_lines(f.read())
        ignored = _DIFFERS_BY_RUN | (_DIFFERS_BY_PROCESS if ours.endswith(".json") else set())
        with open(ours) as f, open(theirs) as g:
            return _differences(read(f), read(g), where, ignored)
    with open(ours, "rb") as f, open(theirs, "rb") as g:
        return [] if f.read() == g.read() else [f"{where}: bytes differ"]


def _written(folder) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files)


def test_inference_gives_tensorflows_answers_without_tensorflow(backend_run, tmp_path):
    """predict, evaluate, embed, fill-mask, the converters and inspect, run on JAX or PyTorch where
    TensorFlow cannot be imported, print and write what they print and write on TensorFlow (here)."""
    work, report = backend_run
    ours_dir, theirs_dir = work / "inference", tmp_path / "inference"
    expected_names = {f"{verb}_{task}" for task in report["tasks"] for verb in ("predict", "evaluate")}
    assert expected_names <= report["inference"].keys() and "evaluate_classify" in expected_names
    differences = []
    for name, result in report["inference"].items():
        assert result["code"] == 0, (name, result["stderr"][-2000:])
        expected = run_kbert(*_outputs(result["args"], name, theirs_dir))
        ours, theirs = _json_lines(result["stdout"], ours_dir), _json_lines(expected.stdout, theirs_dir)
        assert ours and theirs, name
        differences += _differences(ours, theirs, name)
    assert _written(ours_dir) == _written(theirs_dir)
    for path in _written(ours_dir):
        differences += _file_differences(str(ours_dir / path), str(theirs_dir / path))
    assert not differences, differences[:10]


def test_predict_output_resumes_without_tensorflow(backend_run, tmp_path):
    """predict --output stopped by SIGTERM after its first rows, then --resume: the whole file, as
    TensorFlow writes it in one go."""
    _, report = backend_run
    assert report["stopped_predict"]["code"] == 143, report["stopped_predict"]["stderr"]
    assert 0 < report["stopped_rows"] < 300
    resumed = report["resumed_predict"]
    assert resumed["code"] == 0, resumed["stderr"]
    run_kbert(*resumed["args"], "--output", tmp_path / "whole.jsonl")
    with open(resumed["out"]) as f, open(tmp_path / "whole.jsonl") as g:
        ours, theirs = _json_lines(f.read()), _json_lines(g.read())
    assert len(ours) == 300
    assert not _differences(ours, theirs)


# === TensorFlow installed, Keras on JAX or PyTorch (KERAS_BACKEND set by a training shell, or keras.json) ===

ON_ANOTHER_BACKEND = r"""
import contextlib, io, json, sys
job = json.load(open(sys.argv[1]))
from kbert.cli.main import main

def run(*args):
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

print(json.dumps({name: run(*args) for name, args in job.items()}))
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_with_tensorflow_installed_every_keras_backend_predicts_evaluates_and_converts(
    backend, tiny_classifier, tmp_path
):
    """Predict and evaluate give TensorFlow's rows, and to-tf1 its checkpoint, with Keras on JAX or PyTorch;
    export, in a Python whose Keras runs on another backend, says how to run it."""
    import tensorflow as tf

    rows = [(text, "the city.", label) for text, label in sentiment_rows(8, 5)]
    data = write_tsv(tmp_path / "dev.tsv", rows, header=("text", "text_b", "label"))
    export = tmp_path / "export"
    job = {
        "predict": ["predict", str(tiny_classifier), "--input", str(data)],
        "evaluate": ["evaluate", str(tiny_classifier), "--input", str(data)],
        "export": ["export", str(tiny_classifier), str(export)],
        "to_tf1": ["convert", "to-tf1", str(tiny_classifier), str(tmp_path / "tf1")],
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "script.py").write_text(ON_ANOTHER_BACKEND)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), str(tmp_path / "job.json")],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("predict", "evaluate"):
        assert report[name]["code"] == 0, (name, report[name]["stderr"][-2000:])
        expected = run_kbert(*job[name])  # on TensorFlow, in this process
        assert not _differences(_json_lines(report[name]["stdout"]), _json_lines(expected.stdout), name)
    # In a Python whose Keras already runs on another backend, export says how to run it.
    lines = report["export"]["stderr"].strip().splitlines()
    assert report["export"]["code"] == 1 and len(lines) == 1, report["export"]["stderr"]
    assert f"Keras runs on {backend} here: run it with KERAS_BACKEND=tensorflow" in lines[0], lines[0]
    assert not export.exists()  # nothing half-made

    # A checkpoint for the original code, written from the backend's weights, as TensorFlow writes it.
    assert report["to_tf1"]["code"] == 0, report["to_tf1"]["stderr"]
    run_kbert("convert", "to-tf1", tiny_classifier, tmp_path / "tf1-on-tensorflow")
    ours, theirs = (tf.train.load_checkpoint(str(tmp_path / d)) for d in ("tf1", "tf1-on-tensorflow"))
    names = ours.get_variable_to_shape_map()
    assert names == theirs.get_variable_to_shape_map() and len(names) > 40
    for name in names:
        np.testing.assert_array_equal(ours.get_tensor(name), theirs.get_tensor(name), err_msg=name)


def test_export_as_a_command_builds_on_tensorflow_whatever_keras_backend_says(tiny_classifier, tmp_path):
    """`KERAS_BACKEND=jax kbert export` (a training shell's setting): Keras is not imported yet when
    the command starts, so it runs on TensorFlow's backend and says so; the export is the one
    TensorFlow's backend makes (here, in this process)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    on_jax = run_kbert("export", tiny_classifier, tmp_path / "on-jax", env={"KERAS_BACKEND": "jax"})
    assert "KERAS_BACKEND is jax; export builds a TensorFlow SavedModel" in on_jax.stderr
    run_kbert("export", tiny_classifier, tmp_path / "on-tensorflow")
    served = []
    for base in ("on-jax", "on-tensorflow"):
        signature = tf.saved_model.load(str(tmp_path / base / "1")).signatures["serving_default"]
        texts = tf.constant(["the gold city.", "dead dust in the camp."])
        served.append(signature(text=texts, text_b=tf.constant(["the city."] * 2))["probabilities"].numpy())
    np.testing.assert_allclose(served[0], served[1], atol=1e-6)
