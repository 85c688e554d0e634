"""`kbert.formats.model_dir`: the one opener of model sources and the one place casing is decided.

A google-research checkpoint records no casing; its folder name does (cased_L-12_H-768_A-12).
Each command that takes a checkpoint directly (finetune, predict, export) must tokenize a
`cased_...` folder without lower-casing, and a fine-tuned model must record that.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kbert
from conftest import TINY, assert_user_error, kbert_command, run_kbert
from helpers import sentiment_rows, write_tsv
from kbert.formats.model_dir import lower_case_for
from kbert.formats.sources import describe_source, open_model
from kbert.runtime.errors import KbertError

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them


@pytest.fixture(scope="module")
def cased_dir(tmp_path_factory):
    """The original tiny checkpoint in a folder named as Google names its cased releases."""
    folder = tmp_path_factory.mktemp("released") / "cased_L-2_H-32_A-4"
    shutil.copytree(TINY, folder)
    return folder


def test_casing_is_decided_by_the_folder_or_the_record(cased_dir, tiny_model_dir):
    assert describe_source(cased_dir).do_lower_case is False
    assert describe_source(cased_dir / "bert_model.ckpt").do_lower_case is False
    assert describe_source(TINY).do_lower_case is True  # "tf1-tiny" says neither: uncased
    assert describe_source(tiny_model_dir).do_lower_case is True  # recorded by convert
    assert lower_case_for(cased_dir, recorded=True) is True
    model = open_model(cased_dir)
    assert model.do_lower_case is False and type(model).__name__ == "BertPretrainer"


def test_finetune_predict_and_export_keep_a_cased_checkpoint_cased(cased_dir, tmp_path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(32, 0))
    run_kbert(
        "finetune",
        cased_dir,
        "--task",
        "classify",
        "--train",
        train,
        "--output",
        tmp_path / "model",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--max-seq-length",
        "16",
    )
    assert json.load(open(tmp_path / "model" / "bert_config.json"))["do_lower_case"] is False

    # predict on the checkpoint itself: features, tokenized without lower-casing ("GOLD" is not
    # in the lower-case vocabulary; "gold" is).
    (tmp_path / "in.txt").write_text("GOLD gold\n")
    for source, expected in (
        (cased_dir, ["[CLS]", "[UNK]", "gold", "[SEP]"]),
        (TINY, ["[CLS]", "gold", "gold", "[SEP]"]),
    ):
        line = json.loads(run_kbert("predict", source, "--input", tmp_path / "in.txt", "--layers", "-1").stdout)
        assert [f["token"] for f in line["features"]] == expected, source

    # export of the checkpoint itself: "GOLD" and "gold" are different inputs to a cased model.
    path = json.loads(run_kbert("export", cased_dir, tmp_path / "exports").stdout)["export"]
    serve = tf.saved_model.load(path).signatures["serving_default"]
    pooled = serve(text=tf.constant(["GOLD glorious.", "gold glorious."]))["pooled_output"].numpy()
    assert np.abs(pooled[0] - pooled[1]).max() > 1e-4


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """A `kbert pretrain --model-dir` killed (SIGKILL) after its second checkpoint and before it
    wrote model.weights.h5: bert_config.json, vocab.txt and checkpoints/ckpt-N, as a crash leaves it."""
    work = tmp_path_factory.mktemp("interrupted")
    vocab = os.path.join(TINY, "vocab.txt")
    run_kbert(
        "create-data",
        "--input",
        os.path.join(os.path.dirname(TINY), "sample_text.txt"),
        "--vocab",
        vocab,
        "--output",
        work / "data.tfrecord",
        "--max-seq-length",
        "32",
        "--max-predictions-per-seq",
        "5",
        "--dupe-factor",
        "1",
        "--workers",
        "1",
    )
    model_dir = work / "bert"
    process = subprocess.Popen(
        kbert_command()
        + [
            "pretrain",
            "--model-dir",
            str(model_dir),
            "--data",
            str(work / "data.tfrecord"),
            "--config",
            os.path.join(TINY, "bert_config.json"),
            "--vocab",
            vocab,
            "--max-seq-length",
            "32",
            "--max-predictions-per-seq",
            "5",
            "--batch-size",
            "8",
            "--steps",
            "100000",
            "--save-every",
            "2",
            "--steps-per-loop",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Any complete checkpoint past the first will do: the tiny model saves every 2 steps and keeps
    # the last few, so a given step's files may come and go between two looks.
    deadline = time.time() + 300
    while time.time() < deadline and not _checkpoint_past_the_first(model_dir / "checkpoints"):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))  # what --resume continues from
    assert prefix and not (model_dir / "model.weights.h5").exists(), sorted(os.listdir(model_dir))
    return model_dir, int(prefix.rsplit("-", 1)[1])


def _checkpoint_past_the_first(folder) -> bool:
    try:
        recorded = (folder / "checkpoint").read_text()  # TensorFlow writes it last, after the files
    except OSError:
        return False
    return 'model_checkpoint_path: "ckpt-2"' not in recorded and "model_checkpoint_path" in recorded


def test_an_interrupted_pretraining_run_is_named_with_its_checkpoint(interrupted_run, tmp_path):
    model_dir, step = interrupted_run
    said = (
        f"{model_dir}: pretraining stopped at step {step} (checkpoints/ckpt-{step}) before writing the model; "
        f"continue it with `kbert pretrain --model-dir {model_dir} --resume`"
    )
    assert_user_error(run_kbert("fill-mask", model_dir, "the [MASK].", check=False), said)
    assert_user_error(run_kbert("export", model_dir, tmp_path / "exports", check=False), said)
    assert not (tmp_path / "exports").exists()
    assert_user_error(run_kbert("predict", model_dir, "--input", TINY + "/vocab.txt", check=False), said)
    with pytest.raises(KbertError, match=re.escape(said)):
        kbert.load(model_dir)
    report = json.loads(run_kbert("convert", "inspect", model_dir).stdout)
    assert report["checkpoint"] == str(model_dir / "checkpoints" / f"ckpt-{step}") and report["step"] == step
    assert report["resume"].startswith(said)
    assert report["parameters"] == 99374 and report["config"]["hidden_size"] == 64


def test_a_run_without_its_recorded_flags_resumes_with_the_flags_given(interrupted_run, tmp_path):
    """A run from before kbert recorded a run's flags (no pretrain_run.json): every command says
    to resume it with --data and the other flags, and a --resume given them goes on from the
    checkpoint and records them."""
    model_dir, step = interrupted_run
    old = tmp_path / "bert"
    shutil.copytree(model_dir, old)
    (old / "pretrain_run.json").unlink()
    assert_user_error(
        run_kbert("fill-mask", old, "the [MASK].", check=False),
        f"continue it with `kbert pretrain --model-dir {old} --resume --data DATA` and the other flags",
    )
    assert_user_error(
        run_kbert("pretrain", "--model-dir", old, "--resume", check=False),  # (after the lock's notice)
        f"--resume: {old} has no pretrain_run.json",
        "give --data and the other flags",
        alone=False,
    )
    result = run_kbert(
        "pretrain", "--model-dir", old, "--data", model_dir.parent / "data.tfrecord", "--resume",
        "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--batch-size", "8",
        "--steps", str(step + 2), "--save-every", "2",
    )  # fmt: skip
    assert f"resumed from step {step}" in result.stderr
    assert json.loads(result.stdout)["step"] == step + 2
    assert json.load(open(old / "pretrain_run.json"))["options"]["steps"] == step + 2  # recorded now


def test_fill_mask_says_what_a_model_without_the_mlm_head_is(tiny_model_dir, tmp_path):
    pretrained = kbert.load(tiny_model_dir)
    classifier = kbert.bert_classifier(pretrained, 2)
    classifier.task_info = {"task": "classify", "labels": ["neg", "pos"], "max_seq_length": 16}
    kbert.save(classifier, tmp_path / "classifier")
    kbert.save(pretrained.encoder, tmp_path / "encoder", vocab_file=pretrained.vocab_file)
    tagger = kbert.bert_tagger(pretrained, 3)
    tagger.task_info = {"task": "tag", "labels": ["B", "I", "O"]}
    kbert.save(tagger, tmp_path / "tagger")
    for name, what in (
        ("classifier", "a classifier (task classify, labels neg, pos)"),
        ("encoder", "an encoder (no pretraining heads)"),
        ("tagger", "a tagger (task tag, labels B, I, O)"),
    ):
        result = run_kbert("fill-mask", tmp_path / name, "the [MASK] city.", check=False)
        assert_user_error(
            result,
            f"{tmp_path / name} has no masked-LM head: it is {what}; fill-mask needs a "
            f"pretrained or converted model directory",
        )


def test_a_head_saved_without_its_task_loads_with_its_kinds(tiny_model_dir, tmp_path):
    """Directories that kbert.save wrote before it recorded a head's task: kbert.load gives the
    head's task (and class ids as labels), so predict and evaluate treat it as a head."""
    kbert.save(kbert.bert_classifier(kbert.load(tiny_model_dir), 1), tmp_path / "old")
    config_file = tmp_path / "old" / "bert_config.json"
    config = json.load(open(config_file))
    config = {k: v for k, v in config.items() if k not in ("task", "labels", "max_seq_length")}
    config_file.write_text(json.dumps(config))
    assert kbert.load(tmp_path / "old").task_info == {"task": "regress", "max_seq_length": 64}
    report = json.loads(run_kbert("convert", "inspect", tmp_path / "old").stdout)
    assert report["kind"] == "kbert model directory (classifier)" and "task" not in report


