"""SIGTERM and SIGINT during training: finish the step in flight, save, say how to go on.

Preemptible machines (spot GPUs, preemptible TPUs) get SIGTERM with seconds to spare, and
people press Ctrl-C. While `StopSignals` is active, the first of either signal only records a
request; the training loop looks at it between steps, saves a checkpoint at the step reached
and raises `Interrupted`, which the CLI prints as one line and turns into the exit status a
shell expects (128 + the signal: 143 for SIGTERM, 130 for SIGINT). A second signal means "now":
the process exits at once. The checkpoint being written then is left unfinished, but the last
good one is intact: TensorFlow writes a checkpoint under temporary names and records it as the
latest only once it is complete.

Example:
>>> with StopSignals() as signals:
...     for step in range(3):
...         if signals.requested:
...             break
>>> signals.requested is None
True
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from kbert.runtime.errors import Interrupted

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _SignalHandlers:
    """Installs `_handle` for SIGTERM and SIGINT on entering, from the main thread only (where
    Python can install handlers), and can put the previous ones back."""

    def __enter__(self):
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def _restore(self):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}


def _say(message: str):
    print(f"kbert: {message}", file=sys.stderr, flush=True)  # at once: the process may end next


def _say_first(number: int, doing: str):
    """What a first signal gets: what the run does now, and how to stop it at once."""
    _say(f"{signal.Signals(number).name} received{doing} (send it again to stop at once)")


def _stop_now(number: int, message: str):
    _say(f"second {signal.Signals(number).name}: {message}")
    os._exit(128 + number)  # not sys.exit: it would run TensorFlow's teardown mid-write


class StopSignals(_SignalHandlers):
    """A context in which SIGTERM and SIGINT ask the training loop to stop at the next step.

    `requested` is the signal number received first, or None. Outside the main thread (where
    Python cannot install handlers) it does nothing and `requested` stays None.
    """

    def __init__(self, second_signal_message: str = "stopped at once; the last saved checkpoint is intact"):
        self.requested = None
        self.second_signal_message = second_signal_message

    def __exit__(self, *exc):
        # After a stop request the handlers stay: a second signal while the run saves its last
        # files or exits still means "now", not a traceback from the default handler.
        if self.requested is None:
            self._restore()
        self._previous = {}
        return False

    def _handle(self, number, frame):
        if self.requested is None:
            self.requested = number
            _say_first(number, ": saving a checkpoint after the step in flight")
            return
        _stop_now(number, self.second_signal_message)

    def interrupted(self, step: int, what: str, resume: str) -> Interrupted:
        """The exception to raise once the checkpoint at `step` is saved."""
        return Interrupted(
            f"interrupted at step {step}: {what}; continue with {resume}",
            exit_code=128 + int(self.requested or signal.SIGTERM),
        )


class FinishingSignals(_SignalHandlers):
    """A context for the end of a run whose training is done: SIGTERM and SIGINT no longer stop it.

    Training has ended and its last checkpoint is saved; what is left is writing the output and
    clearing the run's own files. A first signal now is said and waited out (the output comes
    whole, and the run ends as a finished one, exit 0); a second one still means "now". On leaving,
    the handlers that were there before are back, and a signal that came is said to have come
    after the end. Outside the main thread it does nothing.

    Example:
    >>> with FinishingSignals("out/model") as finishing:
    ...     pass  # write out/model
    >>> finishing.received is None
    True
    """

    def __init__(self, output: str):
        self.output = output
        self.received = None

    def __exit__(self, error_type, *exc):
        self._restore()
        if self.received is not None and error_type is None:
            _say(
                f"{self.output} is complete: the run had finished training when "
                f"{signal.Signals(self.received).name} came"
            )
        return False

    def _handle(self, number, frame):
        if self.received is None:
            self.received = number
            _say_first(number, f" after training ended: writing {self.output} first")
            return
        _stop_now(number, f"stopped at once, while writing {self.output}")


def ignore_stops():
    """SIGTERM and SIGINT do nothing from here to the process's exit: what a command calls once its
    work is complete, so that a late Ctrl-C (while it prints its result, or while TensorFlow tears
    down) cannot turn a finished run into exit 130. Ignored signals stay ignored through Python's
    finalization, which puts other handlers back to the default. Outside the main thread it does
    nothing.
    """
    if threading.current_thread() is threading.main_thread():
        for number in SIGNALS:
            signal.signal(number, signal.SIG_IGN)
