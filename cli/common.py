"""What every command shares: stdout for results (JSON), stderr for logs, quiet TensorFlow."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

from typer.core import TyperCommand

from kbert._compat import typer_parameter_type


def quiet_tensorflow():
    """Keep TensorFlow's C++ start-up chatter (oneDNN, CUDA probes) off the user's terminal."""
    if os.environ.get("KBERT_DEBUG") != "1":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def keras_backend() -> str:
    """The Keras backend a command runs on: KERAS_BACKEND, which `quiet_tensorflow` defaults to tensorflow."""
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def import_tensorflow_quietly(command: str = "this command", backend_only: bool = False, keras_on_tensorflow=False):
    """Import TensorFlow with fd 2 pointed at /dev/null: its C++ start-up lines (oneDNN, CUDA
    probes) ignore TF_CPP_MIN_LOG_LEVEL in 2.21 and would bury the one line a user needs.

    `backend_only`: `command` needs TensorFlow only on Keras' TensorFlow backend (it runs on
    JAX and PyTorch without it): nothing is imported on the others. `keras_on_tensorflow`:
    `command` builds TensorFlow graphs from Keras layers (a SavedModel), which only Keras'
    TensorFlow backend makes: where KERAS_BACKEND names another, the command runs on TensorFlow's
    all the same if Keras is not imported yet (a command line's process), and is refused in one
    line that says how to run it otherwise. Where TensorFlow is not installed, a command that
    needs it is refused in one line.
    """
    import importlib.util

    if backend_only and keras_backend() != "tensorflow":
        return
    missing = [name for name in ("tensorflow", "tensorflow_text") if importlib.util.find_spec(name) is None]
    if missing:
        from kbert.runtime.errors import KbertError

        if backend_only:
            raise KbertError(
                f"{command} runs on Keras' TensorFlow backend unless KERAS_BACKEND says otherwise, and "
                f"{missing[0]} is not installed: pip install tensorflow tensorflow-text, or run it with "
                "KERAS_BACKEND=jax (or torch)"
            )
        raise KbertError(
            f"{command} needs TensorFlow, and {missing[0]} is not installed: pip install tensorflow tensorflow-text"
        )
    if keras_on_tensorflow and keras_backend() != "tensorflow":
        from kbert.runtime.errors import KbertError

        if "keras" in sys.modules:  # Keras picked its backend at import: this process cannot switch
            raise KbertError(
                f"{command} builds a TensorFlow SavedModel, which needs Keras' TensorFlow backend, and Keras runs "
                f"on {keras_backend()} here: run it with KERAS_BACKEND=tensorflow (a model trained on any backend "
                "exports)"
            )
        logging.getLogger("kbert").info(
            "KERAS_BACKEND is %s; %s builds a TensorFlow SavedModel, so Keras runs on TensorFlow for it",
            keras_backend(),
            command.removeprefix("kbert "),
        )
        os.environ["KERAS_BACKEND"] = "tensorflow"
    if os.environ.get("KBERT_DEBUG") == "1" or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        # Imported here, inside the redirect, and only for commands that need TensorFlow: each
        # of these imports it, and device set-up prints its CUDA probe.
        import keras  # noqa: F401

        from kbert.backend.tensorflow import set_up_devices

        set_up_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def setup_logging(debug: bool = False):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kbert: %(message)s"))
    log = logging.getLogger("kbert")
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if debug else logging.INFO)
    log.propagate = False
    if not debug:
        warnings.filterwarnings("ignore")
        logging.getLogger("absl").setLevel(logging.ERROR)
        logging.getLogger("tensorflow").setLevel(logging.ERROR)


def print_result(result: dict):
    """The command's result: one JSON object on stdout."""
    sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
    sys.stdout.flush()


def bytes_progress(label: str, *more_columns):
    """A rich progress bar over bytes read (bar, bytes, rate, time left) on stderr, shown only on
    a terminal: in a log file a progress bar is noise, and the JSON result says it all."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        *more_columns,
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )


# Value names in --help, by a parameter's declared kind: what a user types there, not typer's
# internals (`<int range>`, `<list[str]>`, `{model_dir}`).
_PATH_NAMES = {"file": "FILE", "shards": "FILE", "dir": "DIR", "dir-in-place": "DIR", "model": "DIR", "any": "PATH"}


def value_name(param, callback) -> str:
    """What --help shows for a parameter's value: FILE, DIR, N, NUMBER, TEXT (FILE... for a list)."""
    declared = {**getattr(callback, "inputs", {}), **getattr(callback, "outputs", {})}.get(param.name)
    typed = typer_parameter_type(param)
    annotation = typed.annotation
    if param.metavar:
        name = param.metavar
    elif declared is not None:
        name = "GLOB" if getattr(declared, "globs", False) and annotation is str else _PATH_NAMES[declared.kind]
    elif typed.is_path:
        name = "PATH"
    elif annotation is int or typed.is_ranged and "int" in typed.ranged_type_name:
        name = "N"
    elif annotation is float or typed.is_ranged:
        name = "NUMBER"
    else:
        name = "TEXT"
    return name + "..." if typed.is_list and not name.endswith("...") else name


def _argument_name(param) -> str:
    name = param.metavar or param.name.upper()
    return name + "..." if param.nargs != 1 else name


class HelpCommand(TyperCommand):
    """A typer command whose --help names values as value_name() does (typer's own rendering
    shows its internal type names)."""

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar]
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(_argument_name(param) if param.required else f"[{_argument_name(param)}]")
        return pieces

    def format_options(self, ctx, formatter):
        sections = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or param.param_type_name not in sections:
                continue
            if param.param_type_name == "argument":
                name = _argument_name(param)
            elif param.is_flag or param.count:
                name = record[0]  # no value to name: `--overwrite / --no-overwrite`
            else:
                name = " / ".join(param.opts) + " " + value_name(param, self.callback)
            sections[param.param_type_name].append((name, record[1]))
        for title, key in (("Arguments", "argument"), ("Options", "option")):
            if sections[key]:
                with formatter.section(title):
                    formatter.write_dl(sections[key])