def test_a_keras_file_is_a_whole_model_and_anything_else_is_one_line(tiny_model_dir, tmp_path):
    import keras

    # What get_config and the archive carry: the vocabulary (its file inside), casing and task.
    tagger = kbert.bert_tagger(kbert.load(tiny_model_dir), 3, task_info={"task": "tag", "labels": ["B", "I", "O"]})
    config = tagger.get_config()
    assert config["vocabulary"] == {"file": os.path.join(str(tiny_model_dir), "vocab.txt"), "do_lower_case": True}
    assert config["task_info"] == {"task": "tag", "labels": ["B", "I", "O"]}
    tagger.save(tmp_path / "tagger.keras")
    loaded = kbert.load(tmp_path / "tagger.keras")
    assert type(loaded) is kbert.BertTagger and loaded.vocab_file != config["vocabulary"]["file"]
    assert open(loaded.vocab_file).read() == open(config["vocabulary"]["file"]).read()
    assert loaded.task_info == {"task": "tag", "labels": ["B", "I", "O"], "max_seq_length": 64}
    data = tmp_path / "words.txt"
    data.write_text("gold\ndust\n")  # CoNLL: a word per line
    rows = [
        json.loads(line)
        for line in run_kbert("predict", tmp_path / "tagger.keras", "--input", data).stdout.splitlines()
    ]
    assert rows[0]["words"] == ["gold", "dust"] and set(rows[0]["tags"]) <= {"B", "I", "O"}

    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(tmp_path / "other.keras")
    assert_user_error(
        run_kbert("predict", tmp_path / "other.keras", "--input", data, check=False),
        "cannot save a Sequential: kbert model directories hold kbert models",
    )
    (tmp_path / "broken.keras").write_bytes(b"not a zip")
    assert_user_error(
        run_kbert("predict", tmp_path / "broken.keras", "--input", data, check=False),
        "broken.keras: Keras cannot load it",
    )
    no_vocabulary = kbert.bert_classifier(
        kbert.BertConfig(
            vocab_size=300, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
        ),
        2,
    )
    no_vocabulary.save(tmp_path / "bare.keras")
    assert_user_error(
        run_kbert("predict", tmp_path / "bare.keras", "--input", data, check=False), "the model declares no vocabulary"
    )


