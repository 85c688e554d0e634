"""`kbert create-data --runner R`: create_pretraining_data.py's algorithm as an Apache Beam pipeline.

The same chunks as the local path, made by any Beam runner (DirectRunner and DaskRunner here;
Dataflow, Flink, Spark, Prism where the user has them). The pipeline uses only Beam's portable
core (Create, ParDo, GroupByKey, CombineGlobally without defaults): no metrics, no side inputs,
no file sink, which some runners lack (Dask's has no metrics and evaluates a singleton side
input once per consumer).

1. The launcher reads the input once, as the local path does, and plans the chunks: chunk k
   is a list of byte ranges [(file, start, end), ...] (`create_data.read_chunks`). Chunk
   boundaries depend on the data alone (documents and bytes), never on the runner or its
   workers; the plan is small (a few ranges per MB of text) and the launcher holds one
   chunk of text at a time.
2. `beam.Create(plan)` hands the chunks to the workers; each reads its ranges through Beam's
   file systems (local paths, gs://, s3://, hdfs://) and builds the chunk's records with
   `random.Random(seed + k * 2**64)`: the local path's generator, so chunk k's records are the
   same whoever makes them, and a corpus that fits in one chunk gives the original script's records.
3. Each worker writes its chunk's records, as TFRecord frames, to one file in a staging folder
   beside the output (`kbert-temp-OUT-<uuid>/`), and passes on only that file's path and the
   chunk's counts, keyed by shard (chunk k goes to shard k % shards).
4. GroupByKey brings each shard's chunk files together; a worker concatenates them, in chunk
   order, into the shard's file in the staging folder (a temporary file renamed when whole), and
   passes on the chunks' counts. A combiner sums the counts, and the job's last step writes the
   sums to `statistics.json` in the staging folder.
5. When the job has succeeded, the launcher reads the statistics and renames the shards into
   their final names; then the staging folder goes (on failure and Ctrl-C too). A killed
   launcher leaves the staging folder: the next run writing the same output removes it.

Why chunk files, not one element per record (Beam's `WriteToTFRecord`): a million records a
million elements made the DirectRunner much slower than the local path, and its own process held
them all in the shuffle, its memory growing with the corpus (measured by
benchmarks/create_data_bench.py; runs in docs/performance.md, "create-data"). A path per chunk
is a few hundred bytes whatever the chunk holds, so no process holds more than one chunk of
records, on any runner. TFRecord files concatenate: a shard made of whole chunk files is a valid
TFRecord file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from fractions import Fraction

from kbert.pretraining import create_data
from kbert.pretraining.create_data import read_chunks
from kbert.pretraining.instances import DataOptions, InstanceCounts
from kbert.pretraining.record_kinds import instance_builder, statistics
from kbert.pretraining.worker_pool import own_peak_kib

# apache_beam and FileSystems as kbert.runtime.beam imports them (with Beam's import-time log quiet).
from kbert.runtime import beam as beam_runtime
from kbert.runtime.beam import FileSystems, beam
from kbert.runtime.errors import KbertError, first_line, option
from kbert.runtime.records import tfrecord_frames

STATISTICS_FILE = "statistics.json"


class BuildChunk(beam.DoFn):
    """(index, ranges) -> (shard, (index, path, counts)): the chunk's records in a TFRecord file
    in `staging`, keyed by the shard they go to, with the chunk's counts."""

    def __init__(
        self, vocab_text: str, vocab_name: str, do_lower_case, options: DataOptions, staging: str, shards: int
    ):
        # The vocabulary (a vocab.txt or a tokenizer.json) travels inside the DoFn: workers
        # (Dataflow's, say) do not see the launcher's disk. Its name's ending picks the records' kind.
        self.vocab_text, self.vocab_name, self.do_lower_case = vocab_text, vocab_name, do_lower_case
        self.options, self.staging, self.shards = options, staging, shards

    def setup(self):
        suffix = "-" + os.path.basename(self.vocab_name)
        with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False, encoding="utf-8") as f:
            f.write(self.vocab_text)
        try:
            self.builder = instance_builder(f.name, self.do_lower_case, self.options)
        finally:
            os.remove(f.name)

    def process(self, chunk):
        index, ranges = chunk
        replaced_before = create_data._REPLACED[0]
        documents = [
            d
            for _, chunk_documents, _, _ in read_chunks(ranges, None, None, open_file=beam_runtime.open_file)
            for d in chunk_documents
        ]
        records, counts = self.builder.chunk(index, documents)
        # A retried bundle writes a file of its own; only the path of the one that committed
        # goes on, and the staging folder goes with every other.
        path = FileSystems.join(self.staging, f"chunk-{index:06d}-{uuid.uuid4().hex[:8]}.tfrecord")
        with beam_runtime.create_file(path) as f:
            f.write(tfrecord_frames(records)[0])  # the local path's framing: the same bytes
        del records
        chunk_counts = {name: getattr(counts, name) for name in InstanceCounts.__slots__}
        chunk_counts.update(replaced=create_data._REPLACED[0] - replaced_before, chunks=1, peak_kib=own_peak_kib())
        yield index % self.shards, (index, path, chunk_counts)


