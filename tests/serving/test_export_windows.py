"""`kbert export` of a model fine-tuned with `--long-text windows`: whole documents served in windows.

The exports are run as TF Serving runs them (a TF1 session on the MetaGraph, in a fresh process
with only TensorFlow and TF Text) and compared with local `kbert predict` on the same documents,
most of them several windows long: one answer per document, to 1e-5 (classify, regress), the
same tag for every word (tag). Also: a request over `--max-windows` fails with an error that
says so, a document that fits one window gets the truncating export's answer, and bfloat16 and
int8 export the same windows.
"""

import json
import os

import numpy as np
import pytest

from conftest import run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, run_in_fresh_process, write_conll, write_tsv

pytestmark = pytest.mark.slow  # several exports: `make test` runs them, `make test-fast` leaves them out

LENGTH, STRIDE, MAX_WINDOWS = 16, 5, 200
LABELS = {"classify": ["a", "b", "c"], "tag": ["B-LOC", "B-PER", "O"]}

SERVE = r"""
import json, sys
sys.modules["kbert"] = sys.modules["keras_hub"] = None  # importing either would now fail
import numpy as np
import tensorflow as tf
from serving_session import ServingSession  # tests/reference: as TF Serving loads a model

spec = json.load(open(sys.argv[1]))


def examples(texts):
    return [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[t.encode()]))})).SerializeToString()
        for t in texts]


def plain(result):
    return {k: (np.char.decode(np.asarray(v).astype(bytes), "utf-8").tolist() if np.asarray(v).dtype == object
                else np.asarray(v).tolist()) for k, v in result.items()}


out = {}
for name, job in spec.items():
    served = ServingSession(job["path"])

    def run(signature, feeds, shapes=False):
        out = served.run(feeds, signature)
        return {k: list(np.shape(v)) for k, v in out.items()} if shapes else plain(out)

    result = {"signatures": sorted(k for k in served.signatures if not k.startswith("__"))}
    pairs = "text_b" in served.signatures["serving_default"].inputs  # a truncating classifier's
    # Each signature's first run in a session costs seconds (TensorFlow optimizes the graph for
    # it): the exports compared on part of it run only that part.
    only = job.get("only", ("texts", "short", "signatures"))
    for key in ("texts", "short"):  # documents of many windows; a request of documents that fit one
        if key in only:
            texts = job[key]
            result[key] = run("serving_default", {"text": texts, **({"text_b": [""] * len(texts)} if pairs else {})})
    if "texts" in only:
        result["serving_default"] = result.pop("texts")
    if "signatures" in only:
        result["serve_examples"] = run("serve_examples", {"examples": examples(job["texts"])})
        for api in ("classify", "regress"):
            if api in served.signatures:
                result[api] = run(api, {"inputs": examples(job["texts"])})
        result["empty"] = {} if pairs else run("serving_default", {"text": []}, shapes=True)
    if job.get("ids"):
        result["serve_ids"] = run("serve_ids", job["ids"])
    if job.get("too_many"):
        try:
            run("serving_default", {"text": job["too_many"]})
            result["too_many"] = None
        except tf.errors.InvalidArgumentError as e:
            result["too_many"] = e.message
    out[name] = result
print(json.dumps(out))
"""


