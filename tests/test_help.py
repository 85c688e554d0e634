"""What kbert says about itself: --help in a user's words, --version, option names that exist
where they are named (a flag of the running command, or the argument a Python caller passed), and
the way a plain Python program loads an export."""

import ast
import json
import pathlib
import re
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest
import typer.main

from conftest import TINY, run_kbert
from kbert.cli.main import app
from kbert.runtime.errors import KbertError

REPO = pathlib.Path(__file__).resolve().parent.parent

# A --flag as a word (not Beam's or TF Serving's --snake_case flags).
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])")
# A whole command a message quotes: its flags are that command's, not the running one's.
QUOTED_COMMAND = re.compile(r"`kbert ([a-z][a-z-]*(?: [a-z][a-z-]*)?)((?: [^`]*)?)`")


def click_commands():
    """{"convert from-tf1": click command, ...} for every command of the app."""
    found, todo = {}, [((), typer.main.get_command(app))]
    while todo:
        path, command = todo.pop()
        for name, sub in getattr(command, "commands", {}).items():
            todo.append(((*path, name), sub))
        if path and not hasattr(command, "commands"):
            found[" ".join(path)] = command
    return found


COMMANDS = click_commands()


def flags_of(name: str) -> set:
    """The --flags `kbert NAME` takes, --help and --debug (accepted anywhere) with them."""
    command = COMMANDS[name]
    return {f for p in command.params for f in p.opts + p.secondary_opts if f.startswith("--")} | {"--help", "--debug"}


def foreign_flags(line: str, name: str) -> set:
    """The flags `line` names that their command does not take: bare ones are `kbert NAME`'s,
    those inside a quoted `kbert OTHER ...` are OTHER's."""
    wrong = set()
    for other, rest in QUOTED_COMMAND.findall(line):
        if other not in COMMANDS:  # `kbert convert` alone, say: its first word only
            other = other.split()[0]
        wrong |= set(FLAG.findall(rest)) - flags_of(other) if other in COMMANDS else set()
    return wrong | set(FLAG.findall(QUOTED_COMMAND.sub("", line))) - flags_of(name)


def test_foreign_flags_reads_quoted_commands():
    assert foreign_flags("pass --lowercase", "finetune") == {"--lowercase"}
    assert foreign_flags("pass `kbert convert from-tf1 --lowercase/--no-lowercase`", "finetune") == set()
    assert foreign_flags("use `kbert finetune --no-such-flag`", "extend") == {"--no-such-flag"}
    assert foreign_flags("--temp_location is Beam's", "vocab") == set()


@pytest.mark.parametrize(
    "name", [""] + sorted({n.split()[0] for n in COMMANDS}) + sorted(n for n in COMMANDS if " " in n)
)
def test_help_names_values_in_a_users_words(name):
    result = run_kbert(*name.split(), "--help")
    text = result.stdout
    assert result.returncode == 0 and text.startswith("Usage: kbert"), result.stderr
    # typer's own rendering: `{model_dir}` in the usage line, `<int range>`, `<list[str]>`, `<path>`.
    assert not re.search(r"[{}]", text), text
    assert not re.search(r"<[a-z][^>]*>", text), text
    # A pip-installed kbert has no docs/ folder to point at.
    assert "docs/" not in text, text


def test_help_usage_and_values():
    text = run_kbert("finetune", "--help").stdout
    assert "Usage: kbert finetune [OPTIONS] MODEL_DIR" in text
    assert re.search(r"--train FILE\s", text) and re.search(r"--epochs N\s", text)
    assert re.search(r"--learning-rate NUMBER\s", text) and re.search(r"--task TEXT\s", text)
    text = run_kbert("create-data", "--help", own_process=False).stdout  # help starts no workers
    assert "Usage: kbert create-data [OPTIONS] [FILE...]" in text and re.search(r"--input FILE\.\.\.\s", text)
    assert re.search(r"--lowercase / --no-lowercase\s", text)


