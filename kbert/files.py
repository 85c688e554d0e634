"""Atomic output directories and the checks every file-reading command shares."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid

from kbert.errors import KbertError


def require_path(path, what: str, fix: str):
    """Raise a one-line `KbertError` unless `path` exists."""
    if not os.path.exists(path):
        raise KbertError(f"{path}: no such {what}; {fix}")


def check_output_dir(path: str, overwrite: bool):
    """Refuse a file, or a non-empty directory unless `overwrite`."""
    if os.path.isfile(path):
        raise KbertError(f"{path} is a file; give a directory path for the output")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise KbertError(f"{path} exists and is not empty; pass --overwrite to replace it, "
                         f"or choose a new directory")


@contextlib.contextmanager
def atomic_output_dir(path, overwrite: bool = False):
    """Yield a temporary directory beside `path`; on success it replaces `path` in one rename.

    A failure (or Ctrl-C) removes the temporary directory, so `path` is either the old
    content or the complete new one, never half-written.

    Example:
    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "model")
    >>> with atomic_output_dir(out) as tmp:
    ...     _ = open(os.path.join(tmp, "x.txt"), "w").write("done")
    >>> os.listdir(out)
    ['x.txt']
    """
    path = os.path.abspath(os.fspath(path))
    check_output_dir(path, overwrite)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(path):
        old = f"{path}.old-{uuid.uuid4().hex[:8]}"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)


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
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
