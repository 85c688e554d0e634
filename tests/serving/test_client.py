"""`kbert.serving.Client` and `kbert predict --server`, over gRPC and REST.

The real tensorflow_model_server cannot be installed here, so the server is
tests/serving/standin_server.py: it loads the exports the way TF Serving does (a TF1 session on the
signature_defs, tensorflow_text's ops registered) and answers with TF Serving's protos, JSON,
status codes and messages. One server serves a sentence-pair classifier and a single-text
regressor, both the tiny checkpoint with a head (what the head learned does not matter to
serving: the classifier is conftest's shared fine-tuned one), exported by `kbert export`; every answer is compared with the same SavedModel's
signatures run in this process by `tf.saved_model.load`.
"""

import json
import logging
import os
import re
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from conftest import CLASSIFIER_LENGTH, TINY, assert_user_error, run_kbert
from helpers import STANDIN_SERVER, write_tsv
from kbert.runtime.errors import KbertError
from kbert.serving import Client

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

LENGTH = CLASSIFIER_LENGTH  # the regressor's, as the shared classifier's
LONG = " ".join(["gold"] * 5000)
# Real text, an empty string, a text far past max length, and invalid UTF-8 bytes (dropped in
# the graph, as the original's decode("utf-8", "ignore") drops them); the last is a pair.
TEXTS = ["gold glorious great.", "dead dust the dread.", "", LONG, b"gold\xff glorious\xfe great."]
TEXTS_B = ["", "", "", "", "dead."]
IDS = {
    "input_ids": [[2, 5, 6, 3, 0], [2, 7, 3, 8, 3]],
    "input_mask": [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],
    "segment_ids": [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]],
}
PROTOCOLS = ["grpc", "rest"]


def as_bytes(texts):
    return [t if isinstance(t, bytes) else t.encode() for t in texts]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_model_dir, tiny_classifier_export):
    """The sentence-pair classifier's export (conftest's, shared), and the regressor exported here
    by `kbert export`."""
    import keras

    import kbert

    work = tmp_path_factory.mktemp("serving")
    keras.utils.set_random_seed(1)
    regressor = kbert.bert_classifier(kbert.load(tiny_model_dir), 1)
    regressor.task_info = {"task": "regress", "max_seq_length": LENGTH, "text_pairs": False}
    kbert.save(regressor, work / "regressor")
    similarity = json.loads(run_kbert("export", work / "regressor", work / "exports" / "similarity").stdout)["export"]
    return {"work": work, "sentiment": str(tiny_classifier_export[0] / "1"), "similarity": similarity}


