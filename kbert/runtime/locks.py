"""One writer per output: a lock file beside the output, held with flock and naming its holder.

The lock of `runs/bert` is `runs/.bert.kbert-lock`, beside the output rather than inside it:
atomic_output_dir replaces a whole directory by a rename, which would take a lock inside it
along. The holder keeps an exclusive flock(2) on the file for as long as it writes, and
writes into it who it is: {"pid", "host", "command", "started"}, for the refusal to name.

The kernel drops a flock when its holder ends, even on kill -9, so a lock file whose flock is
free was left by a process that is gone: the next writer takes it over with a one-line notice.
A flock still held on this host by a process id that no longer runs (a forked child kept the
file open) is taken over too.

What holds where: on a local disk, everything above. On NFSv4 Linux turns flock into a lock on
the server, so it holds across machines; a crashed machine's lock is freed when its lease
ends (about 90 s). On file systems whose locks are local to each machine (NFS mounted with
`nolock` or `local_lock=flock|all`, many FUSE mounts) the lock keeps out a second writer on the
same machine only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time

from kbert.runtime.errors import KbertError
from kbert.runtime.processes import at_forced_exit

log = logging.getLogger("kbert")

LOCK_SUFFIX = ".kbert-lock"
# A holder writes who it is right after it takes the flock; a reader that finds the file
# still empty waits this long for the line before it refuses without the holder's name.
HOLDER_WAIT_SECONDS = 2.0
# The locks this process holds: asking again for one of them (a library call inside a command
# that already claimed its output) nests instead of refusing itself.
_HELD_HERE: dict = {}  # lock path -> its open file descriptor


def lock_path(output) -> str:
    """Where the lock of `output` (a directory or a file) lives: a hidden file beside it.

    Example:
    >>> lock_path("/data/runs/bert")
    '/data/runs/.bert.kbert-lock'
    """
    output = os.path.realpath(os.fspath(output))
    return os.path.join(os.path.dirname(output), f".{os.path.basename(output)}{LOCK_SUFFIX}")


def command_line() -> str:
    """This process's command line as typed: 'kbert pretrain --model-dir runs/bert ...'."""
    return shlex.join([os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]])


@contextlib.contextmanager
def output_lock(output, command: str | None = None):
    """Hold the lock of `output` while the block writes it; a second holder is refused.

    Args:
        output: str. The directory (or file) about to be written. Its parent is created if
            missing (and removed again, if still empty, when the lock is released).
        command: str. What the holder is, for a refused writer to read; default: this
            process's command line.

    Raises `KbertError` naming the holder (pid, host, command, start time) if another process
    holds the lock (tests/test_locks.py). Yields the lock file's path. Within one process the
    lock nests: the command's frame takes it, and the library function it calls takes it again.

    Example:
    >>> import os, subprocess, sys, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "model")
    >>> with output_lock(out, "kbert convert from-tf1 tiny model") as lock:
    ...     with output_lock(out) as again:  # this process already holds it
    ...         print(again == lock)
    ...     other = subprocess.run([sys.executable, "-c", "import sys; from kbert.runtime.locks import output_lock; "
    ...                             "output_lock(sys.argv[1]).__enter__()", out], capture_output=True, text=True)
    True
    >>> print(other.stderr.strip().splitlines()[-1])
    kbert.runtime.errors.KbertError: ... is being written by another process (pid ..., command `kbert convert from-tf1 tiny model`, started ...); wait for it to end or stop it, or choose another output
    >>> os.path.exists(lock)
    False
    """
    path = lock_path(output)
    if path in _HELD_HERE:  # the CLI's frame holds it, and the library function it calls asks again
        yield path
        return
    created = _make_parents(os.path.dirname(path))
    try:
        fd = _acquire(path, os.fspath(output))
        _HELD_HERE[path] = fd
        try:
            _write_holder(fd, command or command_line())
            yield path
        finally:
            _HELD_HERE.pop(path, None)
            _release(fd, path)
    finally:
        _remove_if_empty(created)


@at_forced_exit
def _release_held_locks():
    # A stopped command that must exit before its unwinding ends leaves no lock file behind.
    for path, fd in list(_HELD_HERE.items()):
        with contextlib.suppress(OSError):
            _unlink_if_same(fd, path)


def _make_parents(directory: str) -> list:
    """Create `directory` and any missing parents; return those created, deepest first."""
    created = []
    while not os.path.isdir(directory):
        created.append(directory)
        directory = os.path.dirname(directory)
    for d in reversed(created):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        except OSError as e:
            _remove_if_empty(created)
            raise KbertError(f"cannot create {d} ({e.strerror}); choose another output") from None
    return created


def _remove_if_empty(directories):
    # A run that fails before writing leaves no empty folders behind for its output.
    for d in directories:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            continue
        except OSError:  # not empty: something else was written there meanwhile
            return


def _acquire(path: str, output: str) -> int:
    while True:
        fd = _open_lock_file(path, output)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _wait_for_holder(fd)
            if not _ended_here(holder):
                os.close(fd)
                raise KbertError(
                    f"{output} is being written by another process ({describe_holder(holder)}); "
                    f"wait for it to end or stop it, or choose another output"
                ) from None
            log.warning(
                "taking over the lock of %s from a process that is no longer running (%s)",
                output,
                describe_holder(holder),
            )
            _unlink_if_same(fd, path)  # its flock stays with whoever kept the old file open
            os.close(fd)
            continue
        if not _is_same_file(fd, path):  # the holder removed it between our open and flock
            os.close(fd)
            continue
        previous = _read_holder(fd)
        if previous:
            log.warning(
                "taking over the lock of %s left by a process that ended without releasing it (%s)",
                output,
                describe_holder(previous),
            )
        return fd


def _open_lock_file(path: str, output: str) -> int:
    # An unwritable folder is refused before this (kbert.runtime.files.check_writable); what is left
    # is a lock file another user's crashed run left behind.
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise KbertError(
            f"cannot open the lock file {path} ({e.strerror}); if no process writes {output} "
            f"any more, remove it, or choose another output"
        ) from None


def _write_holder(fd: int, command: str):
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)


def _read_holder(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _wait_for_holder(fd: int) -> dict:
    deadline = time.monotonic() + HOLDER_WAIT_SECONDS
    holder = _read_holder(fd)
    while not holder and time.monotonic() < deadline:
        time.sleep(0.05)
        holder = _read_holder(fd)
    return holder


def describe_holder(holder: dict) -> str:
    """The holder of a lock in words, for one-line messages.

    >>> describe_holder({"pid": 4242, "host": "gpu-1", "command": "kbert pretrain --model-dir runs/bert",
    ...                  "started": "2026-11-24 13:05:00 UTC"})
    'pid 4242 on gpu-1, command `kbert pretrain --model-dir runs/bert`, started 2026-11-24 13:05:00 UTC'
    >>> describe_holder({})
    'which has not written its name into the lock file yet'
    """
    if not holder:
        return "which has not written its name into the lock file yet"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, command `{holder.get('command', '?')}`, "
        f"started {holder.get('started', '?')}"
    )


def _ended_here(holder: dict) -> bool:
    """Whether the holder ran on this host and its process is gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


def _is_same_file(fd: int, path: str) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _unlink_if_same(fd: int, path: str):
    if _is_same_file(fd, path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _release(fd: int, path: str):
    # Removed while still held, so a process that opened it meanwhile sees it gone and starts
    # afresh. If it cannot be removed, the next writer finds its flock free and takes it over.
    try:
        with contextlib.suppress(OSError):
            _unlink_if_same(fd, path)
    finally:
        os.close(fd)
