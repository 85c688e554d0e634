"""`kbert create-data --runner R`: create_pretraining_data.py's algorithm as an Apache Beam pipeline.

The same chunks as the local path, made by any Beam runner (DirectRunner here; Dataflow,
Flink, Spark, Prism where the user has them):

1. The launcher reads the input once, as the local path does, and plans the chunks: chunk k
   is a list of byte ranges [(file, start, end), ...] (`create_data.read_chunks`). Chunk
   boundaries depend on the data alone (documents and bytes), never on the runner or its
   workers; the plan is small (a few ranges per MB of text) and the launcher holds one
   chunk of text at a time.
2. `beam.Create(plan)` hands the chunks to the workers (Create's reshuffle spreads them);
   each worker reads its ranges through Beam's file systems (local paths, gs://, s3://,
   hdfs://) and builds the chunk's records with `random.Random(seed + k * 2**64)`: the
   local path's generator, so chunk k's records are the same whoever makes them, and a
   corpus that fits in one chunk gives the original script's records.
3. Each worker writes its chunk's records, as TFRecord frames, to one file in a staging
   folder beside the output (`kbert-temp-OUT-<uuid>/`), and passes on only that file's path.
4. Beam's own file sink (`FileBasedSink`, as `WriteToTFRecord` is, with `--shards` fixed)
   groups the paths by shard and copies each chunk file whole into a temporary shard file;
   the shards are renamed into their final names only when the job succeeds, then the staging
   folder is removed.

Why chunk files, not one element per record (Beam's `WriteToTFRecord`): with a fixed shard
count Beam's sink shuffles every element to its shard. A million records a million elements
cost the DirectRunner 2.2x the local path's time, and its own process held them all (6 GB
for the 25 MB Debian corpus, growing with the corpus). A path per chunk is a few hundred
bytes whatever the chunk holds, so no process holds more than one chunk of records, on any
runner. TFRecord files concatenate: a shard made of whole chunk files is a valid TFRecord file.

Statistics are Beam counters incremented by the workers (namespace "kbert"), read from the
job's result: nothing re-reads the output.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter

from kbert.beam import expand_inputs, open_file, pipeline_options, run
from kbert.errors import KbertError, first_line
from kbert.pretraining import create_data
from kbert.pretraining.create_data import DataOptions, InstanceBuilder, InstanceCounts, read_chunks, tfrecord_frames
from kbert.text.tokenizer import load_vocab

NAMESPACE = "kbert"
# A float statistic kept in an integer counter, in units of 1e-9 (counters are integers).
_NANO = 10 ** 9


class BuildChunk(beam.DoFn):
    """(index, ranges) -> the path of a TFRecord file of the chunk's records, in `staging`;
    counts go to Beam counters."""

    def __init__(self, vocab_text: str, do_lower_case: bool, options: DataOptions, staging: str):
        # The vocabulary travels inside the DoFn: workers (Dataflow's, say) do not see the
        # launcher's disk.
        self.vocab_text, self.do_lower_case, self.options = vocab_text, do_lower_case, options
        self.staging = staging
        self.counters = {name: Metrics.counter(NAMESPACE, name) for name in InstanceCounts.__slots__ + ("replaced",)}
        self.peak_rss = Metrics.distribution(NAMESPACE, "peak_rss_kib")  # its max: the largest worker's

    def setup(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
            f.write(self.vocab_text)
        self.builder = InstanceBuilder(f.name, self.do_lower_case, self.options)
        os.remove(f.name)

    def process(self, chunk):
        index, ranges = chunk
        replaced_before = create_data._REPLACED[0]
        documents = [d for _, chunk_documents, _, _ in read_chunks(ranges, None, None, open_file=open_file)
                     for d in chunk_documents]
        records, counts = self.builder.chunk(index, documents)
        for name in InstanceCounts.__slots__:
            value = getattr(counts, name)
            self.counters[name].inc(round(value * _NANO) if name == "masked_share_sum" else value)
        self.counters["replaced"].inc(create_data._REPLACED[0] - replaced_before)
        # A retried bundle writes a file of its own; only the path of the one that committed
        # reaches the sink, and the staging folder goes with every other.
        path = FileSystems.join(self.staging, f"chunk-{index:06d}-{uuid.uuid4().hex[:8]}.tfrecord")
        with FileSystems.create(path, mime_type="application/octet-stream",
                                compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(tfrecord_frames(records)[0])  # the local path's framing: the same bytes
        del records
        self.peak_rss.update(create_data.own_peak_kib())
        yield path


class ChunkFilesSink(FileBasedSink):
    """Beam's file sink for elements that are TFRecord files: each is copied whole into its shard.

    Beam's `WriteImpl` does the rest as for `WriteToTFRecord`: a temporary file per shard, the
    elements (paths, here) grouped by shard, renames into the final names when the job ends.
    """

    def __init__(self, output: str, shards: int):
        super().__init__(output, BytesCoder(), num_shards=shards,
                         shard_name_template="" if shards == 1 else "-SSSSS-of-NNNNN",
                         mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED)

    def write_record(self, file_handle, chunk_file):
        with FileSystems.open(chunk_file, mime_type="application/octet-stream",
                              compression_type=CompressionTypes.UNCOMPRESSED) as f:
            shutil.copyfileobj(f, file_handle, 8 << 20)


def _remove(path):
    try:
        FileSystems.delete([path])
    except Exception:  # already gone (a failed job's clean-up, or the pipeline's own step)
        pass


def _plan(input_files, chunk_docs, chunk_bytes):
    """[(index, ranges)] of every chunk, and the documents planned (the launcher's one pass)."""
    plan, documents = [], 0
    for index, chunk_documents, _, ranges in read_chunks(input_files, chunk_docs, chunk_bytes, open_file=open_file):
        plan.append((index, ranges))
        documents += len(chunk_documents)
    return plan, documents


def run_pipeline(input_patterns, vocab_file, output, *, runner: str = "DirectRunner", flags: str = "",
                 do_lower_case: bool = True, options: DataOptions = DataOptions(), shards: int = 1,
                 overwrite: bool = False, chunk_docs: int = create_data.CHUNK_DOCS,
                 chunk_bytes: int = create_data.CHUNK_BYTES) -> dict:
    """Run create-data on a Beam runner; returns the same summary as the local path.

    Example:
    >>> run_pipeline(["corpus/*.txt"], "vocab.txt", "gs://bucket/data.tfrecord", runner="DataflowRunner",
    ...              flags="--project=P --region=R --temp_location=gs://bucket/tmp", shards=256)  # doctest: +SKIP
    """
    started = time.perf_counter()
    options.check()
    beam_options = pipeline_options(runner, flags)  # before any reading: a typo fails at once
    if shards < 1:
        raise KbertError("--shards must be at least 1")
    input_files = expand_inputs(input_patterns)
    vocab_file = os.fspath(vocab_file)
    if not os.path.isfile(vocab_file):
        raise KbertError(f"{vocab_file}: no such vocab file; pass the vocab.txt of the model (or make one with "
                         f"`kbert vocab`)")
    missing = [t for t in create_data.SPECIAL_TOKENS if t not in load_vocab(vocab_file)]
    if missing:
        raise KbertError(f"{vocab_file} has no {', '.join(missing)}; pass a BERT vocab.txt (kbert vocab writes one)")
    output = os.fspath(output)
    outputs = create_data.shard_paths(output, shards)
    try:
        FileSystems.get_filesystem(output)
    except ValueError as e:  # a scheme whose Beam extra is not installed (gs:// needs apache-beam[gcp])
        raise KbertError(f"--output {output}: {first_line(e, 300)}") from None
    for path in outputs:
        if FileSystems.exists(path) and not overwrite:
            raise KbertError(f"{path} exists; pass --overwrite to replace it, or choose a new output path")

    plan, documents = _plan(input_files, chunk_docs, chunk_bytes)
    if documents == 0:
        raise KbertError(f"{', '.join(input_files)}: no text to make instances from; pass text with one "
                         f"sentence per line and blank lines between documents")
    with open(vocab_file, encoding="utf-8") as f:
        vocab_text = f.read()
    if not output.startswith(("gs://", "s3://", "hdfs://")):
        output = os.path.abspath(output)
        os.makedirs(os.path.dirname(output), exist_ok=True)
    folder, name = FileSystems.split(output)
    staging = FileSystems.join(folder, f"kbert-temp-{name}-{uuid.uuid4().hex}")
    FileSystems.mkdirs(staging)
    try:
        pipeline = beam.Pipeline(options=beam_options)
        _ = (pipeline
             | "Chunks" >> beam.Create(plan)
             | "Records" >> beam.ParDo(BuildChunk(vocab_text, do_lower_case, options, staging))
             | "Write" >> beam.io.Write(ChunkFilesSink(output, shards))
             | "Written" >> beam.combiners.Count.Globally()  # one element, once every shard is in place
             | "RemoveStaging" >> beam.Map(lambda _, folder: _remove(folder), staging))
        result = run(pipeline, runner)
    finally:
        _remove(staging)  # a failed job's chunk files (a killed launcher leaves them, as Beam leaves its own)
    metrics = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    counts = {r.key.metric.name: r.committed for r in metrics["counters"]}
    peaks = [r.committed.max for r in metrics["distributions"] if r.committed is not None]
    totals = InstanceCounts()
    for name in InstanceCounts.__slots__:
        setattr(totals, name, counts.get(name, 0) / _NANO if name == "masked_share_sum" else counts.get(name, 0))
    seconds = time.perf_counter() - started
    return {
        "output_files": outputs,
        "runner": runner,
        "instances": totals.instances,
        "documents": totals.documents,
        "skipped_empty_documents": totals.empty_documents,
        "replaced_invalid_utf8": counts.get("replaced", 0),
        "chunks": len(plan),
        "seconds": round(seconds, 3),
        "instances_per_second": round(totals.instances / seconds, 1),
        # In-memory DirectRunner runs the workers in this process; multi_processing in their own.
        "peak_rss_mib_largest_worker": round(max(peaks, default=0) / 1024, 1),
        "peak_rss_mib_main": round(create_data.own_peak_kib() / 1024, 1),
        **totals.statistics(),
    }