def put_rows(rows, output, *, resume: bool, overwrite: bool, source, made_by):
    """A command's rows: written to the `--output` FILE batch by batch (FILE.partial, renamed at the
    end; resumable), with a summary printed, or printed as JSON lines (stdout, or a stream).

    Args:
        rows: callable. The number of rows already written -> the rows from there on.
        made_by: callable. -> what shapes a row besides the input (the model's identity, the
            options): recorded beside FILE.partial, and a `--resume` with any other is refused.
            Called only when a file is written (a model's identity reads its files).
    """
    from kbert.runtime.files import is_stream

    if output is not None and (resume or overwrite or not is_stream(output)):
        from kbert.finetuning.output import write_rows

        print_result(write_rows(output, rows, resume=resume, overwrite=overwrite, source=source, made_by=made_by()))
        return
    print_rows(rows(0), output)


def print_rows(rows, output=None):
    """Each row as a JSON line on stdout (or the stream `--output` names: `-`, /dev/stdout, a pipe)
    as it is computed; a stop says how many rows were printed (`kbert predict`, `kbert embed`)."""
    from kbert.runtime.errors import Interrupted

    stream = sys.stdout if output is None or str(output) == "-" else open(output, "w", encoding="utf-8")
    printed = 0
    try:
        for row in rows:
            stream.write(json.dumps(row) + "\n")
            printed += 1
        stream.flush()
    except (Interrupted, KeyboardInterrupt) as stop:
        how = str(stop).split(";")[0] if isinstance(stop, Interrupted) else "interrupted"
        code = stop.exit_code if isinstance(stop, Interrupted) else 130
        raise Interrupted(f"{how} after printing {printed} rows", code) from None
    finally:
        if stream is not sys.stdout:
            stream.close()
