"""Outputs are checked before the work (kbert/runtime/files.py): never an input, nor inside one (nor
holding one when replaced whole), with a one-line error naming the directory. An unwritable
output is one of the bad-input sweep's cases for every command (tests/test_bad_input_sweep.py)."""

import os
import shutil

import pytest

from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from test_locks import tree

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
VOCAB = os.path.join(TINY, "vocab.txt")


@pytest.fixture(scope="module")
def keras_hub_preset(tmp_path_factory, tiny_model_dir):
    preset = tmp_path_factory.mktemp("keras-hub") / "preset"
    run_kbert("convert", "to-keras-hub", tiny_model_dir, preset)
    return preset


@pytest.fixture
def work(tmp_path, tiny_model_dir, keras_hub_preset):
    """tmp_path with writable inputs: model/ (a kbert model directory), tf1/ (the original
    checkpoint), hf/ (a Hugging Face model), preset/ (a keras-hub preset), data/train.tsv and corpus.txt."""
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    shutil.copytree(os.path.join(FIXTURES, "hf-tiny"), tmp_path / "hf")
    shutil.copytree(keras_hub_preset, tmp_path / "preset")
    shutil.copytree(TINY, tmp_path / "tf1")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("text\tlabel\ngold city\tpos\ndead camp\tneg\n")
    shutil.copy(SAMPLE, tmp_path / "corpus.txt")
    shutil.copy(SAMPLE, tmp_path / "corpus-00001-of-00002")
    shutil.copytree(os.path.join(FIXTURES, "model-garden-tfhub"), tmp_path / "hub")
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(tmp_path / "x.tfrecord")) as writer:
        writer.write(tf.train.Example().SerializeToString())
    return tmp_path


def test_convert_to_tf1_onto_its_own_source_is_refused(work):
    before = tree(work)
    result = run_kbert("convert", "to-tf1", work / "model", work / "model", "--overwrite", check=False)
    assert_user_error(result, f"{work / 'model'}: the output is also an input", "choose another output")
    assert tree(work) == before


OVERLAPS = {  # one case at least for each command: (arguments, what the error says)
    "convert from-tf1 into its source": (["convert", "from-tf1", "tf1", "tf1/kbert"], "lies inside the input tf1"),
    "convert from-hf onto its source": (["convert", "from-hf", "hf", "hf", "--overwrite"], "also an input"),
    "convert to-hf into its source": (["convert", "to-hf", "model", "model/hf"], "lies inside the input model"),
    "convert from-tfhub onto its preprocessor": (
        ["convert", "from-tfhub", "hub/encoder", "hub/preprocessor", "--preprocessor", "hub/preprocessor"],
        "also an input",
    ),
    "convert to-keras-hub over its source's folder": (
        ["convert", "to-keras-hub", "model", ".", "--overwrite"],
        "holds the input model and is replaced whole",
    ),
    "convert from-keras-hub into its source": (
        ["convert", "from-keras-hub", "preset", "preset/kbert"],
        "lies inside the input preset",
    ),
    "export into the model": (["export", "model", "model/exports"], "lies inside the input model"),
    "export --format tfhub over the model's folder": (
        ["export", "model", ".", "--format", "tfhub", "--overwrite"],
        "holds the input model",
    ),
    "finetune onto its model": (
        ["finetune", "model", "--task", "classify", "--train", "data/train.tsv", "--output", "model", "--overwrite"],
        "also an input",
    ),
    "finetune over its data": (
        ["finetune", "model", "--task", "classify", "--train", "data/train.tsv", "--output", "data", "--overwrite"],
        "holds the input data/train.tsv",
    ),
    "pretrain onto its --init": (
        ["pretrain", "--model-dir", "model", "--init", "model", "--data", "x.tfrecord"],
        "also an input",
    ),
    "pretrain into its --init": (
        ["pretrain", "--model-dir", "model/more", "--init", "model", "--data", "x.tfrecord"],
        "lies inside the input model",
    ),
    "create-data onto its input": (
        ["create-data", "--input", "corpus.txt", "--vocab", VOCAB, "--output", "corpus.txt", "--overwrite"],
        "also an input",
    ),
    "create-data with a shard onto its input": (
        [
            "create-data",
            "--input",
            "corpus-00001-of-00002",
            "--vocab",
            VOCAB,
            "--output",
            "corpus",
            "--shards",
            "2",
            "--overwrite",
        ],
        "also an input",
    ),
    "vocab onto its input": (
        ["vocab", "--input", "corpus.txt", "--output", "corpus.txt", "--overwrite"],
        "also an input",
    ),
}


@pytest.mark.parametrize("case", list(OVERLAPS))
def test_an_output_that_is_or_holds_or_lies_inside_an_input_is_refused(work, case, monkeypatch):
    args, fragment = OVERLAPS[case]
    monkeypatch.chdir(work)
    before = tree(work)
    result = run_kbert(*args, check=False, own_process=False)
    assert_user_error(result, fragment)
    assert tree(work) == before
