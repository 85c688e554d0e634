"""What a command does around its work so that a stop is clean: SIGTERM becomes an exception
that unwinds like Ctrl-C (so every `finally` removes its temporaries), and the processes it
started end with it, even when it is killed with -9.

Example:
>>> with stop_cleanly("create-data"):
...     pass
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

from kbert.runtime.errors import Interrupted, record_signalled_stop, signalled_stop

_PR_SET_PDEATHSIG = 1
# How long a command has to unwind after SIGTERM before it exits regardless (its workers die
# with it: `die_with_parent`).
STOP_SECONDS = 10.0
# What must go before a stopped command exits without finishing its unwinding: its
# temporaries and its locks (`kbert.runtime.files`, `kbert.runtime.locks` register them), so that what it
# prints on the way out stays true.
_AT_FORCED_EXIT: list = []


def at_forced_exit(callback):
    """Call `callback()` if a stopped command has to exit before its unwinding ends.

    >>> @at_forced_exit
    ... def remove_scratch():
    ...     pass
    >>> remove_scratch in _AT_FORCED_EXIT
    True
    >>> _AT_FORCED_EXIT.remove(remove_scratch)
    """
    _AT_FORCED_EXIT.append(callback)
    return callback


def _run_forced_exit_callbacks():
    for callback in list(_AT_FORCED_EXIT):
        with contextlib.suppress(Exception):
            callback()


def die_with_parent(parent_pid: int):
    """In a child process: be killed by the kernel when `parent_pid` ends, however it ends.

    Without it, the workers of a parent killed with -9 run on and keep its stdout and stderr
    open, so the shell or script waiting on the parent's output hangs. Linux only; elsewhere
    the parent's clean stop still ends its workers.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the line above: nobody waits for us
        os._exit(1)


def child_processes(pid: int | None = None) -> set:
    """The pids of `pid`'s descendants (default: this process's), from /proc."""
    pid = os.getpid() if pid is None else pid
    parents = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # The name is in parentheses and may hold spaces: the fields after its last ')'.
            fields = stat[stat.rindex(b")") + 2 :].split()
            parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def stop_processes(pids, grace_seconds: float = 5.0):
    """SIGTERM each of `pids`, then SIGKILL those still running after `grace_seconds`, and reap
    the ones that are this process's children."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    waiting = set(pids)
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            if not _runs(pid):
                waiting.discard(pid)
        time.sleep(0.05)
    for pid in waiting:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _runs(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child, now reaped
            return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class _Terminated(Interrupted):
    pass


# How soon a swallowed stop's signal is sent again: time for Python to leave what swallowed it.
RESEND_SECONDS = 0.05


def _signalled(stop: BaseException, number: int) -> BaseException:
    """`stop`, recorded as the one signal `number` raised, with what its landing in the wrong
    place would do undone:

    - where Python swallows it (a garbage-collector callback, a finalizer: "Exception ignored
      in ..."), the command would run on as if no signal had come, so the signal is sent again;
    - where it lands in `Thread.start`, the thread it was starting fails on its first line, and
      Python would print that thread's traceback: it is not printed.
    """
    if signalled_stop() is None:
        record_signalled_stop(stop)
        previous_hook = sys.unraisablehook

        def quiet_while_stopping(unraisable):
            if signalled_stop() is None:  # a later command in this process: as before
                previous_hook(unraisable)
            elif isinstance(unraisable.exc_value, type(signalled_stop())):
                # Sent again from beside: raised here, it would only be swallowed again.
                again = threading.Timer(RESEND_SECONDS, os.kill, (os.getpid(), number))
                again.daemon = True
                again.start()

        sys.unraisablehook = quiet_while_stopping
    return stop


@contextlib.contextmanager
def stop_cleanly(command: str):
    """Run a command's work so that SIGTERM stops it as Ctrl-C does, and every process it
    started (and their children) is stopped and reaped when it ends, whichever way.

    SIGTERM raises `Interrupted` (exit status 143) in the main thread, so the `finally` and
    `except BaseException` blocks that remove temporary files run; SIGINT raises
    `KeyboardInterrupt` as before. Either is recorded (`kbert.runtime.errors.signalled_stop`), so
    the command ends as stopped even where a library turns the exception into one of its own.
    Training loops install their own handlers inside (they save a checkpoint first) and put
    these back after.
    """
    before = child_processes()
    previous = None
    in_main_thread = threading.current_thread() is threading.main_thread()

    message = f"{command} stopped by SIGTERM; its partial outputs were removed, nothing was written"
    deadline = []

    def force_exit(number):
        # The unwinding did not end in time (a process pool's shutdown can hang once its
        # workers are stopped, and a loaded machine is slow): remove what it had yet to
        # remove, then exit.
        _run_forced_exit_callbacks()
        print(f"kbert: {message}", file=sys.stderr, flush=True)
        os._exit(128 + number)

    def on_sigterm(number, frame):
        if not deadline:
            deadline.append(threading.Timer(STOP_SECONDS, force_exit, (number,)))
            deadline[0].daemon = True
            deadline[0].start()
        raise _signalled(_Terminated(message, exit_code=128 + number), number)

    def on_sigint(number, frame):
        raise _signalled(KeyboardInterrupt(), number)

    record_signalled_stop(None)
    previous_sigint = None
    if in_main_thread:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
            previous_sigint = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        if deadline:
            deadline[0].cancel()
            # The unwinding is over and the caller prints the message; but the interpreter's
            # own shutdown (joining a broken process pool's threads) can still hang: exit then.
            guard = threading.Timer(STOP_SECONDS, os._exit, (deadline[0].args[0] + 128,))
            guard.daemon = True
            guard.start()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
            if previous_sigint is not None:
                signal.signal(signal.SIGINT, previous_sigint)
        started = child_processes() - before
        if started:
            stop_processes(started)
        sys.stderr.flush()