@pytest.fixture(scope="module")
def server(exports):
    """The stand-in serving both exports (from the models.config files kbert export wrote), with
    TF Serving's strictest signature checks; the in-process reference answers are computed
    while it loads."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    configs = [os.path.join(os.path.dirname(exports[name]), "models.config") for name in ("sentiment", "similarity")]
    log = open(exports["work"] / "server.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            STANDIN_SERVER,
            "--grpc-port",
            "0",
            "--rest-port",
            "0",
            "--enable_signature_method_name_check",
            *[a for c in configs for a in ("--model_config_file", c)],
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    try:
        signatures = {name: tf.saved_model.load(exports[name]).signatures for name in ("sentiment", "similarity")}
        default = signatures["sentiment"]["serving_default"]
        reference = {
            "serving_default": {
                k: v.numpy()
                for k, v in default(text=tf.constant(as_bytes(TEXTS)), text_b=tf.constant(as_bytes(TEXTS_B))).items()
            },
            "serve_ids": {
                k: v.numpy()
                for k, v in signatures["sentiment"]["serve_ids"](
                    **{k: tf.constant(v, tf.int32) for k, v in IDS.items()}
                ).items()
            },
            "score": signatures["similarity"]["serving_default"](text=tf.constant(as_bytes(TEXTS)))["score"].numpy(),
        }
        line = process.stdout.readline()
        log.flush()
        assert line, "the stand-in server did not start:\n" + (exports["work"] / "server.log").read_text()[-3000:]
        ready = json.loads(line)
        assert ready["models"] == {"sentiment": 1, "similarity": 1} and ready["warmup_requests"] == {
            "sentiment": 3,
            "similarity": 3,
        }
        yield {
            "grpc": f"127.0.0.1:{ready['grpc_port']}",
            "rest": f"http://127.0.0.1:{ready['rest_port']}",
            "reference": reference,
        }
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module", params=PROTOCOLS)
def client(request, server):
    return Client(server[request.param], "sentiment")


def test_predict_text_equals_the_saved_model(client, server):
    expected = server["reference"]["serving_default"]
    out = client.predict_text(TEXTS, TEXTS_B)
    assert sorted(out) == ["label", "label_id", "probabilities"]
    assert out["probabilities"].dtype == np.float32 and out["probabilities"].shape == (5, 2)
    np.testing.assert_allclose(out["probabilities"], expected["probabilities"], atol=1e-5)
    assert out["label_id"].dtype == np.int32 and out["label_id"].tolist() == expected["label_id"].tolist()
    assert out["label"].dtype == object and out["label"].tolist() == [s.decode() for s in expected["label"]]


def test_grpc_and_rest_give_the_same_answers(server):
    grpc, rest = (Client(server[p], "sentiment").predict_text(TEXTS, TEXTS_B) for p in PROTOCOLS)
    assert sorted(grpc) == sorted(rest)
    for name in grpc:
        np.testing.assert_array_equal(grpc[name], rest[name])  # REST's floats round-trip exactly


def test_predict_ids_equals_serve_ids(client, server):
    expected = server["reference"]["serve_ids"]
    out = client.predict_ids(IDS["input_ids"], IDS["input_mask"], IDS["segment_ids"])
    np.testing.assert_allclose(out["probabilities"], expected["probabilities"], atol=1e-5)
    assert out["label_id"].tolist() == expected["label_id"].tolist()
    # predict() casts plain lists to the signature's int32, over gRPC too.
    again = client.predict(IDS, signature_name="serve_ids")
    np.testing.assert_array_equal(again["probabilities"], out["probabilities"])


def test_classify_gives_labels_and_probabilities(client, server):
    probabilities = server["reference"]["serving_default"]["probabilities"]
    rows = client.classify(TEXTS, TEXTS_B)
    assert [[label for label, _ in row] for row in rows] == [["neg", "pos"]] * len(TEXTS)
    np.testing.assert_allclose([[score for _, score in row] for row in rows], probabilities, atol=1e-5)
    # Without text_b the Example has no text_b feature, which parses as "": the same answers.
    single = client.classify(TEXTS[:4])
    np.testing.assert_allclose([[s for _, s in row] for row in single], probabilities[:4], atol=1e-5)
    assert client.classify([]) == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_regress_and_a_single_text_model(server, protocol):
    client = Client(server[protocol], "similarity")
    expected = server["reference"]["score"]
    np.testing.assert_allclose(client.regress(TEXTS), expected, atol=1e-5)
    out = client.predict_text(TEXTS)  # its serving_default takes no text_b
    assert sorted(out) == ["score"] and out["score"].dtype == np.float32
    np.testing.assert_allclose(out["score"], expected, atol=1e-5)
    assert client.regress([]) == []


def test_metadata_and_status(client):
    signatures = client.metadata()
    assert {name: s["method_name"] for name, s in signatures.items() if not name.startswith("__")} == {
        "classify": "tensorflow/serving/classify",
        "serve_examples": "tensorflow/serving/predict",
        "serve_ids": "tensorflow/serving/predict",
        "serving_default": "tensorflow/serving/predict",
    }
    default = signatures["serving_default"]
    assert default["inputs"] == {
        "text": {"dtype": "DT_STRING", "shape": [-1]},
        "text_b": {"dtype": "DT_STRING", "shape": [-1]},
    }
    assert default["outputs"]["probabilities"] == {"dtype": "DT_FLOAT", "shape": [-1, 2]}
    assert signatures["classify"]["outputs"] == {
        "classes": {"dtype": "DT_STRING", "shape": [-1, 2]},
        "scores": {"dtype": "DT_FLOAT", "shape": [-1, 2]},
    }
    assert signatures["serve_ids"]["inputs"]["input_ids"] == {"dtype": "DT_INT32", "shape": [-1, -1]}
    assert client.status() == [{"version": 1, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}]
    assert Client(client.address, "sentiment", version=1).status()[0]["version"] == 1


def test_bad_texts_give_defined_outputs(client):
    out = client.predict_text(TEXTS, TEXTS_B)
    assert np.isfinite(out["probabilities"]).all()
    np.testing.assert_allclose(out["probabilities"].sum(-1), 1, atol=1e-5)
    # Invalid UTF-8 bytes (sent as {"b64": ...} over REST) are dropped: the clean text's answer.
    clean, broken = client.predict_text(["gold glorious great.", b"gold\xff glorious\xfe great."])["probabilities"]
    np.testing.assert_allclose(broken, clean, atol=1e-6)
    empty = client.predict_text([])
    assert empty["probabilities"].shape == (0, 2) and empty["label"].shape == (0,)
    assert empty["probabilities"].dtype == np.float32


# (call, what the message must hold over gRPC, over REST): each a TF Serving error, except
# where TF Serving's REST API ignores the mistake (it reads only the signature's input names).
IGNORED = object()
BAD_REQUESTS = {
    "unknown signature": (
        lambda c: c.predict({"text": ["x"]}, signature_name="nope"),
        'FAILED_PRECONDITION: Serving signature key "nope" not found.',
        'HTTP 400: Serving signature name: "nope" not found in signature def',
    ),
    "wrong input name": (
        lambda c: c.predict({"txt": ["x"], "text_b": [""]}),
        "INVALID_ARGUMENT: Signature input alias: text(feed name: serving_default_text:0) not found in request",
        "HTTP 400: Missing named input: text in 'inputs' object.",
    ),
    "extra input": (
        lambda c: c.predict({"text": ["x"], "text_b": [""], "extra": ["y"]}),
        "INVALID_ARGUMENT: input size does not match signature: 3!=2",
        IGNORED,
    ),
    "unknown model": (
        lambda c: Client(c.address, "nope").predict_text(["x"]),
        "NOT_FOUND: Servable not found for request: Latest(nope)",
        "HTTP 404: Servable not found for request: Latest(nope)",
    ),
    "unknown version": (
        lambda c: Client(c.address, "sentiment", version=7).status(),
        "NOT_FOUND: Could not find version 7 of model sentiment",
        "HTTP 404: Could not find version 7 of model sentiment",
    ),
    "classify on a predict signature": (
        lambda c: c.classify(["x"], signature_name="serving_default"),
        "INVALID_ARGUMENT: Expected classification signature method_name to be tensorflow/serving/classify. "
        "Was: tensorflow/serving/predict",
        "HTTP 400: Expected classification signature method_name",
    ),
    "regress on the classify signature": (
        lambda c: c.regress(["x"], signature_name="classify"),
        "Expected regression signature method_name to be tensorflow/serving/regress. Was: tensorflow/serving/classify",
        "HTTP 400: Expected regression signature method_name",
    ),
    "no such signature for classify": (
        lambda c: c.classify(["x"], signature_name="nope"),
        "INVALID_ARGUMENT: No signature was found with the name: nope",
        "HTTP 400: No signature was found with the name: nope",
    ),
    "pairs for a single-text model": (
        lambda c: Client(c.address, "similarity").predict_text(["gold."], ["dead."]),
        "serving_default takes single texts (no text_b)",
        "serving_default takes single texts (no text_b)",
    ),
    "an error in the graph": (
        lambda c: c.predict_ids([[2, 5, 300000]], [[1, 1, 1]], [[0, 0, 0]]),
        "INVALID_ARGUMENT: indices[0,2] = 300000 is not in [0, 300)",
        "HTTP 400: indices[0,2] = 300000 is not in [0, 300)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_server_errors_are_one_line_kbert_errors(client, case):
    call, grpc_message, rest_message = BAD_REQUESTS[case]
    expected = grpc_message if client.protocol == "grpc" else rest_message
    if expected is IGNORED:
        assert sorted(call(client)) == ["label", "label_id", "probabilities"]
    else:
        with pytest.raises(KbertError) as raised:
            call(client)
        message = str(raised.value)
        assert "\n" not in message
        assert f"TF Serving at {client.target} (model " in message
        assert expected in message, message
    # ... and the server goes on serving.
    assert client.predict_text(["gold."])["probabilities"].shape == (1, 2)


@pytest.mark.parametrize("address", ["127.0.0.1:1", "http://127.0.0.1:1"])
def test_no_server_says_how_to_fix(address):
    with pytest.raises(KbertError, match=r"is the server running at 127\.0\.0\.1:1\?"):
        Client(address, "sentiment", retries=0).metadata()
    with pytest.raises(KbertError, match="give HOST:PORT"):
        Client("127.0.0.1", "sentiment")


def test_rest_row_format_and_examples_with_context(server):
    """What the client does not send, TF Serving's REST API still takes: rows ("instances"),
    a bare "inputs" value, and examples that share a "context"."""
    url = f"{server['rest']}/v1/models/sentiment"

    def post(suffix, body):
        request = urllib.request.Request(url + suffix, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    columnar = post(":predict", {"inputs": {"text": ["gold.", "dead."], "text_b": ["", ""]}})["outputs"]
    rows = post(
        ":predict", {"instances": [{"text": {"b64": "Z29sZC4="}, "text_b": ""}, {"text": "dead.", "text_b": ""}]}
    )["predictions"]
    assert [r["label"] for r in rows] == columnar["label"]
    np.testing.assert_allclose([r["probabilities"] for r in rows], columnar["probabilities"], atol=1e-7)
    with_context = post(
        ":classify",
        {"signature_name": "classify", "context": {"text_b": ""}, "examples": [{"text": "gold."}, {"text": "dead."}]},
    )["results"]
    np.testing.assert_allclose([[s for _, s in row] for row in with_context], columnar["probabilities"], atol=1e-7)
    single = urllib.request.Request(
        f"{server['rest']}/v1/models/similarity:predict", data=json.dumps({"inputs": ["gold."]}).encode(), method="POST"
    )
    with urllib.request.urlopen(single, timeout=30) as response:
        assert len(json.loads(response.read())["outputs"]) == 1  # one output: bare, not {"score": ...}


def test_kbert_predict_server_end_to_end(server, exports):
    work = exports["work"]
    rows = [("gold glorious great.", "the city.", "pos"), ("dead dust the dread.", "", "neg"), ("", "", "neg")]
    tsv = write_tsv(work / "predict.tsv", rows, header=("text", "text_b", "label"))
    result = run_kbert(
        "predict", "--server", server["grpc"], "--model", "sentiment", "--input", tsv, "--batch-size", "2"
    )
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert len(lines) == 3
    expected = Client(server["grpc"], "sentiment").classify([r[0] for r in rows], [r[1] for r in rows])
    for line, row in zip(lines, expected):
        assert line["label"] == max(row, key=lambda pair: pair[1])[0] and line["label"] in ("neg", "pos")
        assert line["probabilities"] == {label: round(score, 6) for label, score in row}
    # The regressor over REST, from a file without labels.
    texts = write_tsv(work / "texts.tsv", [("gold.",), ("dead.",)], header=("text",))
    result = run_kbert("predict", "--server", server["rest"], "--model", "similarity", "--input", texts)
    scores = Client(server["rest"], "similarity").regress(["gold.", "dead."])
    assert [json.loads(line) for line in result.stdout.strip().splitlines()] == [
        {"prediction": round(s, 6)} for s in scores
    ]


def test_kbert_predict_server_not_running(tmp_path):
    tsv = write_tsv(tmp_path / "in.tsv", [("gold.",)], header=("text",))
    result = run_kbert(
        "predict", "--server", "127.0.0.1:1", "--model", "sentiment", "--input", tsv, "--retries", "0", check=False
    )
    assert_user_error(result, "cannot reach TF Serving at 127.0.0.1:1", "is the server running at 127.0.0.1:1?")


class RetryLog(logging.Handler):
    """The log lines of the client's waits, from the "kbert" logger."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("kbert").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("kbert").removeHandler(self)