def test_version_is_the_installed_distributions():
    result = run_kbert("--version")
    assert result.returncode == 0 and result.stdout == f"kbert {version('kbert')}\n" and result.stderr == ""


def test_export_errors_name_python_arguments_from_python_and_flags_on_the_command_line(tmp_path):
    from kbert.serving.export import export_model

    (tmp_path / "base" / "1").mkdir(parents=True)
    with pytest.raises(KbertError) as raised:
        export_model(TINY, tmp_path / "base", version=1)
    said = str(raised.value)
    assert "version" in said and "overwrite=True" in said and "--" not in said, said
    with pytest.raises(KbertError, match=r"^precision='float16': choose"):
        export_model(TINY, tmp_path / "base", precision="float16")

    result = run_kbert("export", TINY, tmp_path / "base", "--version", "1", check=False)
    line = result.stderr.strip()
    assert result.returncode == 1 and "--version" in line and "--overwrite" in line and "overwrite=" not in line
    result = run_kbert("export", TINY, tmp_path / "base", "--precision", "float16", check=False)
    assert result.stderr.startswith("kbert: error: --precision float16: choose"), result.stderr


def test_sequence_length_names_the_argument_or_the_flag():
    from kbert.config import sequence_length
    from kbert.runtime.errors import command_line_names

    with pytest.raises(KbertError, match=r"^max_seq_length=600 exceeds"):
        sequence_length(600, 512)
    with command_line_names({"--max-seq-length"}), pytest.raises(KbertError, match=r"^--max-seq-length 600 exceeds"):
        sequence_length(600, 512)


def test_a_shared_hint_names_the_command_that_has_the_flag(tmp_path):
    # A google-research checkpoint opened by a command without --lowercase (here fill-mask): the
    # casing guessed from the folder name is said with the command that sets it.
    model = tmp_path / "uncased_L-2_H-64"
    shutil.copytree(TINY, model)
    result = run_kbert("fill-mask", model, "the [MASK] .")
    said = [line for line in result.stderr.splitlines() if "do_lower_case" in line]
    assert said and all(not foreign_flags(line, "fill-mask") for line in said), result.stderr
    assert "`kbert convert from-tf1 --lowercase/--no-lowercase`" in said[0]
    result = run_kbert("convert", "from-tf1", model, tmp_path / "out")
    said = [line for line in result.stderr.splitlines() if "do_lower_case" in line]
    assert said and "pass --lowercase/--no-lowercase to set it" in said[0], result.stderr


def test_a_shared_error_names_the_command_that_has_the_flag(tmp_path):
    # Every command that opens a google-research checkpoint says what it lacks; export has no --vocab.
    shutil.copytree(TINY, tmp_path / "no-vocab", ignore=shutil.ignore_patterns("vocab.txt"))
    result = run_kbert("export", tmp_path / "no-vocab", tmp_path / "export", check=False)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and line.startswith("kbert: error: "), result.stderr
    assert line.endswith("pass `kbert convert from-tf1 --vocab`") and not foreign_flags(line, "export"), line
    result = run_kbert("convert", "from-tf1", tmp_path / "no-vocab", tmp_path / "out", check=False)
    assert result.stderr.strip().endswith("there or pass --vocab"), result.stderr


