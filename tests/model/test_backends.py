"""The model, its heads, the optimizer and the losses on each Keras backend: TensorFlow, JAX, PyTorch.

Keras reads KERAS_BACKEND once, when it is first imported, so JAX and PyTorch each run in a Python
of their own, and TensorFlow, the test process's backend, in this one: the script below, which
prints one JSON report. It loads the model directory converted (on
TensorFlow, by the fixture) from the original's checkpoint and compares its outputs with the
original's (fixtures/tf1-tiny/expected.npz); trains each task head with its task's loss and the
original's optimizer; runs the optimizer and the pretraining losses against numpy references of
the original's arithmetic; and saves a fine-tuned classifier, which the other backends then load.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from conftest import TESTS, TINY, run_kbert
from helpers import sentiment_texts
from test_readme import block, run_block, small_real_vocab_bert

BACKENDS = ["tensorflow", "jax", "torch"]

SCRIPT = r"""
import json, os, sys
import numpy as np
import keras, kbert
from keras import ops
from kbert.pretraining.losses import pretraining_losses
from kbert.training.optimization import BertAdamW, WarmupLinearDecay, make_optimizer

job = json.loads(sys.argv[1])
numpy = ops.convert_to_numpy
report = {"backend": keras.config.backend()}

# === The optimizer: three steps of the original's AdamW against numpy (clip, schedule, decay) ===
opt = BertAdamW(WarmupLinearDecay(0.1, total_steps=10, warmup_steps=2), weight_decay_rate=0.01, global_clipnorm=1.0)
values = {name: np.asarray(v, "float32") for name, v in job["optimizer"]["values"].items()}
variables = [keras.Variable(v, name=name) for name, v in values.items()]
for grads in job["optimizer"]["grads"]:
    opt.apply_gradients([(ops.convert_to_tensor(np.asarray(grads[v.name], "float32")), v) for v in variables])
report["optimizer"] = {v.name: numpy(v).tolist() for v in variables}

# === The pretraining losses on given logits ===
losses = pretraining_losses(
    {k: np.asarray(v, "float32") for k, v in job["losses"]["outputs"].items()},
    {k: np.asarray(v, "float32" if k == "masked_lm_weights" else "int32") for k, v in job["losses"]["labels"].items()},
)
report["losses"] = {k: float(v) for k, v in losses.items()}

# === Models built from a config import no TensorFlow on JAX and PyTorch ===
config = kbert.BertConfig.from_json_file(os.path.join(job["model_dir"], "bert_config.json"))
for build in (kbert.bert_encoder, kbert.bert_pretrainer):
    build(config)
report["tensorflow_imported"] = "tensorflow" in sys.modules

