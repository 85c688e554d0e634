"""`kbert vocab --runner R`: the word counting of `kbert vocab` as an Apache Beam pipeline.

Beam reads the text (splitting files among workers), each worker splits lines into the words
kbert.Tokenizer hands to WordPiece (`vocab_builder.WordTokenizer`), and Beam sums the counts:
the same counts as the local path's, so the same vocabulary. This is how tf.text's own
WordPiece vocabulary generator is built on Beam.

The counts come back to the launcher through files in the pipeline's temp location (Beam's
--temp_location, gs:// say, where workers and launcher both reach; without it a fresh local
folder, which only runners on this machine share), removed when the counts are read or the job
fails. Workers write them without Beam's file sink: the words are keyed by one of COUNT_FILES
files, grouped, and each group is written whole (a temporary file renamed), as create-data's
shards are, so any runner runs it (see kbert.runtime.beam). The job's last step writes how many words it
wrote: a job that succeeded without it wrote somewhere the launcher does not see.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import tempfile
import uuid
import zlib

from kbert.runtime import beam as beam_runtime
from kbert.runtime.beam import FileSystems, beam
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import TEXT_CHECK_BYTES, check_head_is_text
from kbert.text.vocab_builder import WordTokenizer

COUNT_FILES = 16  # the counts' files: up to this many workers write them at once
TOTAL_FILE = "words.json"


class _Words(beam.DoFn):
    def __init__(self, do_lower_case: bool):
        self.do_lower_case = do_lower_case

    def setup(self):
        self.words = WordTokenizer(self.do_lower_case)

    def process(self, line: bytes):
        # Invalid UTF-8 becomes U+FFFD, which the tokenizer's cleaning drops (as the local path).
        yield from self.words.tokenize(line.decode("utf-8", "replace"))


def _count_file(word_count) -> tuple:
    # crc32, not hash(): Python salts str hashes per process, and workers are processes.
    return zlib.crc32(word_count[0].encode("utf-8")) % COUNT_FILES, word_count


class _WriteCounts(beam.DoFn):
    """(n, [(word, count), ...]) -> how many words it wrote, as JSON lines, to `folder`/counts-n.jsonl."""

    def __init__(self, folder: str):
        self.folder = folder

    def process(self, group):
        n, word_counts = group
        written = 0

        def write(f):
            nonlocal written
            for word_count in word_counts:
                f.write(json.dumps(word_count).encode("utf-8") + b"\n")
                written += 1

        beam_runtime.write_atomically(FileSystems.join(self.folder, f"counts-{n:05d}.jsonl"), write)
        yield written


def _write_total(total: int, folder: str):
    beam_runtime.write_atomically(FileSystems.join(folder, TOTAL_FILE), lambda f: f.write(json.dumps(total).encode()))


@contextlib.contextmanager
def _counts_folder(options):
    """A new folder under Beam's --temp_location, or a fresh local one; removed afterwards."""
    base = beam_runtime.temp_location(options)
    if base is None:
        folder = tempfile.mkdtemp(prefix="kbert-vocab-")
    else:
        base = base if beam_runtime.is_url(base) else os.path.abspath(base)
        folder = FileSystems.join(base, f"kbert-vocab-{uuid.uuid4().hex}")
        FileSystems.mkdirs(folder)
    try:
        yield folder
    finally:
        beam_runtime.remove(folder)


def beam_word_counts(
    input_patterns, output=None, do_lower_case: bool = True, runner: str = "DirectRunner", flags: str = ""
) -> collections.Counter:
    """{word: count} over the input, counted by a Beam pipeline on `runner`.

    Args:
        input_patterns: list of str. Paths or globs, comma-separated lists of them (as the local
            path takes them), or paths and globs of Beam's file systems (gs://...).
        output: str or None. The vocab.txt that will be written; the counts do not go beside it
            (kept for callers).
        do_lower_case: bool. Lower-case and strip accents.
        runner: str. One of kbert.runtime.beam.RUNNERS.
        flags: str. Beam's pipeline options as one shell string.

    Example:
    >>> counts = beam_word_counts(["gs://bucket/corpus/*.txt"], runner="DataflowRunner",
    ...                           flags="--project=P --region=R --temp_location=gs://bucket/tmp")  # doctest: +SKIP
    """
    options = beam_runtime.pipeline_options(runner, flags)
    input_files = beam_runtime.expand_inputs(input_patterns)
    for path in input_files:  # a binary or compressed file is refused before the job starts
        with beam_runtime.open_file(path) as f:
            check_head_is_text(path, f.read(TEXT_CHECK_BYTES))
    beam_runtime.one_task_per_element(options, runner, len(input_files))
    counts = collections.Counter()
    with _counts_folder(options) as folder:
        pipeline = beam.Pipeline(options=options)
        written = (
            pipeline
            | "Files" >> beam.Create(input_files)
            | "Lines" >> beam.io.ReadAllFromText(coder=beam.coders.BytesCoder())
            | "Words" >> beam.ParDo(_Words(do_lower_case))
            | "Count" >> beam.combiners.Count.PerElement()
            | "ByFile" >> beam.Map(_count_file)
            | "Group" >> beam.GroupByKey()
            | "Write" >> beam.ParDo(_WriteCounts(folder))
        )
        # The total, 0 for text without words; without defaults, as a default is a side input.
        # One chain to the end: the DaskRunner computes only the last step (and what it needs).
        _ = (
            (written, pipeline | "Zero" >> beam.Create([0]))
            | "All" >> beam.Flatten()
            | "Total" >> beam.CombineGlobally(sum).without_defaults()
            | "WriteTotal" >> beam.Map(_write_total, folder)
        )
        beam_runtime.run(pipeline, runner)
        total_file = FileSystems.join(folder, TOTAL_FILE)
        if not FileSystems.exists(total_file):
            raise KbertError(
                f"the {runner} job wrote its word counts where this machine does not see them "
                f"({folder}); add --temp_location=DIR to {option('flags', flag='--pipeline-options')}, with a DIR "
                "both reach (gs://..., a shared disk)"
            )
        with beam_runtime.open_file(total_file) as f:
            total = json.load(f)
        for match in FileSystems.match([FileSystems.join(folder, "counts-*.jsonl")])[0].metadata_list:
            with beam_runtime.open_file(match.path) as f:
                for line in f:
                    word, count = json.loads(line)
                    counts[word] += count
    if len(counts) != total:
        raise KbertError(f"the {runner} job wrote {total:,} words but {len(counts):,} were read back; run it again")
    if not counts:
        raise KbertError(f"{', '.join(input_files)}: no words to learn from; pass text files")
    return counts
