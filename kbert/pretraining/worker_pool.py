"""create-data's worker processes: chunks made in parallel, handed back in chunk order, and
the peak memory every process used.

Each worker builds one instance builder (`record_kinds.instance_builder`: the vocabulary and
byte tables once) and returns a chunk's records already framed as TFRecords, so the parent only
reads text and writes bytes. A worker imports the kbert script, this module, `instances` (or
`mlm_instances` and `tokenizers`) and `record_encoder`, none of which imports TensorFlow: its
start-up alone was a sixth of the whole command's time on the Debian corpus, and every worker
would pay it again.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import resource
import signal
import sys
from concurrent.futures import ProcessPoolExecutor

from kbert.pretraining.record_kinds import instance_builder
from kbert.runtime.processes import die_with_parent
from kbert.runtime.records import tfrecord_frames

_BUILDER = None  # this process's InstanceBuilder or MlmInstanceBuilder


def _start_worker(vocab_file, do_lower_case, options):
    global _BUILDER
    _BUILDER = instance_builder(vocab_file, do_lower_case, options)


def _start_worker_process(parent_pid, *args):
    # A parent killed with -9 takes its workers along: they would otherwise run on, holding its
    # stdout and stderr open, and a caller waiting for its output would hang.
    die_with_parent(parent_pid)
    # Ctrl-C is the parent's to handle (it stops the pool and removes partial output); a
    # worker would only add a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _start_worker(*args)


def _make_chunk(chunk):
    """(framed records joined, the frames' lengths, counts, (pid, peak RSS in KiB)) of one chunk.

    One bytes object and an array of lengths cross the process boundary much faster than a
    list of a hundred thousand small bytes objects (pickling each costs microseconds).
    """
    index, documents = chunk[:2]
    records, counts = _BUILDER.chunk(index, documents)
    frames, lengths = tfrecord_frames(records)
    return frames, lengths, counts, (os.getpid(), own_peak_kib())


def chunk_results(chunks, workers: int, start_args: tuple):
    """(chunk, *_make_chunk(chunk)) in chunk order, made by `workers` processes.

    At most 2 * workers chunks are in flight, so a corpus larger than memory streams through.
    Workers are spawned, not forked: the parent has TensorFlow loaded, and forking a process
    with TensorFlow's threads running is not safe. (So a script that calls this with
    workers > 1 needs the usual `if __name__ == "__main__":` guard.) A worker that dies
    raises BrokenProcessPool here instead of hanging, as multiprocessing.Pool would.
    """
    if workers == 1:
        _start_worker(*start_args)
        for chunk in chunks:
            yield (chunk, *_make_chunk(chunk))
        return
    context = multiprocessing.get_context("spawn")
    # A run stopped by a signal leaves the pool's semaphores to multiprocessing's resource
    # tracker, which removes them and then warns on stderr after the command's one line. The
    # tracker is a process of its own that takes the parent's -W options: this one silences it.
    quiet_tracker = "ignore:resource_tracker:UserWarning"
    if quiet_tracker not in sys.warnoptions:
        sys.warnoptions.append(quiet_tracker)
    others = set(multiprocessing.active_children())
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker_process, initargs=(os.getpid(), *start_args)
    ) as pool:
        pending = collections.deque()
        try:
            for chunk in chunks:
                pending.append((chunk, pool.submit(_make_chunk, chunk)))
                if len(pending) >= 2 * workers:
                    chunk_done, future = pending.popleft()
                    yield (chunk_done, *future.result())
            while pending:
                chunk_done, future = pending.popleft()
                yield (chunk_done, *future.result())
        except BaseException:  # an error, Ctrl-C, or the caller stopped reading
            # Do not make chunks nobody will write: without this, leaving the `with` waits
            # for every chunk already handed to a worker. The stopped workers break the pool,
            # and its manager thread fails every pending future. They are not cancelled first:
            # CPython 3.11's manager thread then dies setting an exception on a cancelled
            # future (InvalidStateError, checked for from 3.12 on), its clean-up never runs,
            # and the resource tracker prints KeyErrors for the queues' semaphores.
            for process in set(multiprocessing.active_children()) - others:
                process.terminate()
            raise


def own_peak_kib() -> int:
    """This process's peak resident memory in KiB: VmHWM where Linux has it, else ru_maxrss.

    ru_maxrss of a spawned process counts the parent's pages from before its exec, so a
    worker of a 600 MB parent would report 600 MB; VmHWM starts afresh at exec.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_rss_mib(worker_peaks: dict) -> dict:
    """Peak resident memory of this process plus each worker's own peak.

    Workers report their own peaks because RUSAGE_CHILDREN gives the largest child of this
    process ever, not a sum (and TensorFlow's import starts a child of its own).
    """
    own = own_peak_kib() / 1024
    workers = [kib / 1024 for pid, kib in worker_peaks.items() if pid != os.getpid()]
    return {
        "peak_rss_mib": round(own + sum(workers), 1),
        "peak_rss_mib_main": round(own, 1),
        "peak_rss_mib_largest_worker": round(max(workers, default=0.0), 1),
    }