# === The original's outputs ===
expected = np.load(job["expected"])
inputs = {k: expected[k].astype("int32") for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
encoder_inputs = {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}
pretrainer = kbert.load(job["model_dir"])
out = pretrainer(inputs, training=False)
embedding = keras.Model(pretrainer.encoder.input, pretrainer.encoder.embeddings.output)(encoder_inputs)
got = {
    "embedding_output": embedding,
    "sequence_output": out["sequence_output"],
    "pooled_output": out["pooled_output"],
    "mlm_log_probs": ops.log_softmax(out["mlm_logits"], axis=-1),
    "nsp_log_probs": ops.log_softmax(out["nsp_logits"], axis=-1),
}
report["parity"] = {k: float(np.max(np.abs(numpy(v) - expected[k]))) for k, v in got.items()}

# === Every task head trains with its task's loss and the original's optimizer ===
from kbert.finetuning.tasks import get_task  # reads files with TensorFlow's ops

keras.utils.set_random_seed(0)  # imports TensorFlow where it is installed
rng = np.random.default_rng(0)
batch = {k: np.concatenate([v, v]) for k, v in encoder_inputs.items()}  # 4 rows, two of them padded
n, seq = batch["input_ids"].shape
half = n // 2  # rows i and i + half are the same inputs: they get the same targets


def twice(targets):
    return np.concatenate([targets, targets])


def fresh():  # each head on its own copy: none starts from an encoder the heads before it moved
    return kbert.load(job["model_dir"])


heads = {
    "classify": (kbert.bert_classifier(fresh(), 3), {"logits": twice(rng.integers(0, 3, half))}),
    "regress": (kbert.bert_classifier(fresh(), 1), {"logits": twice(rng.normal(size=(half, 1)).astype("float32"))}),
    "tag": (kbert.bert_tagger(fresh(), 4), {"logits": np.where(batch["input_mask"] > 0, twice(rng.integers(0, 4, (half, seq))), -1)}),
    "squad": (kbert.bert_span_predictor(fresh()), {"start_logits": twice(rng.integers(0, 5, half)), "end_logits": twice(rng.integers(5, 10, half))}),
    "choice": (kbert.bert_multiple_choice(fresh()), {"logits": np.array([1, 1])}),  # two different choices
}
report["heads"] = {}
for task, (model, targets) in heads.items():
    x = batch if task != "choice" else {k: v.reshape(2, 2, seq) for k, v in batch.items()}
    loss, loss_weights = get_task(task).losses()
    model.compile(
        optimizer=BertAdamW(WarmupLinearDecay(2e-3, total_steps=24, warmup_steps=1), global_clipnorm=1.0),
        loss=loss,
        loss_weights=loss_weights,
        # Uncompiled steps start quicker for a tiny model on TensorFlow and PyTorch; JAX's uncompiled
        # steps run op by op, slower than compiling them. The README test below fits compiled.
        jit_compile=keras.config.backend() == "jax",
    )
    before = model.evaluate(x, targets, batch_size=n, verbose=0, return_dict=True)["loss"]
    # 24 steps of batch 4 under dropout: 8 left the span head's loss above its start once in a while.
    model.fit(x, targets, batch_size=n, epochs=24, verbose=0)
    report["heads"][task] = {"before": before, "after": model.evaluate(x, targets, batch_size=n, verbose=0, return_dict=True)["loss"]}

# === A fine-tuned classifier, saved for the other backends to load ===
classifier = heads["classify"][0]
report["weights_order"] = {task: [v.path for v in model.weights] for task, (model, _) in heads.items()}
kbert.save(classifier, job["save_dir"], task="classify", labels=["a", "b", "c"])
np.savez(job["save_dir"] + ".npz", **{v.path: numpy(v) for v in classifier.weights})
np.save(job["save_dir"] + "-logits.npy", numpy(classifier.predict(batch, verbose=0)["logits"]))
print(json.dumps(report))
"""

LOAD_SCRIPT = r"""
import json, sys
import numpy as np
import keras, kbert

job = json.loads(sys.argv[1])
report = {}
for saved_by, model_dir in job["dirs"].items():
    model = kbert.load(model_dir)
    saved = np.load(model_dir + ".npz")
    logits = model.predict({k: np.asarray(v, "int32") for k, v in job["inputs"].items()}, verbose=0)["logits"]
    report[saved_by] = {
        "paths_equal": sorted(v.path for v in model.weights) == sorted(saved.files),
        "weights_bit_identical": all(np.array_equal(keras.ops.convert_to_numpy(v), saved[v.path]) for v in model.weights),
        "logits_max_diff": float(np.max(np.abs(logits - np.load(model_dir + "-logits.npy")))),
    }
print(json.dumps(report))
"""


def run_on(backend, script, job):
    """`script` run on Keras' `backend` with `job` as its argument; returns its last printed line as
    JSON. The test process's own backend runs it here, as `python -c` would, sparing a new process
    its TensorFlow import; another backend needs a Python of its own."""
    if backend == keras.config.backend():
        return _run_here(script, job)
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=TESTS)
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(job)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _run_here(script, job):
    stdout, argv = io.StringIO(), sys.argv
    sys.argv = ["-c", json.dumps(job)]
    try:  # what it prints to stderr (Keras' warnings) is set aside, as for a process of its own
        with warnings.catch_warnings(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            exec(compile(script, "<script>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = argv
    return json.loads(stdout.getvalue().strip().splitlines()[-1])


# === Independent references: the original's arithmetic in numpy, float64 ===


def optimizer_job():
    rng = np.random.default_rng(1)
    shapes = {"kernel": (3, 4), "bias": (4,), "layer_norm_gamma": (4,)}
    values = {name: rng.normal(size=shape) for name, shape in shapes.items()}
    # Step 1's gradient has a global norm above 1 (clipped), the others below (left as they are).
    grads = [{name: rng.normal(scale=s, size=shape) for name, shape in shapes.items()} for s in (2.0, 0.05, 0.1)]
    return {"values": values, "grads": grads}


def original_adamw(values, grads):
    """optimization.py of google-research/bert: clip_by_global_norm(1.0), then AdamWeightDecayOptimizer
    (β1 0.9, β2 0.999, ε 1e-6, no bias correction, decay 0.01 except LayerNorm and bias) at the
    learning rate of create_optimizer (linear warmup over 2 steps, then polynomial decay to 0 at 10)."""
    w = {k: np.asarray(v, np.float64) for k, v in values.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    for step, g in enumerate(grads):
        g = {k: np.asarray(x, np.float64) for k, x in g.items()}
        norm = np.sqrt(sum(np.sum(x**2) for x in g.values()))
        g = {k: x * 1.0 / max(norm, 1.0) for k, x in g.items()}
        lr = 0.1 * step / 2 if step < 2 else 0.1 * (1 - min(step, 10) / 10)
        for k in w:
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v[k] = 0.999 * v[k] + 0.001 * g[k] ** 2
            update = m[k] / (np.sqrt(v[k]) + 1e-6)
            if not any(tag in k for tag in ("layer_norm", "bias")):
                update += 0.01 * w[k]
            w[k] = w[k] - lr * update
    return w


def losses_job():
    rng = np.random.default_rng(2)
    mlm_logits = rng.normal(0, 3, (2, 3, 50))
    ids = rng.integers(0, 50, (2, 3))
    # Hits: the first position of each row, and row 0's last, which weighs 0 (padding).
    ids[:, 0], ids[0, 2] = mlm_logits[:, 0].argmax(-1), mlm_logits[0, 2].argmax()
    return {
        "outputs": {"mlm_logits": mlm_logits, "nsp_logits": rng.normal(0, 3, (2, 2))},
        "labels": {
            "masked_lm_ids": ids,
            "masked_lm_weights": [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]],  # padding positions weigh 0
            "next_sentence_labels": [0, 1],
        },
    }


def original_losses(job):
    """run_pretraining.py's get_masked_lm_output and get_next_sentence_output, in numpy."""

    def log_softmax(x):
        x = np.asarray(x, np.float64)
        return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))

    ids, weights = np.asarray(job["labels"]["masked_lm_ids"]), np.asarray(job["labels"]["masked_lm_weights"])
    mlm = log_softmax(job["outputs"]["mlm_logits"])
    per_position = -np.take_along_axis(mlm, ids[..., None], -1)[..., 0]
    mlm_loss = np.sum(weights * per_position) / (np.sum(weights) + 1e-5)
    nsp_labels = np.asarray(job["labels"]["next_sentence_labels"])
    nsp = log_softmax(job["outputs"]["nsp_logits"])
    nsp_loss = np.mean(-nsp[np.arange(2), nsp_labels])
    return {
        "loss": mlm_loss + nsp_loss,
        "mlm_loss": mlm_loss,
        "nsp_loss": nsp_loss,
        "mlm_accuracy": np.sum(weights * (mlm.argmax(-1) == ids)) / (np.sum(weights) + 1e-5),
        "nsp_accuracy": np.mean(nsp.argmax(-1) == nsp_labels),
    }


