"""`kbert export` of a sentence-embedding model: `embedding` from raw text, as `kbert embed` computes it.

The model is a sentence-transformers folder (hf-tiny, then mean Pooling and Normalize, as
modules.json says) converted by `kbert convert from-hf`. Each export is run as TF Serving runs it
(a TF1 session on its signatures, tests/reference/serving_session.py), by TF Hub's consumer
(`tensorflow_hub.KerasLayer` on tf-keras), and behind the stand-in TF Serving
(tests/serving/standin_server.py) for `kbert predict --server`; the reference is `kbert embed` on
the model directory (which tests/test_embed.py checks against `SentenceTransformer.encode`).
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, REFERENCE, assert_user_error, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, start_standin_server

pytestmark = pytest.mark.slow  # exports: `make test` runs them, `make test-fast` leaves them out

HF_TINY = os.path.join(FIXTURES, "hf-tiny")
LENGTH = 32  # the max_seq_length sentence_bert_config.json records
WORDS = FILLER + POSITIVE + NEGATIVE


def texts_of(n, seed=0):
    """n texts of the tiny vocabulary's words, 1 to 40 words: short ones, and some past LENGTH tokens."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 41)))) + "." for _ in range(n)]


TEXTS = texts_of(30) + ["", "gold", " ".join(["glittering"] * 50)]  # "", one word, one far past LENGTH


def sentence_transformers_folder(folder, pooling="mean", normalize=True):
    """hf-tiny as sentence-transformers saves a model: modules.json (Transformer, Pooling,
    Normalize), 1_Pooling/config.json and sentence_bert_config.json."""
    shutil.copytree(HF_TINY, folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, "pooling_mode": pooling})
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": LENGTH, "do_lower_case": False}))
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("export-embedding")


@pytest.fixture(scope="module")
def model_dir(work):
    out = work / "minilm"
    converted = json.loads(run_kbert("convert", "from-hf", sentence_transformers_folder(work / "st"), out).stdout)
    assert converted["embedding"] == {"pooling": "mean", "normalize": True, "max_seq_length": LENGTH}
    return out


@pytest.fixture(scope="module")
def texts_file(work):
    path = work / "texts.txt"
    path.write_text("".join(text + "\n" for text in TEXTS).replace("\n\n", "\n"))  # "" is no line: dropped
    return path


@pytest.fixture(scope="module")
def embedded(model_dir, texts_file):
    """`kbert embed`'s vectors of the texts file: float32 [texts, 64]."""
    stdout = run_kbert("embed", model_dir, "--input", texts_file).stdout
    return np.array([json.loads(line)["embedding"] for line in stdout.splitlines()], np.float32)


def lines_of(path):
    return path.read_text().splitlines()


@pytest.fixture(scope="module")
def export(work, model_dir):
    """The float32 export, through the command: (its JSON, EXPORT_BASE)."""
    base = work / "exports" / "minilm"
    return json.loads(run_kbert("export", model_dir, base).stdout), base


def serving_session(path):
    sys.path.insert(0, REFERENCE)
    from serving_session import ServingSession

    return ServingSession(path)


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# === The float32 export ===


def test_serving_default_takes_text_and_gives_kbert_embeds_vectors(export, model_dir, embedded, texts_file):
    import kbert

    summary, base = export
    assert summary["version"] == 1 and summary["precision"] == "float32" and summary["constant_weights"] is False
    assert summary["signatures"] == {
        "serve_examples": "tensorflow/serving/predict",
        "serve_ids": "tensorflow/serving/predict",
        "serving_default": "tensorflow/serving/predict",
    }
    assert 'name: "minilm"' in (base / "models.config").read_text()
    served = serving_session(base / "1")
    default = served.signatures["serving_default"]
    assert {k: (v.dtype, [d.size for d in v.tensor_shape.dim]) for k, v in default.inputs.items()} == {
        "text": (7, [-1])
    }
    assert {k: (v.dtype, [d.size for d in v.tensor_shape.dim]) for k, v in default.outputs.items()} == {
        "embedding": (1, [-1, 64])  # DT_STRING, DT_FLOAT
    }
    vectors = served.run({"text": lines_of(texts_file)})["embedding"]
    assert vectors.dtype == np.float32 and vectors.shape == embedded.shape == (len(TEXTS) - 1, 64)
    assert np.abs(vectors - embedded).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)  # the record normalises
    # The empty text is [CLS] [SEP], as kbert embed and sentence-transformers embed it.
    empty = served.run({"text": [""]})["embedding"]
    assert np.abs(empty - kbert.embed(model_dir, [""])).max() <= 1e-5


