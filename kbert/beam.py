"""What kbert's Apache Beam pipelines share: runner names, Beam's own options, file systems, running a job.

Only the Beam commands import this (`pip install 'kbert[beam]'`); the local paths never do.
"""

from __future__ import annotations

import argparse
import shlex

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from kbert.errors import KbertError, first_line

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner", "PrismRunner")


def open_file(path):
    """A file of any of Beam's file systems (local, gs://, s3://, hdfs://), opened for reading bytes."""
    return FileSystems.open(path, mime_type="application/octet-stream",
                            compression_type=beam.io.filesystem.CompressionTypes.UNCOMPRESSED)


def expand_inputs(patterns) -> list[str]:
    """Files matching each path or glob, through Beam's file systems, in the order given
    (each glob's matches sorted), without repeats."""
    files = []
    for pattern in patterns:
        try:
            matches = FileSystems.match([str(pattern)])[0].metadata_list
        except Exception as e:  # Beam raises BeamIOError for unknown schemes, missing buckets, ...
            raise KbertError(f"{pattern}: cannot list it ({first_line(e)}); check the path") from None
        paths = sorted(m.path for m in matches if m.size_in_bytes is not None)
        if not paths:
            raise KbertError(f"{pattern}: no file matches; pass text files or a glob that matches some")
        files += [p for p in paths if p not in files]
    return files


class _BeamOptionParser(argparse.ArgumentParser):
    def error(self, message):
        raise KbertError(f"--pipeline-options: Beam refuses them ({message}); see Beam's pipeline options")


def pipeline_options(runner: str, flags: str) -> PipelineOptions:
    """Beam's PipelineOptions from `--pipeline-options`, refusing flags no Beam option knows
    (Beam itself only warns and drops them, which hides typos such as --num_workers=)."""
    if runner not in RUNNERS:
        raise KbertError(f"--runner {runner!r}: choose local or one of {', '.join(RUNNERS)}")
    try:
        args = shlex.split(flags or "")
    except ValueError as e:
        raise KbertError(f"--pipeline-options: {e}; quote it as one shell string") from None
    parser = _BeamOptionParser(add_help=False, allow_abbrev=False)
    classes = [PipelineOptions]
    while classes:
        options_class = classes.pop()
        options_class._add_argparse_args(parser)  # how Beam's own PipelineOptions builds its parser
        classes += options_class.__subclasses__()
    _, unknown = parser.parse_known_args(args)
    if unknown:
        raise KbertError(f"--pipeline-options: Beam has no option {unknown[0]}; see Beam's pipeline options")
    return PipelineOptions(args, runner=runner)


def run(pipeline, runner: str):
    """Run `pipeline` to its end; a failed job becomes one line (its first)."""
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except KbertError:
        raise
    except Exception as e:  # the runner's own failure (a worker's error, a cluster refusing the job)
        lines = [line for line in str(e).splitlines() if line.strip() and not line.startswith(" ")]
        # A worker's error arrives as its whole traceback: its last line says what went wrong.
        cause = lines[-1] if lines and lines[0].startswith("Traceback") else first_line(e)
        raise KbertError(f"the {runner} job failed: {cause[:300]}") from None
    return result