def _documents(n, seed):
    """Texts over the tiny vocabulary, from a few words to several windows of 14 tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = [str(w) for w in rng.choice(FILLER, size=int(rng.integers(0, 60)))]
        for _ in range(4):
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(POSITIVE if i % 2 else NEGATIVE)))
        rows.append(words)
    return rows


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model_dir):
    """An untrained classifier, regressor and tagger on tf1-tiny, saved reading long texts in
    windows of 16 tokens (stride 5), and by truncation."""
    import keras

    import kbert

    keras.utils.set_random_seed(5)
    work = tmp_path_factory.mktemp("windows-models")
    base = kbert.load(tiny_model_dir)
    heads = {
        "classify": kbert.bert_classifier(base, 3),
        "regress": kbert.bert_classifier(base, 1),
        "tag": kbert.bert_tagger(base, 3),
    }
    for task, model in heads.items():
        info = {"task": task, "max_seq_length": LENGTH, **({"labels": LABELS[task]} if task in LABELS else {})}
        model.task_info = {**info, "long_text": "windows", "doc_stride": STRIDE}
        kbert.save(model, work / f"{task}-windows")
        model.task_info = info
        kbert.save(model, work / f"{task}-truncate")
    return work


@pytest.fixture(scope="module")
def served(models, tmp_path_factory):
    """Each model exported (windows: float32, and classify in bfloat16, tag in int8; truncate:
    float32), then every export run in one fresh process: (the exports' JSON, the answers,
    the documents)."""
    work = tmp_path_factory.mktemp("windows-exports")
    documents = _documents(24, 0)
    short = [FILLER[i : i + 9] for i in range(6)]  # each fits one window of 14 tokens
    texts = [" ".join(words) for words in documents]
    exported, spec = {}, {}
    runs = [(task, "windows", "float32") for task in ("classify", "regress", "tag")]
    runs += [(task, "truncate", "float32") for task in ("classify", "regress", "tag")]
    runs += [("classify", "windows", "bfloat16"), ("tag", "windows", "int8")]
    for task, long_text, precision in runs:
        name = f"{task}-{long_text}-{precision}"
        flags = ["--max-windows", str(MAX_WINDOWS)] if long_text == "windows" else []
        result = run_kbert("export", models / f"{task}-{long_text}", work / name, "--precision", precision, *flags)
        exported[name] = json.loads(result.stdout)
        job = {"path": exported[name]["export"], "texts": texts, "short": [" ".join(words) for words in short]}
        if long_text == "truncate":  # compared on the documents of one window (and the tagger's first)
            job["only"] = ["texts", "short"] if task == "tag" else ["short"]
        elif precision != "float32":  # compared on the documents' answers
            job["only"] = ["texts"]
        if name == "classify-windows-float32":
            job["too_many"] = [" ".join(["city"] * 1000)] * 2  # 2 x 199 windows of 14 tokens, stride 5
            job["ids"] = {"input_ids": [[101, 7, 8, 102]], "input_mask": [[1] * 4], "segment_ids": [[0] * 4]}
        spec[name] = job
    return exported, run_in_fresh_process(work, SERVE, spec, timeout=600), documents, short


def _local(models, task, documents, tmp_path):
    """Local `kbert predict` on the windows model, one row per document."""
    from kbert.finetuning.predict import predict

    if task == "tag":
        path = write_conll(tmp_path / "docs.conll", [(words, ["O"] * len(words)) for words in documents if words])
    else:
        path = write_tsv(tmp_path / "docs.tsv", [(" ".join(words),) for words in documents], header=("text",))
    return list(predict(models / f"{task}-windows", path))


def test_the_export_records_its_windows(served):
    exported, answers, _, _ = served
    for task in ("classify", "regress", "tag"):
        info = exported[f"{task}-windows-float32"]
        assert (info["long_text"], info["doc_stride"], info["max_windows"]) == ("windows", STRIDE, MAX_WINDOWS)
        with open(os.path.join(info["export"], "assets.extra", "kbert_windows.json")) as f:
            assert json.load(f) == {
                "long_text": "windows", "max_seq_length": LENGTH, "doc_stride": STRIDE, "max_windows": MAX_WINDOWS,
            }  # fmt: skip
        assert "long_text" not in exported[f"{task}-truncate-float32"]
    assert answers["classify-windows-float32"]["signatures"] == [
        "classify", "serve_examples", "serve_ids", "serving_default",
    ]  # fmt: skip


@pytest.mark.parametrize("task", ["classify", "regress"])
def test_served_documents_are_local_predicts_answers(served, models, task, tmp_path):
    _, answers, documents, _ = served
    local = _local(models, task, documents, tmp_path)
    assert len(local) == len(documents)
    got = answers[f"{task}-windows-float32"]
    n = len(documents)
    if task == "classify":
        want = np.array([list(row["probabilities"].values()) for row in local])
        for signature, key in (("serving_default", "probabilities"), ("serve_examples", "probabilities")):
            diff = np.abs(np.array(got[signature][key][:n]) - want).max()
            print(f"{task} {signature}: max |served - local| {diff:.2e}")
            assert diff <= 1e-5, (signature, diff)
            assert got[signature]["label"][:n] == [row["label"] for row in local]
        np.testing.assert_allclose(np.array(got["classify"]["scores"][:n]), want, atol=1e-5)
        assert got["classify"]["classes"][0] == LABELS["classify"]
    else:
        want = np.array([row["prediction"] for row in local])
        for signature, key in (("serving_default", "score"), ("serve_examples", "score"), ("regress", "outputs")):
            diff = np.abs(np.array(got[signature][key][:n]) - want).max()
            print(f"{task} {signature}: max |served - local| {diff:.2e}")
            assert diff <= 1e-5, (signature, diff)


def test_served_tags_are_local_predicts_every_word_once(served, models, tmp_path):
    _, answers, documents, _ = served
    local = iter(_local(models, "tag", documents, tmp_path))
    got = answers["tag-windows-float32"]
    for i, words in enumerate(documents):
        tags = next(local)["tags"] if words else []
        for signature in ("serving_default", "serve_examples"):
            row = got[signature]["word_label"][i]
            assert row[: len(words)] == tags and not any(row[len(words) :]), (i, signature)
    # Per token: each document's first window, which is what the truncating export gives.
    assert np.array(got["serving_default"]["input_mask"]).shape == (len(documents), LENGTH)
    truncate = answers["tag-truncate-float32"]["serving_default"]
    assert got["serving_default"]["input_mask"] == truncate["input_mask"]
    real = np.array(truncate["input_mask"]) == 1  # past a text's tokens, per-token outputs mean nothing
    assert (np.array(got["serving_default"]["label"])[real] == np.array(truncate["label"])[real]).all()


def test_a_request_over_the_window_limit_fails_saying_so(served):
    _, answers, _, _ = served
    message = answers["classify-windows-float32"]["too_many"]
    assert message is not None
    assert "the request needs 398 windows and this export allows 200 (kbert export --max-windows)" in message
    assert "split the request, or export again with a larger --max-windows" in message


def test_an_empty_request_gets_empty_answers(served):
    _, answers, _, _ = served
    assert answers["classify-windows-float32"]["empty"] == {"probabilities": [0, 3], "label_id": [0], "label": [0]}
    assert answers["regress-windows-float32"]["empty"] == {"score": [0]}
    tag = answers["tag-windows-float32"]["empty"]
    assert tag["word_label"][0] == tag["label"][0] == 0


def test_warmup_requests_over_the_limit_are_left_out(models, tmp_path):
    import tensorflow as tf

    result = json.loads(run_kbert("export", models / "classify-windows", tmp_path / "e", "--max-windows", "1").stdout)
    assert result["max_windows"] == 1
    warmup = os.path.join(result["export"], "assets.extra", "tf_serving_warmup_requests")
    assert sum(1 for _ in tf.data.TFRecordDataset(warmup)) == 1  # ["Hello, world!"]: one window


def test_serve_ids_runs_one_window_per_row(served):
    _, answers, _, _ = served
    out = answers["classify-windows-float32"]["serve_ids"]
    assert np.array(out["probabilities"]).shape == (1, 3)


def test_a_document_of_one_window_gets_the_truncating_exports_answer(served):
    _, answers, _, _ = served
    for task, keys in (
        ("classify", ("probabilities", "label")), ("regress", ("score",)), ("tag", ("word_label", "label_id")),
    ):  # fmt: skip
        windows, truncate = answers[f"{task}-windows-float32"]["short"], answers[f"{task}-truncate-float32"]["short"]
        for key in keys:
            assert windows[key] == truncate[key], (task, key)  # bit for bit


def test_bfloat16_and_int8_export_the_same_windows(served):
    _, answers, documents, _ = served
    n = len(documents)
    float32 = answers["classify-windows-float32"]["serving_default"]["probabilities"][:n]
    bfloat16 = answers["classify-windows-bfloat16"]["serving_default"]["probabilities"][:n]
    assert np.abs(np.array(bfloat16) - np.array(float32)).max() < 0.05
    tags = answers["tag-windows-float32"]["serving_default"]["word_label"][:n]
    int8 = answers["tag-windows-int8"]["serving_default"]["word_label"][:n]
    assert [len([t for t in row if t]) for row in int8] == [len([t for t in row if t]) for row in tags]
    same = np.mean([a == b for x, y in zip(int8, tags) for a, b in zip(x, y) if b])
    assert same >= 0.9, same


def test_text_pairs_are_refused_for_a_windows_model(models, tmp_path):
    from conftest import assert_user_error

    result = run_kbert("export", models / "classify-windows", tmp_path / "e", "--text-pairs", check=False)
    assert_user_error(result, "reads long documents in windows, one text each")
    assert not (tmp_path / "e" / "1").exists()


def test_predict_server_on_a_windows_export_is_local_predict(served, models, tmp_path):
    """`kbert predict --server` against the stand-in TF Serving (tests/serving/standin_server.py):
    the same documents' lines as local `kbert predict`; a batch over the limit: one line."""
    from conftest import assert_user_error
    from helpers import start_standin_server

    exported, _, documents, _ = served
    configs = [os.path.join(os.path.dirname(exported[f"{t}-windows-float32"]["export"]), "models.config") for t in
               ("classify", "tag")]  # fmt: skip
    process, ready = start_standin_server(configs, tmp_path / "server.log")
    try:
        address = f"127.0.0.1:{ready['grpc_port']}"
        for task in ("classify", "tag"):
            name = f"{task}-windows-float32"
            local = _local(models, task, documents, tmp_path)
            path = tmp_path / ("docs.conll" if task == "tag" else "docs.tsv")  # written by _local
            result = run_kbert("predict", "--server", address, "--model", name, "--input", path)
            remote = [json.loads(line) for line in result.stdout.splitlines()]
            assert len(remote) == len(local)
            for mine, theirs in zip(remote, local):
                if task == "tag":
                    assert mine == theirs
                else:
                    assert mine["label"] == theirs["label"]
                    diff = np.abs(
                        np.subtract(list(mine["probabilities"].values()), list(theirs["probabilities"].values()))
                    )
                    assert diff.max() <= 1e-5
        big = write_tsv(tmp_path / "big.tsv", [(" ".join(["city"] * 1000),)] * 2, header=("text",))
        result = run_kbert("predict", "--server", address, "--model", "classify-windows-float32", "--input", big,
                           check=False)  # fmt: skip
        assert_user_error(result, "the request needs 398 windows and this export allows 200", alone=False)
    finally:
        process.terminate()
        process.wait(timeout=30)