@pytest.mark.parametrize("address", ["127.0.0.1:1", "http://127.0.0.1:1"])
def test_an_unreachable_server_is_retried_then_given_up(address):
    with RetryLog() as waits, pytest.raises(KbertError) as raised:
        Client(address, "sentiment", retries=3).metadata()
    assert [line.rsplit("(", 1)[1] for line in waits.lines] == ["1/3)", "2/3)", "3/3)"], waits.lines
    assert all(line.startswith("TF Serving at 127.0.0.1:1 unavailable (") for line in waits.lines)
    assert "(after 3 retries in " in str(raised.value) and "is the server running at 127.0.0.1:1?" in str(raised.value)


def test_errors_that_would_repeat_are_not_retried(client):
    """NOT_FOUND, INVALID_ARGUMENT (HTTP 404, 400): the same request would get the same answer."""
    with RetryLog() as waits:
        with pytest.raises(KbertError, match="Servable not found"):
            Client(client.address, "nope", retries=5).predict_text(["x"])
        with pytest.raises(KbertError, match="is not in"):
            Client(client.address, "sentiment", retries=5).predict_ids([[2, 5, 300000]], [[1, 1, 1]], [[0, 0, 0]])
    assert waits.lines == []


def test_retry_waits_double_up_to_a_cap():
    from kbert.serving.client import retry_wait

    assert [retry_wait(n) for n in range(10)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    assert retry_wait(10_000) == 10.0
    for bad in ({"retries": -1}, {"timeout": 0}):
        with pytest.raises(KbertError, match="retries -1|timeout 0"):
            Client("127.0.0.1:8500", "sentiment", **bad)


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([], "give MODEL_DIR to predict with a local model, or --server"),
        (["MODEL", "--server", "127.0.0.1:1", "--model", "m"], "not both"),  # MODEL: a model that exists
        (["--server", "127.0.0.1:1"], "needs --model NAME"),
        # kbert.serving.predict.served_options refuses it; in-process the option reads as Python's.
        (["--server", "127.0.0.1:1", "--model", "m", "--max-seq-length", "8"], "max_seq_length applies to a local"),
    ],
)
def test_kbert_predict_flags(tmp_path, args, fragment):
    from typer.testing import CliRunner

    from kbert.cli.main import app

    tsv = write_tsv(tmp_path / "in.tsv", [("gold.",)], header=("text",))
    args = [TINY if a == "MODEL" else a for a in args]
    result = CliRunner().invoke(app, ["predict", *args, "--input", str(tsv)])
    assert isinstance(result.exception, KbertError), result.output
    assert fragment in str(result.exception)


