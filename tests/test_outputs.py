"""Outputs are checked before the work (kbert/outputs.py): never an input, nor inside one (nor
holding one when replaced whole), and writable, with a one-line error naming the directory."""

import os
import shutil
import subprocess

import pytest

from conftest import FIXTURES, TINY, assert_user_error, kbert_command, run_kbert
from test_locks import tree

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
VOCAB = os.path.join(TINY, "vocab.txt")


@pytest.fixture
def work(tmp_path, tiny_model_dir):
    """tmp_path with writable inputs: model/ (a kbert model directory), tf1/ (the original
    checkpoint), data/train.tsv and corpus.txt."""
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    shutil.copytree(TINY, tmp_path / "tf1")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("text\tlabel\ngold city\tpos\ndead camp\tneg\n")
    shutil.copy(SAMPLE, tmp_path / "corpus.txt")
    shutil.copy(SAMPLE, tmp_path / "corpus-00001-of-00002")
    shutil.copytree(os.path.join(FIXTURES, "model-garden-tfhub"), tmp_path / "hub")
    (tmp_path / "preset").mkdir()  # inputs must exist: the frame checks them first
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
    "convert from-hf onto its source": (["convert", "from-hf", "model", "model", "--overwrite"], "also an input"),
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


# Capabilities dropped for the command and its children: root without DAC override is held to
# file modes as any user (util-linux's setpriv; util-linux is in every Debian base image).
WITHOUT_DAC_OVERRIDE = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
    "--",
]


def run_without_dac_override(*args):
    env = {k: v for k, v in os.environ.items() if k != "KBERT_DEBUG"}
    return subprocess.run(
        WITHOUT_DAC_OVERRIDE + kbert_command() + [str(a) for a in args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture
def read_only(tmp_path):
    """A mode-555 directory that this test's commands really cannot write."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    probe = subprocess.run(WITHOUT_DAC_OVERRIDE + ["touch", str(folder / "probe")], capture_output=True, text=True)
    assert probe.returncode != 0 and "Permission denied" in probe.stderr, "the capabilities were not dropped"
    yield folder
    folder.chmod(0o755)


UNWRITABLE = {  # the output in (or being) the read-only directory, for each command
    "vocab": lambda ro, model, binary: ["vocab", "--input", binary, "--output", ro / "vocab.txt"],
    "convert from-tf1": lambda ro, model, binary: ["convert", "from-tf1", TINY, ro / "tiny"],
    "pretrain (in place)": lambda ro, model, binary: ["pretrain", "--model-dir", ro, "--init", model, "--data", binary],
    "export (in place)": lambda ro, model, binary: ["export", model, ro],
    "finetune": lambda ro, model, binary: [
        "finetune",
        model,
        "--task",
        "classify",
        "--train",
        binary,
        "--output",
        ro / "classifier",
    ],
    "create-data": lambda ro, model, binary: [
        "create-data",
        "--input",
        binary,
        "--vocab",
        VOCAB,
        "--output",
        ro / "records.tfrecord",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(UNWRITABLE))
def test_an_unwritable_output_is_refused_before_the_work(tmp_path, read_only, tiny_model_dir, command):
    # The input is binary: a command that read its inputs before checking the output would
    # fail on that instead, so the message shows the output was checked first.
    binary = tmp_path / "corpus.gz"
    binary.write_bytes(bytes(range(256)) * 64)
    before = tree(tmp_path)
    result = run_without_dac_override(*UNWRITABLE[command](read_only, tiny_model_dir, binary))
    assert_user_error(result, f"cannot write to {os.path.realpath(read_only)} (permission denied")
    assert tree(tmp_path) == before