def shard_file(staging: str, shard: int) -> str:
    return FileSystems.join(staging, f"shard-{shard:05d}")


class WriteShard(beam.DoFn):
    """(shard, [(index, path, counts), ...]) -> each chunk's counts, once the chunk files are
    copied whole, in chunk order, into the shard's file in `staging`."""

    def __init__(self, staging: str):
        self.staging = staging

    def process(self, shard_chunks):
        shard, chunks = shard_chunks
        chunks = sorted(chunks, key=lambda chunk: chunk[0])  # the same bytes whatever order they came in

        def write(out):
            for _, path, _ in chunks:
                with beam_runtime.open_file(path) as f:
                    shutil.copyfileobj(f, out, 8 << 20)

        beam_runtime.write_atomically(shard_file(self.staging, shard), write)
        for _, _, counts in chunks:
            yield counts


class SumCounts(beam.CombineFn):
    """The chunks' counts summed (the largest worker's peak memory: their maximum).
    masked_share_sum, the one float, is summed exactly (as a fraction), so the total does not
    depend on the order the runner combines chunks in."""

    def create_accumulator(self):
        return {}

    def add_input(self, total, counts):
        for name, value in counts.items():
            if name == "peak_kib":
                total[name] = max(total.get(name, 0), value)
            else:
                total[name] = total.get(name, 0) + (Fraction(value) if isinstance(value, float) else value)
        return total

    def merge_accumulators(self, totals):
        merged = {}
        for total in totals:
            self.add_input(merged, total)
        return merged

    def extract_output(self, total):
        return {name: float(value) if isinstance(value, Fraction) else value for name, value in total.items()}


def _write_statistics(totals: dict, staging: str):
    beam_runtime.write_atomically(
        FileSystems.join(staging, STATISTICS_FILE), lambda f: f.write(json.dumps(totals).encode())
    )
    return totals


def _plan(input_files, chunk_docs, chunk_bytes):
    """[(index, ranges)] of every chunk, and the documents planned (the launcher's one pass)."""
    plan, documents = [], 0
    for index, chunk_documents, _, ranges in read_chunks(
        input_files, chunk_docs, chunk_bytes, open_file=beam_runtime.open_file
    ):
        plan.append((index, ranges))
        documents += len(chunk_documents)
    return plan, documents


def _commit(staging: str, outputs: list, chunks: int, runner: str) -> dict:
    """The job's statistics; the shards renamed from the staging folder into their final names."""
    statistics = FileSystems.join(staging, STATISTICS_FILE)
    if not FileSystems.exists(statistics):
        raise KbertError(
            f"the {runner} job ended without its results in {staging}; its workers must write "
            f"where this machine reads: give an {option('output')} on a file system both reach (gs://, s3://, "
            f"a shared disk)"
        )
    with beam_runtime.open_file(statistics) as f:
        totals = json.load(f)
    if totals["chunks"] != chunks:
        raise KbertError(f"the {runner} job made {totals['chunks']} of the {chunks} chunks; run it again")
    for shard, path in enumerate(outputs):
        if shard < chunks:
            FileSystems.rename([shard_file(staging, shard)], [path])
        else:  # more shards than chunks: this one has no records, as the local path would write it
            beam_runtime.create_file(path).close()
    return totals


