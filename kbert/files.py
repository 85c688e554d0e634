"""Atomic output directories and the checks every file-reading command shares."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid

from kbert.errors import KbertError, on_command_line, option, user_path
from kbert.processes import at_forced_exit

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
    kbert.errors.KbertError: data.gz: not UTF-8 text (512 invalid sequences in its first 1,024 bytes); is it a binary or compressed file? pass text, one sentence per line (gunzip it first)
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
    kbert.errors.KbertError: ...: no space left on device for a huge file (it needs at least 4,194,304 TiB, ... free); free some space there (or choose a path on another disk), then run again
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
    kbert.errors.KbertError: tests/fixtures/*.missing: no file matches; pass text files, or a glob that matches some
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
                raise KbertError(f"{pattern}: no file matches; pass {what}s, or a glob that matches some")
            files += [p for p in matches if p not in files]
    if not files:
        named = f"{option('input')} FILE" if on_command_line() else f"the paths of some {what}s"
        raise KbertError(f"no {what}s given; pass {named}")
    return files
