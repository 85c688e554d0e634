"""What kbert says about itself is true and said one way: command names as typed, the backends it
runs on, what a converter takes, the model sources a command reads, and the truncation warning."""

import os
import tomllib

from conftest import CLASSIFIER_LENGTH, run_kbert
from kbert.cli.frame import command_name
from test_bad_input_sweep import commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_command_is_named_as_typed():
    """The frame's messages ("kbert convert inspect needs TensorFlow", SIGTERM's line) name each
    command as the user types it, whatever its function is called (`inspect_`, `pretrain_command`)."""
    for name, callback in commands().items():
        assert command_name(callback) == name.split()[-1], name


def test_kbert_and_its_package_name_every_backend():
    result = run_kbert("--help")
    assert "BERT for Keras 3 on TensorFlow, JAX or PyTorch" in " ".join(result.stdout.split())
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["description"].startswith("BERT for Keras 3 on TensorFlow, JAX or PyTorch")


def test_to_hf_says_it_takes_classifiers():
    help_text = " ".join(run_kbert("convert", "to-hf", "--help").stdout.split())
    assert "a pretrainer or an encoder" not in help_text
    assert "a classifier or regressor" in help_text


def test_export_says_which_classifiers_take_text_b():
    """A classifier fine-tuned on single texts exports `text` only (tests/test_readme.py serves one)."""
    help_text = " ".join(run_kbert("export", "--help").stdout.split())
    assert "yes for classifiers and regressors" not in help_text
    assert "fine-tuned on pairs takes text and text_b, one fine-tuned on single texts text only" in help_text


def test_a_finished_file_is_not_resumed_in_words_of_one_command(tmp_path):
    """`--resume` of a complete --output file: predict and embed share the line, so it names neither."""
    import pytest

    from kbert.finetuning.output import write_rows
    from kbert.runtime.errors import KbertError

    path = tmp_path / "rows.jsonl"
    write_rows(path, lambda start: ({"n": n} for n in range(start, 2)))
    with pytest.raises(KbertError) as error:
        write_rows(path, lambda start: iter(()), resume=True)
    assert (
        str(error.value)
        == f"{path} is complete, with no unfinished run to resume; pass overwrite=True to write it again"
    )


def test_convert_inspect_lists_the_sources_as_every_command_does(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a note\n")
    inspected = run_kbert("convert", "inspect", tmp_path / "notes", check=False)
    predicted = run_kbert("predict", tmp_path / "notes", "--input", tmp_path / "notes" / "a.txt", check=False)
    assert inspected.returncode == predicted.returncode == 1
    # Each line names its own argument (SRC, MODEL_DIR); what it asks for is the same.
    assert inspected.stderr.split("; pass ")[1] == predicted.stderr.split("; pass ")[1], (
        inspected.stderr,
        predicted.stderr,
    )


def test_predict_and_evaluate_word_truncation_alike(tmp_path, tiny_classifier):
    long_text = " ".join(["the city is great"] * CLASSIFIER_LENGTH)
    data = tmp_path / "test.tsv"
    data.write_text(f"text\ttext_b\tlabel\n{long_text}\tthe city.\tpos\nshort\tthe city.\tneg\n")
    lines = []
    for command in ("predict", "evaluate"):
        result = run_kbert(command, tiny_classifier, "--input", data)
        (line,) = [line for line in result.stderr.splitlines() if "truncated" in line]
        lines.append(line)
    expected = f"kbert: {data}: 1 of 2 examples longer than --max-seq-length {CLASSIFIER_LENGTH} were truncated"
    assert lines == [expected, expected]
