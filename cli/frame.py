"""The one frame every kbert command runs in: its paths declared, checked before any work.

A command declares which of its parameters are inputs and outputs, and of what kind:

    @command(inputs={"model_dir": MODEL, "input": TEXT}, outputs={"output": FILE})
    def predict(model_dir: Path = ..., input: Path = ..., output: Optional[Path] = ...): ...

Before the command's body runs (and so before TensorFlow loads a model), the frame:
- expands --input globs and comma-separated lists the same way for every runner;
- checks every input: it exists, is a file or a directory as declared, is not empty, and is
  what it claims (text is text, TFRecords are framed records, a JSON file parses);
- refuses an output that is an input or lies inside one, one of the wrong kind, and one this
  process cannot write;
- sweeps what dead writers of each output left beside it, and takes each output's lock.
While the body runs, SIGTERM stops it as Ctrl-C does, and every child process it started is
stopped and reaped when it ends (`kbert.runtime.processes`). An output directory the command made and
left empty (an export base, after Ctrl-C) is removed.

Numbers are declared where typer declares them (`typer.Option(32, min=1)`);
tests/test_bad_input_sweep.py runs every command with bad values for every declared path and
number, so a new command or option cannot skip the frame.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import os
import shutil

from kbert.cli.common import import_tensorflow_quietly
from kbert.formats.sources import KINDS, check_source, source_family, source_kind
from kbert.runtime.errors import KbertError, os_error_parts
from kbert.runtime.files import (
    TEXT_CHECK_BYTES,
    check_apart,
    check_head_is_text,
    check_writable,
    claim_output,
    expand_inputs,
    is_stream,
    is_url,
    sweep_stale_temporaries,
)
from kbert.runtime.processes import stop_cleanly


@dataclasses.dataclass(frozen=True)
class Input:
    """What an input parameter must be.

    kind: "file", "dir", "model" (a model source: `kbert.formats.sources.source_kind` names its kind), or "any".
    content: "text", "json", "records" (TFRecords) or None (not looked into).
    globs: the value is a list of paths and globs, comma-separated lists too (expand_inputs).
    what: what the user should pass, in words, for the message when it is missing.
    accepts: for a model, the source kinds taken (`kbert.formats.sources.KINDS`, and "run" for an
        unfinished training run's folder); None: every kind of model.
    families: for a model, the model families taken (`kbert.formats.sources.source_family`).
    """

    kind: str
    content: str | None = None
    globs: bool = False
    what: str | None = None
    accepts: tuple | None = None
    families: tuple = ("bert",)


@dataclasses.dataclass(frozen=True)
class Output:
    """What an output parameter is.

    kind: "file"; "dir" (replaced whole by an atomic rename); "dir-in-place" (written in place:
    pretrain's --model-dir, an export base); "shards" (a file, or OUT-0000i-of-0000N with
    the command's `shards_from` parameter).
    lock: False where the body takes the lock itself (a multi-worker pretrain's non-chief
    workers do not lock).
    streams: a file output that may also be a stream (`-`, /dev/stdout, a pipe), which the
    command writes as it goes: nothing to check or lock then.
    """

    kind: str
    shards_from: str | None = None
    lock: bool = True
    streams: bool = False


TEXT = Input("file", "text")
TEXT_FILES = Input("file", "text", globs=True)
JSON = Input("file", "json")
RECORDS = Input("file", "records", globs=True)
FAMILIES = ("bert", "modernbert")
MODEL = Input("model")  # any BERT source kbert reads (kbert.formats.sources.open_model)
ANY_MODEL = Input("model", families=FAMILIES)  # a BERT or a ModernBERT
MODEL_OR_RUN = Input("model", accepts=(*KINDS, "run"), families=FAMILIES)  # convert inspect: unfinished runs too
TF1_CHECKPOINT = Input("model", accepts=("tf1",))
HF_MODEL = Input("model", accepts=("hf",), families=FAMILIES)
TFHUB_MODEL = Input("model", accepts=("tfhub",))
KERAS_HUB_PRESET = Input("model", accepts=("keras_hub",))

FILE = Output("file")
FILE_OR_STREAM = Output("file", streams=True)
DIR = Output("dir")
DIR_IN_PLACE = Output("dir-in-place")


# What each command's --help says of TensorFlow, by its `tensorflow` declaration.
TENSORFLOW_HELP = {
    True: "Needs TensorFlow (pip install tensorflow tensorflow-text), whatever KERAS_BACKEND says.",
    "keras": "Needs TensorFlow; runs Keras on its TensorFlow backend, whatever KERAS_BACKEND says.",
    "backend": "Runs on Keras' TensorFlow, JAX or PyTorch backend (KERAS_BACKEND), on JAX and PyTorch without "
    "TensorFlow unless it reads a google-research checkpoint or a TF Hub SavedModel.",
    False: "Needs no TensorFlow.",
}


def command(
    inputs: dict | None = None, outputs: dict | None = None, above_zero: tuple = (), tensorflow: bool | str = True
):
    """Declare a typer command's inputs and outputs; the frame checks them before its body runs.

    Args:
        inputs: {parameter name: Input}.
        outputs: {parameter name: Output}.
        above_zero: names of number parameters that must be above 0 (typer's `min` allows it).
        tensorflow: bool, "backend" or "keras". Import TensorFlow (quietly) once the checks pass; create-data
            never needs it; "backend": only on Keras' TensorFlow backend (the command also runs on JAX and
            PyTorch); "keras": TensorFlow and Keras' TensorFlow backend, which the command switches to where
            Keras is not imported yet (it builds a SavedModel).
            Where TensorFlow is not installed, a command that needs it says so in one line.
    """
    inputs, outputs = dict(inputs or {}), dict(outputs or {})

    def wrap(function):
        signature = inspect.signature(function)
        unknown = set(inputs) | set(outputs) | set(above_zero)
        unknown -= set(signature.parameters)
        if unknown:
            raise TypeError(f"{function.__name__} has no parameter {', '.join(sorted(unknown))}")

        @functools.wraps(function)
        def run(**values):
            name = command_name(function)
            with contextlib.ExitStack() as stack:
                stack.enter_context(stop_cleanly(f"kbert {name}"))
                for parameter in above_zero:
                    if values.get(parameter) is not None and values[parameter] <= 0:
                        raise KbertError(f"{option_name(signature, parameter)} {values[parameter]}: must be above 0")
                # Cheap checks first, each before any work: the inputs exist and are of their kind;
                # the outputs are apart from them, of theirs, and writable; then the inputs'
                # content (a binary given as text); then the locks.
                given = _find_inputs(signature, values, inputs)
                written = {
                    parameter: output
                    for parameter, output in outputs.items()
                    if values.get(parameter) is not None and not (output.streams and is_stream(values[parameter]))
                }
                for parameter, output in written.items():
                    _check_output(signature, parameter, values, output, [path for path, _, _ in given])
                for path, declared, flag in given:
                    check_content(path, declared, flag)
                try:
                    for parameter, output in written.items():
                        stack.enter_context(_claim(values[parameter], output, values))
                    if tensorflow:
                        group = "convert " if function.__module__.endswith(".convert") else ""  # kbert's one group
                        import_tensorflow_quietly(
                            f"kbert {group}{name}",
                            backend_only=tensorflow == "backend",
                            keras_on_tensorflow=tensorflow == "keras",
                        )
                    return function(**values)
                except KbertError:
                    raise  # already the one line, whatever words it quotes
                except Exception as e:  # a full disk whose error names no file: name the output
                    parts = os_error_parts(e, writing=", ".join(str(values[p]) for p in written))
                    if parts is None:
                        raise
                    raise KbertError("{}: {}; {}".format(*parts)) from None

        run.inputs, run.outputs, run.above_zero = inputs, outputs, tuple(above_zero)
        run.tensorflow = tensorflow
        run.__doc__ = f"{inspect.cleandoc(function.__doc__ or '')}\n\n{TENSORFLOW_HELP[tensorflow]}".strip()
        return run

    return wrap


def command_name(function) -> str:
    """The name a user types for a command's function, as its messages say it: `pretrain_command`
    is pretrain, `create_data` create-data, and `inspect_` (named so beside the module) inspect.

    >>> command_name(command_name)
    'command-name'
    """
    return function.__name__.replace("_command", "").strip("_").replace("_", "-")


def needs_tensorflow(commands: dict) -> list:
    """The names of `commands` ({name: callback}) that need TensorFlow whatever the backend, or its backend."""
    return [name for name, callback in commands.items() if getattr(callback, "tensorflow", False) in (True, "keras")]


def option_name(signature, parameter: str) -> str:
    """How the user typed a parameter: its first --flag, or its METAVAR for an argument."""
    info = signature.parameters[parameter].default
    declarations = [d for d in (getattr(info, "param_decls", None) or ()) if d.startswith("--")]
    if declarations:
        return declarations[0].split("/")[0]
    if type(info).__name__ == "ArgumentInfo":
        return parameter.upper()
    return "--" + parameter.replace("_", "-")


def _find_inputs(signature, values: dict, inputs: dict) -> list:
    """Check that each declared input exists and is of its kind; return (path, declared, flag)
    for every input path (globs expanded)."""
    found = []
    for parameter, declared in inputs.items():
        value = values.get(parameter)
        if value is None or value == [] or value == "":
            continue
        flag = option_name(signature, parameter)
        given = value if isinstance(value, (list, tuple)) else [value]
        if declared.globs:
            try:
                what = {"text": "text file", "records": "TFRecord file"}.get(declared.content, "file")
                files = expand_inputs([str(v) for v in given], what=what)
            except KbertError as e:
                raise KbertError(f"{flag} {e}") from None
            files = skip_empty_files(files, flag)
            if isinstance(value, (list, tuple)):
                values[parameter] = files  # the same files on every runner
        else:
            files = [str(v) for v in given]
        for path in files:
            check_input(path, declared, flag)
            found.append((path, declared, flag))
    return found


def skip_empty_files(files: list, flag: str) -> list:
    """`files` without the empty ones, each named in a warning, as create_pretraining_data.py
    skips empty input; all of them empty, they stay, for check_content to refuse."""
    empty = [p for p in files if not is_url(p) and os.path.isfile(p) and os.path.getsize(p) == 0]
    if not empty or len(empty) == len(files):
        return files
    for path in empty:
        logging.getLogger("kbert").warning(f"{flag} {path}: the file is empty; skipped")
    return [p for p in files if p not in empty]


def check_input(path: str, declared: Input, flag: str):
    """Raise a one-line `KbertError` naming `flag` unless `path` exists and is of the kind `declared` says."""
    if declared.kind == "model":
        try:
            with contextlib.suppress(KbertError):  # check_source says what is wrong with the path
                if source_kind(path) == "run" and "run" not in (declared.accepts or ()):
                    # The run's last checkpoint, named in the message, is TensorFlow's to find on its backend.
                    import_tensorflow_quietly(backend_only=True)
                    # Each trainer registers how its unfinished runs are told apart and finished.
                    import kbert.finetuning.run_state
                    import kbert.pretraining.run_record  # noqa: F401
            check_source(path, declared.accepts)
        except KbertError as e:
            raise KbertError(f"{flag} {e}") from None
        if source_family(path) not in declared.families:
            raise KbertError(
                f"{flag} {path}: a ModernBERT, and this command takes BERT models only so far; a ModernBERT "
                f"converts from and to Hugging Face, fills masks, embeds, fine-tunes to classify, regress, tag or "
                f"embed, predicts, evaluates and exports for TF Serving (docs/modernbert.md)"
            )
        return
    if is_url(path):
        return  # a remote file system's (gs://, ...): its runner checks it
    if not os.path.exists(path):
        kind = "directory" if declared.kind == "dir" else "file"
        fix = f"pass a {declared.what}" if declared.what else "check the path"
        raise KbertError(f"{flag} {path}: no such {kind}; {fix}")
    if declared.kind == "dir":
        if not os.path.isdir(path):
            raise KbertError(f"{flag} {path}: is a file; pass a directory")
        return
    if os.path.isdir(path):
        if declared.kind == "any":
            return
        raise KbertError(f"{flag} {path}: is a directory; pass a file")


def check_content(path: str, declared: Input, flag: str):
    """Raise a one-line `KbertError` naming `flag` unless the file at `path` holds what
    `declared` says: not empty, and text, JSON or TFRecords."""
    if is_url(path) or not os.path.isfile(path):
        return
    if os.path.getsize(path) == 0:
        raise KbertError(f"{flag} {path}: the file is empty; pass one with data in it")
    try:
        with open(path, "rb") as f:
            head = f.read(TEXT_CHECK_BYTES)
    except OSError as e:
        raise KbertError(f"{flag} {path}: cannot read it ({e.strerror}); check its permissions") from None
    if declared.content in ("text", "json"):
        check_head_is_text(f"{flag} {path}", head)
    if declared.content == "json":
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except ValueError as e:
            raise KbertError(f"{flag} {path}: not valid JSON ({e}); is the file complete?") from None
    if declared.content == "records":
        from kbert.runtime.records import check_records_file

        check_records_file(path, flag)


def _output_paths(value, output: Output, values: dict) -> list:
    if output.kind == "shards" and output.shards_from:
        from kbert.pretraining.create_data import shard_paths

        return shard_paths(str(value), values.get(output.shards_from) or 1)
    return [str(value)]


def _check_output(signature, parameter: str, values: dict, output: Output, inputs: list):
    """Refuse an output that is or lies inside an input, of the wrong kind, or unwritable."""
    flag = option_name(signature, parameter)
    for each in _output_paths(values[parameter], output, values):
        if is_url(each):
            continue
        try:
            check_apart(each, inputs, replaces=output.kind == "dir")
        except KbertError as e:
            raise KbertError(f"{flag} {e}") from None
        if output.kind in ("file", "shards") and os.path.isdir(each):
            raise KbertError(f"{flag} {each}: is a directory; give a file path for the output")
        if output.kind.startswith("dir") and os.path.isfile(each):
            raise KbertError(f"{flag} {each}: is a file; give a directory path for the output")
        if output.kind == "dir" and os.path.isdir(each) and os.listdir(each) and not values.get("overwrite"):
            raise KbertError(
                f"{flag} {each}: exists and is not empty; pass --overwrite to replace it, or choose a new directory"
            )
        check_writable(each, in_place=output.kind == "dir-in-place")


@contextlib.contextmanager
def _claim(value, output: Output, values: dict):
    """Lock an output and sweep its dead writers' leftovers; remove it if this run made it and
    left it empty."""
    path, paths = str(value), _output_paths(value, output, values)
    made = output.kind == "dir-in-place" and not os.path.exists(path)
    with claim_output(path, in_place=output.kind == "dir-in-place") if output.lock else contextlib.nullcontext():
        for each in paths:
            if not is_url(each):
                sweep_stale_temporaries(each)
        try:
            yield
        except BaseException:
            # A directory this run made and left empty (Ctrl-C before an export's first file).
            if made and os.path.isdir(path) and not os.listdir(path):
                shutil.rmtree(path, ignore_errors=True)
            raise
