"""create-data's worker pool stopped in the middle: nothing but the stopping error comes out."""

import multiprocessing
import os
import signal
import threading

import pytest

from conftest import FIXTURES, UNCASED_VOCAB
from kbert.pretraining.instances import DataOptions
from kbert.pretraining.worker_pool import chunk_results


class Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise Stop


def test_a_pool_stopped_while_chunks_wait_leaves_no_thread_error():
    """A signal while the parent waits for a chunk (how SIGTERM reaches create-data) stops the pool.

    Four chunks are in flight and two workers are still starting, so one chunk has not reached
    the workers' queue yet. Cancelling it before stopping the workers made CPython 3.11's pool
    manager thread die with InvalidStateError (it then failed a cancelled future), and the
    resource tracker print KeyErrors: the create-data SIGTERM test saw both now and then.
    """
    with open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    # Seconds of work per chunk, so that none is done when the signal comes: a worker stopped
    # while it sends a chunk's records back leaves the pool's result pipe half-written, and
    # CPython 3.11's pool then waits on it forever. Small chunks (their pickles pass through the
    # pipes at once) made of many passes.
    documents = [lines] * 40
    start_args = (UNCASED_VOCAB, True, DataOptions(dupe_factor=200))
    thread_errors = []
    hook, handler = threading.excepthook, signal.signal(signal.SIGALRM, _raise_stop)
    threading.excepthook = thread_errors.append
    try:
        for _ in range(3):
            before = set(multiprocessing.active_children())
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(Stop):
                for _ in chunk_results(((index, documents) for index in range(8)), 2, start_args):
                    pass
            assert [f"{args.exc_type.__name__}: {args.exc_value}" for args in thread_errors] == []
            assert set(multiprocessing.active_children()) <= before  # the workers are stopped and reaped
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        threading.excepthook = hook
