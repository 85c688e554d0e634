"""`kbert create-data`: google-research/bert's create_pretraining_data.py, streamed and in parallel.

This module is the command: its options, reading the text in chunks, and writing the shards.
The rest of it, one job a module:
- `record_kinds`: which records the vocabulary file makes, and each kind's defaults: BERT's from a
  vocab.txt, masked-LM-only from a tokenizer.json (a ModernBERT's);
- `instances`: the algorithm, beside the original's functions, and where and why it differs;
- `mlm_instances`: masked-LM-only instances (run_mlm.py's pieces of text, BERT's masking);
- `python_random`: `random.shuffle` and `randint`, the same draws with fewer Python calls;
- `record_encoder`: tf.train.Example bytes, without TensorFlow (`kbert.runtime.records` frames them);
- `worker_pool`: the spawned worker processes, and peak memory;
- `record_statistics`: `compute_statistics`, what any writer's records hold (read by `kbert.runtime.records`).

It is faster because: kbert.Tokenizer is; every document is tokenized once, not once per
pass; a token is held as the protobuf bytes of its id, so a record's bytes are assembled with
a few joins of precomputed pieces instead of building `tf.train.Example` objects; `shuffle`
draws the same numbers as `random.shuffle` with fewer Python calls; and chunks are made in
`workers` processes, which also frame the records as TFRecords (CRC32C in C, google-crc32c),
while the parent only reads text and writes each chunk's bytes. TensorFlow is never imported:
its start-up alone was a sixth of the whole command's time on the Debian corpus.

Invalid UTF-8 is decoded as U+FFFD and counted; the tokenizer then drops U+FFFD, so the tokens
are those of the original, which drops invalid bytes.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import time

from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.pretraining.instances import DataOptions, InstanceCounts
from kbert.pretraining.record_kinds import data_options, instance_builder, statistics
from kbert.pretraining.worker_pool import chunk_results, peak_rss_mib
from kbert.runtime.errors import KbertError, on_command_line, option
from kbert.runtime.files import (
    TEXT_CHECK_BYTES,
    check_text,
    claim_output,
    count_control,
    expand_inputs,
    sweep_stale_temporaries,
    temporary_name,
)

__all__ = ["DataOptions", "create_pretraining_data", "read_chunks", "shard_paths"]
CHUNK_DOCS = 5000
CHUNK_BYTES = 1 << 20

# Invalid UTF-8 becomes U+FFFD, as errors="replace" does, and is counted (parent process only).
_REPLACED = [0]


def _count_and_replace(error: UnicodeDecodeError):
    _REPLACED[0] += 1
    return "\ufffd", error.end


codecs.register_error("kbert.count_replace", _count_and_replace)


def read_chunks(sources, chunk_docs: int = CHUNK_DOCS, chunk_bytes: int = CHUNK_BYTES, open_file=None):
    """Stream (index, documents, bytes_read, ranges) chunks; a document is a list of non-blank lines.

    A chunk closes after the document that brings it to `chunk_docs` documents or
    `chunk_bytes` bytes of input, so memory holds a few chunks whatever the corpus size. Its
    `ranges` [(path, start, end), ...] are the bytes it was read from: reading just those
    ranges again (as one chunk, with `chunk_docs=None`) gives the same documents, which is how
    the Beam pipeline's workers read the chunks its launcher planned.

    Args:
        sources: list of paths, or of (path, start, end) byte ranges. Text: one sentence per
            line, blank lines between documents.
        chunk_docs: int or None (no limit). Documents per chunk at most.
        chunk_bytes: int or None (no limit). Input bytes after which a chunk closes at the next
            document end.
        open_file: callable(path) -> binary file; default `open(path, "rb")` (Beam passes its
            file systems' open, for gs:// and the like).

    Example:
    >>> chunks = list(read_chunks(["tests/fixtures/sample_text.txt"], chunk_docs=2))
    >>> [len(documents) for _, documents, _, _ in chunks], sum(size for _, _, size, _ in chunks)
    ([2, 1], 4394)
    >>> chunks[1][1][0][0], chunks[1][3]
    ('The fountain of classic wisdom, Hypatia herself.', [('tests/fixtures/sample_text.txt', 1876, 4394)])
    >>> [len(d) for _, d, _, _ in read_chunks(chunks[1][3], chunk_docs=None)] == [len(chunks[1][1])]
    True
    """
    open_file = open_file or (lambda path: open(path, "rb"))
    index, documents, document, size, ranges = 0, [], [], 0, []
    for source in sources:
        path, begin, stop = source if isinstance(source, tuple) else (source, 0, None)
        offset, range_start, replaced_before, checked, control = begin, begin, _REPLACED[0], False, 0
        with open_file(path) as f:
            if begin:
                f.seek(begin)
            for raw in f:
                offset += len(raw)
                size += len(raw)
                line = raw.decode("utf-8", "kbert.count_replace").strip()
                if not checked:  # the head of each file is checked for being text
                    control += count_control(raw)
                    if offset - begin >= TEXT_CHECK_BYTES:
                        check_text(path, offset - begin, _REPLACED[0] - replaced_before, control)
                        checked = True
                if line:
                    document.append(line)
                elif document:
                    documents.append(document)
                    document = []
                if not line and (
                    chunk_docs is not None
                    and len(documents) >= chunk_docs
                    or (chunk_bytes is not None and documents and size >= chunk_bytes)
                ):
                    ranges.append((path, range_start, offset))
                    yield index, documents, size, ranges
                    index, documents, size, ranges, range_start = index + 1, [], 0, [], offset
                if stop is not None and offset >= stop:
                    break
        check_text(path, offset - begin, _REPLACED[0] - replaced_before, 0 if checked else control)
        if document:  # the end of a file (or of its range) ends its last document
            documents.append(document)
            document = []
        if offset > range_start:
            ranges.append((path, range_start, offset))
    if documents or size:
        yield index, documents, size, ranges


def shard_paths(output, shards: int) -> list[str]:
    """OUT for one shard, else OUT-00000-of-0000N ... (the names TF's sharded files use).

    Example:
    >>> shard_paths("data.tfrecord", 2)
    ['data.tfrecord-00000-of-00002', 'data.tfrecord-00001-of-00002']
    """
    output = os.fspath(output)
    if shards == 1:
        return [output]
    return [f"{output}-{i:05d}-of-{shards:05d}" for i in range(shards)]


def _check_paths(input_files, vocab_file, outputs, overwrite):
    if not input_files:
        named = f"{option('input_files', flag='--input')} FILE" if on_command_line() else "input_files"
        raise KbertError(f"no input files; pass {named} (text, one sentence per line, blank lines between documents)")
    for path in input_files:
        if not os.path.isfile(path):
            what = "is a directory, not a text file" if os.path.isdir(path) else "no such input file"
            raise KbertError(
                f"{path}: {what}; pass text files with one sentence per line and a blank line between documents"
            )
    if not os.path.isfile(vocab_file):
        raise KbertError(
            f"{vocab_file}: no such vocab file; pass the vocab.txt of the model (or make one with `kbert vocab`), "
            "or a ModernBERT's tokenizer.json"
        )
    for path in outputs:
        if os.path.isdir(path):
            raise KbertError(f"{path} is a directory; give a file path for the output")
        if os.path.exists(path) and os.path.getsize(path) > 0 and not overwrite:
            raise KbertError(
                f"{path} exists and is not empty; pass {option('overwrite', True)} to replace it, "
                f"or choose a new output path"
            )


def create_pretraining_data(
    input_files,
    vocab_file,
    output,
    *,
    do_lower_case: bool | None = None,
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH,
    max_predictions_per_seq: int | None = None,
    masked_lm_prob: float | None = None,
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
    seed: int = 12345,
    whole_word_mask: bool = False,
    shards: int = 1,
    workers: int | None = None,
    overwrite: bool = False,
    chunk_docs: int = CHUNK_DOCS,
    chunk_bytes: int = CHUNK_BYTES,
    on_progress=None,
) -> dict:
    """Write pretraining TFRecords from text, as create_pretraining_data.py does (see the module doc).

    From a vocab.txt: BERT's records (masked LM + next sentence). From a tokenizer.json (a
    ModernBERT's): masked-LM-only records, pieces of each document's text in its template
    (`kbert.pretraining.mlm_instances`).

    Args:
        input_files: list of str. Text: one sentence per line, a blank line between documents.
        vocab_file: str. The vocab.txt, or the tokenizer.json, to tokenize with.
        output: str. The TFRecord file; with `shards` > 1 the prefix of OUT-0000i-of-0000N.
        do_lower_case: bool or None. Lower-case and strip accents (uncased vocabularies); None:
            True for a vocab.txt. A tokenizer.json's own normalizer decides, so leave it None.
        max_seq_length: int. Tokens per instance.
        max_predictions_per_seq: int or None. Masked positions per instance at most; None: 20
            for a vocab.txt, round(max_seq_length * masked_lm_prob) for a tokenizer.json.
        masked_lm_prob: float or None. Share of tokens to mask; None: 0.15 for a vocab.txt, 0.3
            (ModernBERT's recipe) for a tokenizer.json.
        dupe_factor: int. Passes over the data, each with fresh masks.
        short_seq_prob: float. Probability of a shorter target length.
        seed: int. Random seed; the output is the same for the same seed whatever `workers` is.
        whole_word_mask: bool. Mask whole words (WordPiece's; not for a tokenizer.json).
        shards: int. Output files; records go to them round-robin.
        workers: int or None. Processes making chunks (None: the CPUs this process may use).
            Above 1 they are spawned, so a script calling this needs the usual
            `if __name__ == "__main__":` guard.
        overwrite: bool. Replace existing non-empty output files.
        chunk_docs: int. Documents per chunk (the scope of random-next and shuffling).
        chunk_bytes: int. Input bytes after which a chunk closes at the next document end.
        on_progress: callable or None. Called as on_progress(bytes_read, total_bytes, instances)
            after each chunk is written.

    Returns:
        dict: output_files, instances, documents, skipped_empty_documents,
        replaced_invalid_utf8, chunks, seconds, instances_per_second, peak_rss_mib (+ main and
        largest worker), and the statistics of `compute_statistics` (for masked-LM-only records
        also objective "mlm", and the max_seq_length and max_predictions_per_seq to pretrain with).

    Example:
    >>> import tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "sample.tfrecord")
    >>> result = create_pretraining_data(["tests/fixtures/sample_text.txt"],
    ...     "tests/fixtures/vocab-uncased.txt", out, dupe_factor=2, workers=1)
    >>> result["instances"], result["documents"], result["output_files"] == [out]
    (23, 3, True)
    """
    started = time.perf_counter()
    vocab_file = os.fspath(vocab_file)
    options, do_lower_case = data_options(
        vocab_file,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        dupe_factor=dupe_factor,
        short_seq_prob=short_seq_prob,
        whole_word_mask=whole_word_mask,
        seed=seed,
        do_lower_case=do_lower_case,
    )
    if shards < 1:
        raise KbertError(f"{option('shards')} must be at least 1")
    if workers is None:
        workers = len(os.sched_getaffinity(0))
    if workers < 1:
        raise KbertError(f"{option('workers')} must be at least 1")
    input_files = expand_inputs([os.fspath(p) for p in input_files]) if input_files else []
    outputs = shard_paths(output, shards)
    _check_paths(input_files, vocab_file, outputs, overwrite)
    with claim_output(output, inputs=[*input_files, vocab_file]):
        return _create_pretraining_data(
            input_files,
            vocab_file,
            outputs,
            options,
            do_lower_case,
            workers,
            chunk_docs,
            chunk_bytes,
            on_progress,
            started,
        )


def _create_pretraining_data(
    input_files, vocab_file, outputs, options, do_lower_case, workers, chunk_docs, chunk_bytes, on_progress, started
) -> dict:
    shards = len(outputs)
    instance_builder(vocab_file, do_lower_case, options)  # a file that cannot make records fails here, once

    total_bytes = sum(os.path.getsize(p) for p in input_files)
    for path in outputs:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for path in outputs:
        sweep_stale_temporaries(path)
    temps = [temporary_name(os.path.abspath(p)) for p in outputs]
    writers = [open(t, "wb") for t in temps]
    replaced_before = _REPLACED[0]
    counts, done_bytes, written, chunks, peaks = InstanceCounts(), 0, 0, 0, {}
    results = chunk_results(
        read_chunks(input_files, chunk_docs, chunk_bytes), workers, (vocab_file, do_lower_case, options)
    )
    try:
        for (_, _, size, _), frames, lengths, chunk_counts, (pid, peak) in results:
            peaks[pid] = max(peak, peaks.get(pid, 0))
            if shards == 1:
                writers[0].write(frames)
                written += len(lengths)
            else:  # round-robin, record by record, as the original writes its output files
                view, start = memoryview(frames), 0
                for length in lengths:
                    writers[written % shards].write(view[start : start + length])
                    start += length
                    written += 1
            counts.add(chunk_counts)
            done_bytes += size
            chunks += 1
            if on_progress is not None:
                on_progress(done_bytes, total_bytes, counts.instances)
        for writer in writers:
            writer.close()
        if counts.instances == 0:
            raise KbertError(
                f"{', '.join(input_files)}: no text to make instances from; pass "
                f"text with one sentence per line and blank lines between documents"
            )
        for temp, path in zip(temps, outputs):
            os.replace(temp, path)
    except BaseException:
        # The partial output goes first: stopping the pool can hang (a worker stopped while
        # the queue feeding it is full), and then only the frame's deadline ends the process.
        for writer in writers:
            with contextlib.suppress(OSError):  # a full disk fails the buffer's flush again
                writer.close()
        for temp in temps:
            if os.path.exists(temp):
                os.remove(temp)
        results.close()  # stop the workers now, not when the traceback is gone
        raise
    seconds = time.perf_counter() - started
    return {
        "output_files": outputs,
        "instances": counts.instances,
        "documents": counts.documents,
        "skipped_empty_documents": counts.empty_documents,
        "replaced_invalid_utf8": _REPLACED[0] - replaced_before,
        "chunks": chunks,
        "workers": workers,
        "seconds": round(seconds, 3),
        "instances_per_second": round(counts.instances / seconds, 1),
        **peak_rss_mib(peaks),
        **statistics(counts, vocab_file, options),
    }