# === The directory format knows no trainer and no task ===


def test_the_directory_format_imports_no_trainer():
    """model_dir and sources sit below pretraining/ and finetuning/: they ask the tasks through
    register_head_describer (and the trainers through register_unfinished_run), never import them."""
    import ast
    import pathlib

    for name in ("model_dir.py", "sources.py"):
        tree = ast.parse((pathlib.Path(kbert.__file__).parent / "formats" / name).read_text())
        imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        upward = [m for m in imported if m and m.startswith(("kbert.finetuning", "kbert.pretraining"))]
        assert not upward, f"formats/{name} imports {upward}"


def test_the_head_kinds_are_the_kinds_the_tasks_serve():
    from kbert.finetuning.tasks import HEAD_TASKS
    from kbert.model.kinds import HEAD_KINDS

    assert sorted(HEAD_TASKS) == sorted(HEAD_KINDS)


def test_importing_any_task_tells_the_format_how_to_describe_a_head():
    """Whatever imports one task (finetune, predict, export) has the describer the format asks."""
    code = (
        "import kbert.finetuning.tasks.tag\n"
        "from kbert.formats.model_dir import HEAD_DESCRIBERS\n"
        "from kbert.finetuning.tasks import head_task_info\n"
        "assert HEAD_DESCRIBERS == [head_task_info], HEAD_DESCRIBERS\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "KERAS_BACKEND": "jax"})