# long: its keyword arguments and the summary's fields take a line each; each step is one call
def run_pipeline(
    input_patterns,
    vocab_file,
    output,
    *,
    runner: str = "DirectRunner",
    flags: str = "",
    do_lower_case: bool | None = None,
    options: DataOptions = DataOptions(),
    shards: int = 1,
    overwrite: bool = False,
    chunk_docs: int = create_data.CHUNK_DOCS,
    chunk_bytes: int = create_data.CHUNK_BYTES,
) -> dict:
    """Run create-data on a Beam runner; returns the same summary as the local path.

    `vocab_file` is a vocab.txt (BERT's records) or a tokenizer.json (masked-LM-only records);
    `options` as `record_kinds.data_options` resolves them for it.

    Example:
    >>> run_pipeline(["corpus/*.txt"], "vocab.txt", "gs://bucket/data.tfrecord", runner="DataflowRunner",
    ...              flags="--project=P --region=R --temp_location=gs://bucket/tmp", shards=256)  # doctest: +SKIP
    """
    started = time.perf_counter()
    options.check()
    beam_options = beam_runtime.pipeline_options(runner, flags)  # before any reading: a typo fails at once
    if shards < 1:
        raise KbertError(f"{option('shards')} must be at least 1")
    input_files = beam_runtime.expand_inputs(input_patterns)
    vocab_file = os.fspath(vocab_file)
    if not os.path.isfile(vocab_file):
        raise KbertError(
            f"{vocab_file}: no such vocab file; pass the vocab.txt of the model (or make one with `kbert vocab`), "
            "or a ModernBERT's tokenizer.json"
        )
    instance_builder(vocab_file, do_lower_case, options)  # a file that cannot make records fails here, not on a worker
    output = os.fspath(output)
    outputs = create_data.shard_paths(output, shards)
    try:
        FileSystems.get_filesystem(output)
    except ValueError as e:  # a scheme whose Beam extra is not installed (gs:// needs apache-beam[gcp])
        raise KbertError(f"{option('output', output)}: {first_line(e, 300)}") from None
    for path in outputs:
        if FileSystems.exists(path) and not overwrite:
            raise KbertError(
                f"{path} exists; pass {option('overwrite', True)} to replace it, or choose a new output path"
            )

    plan, documents = _plan(input_files, chunk_docs, chunk_bytes)
    if documents == 0:
        raise KbertError(
            f"{', '.join(input_files)}: no text to make instances from; pass text with one "
            f"sentence per line and blank lines between documents"
        )
    beam_runtime.one_task_per_element(beam_options, runner, len(plan))
    with open(vocab_file, encoding="utf-8") as f:
        vocab_text = f.read()
    if not beam_runtime.is_url(output):
        output = os.path.abspath(output)
        os.makedirs(os.path.dirname(output), exist_ok=True)
    final = create_data.shard_paths(output, shards)
    beam_runtime.remove_stale(output)  # what a killed run on this output left (this one's, and Beam's file sink's)
    folder, name = FileSystems.split(output)
    staging = FileSystems.join(folder, f"kbert-temp-{name}-{uuid.uuid4().hex}")
    FileSystems.mkdirs(staging)
    try:
        pipeline = beam.Pipeline(options=beam_options)
        # One chain, no branches: the DaskRunner computes only the last step (and what it needs).
        _ = (
            pipeline
            | "Chunks" >> beam.Create(plan)
            | "Records" >> beam.ParDo(BuildChunk(vocab_text, vocab_file, do_lower_case, options, staging, shards))
            | "ByShard" >> beam.GroupByKey()
            | "Shards" >> beam.ParDo(WriteShard(staging))
            | "Sum" >> beam.CombineGlobally(SumCounts()).without_defaults()  # with defaults: a side input
            | "Statistics" >> beam.Map(_write_statistics, staging)
        )
        beam_runtime.run(pipeline, runner)
        totals = _commit(staging, final, len(plan), runner)
    finally:
        beam_runtime.remove(staging)  # the chunk files, and a failed or interrupted job's shards
    counts = InstanceCounts()
    for name in InstanceCounts.__slots__:
        setattr(counts, name, totals[name])
    seconds = time.perf_counter() - started
    return {
        "output_files": outputs,
        "runner": runner,
        "instances": counts.instances,
        "documents": counts.documents,
        "skipped_empty_documents": counts.empty_documents,
        "replaced_invalid_utf8": totals["replaced"],
        "chunks": len(plan),
        "seconds": round(seconds, 3),
        "instances_per_second": round(counts.instances / seconds, 1),
        # In-memory DirectRunner runs the workers in this process; multi_processing in their own.
        "peak_rss_mib_largest_worker": round(totals["peak_kib"] / 1024, 1),
        "peak_rss_mib_main": round(own_peak_kib() / 1024, 1),
        **statistics(counts, vocab_file, options),
    }
