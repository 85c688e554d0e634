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


# A file whose decoded text is more than this share invalid UTF-8 is not text: a binary or
# compressed file passed by mistake (real corpora have a few bad bytes, never one in ten).
MAX_INVALID_SHARE = 0.1
TEXT_CHECK_BYTES = 1 << 16  # readers check after this much of a file, and at its end


def check_text(path, size: int, invalid: int):
    """Raise a one-line `KbertError` naming `path` if `invalid` of its first `size` bytes
    (invalid UTF-8 sequences) are more than MAX_INVALID_SHARE of them."""
    if size and invalid > MAX_INVALID_SHARE * size:
        raise KbertError(f"{path}: not UTF-8 text ({invalid:,} invalid sequences in its first {size:,} bytes); "
                         f"is it a binary or compressed file? pass text, one sentence per line (gunzip it first)")


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
    check_text(path, len(head), max(0, invalid - 3 if len(head) >= TEXT_CHECK_BYTES else invalid))


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
