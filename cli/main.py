"""`kbert`: the command line. One module per command group; this one joins them and turns
user errors into one line on stderr and exit status 1 (tracebacks only with --debug)."""

from __future__ import annotations

import itertools
import os
import sys

import typer
from typer import Abort

from kbert._compat import command_line_errors
from kbert.cli import (
    convert,
    create_data,
    embed,
    export,
    extend,
    fill_mask,
    finetune,
    predict,
    pretrain,
    rerank,
    vocab,
)
from kbert.cli.common import HelpCommand, quiet_tensorflow, setup_logging
from kbert.cli.frame import needs_tensorflow
from kbert.runtime.errors import (
    Interrupted,
    KbertError,
    command_line_names,
    first_line,
    os_error_line,
    record_signalled_stop,
    stop_behind,
)

NoArgsIsHelpError, UsageError = command_line_errors()

app = typer.Typer(
    name="kbert",
    help="BERT for Keras 3 on TensorFlow, JAX or PyTorch: convert, pretrain, fine-tune and serve google-research/bert models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(convert.app, name="convert")
app.command("pretrain")(pretrain.pretrain_command)
app.command("fill-mask")(fill_mask.fill_mask_command)
app.command("create-data")(create_data.create_data)
app.command("vocab")(vocab.vocab)
app.command("finetune")(finetune.finetune)
app.command("predict")(predict.predict)
app.command("evaluate")(predict.evaluate)
app.command("embed")(embed.embed)
app.command("rerank")(rerank.rerank)
app.command("export")(export.export)
app.command("extend")(extend.extend)
_COMMANDS = {
    **{info.name: info.callback for info in app.registered_commands},
    **{f"{g.name} {c.name}": c.callback for g in app.registered_groups for c in g.typer_instance.registered_commands},
}
for _info in app.registered_commands + [c for g in app.registered_groups for c in g.typer_instance.registered_commands]:
    _info.cls = HelpCommand  # --help names values FILE, DIR, N, not by typer's internal type names
# Said once, from each command's declaration: which commands need TensorFlow.
app.info.help += (
    f"\n\nNeed TensorFlow: {', '.join(needs_tensorflow(_COMMANDS))}, and predict --server. Every other command "
    "runs on Keras' JAX or PyTorch backend (KERAS_BACKEND) without it, on any model but a google-research "
    "checkpoint or a TF Hub SavedModel."
)


def _print_version(value: bool):
    if value:
        from importlib.metadata import version

        print(f"kbert {version('kbert')}")
        raise typer.Exit()


def _flags_of(argv) -> set:
    """The --flags of the command that argv runs (`kbert convert from-tf1 ...`: from-tf1's)."""
    command = typer.main.get_command(app)
    for word in argv:
        if word not in getattr(command, "commands", {}):
            break
        command = command.commands[word]
    return {flag for param in command.params for flag in param.opts + param.secondary_opts if flag.startswith("--")}


def _expanded_glob(argv, message: str) -> str | None:
    """The line for paths left over after an option that takes one value (`--data data/*.tfrecord`,
    unquoted: the shell expanded it into several words), or None for other extra arguments.

    >>> _expanded_glob(["pretrain", "--data", "docs/model.md", "docs/layout.md"], "Got unexpected extra argument(s) (x)")
    "--data takes one value, and the shell passed it 2 files (docs/model.md docs/layout.md): quote the glob, --data 'docs/*', so that kbert expands it, or join the files with commas"
    """
    if not message.startswith("Got unexpected extra argument"):
        return None
    for i, word in enumerate(argv):
        if not word.startswith("--") or "=" in word or i + 2 >= len(argv):
            continue
        following = list(itertools.takewhile(lambda w: not w.startswith("-"), argv[i + 1 :]))
        if len(following) > 1 and all(os.path.exists(path) for path in following):
            pattern = os.path.commonprefix(following) + "*"
            return (
                f"{word} takes one value, and the shell passed it {len(following)} files ({' '.join(following)}): "
                f"quote the glob, {word} '{pattern}', so that kbert expands it, or join the files with commas"
            )
    return None


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks (or set KBERT_DEBUG=1)."),
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the installed version and exit."
    ),
):
    """Results print as JSON on stdout; progress and logs go to stderr."""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere on the line, so it can be added to a failing command as is.
    debug = "--debug" in argv or os.environ.get("KBERT_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    if debug:
        os.environ["KBERT_DEBUG"] = "1"
    quiet_tensorflow()
    setup_logging(debug)
    record_signalled_stop(None)  # an earlier command's stop, where Python calls main twice
    # TensorFlow is imported by the frame (kbert.cli.frame), once a command's inputs and outputs
    # are checked: a mistake is answered at once, and create-data never imports it.
    try:
        with command_line_names(_flags_of(argv)):  # messages name options as the user types them
            code = app(args=argv, prog_name="kbert", standalone_mode=False)
    except UsageError as e:
        if isinstance(e, NoArgsIsHelpError):  # `kbert convert` alone: its help, as before
            e.show()
            sys.exit(e.exit_code)
        # A mistyped flag or a value out of range is a user error like any other: one line, exit 1.
        command = e.ctx.command_path if e.ctx is not None else "kbert"
        expanded = _expanded_glob(argv, e.format_message())
        if expanded:
            print(f"kbert: error: {expanded}", file=sys.stderr)
            sys.exit(1)
        print(
            f"kbert: error: {first_line(e.format_message(), 300).rstrip('.')}; see `{command} --help`", file=sys.stderr
        )
        sys.exit(1)
    except Abort:
        sys.exit(1)
    except KbertError as e:
        stop = stop_behind(e)
        if stop is not None:  # a signal's stop that a library turned into an error of its own
            _exit_as_stopped(stop)
        if debug:
            raise
        print(f"kbert: error: {e}", file=sys.stderr)
        sys.exit(1)
    except Interrupted as e:
        print(f"kbert: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("kbert: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # a bug, not a user error: still one line unless --debug
        stop = stop_behind(e)
        if stop is not None:  # raised while a signal's stop was unwinding: the stop is what happened
            _exit_as_stopped(stop)
        if debug:
            raise
        if os_error_line(e):  # a full disk, a permission: the path and the cause, which the user can fix
            print(f"kbert: error: {os_error_line(e)}", file=sys.stderr)
            sys.exit(1)
        first = first_line(e, 300) if str(e).strip() else ""
        print(
            f"kbert: unexpected error: {type(e).__name__}: {first} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        sys.exit(2)
    if isinstance(code, int) and code:  # typer's Exit(130) for Ctrl-C, for one
        if code == 130:
            print("kbert: interrupted", file=sys.stderr)
        sys.exit(code)


def _exit_as_stopped(stop: BaseException):
    print(f"kbert: {stop}" if isinstance(stop, Interrupted) else "kbert: interrupted", file=sys.stderr)
    sys.exit(getattr(stop, "exit_code", 130))


if __name__ == "__main__":
    main()
