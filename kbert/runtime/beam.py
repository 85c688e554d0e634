"""What kbert's Apache Beam pipelines share: runner names, Beam's options and its log, file
systems, writing files without Beam's file sink, running a job.

Only the Beam commands import this (`pip install 'kbert[beam]'`); the local paths never do.

The pipelines use only Beam's portable core (Create, ParDo, GroupByKey, CombineGlobally without
defaults), so that every runner runs them: no metrics, no side inputs, no file sink. Beam's
DaskRunner, for one, has no metrics and evaluates a singleton side input (the set-up of Beam's
file sink) once per consumer, not once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import threading
import uuid

from kbert._compat import add_beam_options
from kbert.runtime import files
from kbert.runtime.errors import Interrupted, KbertError, first_line, on_command_line, option
from kbert.runtime.files import is_url  # re-exported: the Beam pipelines import it from here


def _debug() -> bool:
    return os.environ.get("KBERT_DEBUG") == "1"


@contextlib.contextmanager
def _quiet_logging():
    """Beam's (and Dask's) INFO and WARNING lines off stderr, unless KBERT_DEBUG=1.

    Beam logs its start-up, its workers' harness and its file renames (about 45 lines for a
    two-process DirectRunner run), and importing it logs a warning on the root logger, which
    gives the root logger a handler that prints every library's warnings from then on. A
    NullHandler on the root logger while Beam runs keeps that handler from being made.
    """
    if _debug():
        yield
        return
    root = logging.getLogger()
    null = logging.NullHandler() if not root.handlers else None
    if null:
        root.addHandler(null)
    loggers = [logging.getLogger(name) for name in ("apache_beam", "distributed", "dask")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
        if null:
            root.removeHandler(null)


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 pointed at /dev/null, unless KBERT_DEBUG=1: the DirectRunner's worker
    processes (multi_processing) log to the stderr they inherit, TensorFlow's C++ start-up too.
    A failed job still comes back as an exception, which `run` turns into one line."""
    if _debug():
        yield
        return
    import sys

    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


with _quiet_logging():
    import apache_beam as beam  # noqa: F401 (the pipelines take Beam from here, imported quietly)
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

