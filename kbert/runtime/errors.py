"""The one exception type for user errors: the CLI prints its message as one line and exits 1."""

import contextlib
import re


class KbertError(Exception):
    """A problem with the user's input (a path, a file, a flag) that they can fix.

    The message is one line that says what is wrong and how to fix it.
    """


class Interrupted(Exception):
    """A run stopped by SIGTERM or SIGINT after saving what it needs to resume.

    The CLI prints the message as one line and exits with `exit_code` (128 + the signal).
    """

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


# The stop a signal raised in this command (`kbert.runtime.processes.stop_cleanly` records it),
# or None. A signal's exception can land in library code that catches it and raises an error of
# its own without the chain back to it (gRPC, serializing a request): the record still tells.
_signalled_stop = None


def record_signalled_stop(stop: BaseException | None):
    """Remember the stop a signal handler is raising (None: a new command starts, none yet)."""
    global _signalled_stop
    _signalled_stop = stop


def signalled_stop() -> BaseException | None:
    """The stop a signal raised in the running command, or None."""
    return _signalled_stop


def stop_behind(error: BaseException) -> BaseException | None:
    """The stop (`Interrupted`, `KeyboardInterrupt`) that `error` was raised while handling, or
    that a signal raised in this command, or None. A signal's exception can land inside library
    code, whose own clean-up then fails with an error of its own (a thread being started, when it
    lands in `Thread.start`; a request being serialized, in gRPC): the run was still stopped by
    the signal, and says so.

    >>> try:
    ...     try:
    ...         raise Interrupted("kbert predict stopped by SIGTERM", 143)
    ...     except Interrupted:
    ...         raise KeyError("a thread's clean-up")
    ... except KeyError as e:
    ...     stop_behind(e).exit_code
    143
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (Interrupted, KeyboardInterrupt)):
            return error
        seen.add(id(error))
        error = error.__context__
    return _signalled_stop


# The options of the `kbert` command that is running (kbert.cli.main sets them for the command's
# length), or None when Python code called kbert: a message names an option as the user typed
# it, `--max-seq-length 128`, or as the argument the caller passed, `max_seq_length=128`.
_command_flags = None


@contextlib.contextmanager
def command_line_names(flags):
    """Messages raised inside name options as --flags; `flags`: the running command's own."""
    global _command_flags
    before, _command_flags = _command_flags, frozenset(flags)
    try:
        yield
    finally:
        _command_flags = before


def on_command_line() -> bool:
    """Whether the `kbert` command is running, not Python code that called kbert: for the words
    around an option (`run the same command with --resume`, `call it again with resume=True`).

    >>> on_command_line()
    False
    >>> with command_line_names({"--resume"}):
    ...     on_command_line()
    True
    """
    return _command_flags is not None


_NO_VALUE = object()


def option(name: str, value=_NO_VALUE, flag: str | None = None, command: str | None = None) -> str:
    """An option as a message names it: `--max-seq-length 128` when the `kbert` command runs,
    `max_seq_length=128` when Python code called the function.

    Args:
        name: str. The Python argument's name.
        value: the value to show with it, if any; True for a flag that takes none (`--overwrite`,
            `overwrite=True`).
        flag: str. The command line's flag where it is not the name with hyphens (`--lowercase`
            for `do_lower_case`).
        command: str. The command that has the flag, for a message that other commands share:
            they name it whole (`kbert convert from-tf1 --lowercase`), as they have no such flag.

    >>> option("max_seq_length", 600), option("overwrite", True), option("max_seq_length")
    ('max_seq_length=600', 'overwrite=True', 'max_seq_length')
    >>> with command_line_names({"--max-seq-length", "--overwrite"}):
    ...     option("max_seq_length", 600), option("overwrite", True), option("lowercase", command="convert from-tf1")
    ('--max-seq-length 600', '--overwrite', '`kbert convert from-tf1 --lowercase`')
    """
    if _command_flags is not None:
        flag = flag or "--" + name.replace("_", "-")
        said = flag if value is _NO_VALUE or value is True else f"{flag} {value}"
        if command and flag.split("/")[0] not in _command_flags:
            return f"`kbert {command} {said}`"
        return said
    if value is _NO_VALUE:
        return name
    return f"{name}={value!r}"


def plural(n: int, word: str) -> str:
    """'1 weight', '2 weights': for messages.

    >>> plural(1, "weight"), plural(3, "weight")
    ('1 weight', '3 weights')
    """
    return f"{n} {word}{'' if n == 1 else 's'}"


def listing(names, limit: int = 8) -> str:
    """Sorted names, the first `limit` of them, then 'and N more': for one-line errors.

    >>> listing(["c", "a", "b"], limit=2)
    'a, b and 1 more'
    """
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def first_line(error: BaseException, limit: int = 200) -> str:
    """An exception's first line, cut to `limit` characters (its type name if it has no text):
    what a one-line error message quotes from a library's multi-line one.

    >>> first_line(ValueError("shape mismatch\\nlong details..."))
    'shape mismatch'
    >>> first_line(KeyError())
    'KeyError'
    """
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def op_error_text(error) -> str:
    """A TensorFlow op error's own words, whole: its first line without the `{{function_node ...}}`
    prefix and `[Op:...]` suffix that tf.function adds (which left no room for the words themselves).

    >>> op_error_text(ValueError("{{function_node __wrapped__IteratorGetNext}} corrupted record at 0 [Op:IteratorGetNext]"))
    'corrupted record at 0'
    """
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first_line(error, limit=1000))
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or type(error).__name__