# === HTTP 503 (TF Serving's UNAVAILABLE) against a tiny local REST server ===


class ScriptedRestServer:
    """An HTTP server on 127.0.0.1 that answers each request with the next (status, JSON body) of
    its script, the last one for ever after; it counts the requests it got."""

    def __init__(self, script):
        import http.server
        import threading

        self.script, self.requests = list(script), 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                status, body = owner.script[min(owner.requests, len(owner.script) - 1)]
                owner.requests += 1
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


LOADING = (503, {"error": "Servable not available yet: model sentiment is loading"})
STATUS = (
    200,
    {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    },
)


def test_http_503_is_retried_until_the_server_answers():
    with ScriptedRestServer([LOADING] * 3 + [STATUS]) as server, RetryLog() as waits:
        status = Client(server.address, "sentiment", retries=5, timeout=30).status()
    assert status == [{"version": 1, "state": "AVAILABLE", "error_code": "OK", "error_message": ""}]
    assert server.requests == 4
    port = server.address.rsplit(":", 1)[1]
    assert [line.rsplit("(", 1)[1] for line in waits.lines] == ["1/5)", "2/5)", "3/5)"], waits.lines
    assert all(
        line.startswith(
            f"TF Serving at 127.0.0.1:{port} unavailable (HTTP 503: Servable not available yet: "
            f"model sentiment is loading); retrying in "
        )
        for line in waits.lines
    ), waits.lines


