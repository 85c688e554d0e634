"""`kbert export --precision int8 --calibration FILE [--max-drift X]`: the drift from float32, as a client sees it.

Each kind of served model is exported in int8 with calibration texts, and in float32 by a second
`kbert export`; the test loads both SavedModels itself, calls their `serving_default` on the same
texts, and computes the numbers the report must hold (cosines, agreement, errors) with its own
numpy. --max-drift below the measured drift refuses and writes nothing; above it, the export is
written. The refusals of bad calibration input are in tests/test_bad_input_sweep.py.
"""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, assert_user_error, run_kbert
from kbert.serving.drift import drift_report

pytestmark = pytest.mark.skipif(os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0", reason="oneDNN is off")

LABELS = ["O", "B-LOC", "I-LOC", "PER"]


@pytest.fixture(scope="module")
def texts_file():
    """google-research's sample text: 31 real lines, one batch of the drift's requests."""
    return os.path.join(FIXTURES, "sample_text.txt")


def texts_of(path):
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """The tiny model as each kind the export serves: encoder, sentence-embedding model (its
    pooling recorded as `kbert convert from-hf` records it), classifier, regressor, tagger (their
    heads fresh: random weights give outputs that are neither all alike nor trained)."""
    work = tmp_path_factory.mktemp("drift-models")
    shutil.copytree(tiny_model_dir, work / "embedding")
    config = json.loads((work / "embedding" / "bert_config.json").read_text())
    embedding = {"pooling": "mean", "normalize": True, "max_seq_length": 32}
    (work / "embedding" / "bert_config.json").write_text(json.dumps(dict(config, embedding=embedding)))
    encoder = kbert.load(tiny_model_dir)
    kbert.save(kbert.bert_classifier(encoder, 3, task_info={"labels": ["a", "b", "c"]}), work / "classifier")
    kbert.save(kbert.bert_classifier(encoder, 1, task_info={"task": "regress"}), work / "regressor")
    kbert.save(kbert.bert_tagger(encoder, 4, task_info={"task": "tag", "labels": LABELS}), work / "tagger")
    return {
        "encoder": tiny_model_dir,
        **{kind: work / kind for kind in ("embedding", "classifier", "regressor", "tagger")},
    }


def serving_default(path, texts, texts_b=None):
    """The numeric outputs of the SavedModel at `path` for `texts`, one request of them all."""
    function = tf.saved_model.load(str(path)).signatures["serving_default"]
    request = {"text": tf.constant(texts)}
    if "text_b" in function.structured_input_signature[1]:
        request["text_b"] = tf.constant(texts_b or [""] * len(texts))
    return {k: v.numpy() for k, v in function(**request).items() if v.dtype != tf.string}


def cosines(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def expected(kind, want, got):
    """The report's numbers, computed here from both exports' outputs."""
    if kind == "embedding":
        c = cosines(want["embedding"], got["embedding"])
        return {"cosine_median": np.median(c), "cosine_min": c.min(), "drift": 1 - c.min()}
    if kind == "encoder":
        real = want["input_mask"] == 1
        c = cosines(want["pooled_output"], got["pooled_output"])
        t = cosines(want["sequence_output"][real], got["sequence_output"][real])
        return {
            "cosine_median": np.median(c),
            "cosine_min": c.min(),
            "token_cosine_median": np.median(t),
            "token_cosine_min": t.min(),
            "drift": 1 - min(c.min(), t.min()),
        }
    if kind == "classifier":
        agreement = np.mean(want["label_id"] == got["label_id"])
        error = np.abs(want["probabilities"] - got["probabilities"])
        return {
            "agreement": agreement,
            "probability_error_max": error.max(),
            "probability_error_mean": error.mean(),
            "drift": 1 - agreement,
        }
    if kind == "regressor":
        error = np.abs(want["score"].astype(np.float64) - got["score"])
        return {"error_max": error.max(), "error_mean": error.mean(), "drift": error.max()}
    real = want["input_mask"] == 1
    agreement = np.mean(want["label_id"][real] == got["label_id"][real])
    return {"agreement": agreement, "drift": 1 - agreement}


@pytest.fixture(scope="module")
def exported(models, texts_file, tmp_path_factory):
    """Each kind exported in int8 with --calibration (its JSON) and in float32 (its path)."""
    work = tmp_path_factory.mktemp("drift-exports")
    out = {}
    for kind, model in models.items():
        result = run_kbert("export", model, work / kind, "--precision", "int8", "--calibration", texts_file)
        float32 = run_kbert("export", model, work / f"{kind}-float32")
        out[kind] = (json.loads(result.stdout), json.loads(float32.stdout)["export"])
    return out


@pytest.mark.slow  # ten exports: `make test` runs it, `make test-fast` leaves it out
@pytest.mark.parametrize("kind", ["encoder", "embedding", "classifier", "regressor", "tagger"])
def test_the_drift_is_what_a_client_of_both_exports_sees(exported, texts_file, kind):
    """The report's numbers equal those computed here from the int8 export and the float32
    export of the same model, both loaded with tf.saved_model.load and called on the calibration
    texts; it is printed and recorded beside the export alike."""
    result, float32 = exported[kind]
    report = result["drift"]
    texts = texts_of(texts_file)
    assert report["kind"] == kind and report["texts"] == len(texts) == 31
    assert report["precision"] == "int8" and report["reference"] == "float32" and report["max_drift"] is None
    want = expected(kind, serving_default(float32, texts), serving_default(result["export"], texts))
    for name, value in want.items():
        assert report[name] == pytest.approx(float(value), abs=1e-6), name
    with open(os.path.join(result["export"], "assets.extra", "kbert_drift.json")) as f:
        assert json.load(f) == report
    # Close to float32, and not equal to it: the int8 outputs were really compared.
    if kind in ("encoder", "embedding"):
        assert 0 < report["drift"] < 0.05
    if kind == "regressor":
        assert 0 < report["drift"]


@pytest.mark.slow
def test_max_drift_refuses_past_the_measured_drift_and_writes_nothing(exported, models, texts_file, tmp_path):
    measured = exported["embedding"][0]["drift"]["drift"]
    base = tmp_path / "base"
    args = ["export", models["embedding"], base, "--precision", "int8", "--calibration", texts_file]
    refused = run_kbert(*args, "--max-drift", f"{measured / 2:.9f}", check=False)
    # Refused after the export is built and measured: the warnings of that work (a CPU without
    # int8 dot products) may come before the one error line.
    assert_user_error(
        refused, "the int8 export drifts", f"--max-drift {measured / 2:.9f}", "nothing was written", alone=False
    )
    assert f"{measured:.6g}" in refused.stderr
    assert not (base / "1").exists() and not base.exists()
    written = json.loads(run_kbert(*args, "--max-drift", f"{measured * 2:.9f}").stdout)
    assert written["drift"]["drift"] == pytest.approx(measured, abs=1e-6)
    assert written["drift"]["max_drift"] == pytest.approx(measured * 2)
    assert os.path.exists(os.path.join(written["export"], "saved_model.pb"))


@pytest.mark.slow
def test_a_bfloat16_export_of_sentence_pairs_is_measured_against_float32_the_same_way(
    exported, models, texts_file, tmp_path
):
    """bfloat16 is measured as int8 is (its float32 reference opened again in float32), and a
    calibration table of pairs sends each text with its text_b; --calibration-texts takes the first N."""
    texts = texts_of(texts_file)[:20]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("text\ttext_b\n" + "".join(f"{a}\t{b}\n" for a, b in zip(texts, texts[1:] + texts[:1])))
    result = json.loads(
        run_kbert(
            "export", models["classifier"], tmp_path / "base", "--precision", "bfloat16",
            "--calibration", pairs, "--calibration-texts", "16",
        ).stdout
    )  # fmt: skip
    report, float32 = result["drift"], exported["classifier"][1]
    assert (report["precision"], report["kind"], report["texts"]) == ("bfloat16", "classifier", 16)
    texts_b = texts[1:17]
    want = expected(
        "classifier",
        serving_default(float32, texts[:16], texts_b),
        serving_default(result["export"], texts[:16], texts_b),
    )
    for name, value in want.items():
        assert report[name] == pytest.approx(float(value), abs=1e-6), name
    assert report["probability_error_max"] > 0  # bfloat16 really ran


def test_without_calibration_no_drift_is_measured_or_recorded(tiny_encoder_export):
    base, result = tiny_encoder_export
    assert "drift" not in result
    assert not (base / "1" / "assets.extra" / "kbert_drift.json").exists()


def test_drift_report_per_kind():
    """Each kind's numbers on outputs small enough to check by hand."""
    regress = drift_report([{"score": np.array([1.0, 2.0])}], [{"score": np.array([1.5, 2.0])}])
    assert (regress["kind"], regress["error_max"], regress["error_mean"], regress["drift"]) == (
        "regressor",
        0.5,
        0.25,
        0.5,
    )
    mask = np.array([[1, 1, 1, 0]])
    tag = drift_report(
        [{"label_id": np.array([[0, 1, 2, 3]]), "input_mask": mask}],
        [{"label_id": np.array([[0, 1, 0, 0]]), "input_mask": mask}],
    )
    assert (tag["kind"], tag["agreement"]) == ("tagger", pytest.approx(2 / 3))
    vectors = drift_report(
        [{"embedding": np.array([[1.0, 0.0], [0.0, 1.0]])}], [{"embedding": np.array([[1.0, 0.0], [1.0, 1.0]])}]
    )
    assert vectors["cosine_min"] == pytest.approx(np.sqrt(0.5)) and vectors["drift"] == pytest.approx(1 - np.sqrt(0.5))


def test_the_help_names_the_default_number_of_calibration_texts():
    from kbert.serving.drift import CALIBRATION_TEXTS

    shown = " ".join(run_kbert("export", "--help").stdout.split())
    assert f"the first {CALIBRATION_TEXTS}," in shown