# What the operating system's failures mean to a user, and what to do about each: a full disk or a
# permission is not a bug of kbert's nor a damaged file, and the path it happened at is what to fix.
_OS_CAUSES = {
    "ENOSPC": ("no space left on device", "free some space there (or choose a path on another disk), then run again"),
    "EDQUOT": ("disk quota exceeded", "free some space there (or choose a path on another disk), then run again"),
    "EACCES": ("permission denied", "give this user access to it (chmod, chown), or choose another path"),
    "EPERM": ("operation not permitted", "give this user access to it (chmod, chown), or choose another path"),
    "EROFS": ("read-only file system", "choose a path on a writable file system"),
    "EIO": ("input/output error", "the disk or network file system failed: check it, then run again"),
    "EMFILE": ("too many open files", "raise the limit (ulimit -n), then run again"),
    "ENFILE": ("too many open files in the system", "close other programs' files, then run again"),
    "ENAMETOOLONG": ("file name too long", "choose a shorter path"),
}


def os_error_line(error: BaseException) -> str | None:
    """`PATH: CAUSE; FIX` for an operating-system failure (see `os_error_parts`); None for any other error.

    >>> os_error_line(OSError(28, "No space left on device", "out/model.weights.h5"))
    'out/model.weights.h5: no space left on device; free some space there (or choose a path on another disk), then run again'
    >>> os_error_line(ValueError("shapes differ")) is None
    True
    """
    parts = os_error_parts(error)
    return f"{parts[0]}: {parts[1]}; {parts[2]}" if parts else None


def os_error_parts(error: BaseException, writing=None) -> tuple | None:
    """(path, cause, fix) of an operating-system failure (a full disk, a permission, a read-only
    file system) raised by Python, h5py or TensorFlow (whose SaveV2 and readers say it in words);
    None for any other error.

    Temporary names that writers build under (TensorFlow's `ckpt-8_temp/...tempstate123`,
    kbert's `.model.tmp-PID-...`) are given as the path the user named. An error that names no
    path is put on `writing` (what the command writes) if only a write can meet it (a full disk,
    a quota, a read-only file system).

    >>> os_error_parts(RuntimeError("run/checkpoints/ckpt-8_temp/part-00000-of-00001.data-00000-of-00001.tempstate42; Permission denied"))
    ('run/checkpoints', 'permission denied', 'give this user access to it (chmod, chown), or choose another path')
    >>> os_error_parts(OSError(13, "Unable to synchronously open file (unable to open file: name = 'm/.model.tmp-12-0123abcd/model.weights.h5', errno = 13)"))
    ('m/model', 'permission denied', 'give this user access to it (chmod, chown), or choose another path')
    """
    import errno as errno_names
    import os

    if isinstance(error, OSError) and error.errno in errno_names.errorcode:
        name, path = errno_names.errorcode[error.errno], error.filename
    else:
        name, path = None, None
    text = str(error)
    if name is None or path is None:
        # h5py: "... (unable to open file: name = 'PATH', errno = 13, ...)"; TensorFlow: "PATH; Permission denied".
        if name is None:
            for code, number in vars(errno_names).items():
                if code in _OS_CAUSES and isinstance(number, int) and os.strerror(number) in text:
                    name = code
                    break
            match = re.search(r"errno = (\d+)", text)
            if match and int(match.group(1)) in errno_names.errorcode:
                name = errno_names.errorcode[int(match.group(1))]
        if name is not None and path is None:
            match = re.search(r"name = '([^']+)'", text) or re.search(
                r"([^\s;{}()\[\]'\"]+)\s*;\s*" + re.escape(os.strerror(getattr(errno_names, name))), text
            )
            path = match.group(1) if match else None
    if path is None and writing and name in ("ENOSPC", "EDQUOT", "EROFS"):
        path = writing
    if name not in _OS_CAUSES or path is None:
        return None
    cause, fix = _OS_CAUSES[name]
    return user_path(os.fspath(path)), cause, fix


def user_path(path: str) -> str:
    """The path a user named, for a writer's temporary one (see os_error_parts).

    >>> user_path("out/.model.tmp-12-0123abcd"), user_path("run/checkpoints/ckpt-8_temp/part-0.tempstate7")
    ('out/model', 'run/checkpoints')
    """
    import os

    path = re.sub(r"\.tempstate\d+$", "", path)
    parts = path.split(os.sep)
    for i, part in enumerate(parts):
        if part.endswith("_temp") and i:  # TensorFlow's checkpoint shards, before their rename
            return os.sep.join(parts[:i]) or os.sep
        match = re.fullmatch(r"\.(.+)\.tmp-\d+-[0-9a-f]{8}|\.tmp-(.+)|\.(.+)\.tmp", part)
        if match:  # kbert.runtime.files.temporary_name's, and model_dir.write_model_files'
            parts[i] = next(g for g in match.groups() if g)
            return os.sep.join(parts[: i + 1])
    return path


def os_error_or(error: BaseException, message: str) -> "KbertError":
    """`KbertError(message)`, unless `error` is the operating system's (permission denied, a full
    disk): then `os_error_line`'s line, so that an unreadable file is not called damaged.

    >>> str(os_error_or(PermissionError(13, "Permission denied", "m/model.weights.h5"), "m: the file is damaged"))
    'm/model.weights.h5: permission denied; give this user access to it (chmod, chown), or choose another path'
    >>> str(os_error_or(ValueError("bad magic"), "m: the file is damaged"))
    'm: the file is damaged'
    """
    return KbertError(os_error_line(error) or message)