def test_http_503_until_the_timeout_is_one_clear_line():
    with ScriptedRestServer([LOADING]) as server, RetryLog() as waits:
        with pytest.raises(KbertError) as raised:
            Client(server.address, "sentiment", retries=1000, timeout=1.5).status()
    message = str(raised.value)
    port = server.address.rsplit(":", 1)[1]
    assert "\n" not in message
    assert re.fullmatch(
        rf"TF Serving at 127\.0\.0\.1:{port} \(model sentiment, REST\): HTTP 503: Servable not available yet: model "
        rf"sentiment is loading \(after \d+ retr(?:y|ies) in \d+\.\d s\); the server is up but not serving the model: wait "
        rf"until it has loaded it \(its log says\), or allow more time \(retries, timeout; kbert predict --retries, "
        rf"--timeout\)",
        message,
    ), message
    assert 3 <= server.requests == len(waits.lines) + 1 < 1000  # the deadline ended it, not the retries


def test_tensorflow_wrapping_stays_out_of_server_errors():
    """A graph error as TF Serving reports it: TensorFlow's node annotations are not the user's business."""
    error = (
        400,
        {
            "error": "indices[0,2] = 300000 is not in [0, 300)\n\t [[{{function_node "
            "__inference_serve_ids_1234}}{{node bert_encoder/word_embeddings/GatherV2}}]]"
        },
    )
    with ScriptedRestServer([error]) as server, RetryLog() as waits:
        with pytest.raises(KbertError) as raised:
            Client(server.address, "sentiment").status()
    assert str(raised.value).endswith("(model sentiment, REST): HTTP 400: indices[0,2] = 300000 is not in [0, 300)")
    assert waits.lines == [] and server.requests == 1
