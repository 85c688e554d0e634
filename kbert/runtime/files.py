"""Atomic output directories and the checks every file-reading command shares.

Outputs: Before a command writes: its output apart from its inputs, writable, and locked for it alone.

Every writing command calls these before its work, so a mistake costs one line at once: never
an input replaced by the output, nor an hour of work lost to a directory it cannot write.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid

from kbert.runtime.errors import KbertError, first_line, on_command_line, option, os_error_or, user_path
from kbert.runtime.locks import output_lock
from kbert.runtime.processes import at_forced_exit

# Every temporary this process named: what a forced exit removes (those renamed into place
# are gone under their temporary name already).
_NAMED_HERE: set = set()


def require_path(path, what: str, fix: str):
    """Raise a one-line `KbertError` unless `path` exists."""
    if not os.path.exists(path):
        raise KbertError(f"{path}: no such {what}; {fix}")


# A file whose decoded text is more than this share invalid UTF-8 is not text: a binary or
# compressed file passed by mistake (real corpora have a few bad bytes, never one in ten; a
# Latin-1 file's accents stay well below it).
MAX_INVALID_SHARE = 0.1
# Nor is one with more than this share of control bytes (NUL, and the C0 codes other than tab,
# newlines, form feed and escape): an executable or a TFRecord file is full of them, and is
# mostly valid UTF-8, since most of its bytes are below 0x80. Text has next to none.
MAX_CONTROL_SHARE = 0.01
CONTROL_BYTES = bytes([*range(0, 9), *range(14, 27), *range(28, 32), 127])
TEXT_CHECK_BYTES = 1 << 16  # readers check after this much of a file, and at its end
# What an unfinished output is called until it is complete: `kbert predict --output FILE`'s rows
# (FILE.partial) and `kbert finetune --output DIR`'s run (DIR.partial/, checkpoints and state).
PARTIAL_SUFFIX = ".partial"


def count_control(data: bytes) -> int:
    """How many of `data`'s bytes are control bytes no text holds (see MAX_CONTROL_SHARE).

    >>> count_control(b"tab\\tand newline\\n"), count_control(b"ELF\\x00\\x00\\x01")
    (0, 3)
    """
    return len(data) - len(data.translate(None, CONTROL_BYTES))


def check_text(path, size: int, invalid: int, control: int = 0):
    """Raise a one-line `KbertError` naming `path` if, of its first `size` bytes, `invalid`
    (invalid UTF-8 sequences) are more than MAX_INVALID_SHARE, or `control` (control bytes)
    more than MAX_CONTROL_SHARE."""
    if size and invalid > MAX_INVALID_SHARE * size:
        raise KbertError(
            f"{path}: not UTF-8 text ({invalid:,} invalid sequences in its first {size:,} bytes); "
            f"is it a binary or compressed file? pass text, one sentence per line (gunzip it first)"
        )
    if size and control > max(MAX_CONTROL_SHARE * size, 16):  # a stray \x01 or two is not a binary
        raise KbertError(
            f"{path}: not text ({control:,} control bytes in its first {size:,} bytes); is it a "
            f"binary, TFRecord or compressed file? pass text, one sentence per line"
        )


def check_head_is_text(path, head: bytes):
    r"""`check_text` on the first bytes of a file (a cut multi-byte character at the end is not counted).

    Example:
    >>> check_head_is_text("notes.txt", "plain text, caf\u00e9\n".encode())
    >>> check_head_is_text("data.gz", bytes(range(256)) * 4)
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: data.gz: not UTF-8 text (512 invalid sequences in its first 1,024 bytes); is it a binary or compressed file? pass text, one sentence per line (gunzip it first)
    """
    text = head.decode("utf-8", "surrogateescape")
    invalid = sum(1 for c in text if "\udc80" <= c <= "\udcff")
    check_text(path, len(head), max(0, invalid - 3 if len(head) >= TEXT_CHECK_BYTES else invalid), count_control(head))


def check_output_dir(path: str, overwrite: bool):
    """Refuse a file, or a non-empty directory unless `overwrite`."""
    if os.path.isfile(path):
        raise KbertError(f"{path} is a file; give a directory path for the output")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise KbertError(
            f"{path} exists and is not empty; pass {option('overwrite', True)} to replace it, or choose a new directory"
        )


def umask() -> int:
    """This process's umask, read without changing it (os.umask can only set it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_umask_mode(path, directory: bool):
    """Give `path` the mode a plain mkdir or open would have: mkdtemp and mkstemp make theirs
    0700 and 0600, and a SavedModel TF Serving runs as another user must stay readable."""
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


def temporary_name(path) -> str:
    """The hidden name beside `path` that a writer builds it under, tagged with the writer's
    pid so that a later run can tell a dead writer's leftovers from a live one's.

    >>> temporary_name("out/model").startswith(f"out/.model.tmp-{os.getpid()}-")
    True
    """
    path = os.fspath(path)
    name = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    _NAMED_HERE.add(os.path.abspath(name))
    return name