# Modules of the Python API whose messages name options through kbert.runtime.errors.option, so that
# they say `max_seq_length=600` to a Python caller and `--max-seq-length 600` on the command line.
OPTION_NAMING_MODULES = [
    "kbert/runtime/beam.py",
    "kbert/config.py",
    "kbert/finetuning/embedding.py",
    "kbert/extend.py",
    "kbert/runtime/files.py",
    "kbert/runtime/locks.py",
    "kbert/model/embedding_record.py",
    "kbert/formats/model_dir.py",
    "kbert/finetuning/formats.py",
    "kbert/finetuning/options.py",
    "kbert/finetuning/output.py",
    "kbert/finetuning/predict.py",
    "kbert/finetuning/readers.py",
    "kbert/finetuning/squad.py",
    "kbert/finetuning/rows.py",
    "kbert/finetuning/tasks/__init__.py",
    "kbert/finetuning/tasks/base.py",
    "kbert/finetuning/tasks/classify.py",
    "kbert/finetuning/tasks/embed.py",
    "kbert/finetuning/tasks/regress.py",
    "kbert/finetuning/tasks/squad.py",
    "kbert/finetuning/train.py",
    "kbert/new_words.py",
    "kbert/runtime/files.py",
    "kbert/pretraining/beam_pipeline.py",
    "kbert/pretraining/create_data.py",
    "kbert/pretraining/fill_mask.py",
    "kbert/pretraining/instances.py",
    "kbert/pretraining/mlm_instances.py",
    "kbert/pretraining/record_kinds.py",
    "kbert/pretraining/record_statistics.py",
    "kbert/pretraining/keras_engine.py",
    "kbert/pretraining/record_checks.py",
    "kbert/pretraining/run_record.py",
    "kbert/pretraining/run_setup.py",
    "kbert/pretraining/tf_dataset.py",
    "kbert/pretraining/tf_engine.py",
    "kbert/pretraining/train.py",
    "kbert/formats/sources.py",
    "kbert/text/tf_text_vocab.py",
    "kbert/text/vocab_builder.py",
    "kbert/text/vocab_pipeline.py",
    "kbert/training/interruption.py",
    "kbert/training/progress.py",
    "kbert/backend/jax.py",
    "kbert/backend/placement.py",
    "kbert/backend/portable.py",
    "kbert/backend/tensorflow.py",
    "kbert/backend/torch.py",
    "converters/hf.py",
    "converters/keras_hub.py",
    "converters/tf1.py",
    "converters/tfhub.py",
    "serving/export.py",
    "serving/int8.py",
    "serving/predict.py",
    "serving/tfhub.py",
]


def message_texts(path):
    """(line, text) of each KbertError, Interrupted and log call in a module: its string pieces joined."""
    for node in ast.walk(ast.parse((REPO / path).read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("KbertError", "Interrupted", "debug", "info", "warning", "error"):
            yield node.lineno, "".join(_strings(node))


def _strings(node):
    """The string constants under `node`, but not the arguments of option() calls inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child.value
        elif not (isinstance(child, ast.Call) and getattr(child.func, "id", None) == "option"):
            yield from _strings(child)


@pytest.mark.parametrize("path", OPTION_NAMING_MODULES)
def test_messages_name_options_through_option(path):
    written = [
        (line, text)
        for line, text in message_texts(path)
        if FLAG.search(QUOTED_COMMAND.sub("", text.replace("\n", " ")))
    ]
    assert not written, f"{path}: name these options with kbert.runtime.errors.option(): {written}"


@pytest.mark.slow
def test_an_export_loads_in_plain_python_as_its_json_says(tiny_encoder_export, tiny_hub_export):
    (_, result), (_, hub) = tiny_encoder_export, tiny_hub_export
    export, preprocessor = result["export"], hub["preprocessor"]
    assert result["load_with"] == f"import tensorflow as tf, tensorflow_text; tf.saved_model.load({export!r})"
    assert hub["load_with"] == f"import tensorflow as tf, tensorflow_text; tf.saved_model.load({preprocessor!r})"
    # Loading without tensorflow_text fails on its ops; as the JSON says, it serves text.
    script = f"""
import json, sys
import tensorflow as tf
said = {{}}
for path in sys.argv[1:]:
    try:
        tf.saved_model.load(path)
        said[path] = "loaded"
    except Exception as e:
        said[path] = type(e).__name__ + ": " + str(e)[:300]
{result["load_with"]}
said["served"] = tf.saved_model.load({export!r}).signatures["serving_default"](text=tf.constant(["the camp"]))
said["served"] = sorted(said["served"])
{hub["load_with"]}
print(json.dumps(said))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, export, preprocessor], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    for path in (export, preprocessor):
        assert said[path] != "loaded" and "Op type not registered" in said[path], said[path]
    assert said["served"]
