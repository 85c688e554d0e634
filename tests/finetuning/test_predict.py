"""Local `kbert predict` and `kbert predict --server` print the same JSON for the same model,
for every task that exports; and the multiple-choice task end to end.

The server is tests/serving/standin_server.py (the real tensorflow_model_server cannot be installed
here; see tests/test_serving_client.py), serving what `kbert export` wrote.
"""

import json

import pytest

from conftest import run_kbert
from helpers import start_standin_server, swag_rows, write_conll, write_swag, write_tsv

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

@pytest.fixture(scope="module")
def choice_run(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("choice")
    train, dev = write_swag(work / "train.csv", swag_rows(256, 0)), write_swag(work / "val.csv", swag_rows(64, 1))
    result = run_kbert("finetune", tiny_model_dir, "--task", "choice", "--train", train, "--dev", dev,
                       "--output", work / "model", "--epochs", "4", "--batch-size", "16",
                       "--learning-rate", "1e-3", "--max-seq-length", "16")
    return work, work / "model", json.loads(result.stdout)


def test_choice_learns_predicts_and_evaluates(choice_run):
    work, model, metrics = choice_run
    assert metrics["accuracy"] >= 0.9, metrics
    config = json.load(open(model / "bert_config.json"))
    assert (config["task"], config["kbert_model"], config["max_seq_length"]) == ("choice", "multiple_choice", 16)
    evaluated = json.loads(run_kbert("evaluate", model, "--input", work / "val.csv").stdout)
    assert evaluated["examples"] == 64 and evaluated["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    # SWAG's test.csv has no label column.
    rows = swag_rows(8, 2)
    test = write_swag(work / "test.csv", rows, labels=False)
    predictions = [json.loads(line) for line in run_kbert("predict", model, "--input", test).stdout.splitlines()]
    assert [p["label"] for p in predictions] == [r[4] for r in rows]
    assert all(len(p["probabilities"]) == 4 and abs(sum(p["probabilities"]) - 1) < 1e-4 for p in predictions)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir, choice_run):
    """A tagger, a single-text classifier, a regressor, an encoder and the multiple-choice model,
    each exported by `kbert export` and served by the stand-in server; plus each one's input file.
    The first three are untrained heads (what a head learned does not matter to this comparison),
    saved with the task metadata `kbert finetune` records."""
    import keras

    import kbert

    work = tmp_path_factory.mktemp("served")
    keras.utils.set_random_seed(2)
    base = kbert.load(tiny_model_dir)
    heads = {"tagger": (kbert.bert_tagger(base, 3), {"task": "tag", "labels": ["B-LOC", "I-LOC", "O"]}),
             "sentiment": (kbert.bert_classifier(base, 2), {"task": "classify", "labels": ["neg", "pos"],
                                                             "text_pairs": False}),
             "similarity": (kbert.bert_classifier(base, 1), {"task": "regress", "text_pairs": False})}
    models = {"choice": choice_run[1], "encoder": tiny_model_dir}
    for name, (model, info) in heads.items():
        model.task_info = dict(info, max_seq_length=16)
        kbert.save(model, work / name)
        models[name] = work / name
    configs = []
    for name, model in models.items():
        pairs = ["--text-pairs"] if name == "encoder" else []
        run_kbert("export", model, work / "exports" / name, "--max-seq-length", "16", *pairs)
        configs.append(work / "exports" / name / "models.config")
    process, ready = start_standin_server(configs, work / "server.log")
    try:
        inputs = {
            # CoNLL words, one of them two WordPieces (cass ##ius) and one past --max-seq-length.
            "tagger": write_conll(work / "in.conll", [(["the", "great", "city", "cassius"], ["O"] * 4),
                                                      (["camp"] * 20, ["O"] * 20)]),
            "sentiment": write_tsv(work / "in.tsv", [("gold glorious great.",), ("dead dust the dread.",)],
                                   header=("text",)),
            "similarity": write_tsv(work / "in-scores.tsv", [("gold.",), ("dead.",)], header=("text",)),
            "choice": write_swag(work / "in.csv", swag_rows(5, 3), labels=False),
            "encoder": work / "in.txt",
        }
        (work / "in.txt").write_text("gold glorious great.\ndead dust ||| the dread.\n")
        yield {"grpc": f"127.0.0.1:{ready['grpc_port']}", "rest": f"http://127.0.0.1:{ready['rest_port']}",
               "models": models, "inputs": inputs}
    finally:
        process.terminate()
        process.wait(timeout=30)


def assert_same_json(remote, local, where=""):
    """Equal keys, strings, ints and list lengths; floats equal up to the last printed digit
    (the server's graph and Keras' predict may round the 7th digit differently)."""
    assert type(remote) is type(local), (where, remote, local)
    if isinstance(local, dict):
        assert list(remote) == list(local), (where, remote, local)
        for key in local:
            assert_same_json(remote[key], local[key], f"{where}.{key}")
    elif isinstance(local, list):
        assert len(remote) == len(local), (where, remote, local)
        for i, (r, v) in enumerate(zip(remote, local)):
            assert_same_json(r, v, f"{where}[{i}]")
    elif isinstance(local, float):
        assert abs(remote - local) <= 2e-6, (where, remote, local)
    else:
        assert remote == local, (where, remote, local)


@pytest.mark.parametrize("name", ["tagger", "sentiment", "similarity", "choice", "encoder"])
def test_local_and_server_predict_print_the_same_json(served, name):
    local = run_kbert("predict", served["models"][name], "--input", served["inputs"][name],
                      "--max-seq-length", "16").stdout
    lines = [json.loads(line) for line in local.splitlines()]
    for protocol in ("grpc", "rest"):
        remote = run_kbert("predict", "--server", served[protocol], "--model", name,
                           "--input", served["inputs"][name]).stdout
        assert_same_json([json.loads(line) for line in remote.splitlines()], lines, protocol)
    if name == "tagger":
        assert lines[0]["words"] == ["the", "great", "city", "cassius"] and len(lines[0]["tags"]) == 4
        assert len(lines[1]["tags"]) == 20  # words cut off by --max-seq-length still get a tag