@at_forced_exit
def _remove_named_temporaries():
    for path in list(_NAMED_HERE):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)


def sweep_stale_temporaries(path) -> list:
    """Remove what writers of `path` that died (kill -9, a lost machine) left beside it: the
    temporaries of `temporary_name` and the old copies `atomic_output_dir` replaces, whose
    pid no longer runs on this host. Returns the paths removed.

    Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkdir(os.path.join(folder, ".model.tmp-999999999-abcd"))
    >>> os.mkdir(os.path.join(folder, f".model.tmp-{os.getpid()}-abcd"))  # this process: alive
    >>> [os.path.basename(p) for p in sweep_stale_temporaries(os.path.join(folder, "model"))]
    ['.model.tmp-999999999-abcd']
    """
    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.dirname(path), os.path.basename(path)
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for entry in entries:
        for kind in ("tmp", "old"):
            prefix = f".{name}.{kind}-"
            if not entry.startswith(prefix):
                continue
            pid = entry[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not _process_runs(int(pid)):
                stale = os.path.join(folder, entry)
                if os.path.isdir(stale) and not os.path.islink(stale):
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(stale)
                removed.append(stale)
    return removed


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


@contextlib.contextmanager
def atomic_output_dir(path, overwrite: bool = False):
    """Yield a temporary directory beside `path`; on success it replaces `path` in one rename.

    A failure (or Ctrl-C) removes the temporary directory, so `path` is either the old
    content or the complete new one, never half-written. The directory gets the mode the
    umask gives (not mkdtemp's 0700), and a dead writer's leftovers are swept first.

    Example:
    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "model")
    >>> with atomic_output_dir(out) as tmp:
    ...     _ = open(os.path.join(tmp, "x.txt"), "w").write("done")
    >>> os.listdir(out), oct(os.stat(out).st_mode & 0o777) == oct(0o777 & ~umask())
    (['x.txt'], True)
    """
    path = os.path.abspath(os.fspath(path))
    check_output_dir(path, overwrite)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    sweep_stale_temporaries(path)
    tmp = temporary_name(path)
    os.mkdir(tmp)
    try:
        give_umask_mode(tmp, directory=True)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(path):
        old = os.path.join(parent, f".{os.path.basename(path)}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)


def check_free_space(path, needed: int, what: str):
    """Raise a one-line `KbertError` if the file system that `path` is (or will be) on has fewer
    than `needed` bytes free for this user.

    >>> check_free_space(".", 1, "a note")
    >>> check_free_space(".", 1 << 62, "a huge file")
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: ...: no space left on device for a huge file (it needs at least 4,194,304 TiB, ... free); free some space there (or choose a path on another disk), then run again
    """
    folder = os.path.abspath(os.fspath(path))
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    status = os.statvfs(folder)
    free = status.f_bavail * status.f_frsize
    if free < needed:
        raise KbertError(
            f"{user_path(folder)}: no space left on device for {what} (it needs at least {_size(needed)}, {_size(free)} "
            f"free); free some space there (or choose a path on another disk), then run again"
        )


def _size(n: int) -> str:
    """'1.5 MiB', in the largest unit under which `n` is at least 1."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.0f} TiB"


# HDF5 keeps a header and an index for each variable beside its values; this is less than it takes.
H5_BYTES_PER_VARIABLE = 1024


def save_weights(model, path):
    """`model.save_weights(path)`, once the disk is known to hold at least the values.

    h5py (HDF5) does not fail cleanly when a disk fills while it writes: it prints errors it
    cannot raise, then crashes the process as it closes the file. So the least the file takes
    (every value, plus HDF5's own bookkeeping) is checked against the free space first.
    """
    check_free_space(path, weights_file_bytes(model), os.path.basename(os.fspath(path)).removeprefix(".tmp-"))
    model.save_weights(path)


def load_weights(model, path, config_name: str):
    """`model.load_weights(path)`, or one line: the file is damaged, or not of the model its
    `config_name` describes."""
    try:
        model.load_weights(path)
    except (ValueError, OSError) as e:
        raise os_error_or(
            e, f"{path}: cannot load ({first_line(e)}); the file is damaged or does not match {config_name}"
        ) from None


def weights_file_bytes(model) -> int:
    """The least a Keras weights file of `model` takes: its values and HDF5's bookkeeping."""
    import numpy as np

    needed = H5_BYTES_PER_VARIABLE * len(model.weights)
    for variable in model.weights:
        dtype = str(getattr(variable.dtype, "name", variable.dtype))
        needed += int(np.prod(variable.shape)) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    return needed


def count_lines(path: str) -> int:
    """Entries in a vocab.txt, counted as tokenization.load_vocab reads them (one per line)."""
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def replace_file(path, write, tmp_name: str | None = None):
    """`write(tmp)` a file beside `path`, then rename it over `path`; a failed write (a full
    disk) leaves no half-written file beside the good one. `tmp_name` is the temporary's path,
    for writers that insist on a suffix (default: `.NAME.tmp` beside `path`).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> replace_file(path, lambda tmp: open(tmp, "w").write("one"))
    >>> open(path).read(), os.listdir(os.path.dirname(path))
    ('one', ['a.txt'])
    """
    path = os.fspath(path)
    tmp = tmp_name or os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path, text: str):
    r"""Write `text` to a temporary file beside `path`, then rename: never a half-written file.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "out.txt")
    >>> atomic_write_text(path, "one\n")
    >>> open(path).read()
    'one\n'
    """
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sweep_stale_temporaries(path)
    temp = temporary_name(path)
    try:
        with open(temp, "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def folder_of_glob(pattern: str, most: int = 3) -> str:
    """What the folder of a glob that matched nothing holds, said in the error line: the names a
    user can write a glob for (create-data's shards end in -00000-of-00004, not in .tfrecord).
    Empty when the folder part is itself a glob.

    Example:
    >>> folder_of_glob("tests/fixtures/tf1-tiny/*.ckpt")
    'tests/fixtures/tf1-tiny/ holds README.md, bert_config.json, bert_model.ckpt.data-00000-of-00001 and 3 more'
    >>> folder_of_glob("no/such/*.txt")
    'no/such/ does not exist'
    """
    import glob

    folder = os.path.dirname(pattern)
    if glob.has_magic(folder):
        return ""
    shown = (folder or ".") + "/" if not folder.endswith("/") else folder
    if not os.path.isdir(folder or "."):
        return f"{shown} does not exist"
    names = sorted(name + "/" * os.path.isdir(os.path.join(folder, name)) for name in os.listdir(folder or "."))
    if not names:
        return f"{shown} is empty"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{shown} holds {', '.join(names[:most])}{more}"


def expand_inputs(patterns, what: str = "text file") -> list[str]:
    """The files a list of --input values names, as create_pretraining_data.py reads them:
    each value is a comma-separated list of paths or globs (quoted or not), expanded in the
    order given, each glob's matches sorted, without repeats. The same files on every runner:
    Beam's paths (gs://, s3://, ...) are kept as they are, for Beam's file systems to expand.

    A pattern that matches nothing, or names a directory, is refused in one line.

    Example:
    >>> expand_inputs(["tests/fixtures/sample_text.txt,tests/fixtures/tf1-tiny/vocab*"])
    ['tests/fixtures/sample_text.txt', 'tests/fixtures/tf1-tiny/vocab.txt']
    >>> expand_inputs(["tests/fixtures/*.missing"])
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: tests/fixtures/*.missing: no file matches; tests/fixtures/ holds README.md, hf-tiny/, model-garden-tfhub/ and 4 more; pass text files, or a glob that matches some
    """
    import glob

    files = []
    for value in patterns:
        for pattern in str(value).split(","):
            if not pattern:
                continue
            if "://" in pattern:
                matches = [pattern]
            elif glob.has_magic(pattern):
                matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            else:
                matches = [pattern]
            for path in matches:
                if "://" not in path and os.path.isdir(path):
                    raise KbertError(
                        f"{path}: is a directory, not a {what}; pass the files in it, e.g. "
                        f"'{os.path.join(path, '*.txt')}'"
                    )
                if "://" not in path and not os.path.exists(path):
                    raise KbertError(f"{path}: no such {what}; check the path")
            if not matches:
                beside = folder_of_glob(pattern)
                raise KbertError(
                    f"{pattern}: no file matches; {beside + '; ' if beside else ''}pass {what}s, or a glob that matches some"
                )
            files += [p for p in matches if p not in files]
    if not files:
        named = f"{option('input')} FILE" if on_command_line() else f"the paths of some {what}s"
        raise KbertError(f"no {what}s given; pass {named}")
    return files


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
    kbert.runtime.errors.KbertError: models/base: the output is also an input; writing it would replace what is being read: choose another output
    >>> check_apart("models/base/tf1", ["models/base"])
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: models/base/tf1: the output lies inside the input models/base; choose an output outside it
    >>> check_apart("models", ["models/base"])
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: models: the output holds the input models/base and is replaced whole; choose an output that does not contain the inputs
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
    kbert.runtime.errors.KbertError: /proc/version is a file, so /proc/version/model cannot be written under it; choose another output
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
    >>> from kbert.runtime.locks import lock_path
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
    kbert.runtime.errors.KbertError: README.md: the output is also an input; writing it would replace what is being read: choose another output
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