def to_json(value):
    return json.loads(json.dumps(value, default=lambda a: np.asarray(a).tolist()))


@pytest.fixture(scope="module")
def reports(tiny_model_dir, tmp_path_factory):
    """Each backend's report (run once, in the order BACKENDS names them), and where each saved its classifier."""
    work = tmp_path_factory.mktemp("backends")
    jobs = {
        b: to_json(
            {
                "model_dir": str(tiny_model_dir),
                "expected": os.path.join(TINY, "expected.npz"),
                "save_dir": str(work / f"saved-on-{b}"),
                "optimizer": optimizer_job(),
                "losses": losses_job(),
            }
        )
        for b in BACKENDS
    }
    return {b: run_on(b, SCRIPT, jobs[b]) for b in BACKENDS}, {b: jobs[b]["save_dir"] for b in BACKENDS}


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_match_the_original_on_each_backend(reports, backend):
    report = reports[0][backend]
    assert report["backend"] == backend
    assert set(report["parity"]) == {
        "embedding_output",
        "sequence_output",
        "pooled_output",
        "mlm_log_probs",
        "nsp_log_probs",
    }
    for name, diff in report["parity"].items():
        assert diff <= 1e-5, (backend, name, diff)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_models_import_no_tensorflow_on_jax_and_torch(reports, backend):
    assert reports[0][backend]["tensorflow_imported"] is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimizer_is_the_originals_on_each_backend(reports, backend):
    job = optimizer_job()
    expected = original_adamw(job["values"], job["grads"])
    for name, value in reports[0][backend]["optimizer"].items():
        np.testing.assert_allclose(value, expected[name], atol=1e-6, rtol=0, err_msg=f"{backend} {name}")
    # The steps moved every weight, and the decayed kernel differently from an undecayed update.
    assert all(np.abs(np.asarray(expected[k]) - job["values"][k]).max() > 1e-3 for k in expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pretraining_losses_are_the_originals_on_each_backend(reports, backend):
    expected = original_losses(losses_job())
    got = reports[0][backend]["losses"]
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], abs=1e-5), (backend, name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_head_trains_on_each_backend(reports, backend):
    heads = reports[0][backend]["heads"]
    assert set(heads) == {"classify", "regress", "tag", "squad", "choice"}
    for task, losses in heads.items():
        assert np.isfinite(losses["after"]) and losses["after"] < losses["before"], (backend, task, losses)


def test_models_list_their_weights_in_one_order_on_every_backend(reports):
    """The order of `model.weights` is the order of the optimizer's slots in a `.keras` file."""
    orders = {b: reports[0][b]["weights_order"] for b in BACKENDS}
    assert orders["jax"] == orders["tensorflow"] and orders["torch"] == orders["tensorflow"]


@pytest.mark.parametrize("loaded_by", BACKENDS)
def test_weights_saved_on_one_backend_load_on_the_others(reports, loaded_by):
    _, saved = reports
    expected = np.load(os.path.join(TINY, "expected.npz"))
    inputs = {k: np.concatenate([expected[k]] * 2).tolist() for k in ("input_ids", "input_mask", "segment_ids")}
    dirs = {b: d for b, d in saved.items() if b != loaded_by}
    result = run_on(loaded_by, LOAD_SCRIPT, {"dirs": dirs, "inputs": inputs})
    assert set(result) == set(dirs)
    for saved_by, check in result.items():
        assert check["paths_equal"] and check["weights_bit_identical"], (saved_by, loaded_by, check)
        # The weights are the same bits; the logits are another backend's arithmetic on them, whose
        # order of summation varies with the threads it gets (1.3e-6 seen under a loaded host).
        assert check["logits_max_diff"] <= 1e-5, (saved_by, loaded_by, check)


@pytest.mark.slow  # the README's model on the real vocabulary, compiled fit, then `kbert predict`
@pytest.mark.parametrize("backend", BACKENDS)
def test_readme_model_fit_block_runs_on_each_backend(backend, tmp_path, monkeypatch):
    """README's model.fit example, as written, on each backend; the CLI (on TensorFlow) then reads the
    `.keras` file it saved (the whole classifier: its labels, vocabulary and casing), and the kbert
    model directory it saved is there."""
    small_real_vocab_bert(tmp_path / "bert-base")
    texts, labels = sentiment_texts(32, seed=0)
    data = f"texts = {texts!r}\nlabels = {[int(label) for label in labels]!r}\n"
    monkeypatch.setenv("KERAS_BACKEND", backend)
    values = run_block(data + block("model-fit") + "\nkeras.config.backend()\n", tmp_path)
    monkeypatch.undo()
    assert values[-1] == repr(backend)
    test = tmp_path / "test.tsv"
    test.write_text("text\tlabel\n" + "".join(f"{t}\t{['neg', 'pos'][int(y)]}\n" for t, y in zip(texts[:4], labels)))
    rows = [
        json.loads(line)
        for line in run_kbert("predict", tmp_path / "classifier.keras", "--input", test).stdout.splitlines()
    ]
    assert len(rows) == 4 and all(set(row["probabilities"]) == {"neg", "pos"} for row in rows)
    assert (tmp_path / "out" / "clf" / "model.weights.h5").is_file()
    assert keras.config.backend() == "tensorflow"


@pytest.mark.parametrize("keras_json_backend", [None, "jax"])
def test_import_kbert_leaves_the_backend_to_keras(tmp_path, keras_json_backend):
    """Without KERAS_BACKEND, Keras' own choice stands: the backend ~/.keras/keras.json names, else
    TensorFlow; and importing kbert sets no KERAS_BACKEND for the processes it starts."""
    if keras_json_backend:
        (tmp_path / "keras.json").write_text(json.dumps({"backend": keras_json_backend}))
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    code = "import os, kbert, keras; print(keras.config.backend(), os.environ.get('KERAS_BACKEND'))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(env, KERAS_HOME=str(tmp_path)),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [keras_json_backend or "tensorflow", "None"]