RUNNERS = (
    "DirectRunner",
    "DaskRunner",
    "DataflowRunner",
    "FlinkRunner",
    "SparkRunner",
    "PortableRunner",
    "PrismRunner",
)
# Beam knows the others by name; the DaskRunner only by its module path.
_RUNNER_PATHS = {"DaskRunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}


def open_file(path):
    """A file of any of Beam's file systems (local, gs://, s3://, hdfs://), opened for reading bytes."""
    return FileSystems.open(path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED)


def create_file(path):
    """A new file of any of Beam's file systems, opened for writing bytes."""
    return FileSystems.create(
        path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
    )


def write_atomically(path: str, write):
    """Write `path` whole or not at all: `write(f)` fills a temporary file beside it, which is
    then renamed to `path` (a retried writer's file replaces an earlier one)."""
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with create_file(temp) as f:
            write(f)
        FileSystems.rename([temp], [path])
    except BaseException:
        remove(temp)
        raise


def remove(path: str):
    """Delete a file, or a folder and all in it, of any of Beam's file systems; nothing if it is gone."""
    if not is_url(path):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
        return
    with contextlib.suppress(Exception):  # Beam raises BeamIOError for a path that is gone
        FileSystems.delete([path])
    with contextlib.suppress(Exception):  # a "folder" of gs:// is its objects: the trailing / deletes them
        FileSystems.delete([path.rstrip("/") + "/"])


def remove_stale(output: str, kinds=("kbert-temp", "beam-temp")):
    """Remove the temporary folders that earlier runs writing `output` left beside it (a killed or
    failed job's): only `KIND-NAME-<32 hex digits>` for this output's NAME, never another output's.
    A live run's folder is safe from it as long as runs on one output are kept apart: the CLI
    locks local outputs (outputs on gs://, s3:// are not locked, as anywhere in kbert)."""
    folder, name = FileSystems.split(output)
    stale = re.compile(f"(?:{'|'.join(kinds)})-{re.escape(name)}-[0-9a-f]{{32}}")
    if not is_url(output):
        for entry in os.listdir(folder) if os.path.isdir(folder) else ():
            if stale.fullmatch(entry):
                remove(os.path.join(folder, entry))
        return
    for kind in kinds:  # gs:// and s3:// have no folders to list: the objects one level inside them
        try:
            found = FileSystems.match([FileSystems.join(folder, f"{kind}-*/*")])[0].metadata_list
        except Exception:  # nothing to list
            continue
        paths = [m.path for m in found if stale.fullmatch(m.path[len(folder) :].lstrip("/").split("/")[0])]
        if paths:
            with contextlib.suppress(Exception):
                FileSystems.delete(paths)


def expand_inputs(patterns) -> list[str]:
    """Input files as the local path names them (`kbert.runtime.files.expand_inputs`: comma-separated
    paths or globs, each glob's matches sorted, a directory refused), local ones absolute, as
    workers need them; paths and globs of Beam's remote file systems matched by Beam."""
    found = []
    for pattern in files.expand_inputs(patterns):
        if not is_url(pattern):
            paths = [os.path.abspath(pattern)]
        else:
            try:
                matches = FileSystems.match([pattern])[0].metadata_list
            except Exception as e:  # Beam raises BeamIOError for unknown schemes, missing buckets, ...
                raise KbertError(f"{pattern}: cannot list it ({first_line(e)}); check the path") from None
            paths = sorted(m.path for m in matches if m.size_in_bytes is not None)
            if not paths:
                raise KbertError(f"{pattern}: no file matches; pass text files or a glob that matches some")
        found += [p for p in paths if p not in found]
    return found


def _flags_option() -> str:
    """Beam's flags as the caller gave them: `--pipeline-options` on the command line, `flags` in Python."""
    return option("flags", flag="--pipeline-options")


class _BeamOptionParser(argparse.ArgumentParser):
    def error(self, message):
        raise KbertError(f"{_flags_option()}: Beam refuses them ({message}); see Beam's pipeline options")


def pipeline_options(runner: str, flags: str) -> PipelineOptions:
    """Beam's PipelineOptions from `--pipeline-options`, refusing flags no Beam option knows
    (Beam itself only warns and drops them, which hides typos such as --num_workers=)."""
    if runner not in RUNNERS:
        raise KbertError(f"{option('runner')} {runner!r}: choose local or one of {', '.join(RUNNERS)}")
    if runner == "DaskRunner":
        try:
            import apache_beam.runners.dask.dask_runner  # noqa: F401 (its options, --dask_*)
        except ImportError:
            raise KbertError(
                f"{option('runner', 'DaskRunner')} needs Dask: pip install 'kbert[beam]' (or 'apache-beam[dask]')"
            ) from None
    try:
        args = shlex.split(flags or "")
    except ValueError as e:
        raise KbertError(f"{_flags_option()}: {e}; quote it as one shell string") from None
    parser = _BeamOptionParser(add_help=False, allow_abbrev=False)
    classes = [PipelineOptions]
    while classes:
        options_class = classes.pop()
        add_beam_options(options_class, parser)  # how Beam's own PipelineOptions builds its parser
        classes += options_class.__subclasses__()
    _, unknown = parser.parse_known_args(args)
    if unknown:
        raise KbertError(f"{_flags_option()}: Beam has no option {unknown[0]}; see Beam's pipeline options")
    return PipelineOptions(args, runner=_RUNNER_PATHS.get(runner, runner))


def temp_location(options: PipelineOptions) -> str | None:
    """Beam's --temp_location, if the user gave one."""
    return options.view_as(GoogleCloudOptions).temp_location


def one_task_per_element(options: PipelineOptions, runner: str, elements: int):
    """On Dask, Beam's Create makes one task of up to 128 elements (its default partition size), so
    a job of fewer chunks or files would run on one worker: one partition per element, unless
    the user chose (--dask_npartitions, --dask_partition_size)."""
    if runner != "DaskRunner":
        return
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if dask.npartitions is None and dask.partition_size is None:
        dask.npartitions = max(1, elements)


class _StopSignals:
    """SIGINT and SIGTERM while a job runs: each raises in the main thread, as on the local path
    (KeyboardInterrupt, exit 130; `Interrupted`, exit 143), and is remembered, since a runner
    may catch what a signal raises and run on, or fail the job with its own error: `check`
    raises it again once the runner is back."""

    def __init__(self, runner: str):
        self.received, self._previous, self.runner = None, {}, runner

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.getsignal(number)
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}
        return False

    def _handle(self, number, frame):
        self.received = self.received or number
        self.check()

    def check(self):
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is not None:
            raise Interrupted(
                f"the {self.runner} job stopped by SIGTERM; its partial outputs were removed, nothing was written",
                exit_code=128 + self.received,
            )


def run(pipeline, runner: str):
    """Run `pipeline` to its end; a failed job becomes one line (its first). Beam's own log is
    shown only with KBERT_DEBUG=1 (`kbert --debug`)."""
    result = None
    signals = _StopSignals(runner)
    try:
        with signals, _quiet_logging(), _quiet_stderr():
            result = pipeline.run()
            result.wait_until_finish()
        signals.check()  # a runner that swallowed the signal's exception and ran on
    except KbertError:
        raise
    except (KeyboardInterrupt, Interrupted) as e:
        with contextlib.suppress(Exception):  # a job on a cluster (Dask's) would go on without us
            result is not None and result.cancel()
        signals.check()
        raise e from None
    except Exception as e:  # the runner's own failure (a worker's error, a cluster refusing the job)
        signals.check()  # a signal that reached the workers too, which failed the job
        lines = [line for line in str(e).splitlines() if line.strip() and not line.startswith(" ")]
        # A worker's error arrives as its whole traceback: its last line says what went wrong.
        cause = lines[-1] if lines and lines[0].startswith("Traceback") else first_line(e)
        # --debug sets KBERT_DEBUG=1, which is what Python callers set for the same log.
        rerun = "--debug" if on_command_line() else "KBERT_DEBUG=1 in the environment"
        hint = "" if _debug() else f" (rerun with {rerun} for Beam's log)"
        raise KbertError(f"the {runner} job failed: {cause[:300]}{hint}") from None
    finally:
        # Beam's DaskRunner leaves its Dask client connected (and a LocalCluster it started, running).
        client = getattr(result, "client", None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    return result