def test_serve_ids_and_serve_examples_give_serving_defaults_vectors(export, model_dir, texts_file):
    import tensorflow as tf

    from kbert.text.graph_packer import BertPreprocessor

    texts = lines_of(texts_file)
    served = serving_session(export[1] / "1")
    by_text = served.run({"text": texts})["embedding"]
    features = {k: v.numpy() for k, v in BertPreprocessor.for_model(model_dir, LENGTH)(tf.constant(texts)).items()}
    np.testing.assert_allclose(served.run(features, "serve_ids")["embedding"], by_text, rtol=0, atol=1e-6)
    examples = [
        tf.train.Example(
            features=tf.train.Features(feature={"text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[t]))})
        ).SerializeToString()
        for t in (text.encode() for text in texts)
    ]
    np.testing.assert_allclose(served.run({"examples": examples}, "serve_examples")["embedding"], by_text, atol=1e-6)


def test_a_batch_runs_on_its_longest_text(export, model_dir, embedded, texts_file):
    """Two texts of 6 and 13 tokens run at 16 positions (attention's softmax is [2, heads, 16, 16]),
    not the 32 the export packs to; with a text past 32 tokens beside them, at 32."""
    import tensorflow as tf

    import kbert

    served = serving_session(export[1] / "1")

    def softmax_shapes(texts):
        metadata = tf.compat.v1.RunMetadata()
        trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        out = served.run({"text": texts}, options=trace, run_metadata=metadata)["embedding"]
        shapes = {
            tuple(d.size for d in output.tensor_description.shape.dim)
            for device in metadata.step_stats.dev_stats
            for node in device.node_stats
            if node.node_name.split("/")[-1] == "Softmax"
            for output in node.output
        }
        return out, shapes

    short = ["gold glorious great.", "gold glorious great. dead dust the dread. gold."]
    out, shapes = softmax_shapes(short)
    assert shapes == {(2, 4, 16, 16)}
    assert np.abs(out - kbert.embed(model_dir, short)).max() <= 1e-5
    texts = lines_of(texts_file)
    long = [t for t in texts if len(t.split()) > 35][0]
    out, shapes = softmax_shapes(short + [long])
    assert shapes == {(3, 4, 32, 32)}
    np.testing.assert_allclose(out[2], embedded[texts.index(long)], atol=1e-5)


def test_warmup_requests_run_against_the_export(export):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = export[1] / "1" / "assets.extra" / "tf_serving_warmup_requests"
    served = serving_session(export[1] / "1")
    count = 0
    for record in tf.data.TFRecordDataset(str(path)):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        assert request.model_spec.name == "minilm" and sorted(request.inputs) == ["text"]
        texts = tf.make_ndarray(request.inputs["text"]).tolist()
        assert served.run({"text": texts})["embedding"].shape == (len(texts), 64)
        count += 1
    assert count == 3


# === Every pooling mode and normalisation, in the head the export runs ===


@pytest.mark.parametrize(
    "pooling, normalize", [("cls", False), ("mean", False), ("max", True), ("mean_sqrt_len", False)]
)
def test_the_served_head_pools_as_the_record_says(model_dir, pooling, normalize):
    """serve_embedding on the model rewritten for serving (kbert.serving.optimize: groups of
    similar length, each on its longest text) against kbert.embed with the same record."""
    import tensorflow as tf

    import kbert
    from kbert.serving.heads import serve_embedding
    from kbert.serving.optimize import optimize
    from kbert.text.graph_packer import BertPreprocessor

    model = kbert.load(model_dir)
    model.config.extras["embedding"] = {"pooling": pooling, "normalize": normalize, "max_seq_length": LENGTH}
    head = serve_embedding(model, optimize)
    features = BertPreprocessor.for_model(model_dir, LENGTH)(tf.constant(TEXTS))
    served = head.outputs(features)["embedding"].numpy()
    expected = kbert.embed(model, TEXTS)
    assert np.abs(served - expected).max() <= 1e-5
    norms = np.linalg.norm(served, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-6) if normalize else not np.allclose(norms, 1.0, atol=1e-3)


# === bfloat16 (with constant weights) and int8 ===


@pytest.mark.parametrize("flags", [["--precision", "bfloat16", "--constant-weights"], ["--precision", "int8"]])
def test_bfloat16_and_int8_exports_stay_close_to_float32(work, model_dir, export, texts_file, flags):
    """Each text's vector against the float32 export's: cosine at least 0.99. Measured on these
    texts: bfloat16 (constant weights) median 0.99997, lowest 0.99992; int8 median 0.9992, lowest 0.9983."""
    base = work / "exports" / flags[1]
    summary = json.loads(run_kbert("export", model_dir, base, *flags).stdout)
    assert summary["precision"] == flags[1]
    assert summary["constant_weights"] is ("--constant-weights" in flags)
    texts = lines_of(texts_file)
    vectors = serving_session(base / "1").run({"text": texts})["embedding"]
    reference = serving_session(export[1] / "1").run({"text": texts})["embedding"]
    assert vectors.dtype == np.float32
    similarity = cosine(vectors, reference)
    assert similarity.min() >= 0.99
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


# === TF Hub's format ===

HUB_EMBEDDING = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_hub as hub
import tensorflow_text  # noqa: F401
import tf_keras

export, texts = sys.argv[1], json.loads(sys.argv[2])
preprocessor = hub.KerasLayer(export + "/preprocessor")
encoder = hub.KerasLayer(export + "/encoder")
text_input = tf_keras.layers.Input(shape=(), dtype=tf.string)
outputs = encoder(preprocessor(text_input))
model = tf_keras.Model(text_input, {"embedding": outputs["embedding"], "default": outputs["default"],
                                    "pooled_output": outputs["pooled_output"]})
out = model(tf.constant(texts))
np.savez(sys.argv[3], **{k: v.numpy() for k, v in out.items()})
print(json.dumps({"modules": sorted(m for m in ("kbert", "keras_hub") if m in sys.modules)}))
"""


def test_tfhub_export_carries_the_embedding_beside_tf_hubs_outputs(work, model_dir, embedded, texts_file):
    out = work / "hub"
    summary = json.loads(run_kbert("export", model_dir, out, "--format", "tfhub").stdout)
    assert summary["embedding"] == {"pooling": "mean", "normalize": True, "max_seq_length": LENGTH}
    assert summary["seq_length"] == LENGTH  # the preprocessor packs to the record's length
    texts = lines_of(texts_file)
    result = subprocess.run(
        [sys.executable, "-c", HUB_EMBEDDING, str(out), json.dumps(texts), str(work / "hub.npz")],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["modules"] == []
    hub = np.load(work / "hub.npz")
    assert hub["embedding"].dtype == np.float32 and hub["embedding"].shape == embedded.shape
    assert np.abs(hub["embedding"] - embedded).max() <= 1e-5
    np.testing.assert_array_equal(hub["default"], hub["pooled_output"])  # TF Hub's default stays pooled_output
    # kbert reads the record back from the encoder's bert_config.json.
    back = json.loads(run_kbert("convert", "from-tfhub", out / "encoder", work / "from-hub").stdout)
    assert json.load(open(work / "from-hub" / "bert_config.json"))["embedding"] == summary["embedding"], back


# === kbert predict --server ===


def test_predict_server_gives_kbert_embeds_rows(export, embedded, texts_file, work):
    process, ready = start_standin_server([export[1] / "models.config"], work / "server.log")
    try:
        for server in (f"127.0.0.1:{ready['grpc_port']}", f"http://127.0.0.1:{ready['rest_port']}"):
            stdout = run_kbert("predict", "--server", server, "--model", "minilm", "--input", texts_file).stdout
            rows = [json.loads(line) for line in stdout.splitlines()]
            assert [list(row) for row in rows] == [["embedding"]] * len(embedded)
            assert np.abs(np.array([row["embedding"] for row in rows], np.float32) - embedded).max() <= 1e-5
    finally:
        process.terminate()
        process.wait(timeout=30)


# === Bad input ===


def test_text_pairs_are_refused_in_one_line_with_nothing_written(model_dir, tmp_path):
    result = run_kbert("export", model_dir, tmp_path / "base", "--text-pairs", check=False)
    assert_user_error(result, "a sentence-embedding model embeds one text per request row", "--text-pairs")
    assert os.listdir(tmp_path) == []
