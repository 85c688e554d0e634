"""Before a command writes: its output apart from its inputs, writable, and locked for it alone.

Every writing command calls these before its work, so a mistake costs one line at once: never
an input replaced by the output, nor an hour of work lost to a directory it cannot write.
"""

from __future__ import annotations

import contextlib
import os
import stat

from kbert.errors import KbertError
from kbert.locks import output_lock


def check_apart(output, inputs, replaces: bool = True):
    """Refuse an output that is an input or lies inside one; and one that holds an input when
    it is `replaces`d as a whole (atomic_output_dir renames a new directory over it).

    Args:
        output: str. The file or directory to write.
        inputs: list of str. The files and directories the command reads (None is skipped).
        replaces: bool. False for a directory written in place (pretrain's --model-dir, an
            export base), whose inputs may sit inside it.

    Example:
    >>> check_apart("out/mrpc", ["data/train.tsv", "models/base", None])
    >>> check_apart("models/base", ["models/base"])
    Traceback (most recent call last):
    kbert.errors.KbertError: models/base: the output is also an input; writing it would replace what is being read: choose another output
    >>> check_apart("models/base/tf1", ["models/base"])
    Traceback (most recent call last):
    kbert.errors.KbertError: models/base/tf1: the output lies inside the input models/base; choose an output outside it
    >>> check_apart("models", ["models/base"])
    Traceback (most recent call last):
    kbert.errors.KbertError: models: the output holds the input models/base and is replaced whole; choose an output that does not contain the inputs
    >>> check_apart("runs/bert", ["runs/bert/data.tfrecord"], replaces=False)
    """
    if is_url(output):
        return
    real_output = os.path.realpath(os.fspath(output))
    for given in inputs:
        if given is None or is_url(given):
            continue
        real_input = os.path.realpath(os.fspath(given))
        if real_output == real_input:
            raise KbertError(
                f"{output}: the output is also an input; writing it would replace what is being "
                f"read: choose another output"
            )
        if _is_inside(real_output, real_input):
            raise KbertError(f"{output}: the output lies inside the input {given}; choose an output outside it")
        if replaces and _is_inside(real_input, real_output):
            raise KbertError(
                f"{output}: the output holds the input {given} and is replaced whole; choose an "
                f"output that does not contain the inputs"
            )


def is_url(path) -> bool:
    """Whether `path` names a file of a remote file system (gs://, s3://, hdfs://: Beam's),
    which has no local directory to check or lock.

    >>> is_url("gs://bucket/data.tfrecord"), is_url("data/train.tsv")
    (True, False)
    """
    return "://" in os.fspath(path)


def is_stream(path) -> bool:
    """Whether an output path names a stream rather than a file: `-` (stdout), a path under /dev
    or /proc/self/fd (`/dev/stdout`, whatever the shell connected it to: a terminal, a pipe, or a
    file by `>`), or an existing character device or pipe elsewhere (a named pipe). A stream is
    written as it goes, with no temporary file, rename or lock.

    >>> is_stream("-"), is_stream("/dev/stdout"), is_stream("out/predictions.jsonl")
    (True, True, False)
    """
    path = os.fspath(path)
    if path == "-" or path.startswith(("/dev/", "/proc/self/fd/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _is_inside(path: str, folder: str) -> bool:
    return path != folder and os.path.commonpath([path, folder]) == folder


def check_writable(output, in_place: bool = False):
    """Refuse an output this process cannot write, naming the directory that stops it.

    Checked with access(2), so nothing is touched: the directory the output is made in (its
    nearest existing ancestor), and with `in_place` the output directory itself if it exists.

    Example:
    >>> import tempfile
    >>> check_writable(os.path.join(tempfile.mkdtemp(), "new", "model"))
    >>> check_writable("/proc/version/model")
    Traceback (most recent call last):
    kbert.errors.KbertError: /proc/version is a file, so /proc/version/model cannot be written under it; choose another output
    """
    if is_url(output):
        return
    real = os.path.realpath(os.fspath(output))
    directories = [_nearest_existing(os.path.dirname(real))]
    if in_place and os.path.isdir(real):
        directories.append(real)
    for directory in directories:
        if not os.path.isdir(directory):
            raise KbertError(f"{directory} is a file, so {output} cannot be written under it; choose another output")
        # access(2) with the real ids asks the kernel, which also counts capabilities (root's
        # DAC override), ACLs and read-only mounts.
        if not os.access(directory, os.W_OK | os.X_OK):
            raise KbertError(
                f"cannot write to {directory} (permission denied, or a read-only file system); "
                f"make it writable, or choose another output"
            )


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


@contextlib.contextmanager
def claim_output(output, inputs=(), in_place: bool = False, command: str | None = None):
    """Claim `output` for this process before any work: apart from `inputs`, writable, locked.

    What the writing commands (pretrain, finetune, export, create-data, convert) call first.

    Args:
        output: str. The directory or file the command writes.
        inputs: list of str. What it reads (see `check_apart`).
        in_place: bool. Whether `output` is a directory written in place (pretrain's
            --model-dir, an export base) rather than replaced whole.
        command: str. The holder's command for the lock; default: this process's command line.

    Example:
    >>> import tempfile
    >>> from kbert.locks import lock_path
    >>> out = os.path.join(tempfile.mkdtemp(), "tiny")
    >>> with claim_output(out, inputs=["tests/fixtures/tf1-tiny"]):
    ...     os.path.exists(lock_path(out))
    True
    >>> os.path.exists(lock_path(out))
    False
    """
    check_apart(output, inputs, replaces=not in_place)
    check_writable(output, in_place=in_place)
    # Beam's remote file systems (gs://, ...) have no flock: outputs there are not locked.
    with contextlib.nullcontext() if is_url(output) else output_lock(output, command):
        yield


def writes(output: str, inputs: tuple = (), in_place: bool = False):
    """Give a library function that writes a path the checks and the lock the CLI's frame gives a
    command: its output apart from its inputs, writable, and locked while it runs. Called
    inside a command, whose frame already holds the lock, the lock nests.

    Args:
        output: str. The name of the parameter that holds the path written.
        inputs: tuple of str. The names of parameters that hold paths read (others are skipped).
        in_place: bool. Whether the output is a directory written in place (see `claim_output`).

    Example:
    >>> @writes("out", inputs=("source",))
    ... def copy(source, out):
    ...     open(out, "w").write(open(source).read())
    >>> copy("README.md", "README.md")
    Traceback (most recent call last):
    kbert.errors.KbertError: README.md: the output is also an input; writing it would replace what is being read: choose another output
    """
    import functools
    import inspect

    def wrap(function):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def run(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            paths = [bound.arguments[name] for name in inputs]
            paths = [p for p in paths if isinstance(p, (str, os.PathLike))]
            target = bound.arguments[output]
            if isinstance(target, (str, os.PathLike)) and is_stream(target):
                return function(*args, **kwargs)  # a stream is written as it goes: nothing to claim or lock
            with claim_output(target, inputs=paths, in_place=in_place):
                return function(*args, **kwargs)

        return run

    return wrap
