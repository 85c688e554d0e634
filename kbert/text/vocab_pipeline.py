"""`kbert vocab --runner R`: the word counting of `kbert vocab` as an Apache Beam pipeline.

Beam reads the text (splitting files among workers), each worker splits lines into the words
kbert.Tokenizer hands to WordPiece (`vocab_builder.WordTokenizer`), and Beam sums the counts:
the same counts as the local path's, so the same vocabulary. The counts come back to the
launcher through a file beside the output (Beam's file systems, so gs:// works too), where
tensorflow-text's learner makes the vocabulary, as on the local path. This is how tf.text's
own WordPiece vocabulary generator is built on Beam.
"""

from __future__ import annotations

import collections
import json
import os
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from kbert.beam import expand_inputs, open_file, pipeline_options, run
from kbert.errors import KbertError
from kbert.files import TEXT_CHECK_BYTES, check_head_is_text
from kbert.text.vocab_builder import WordTokenizer


class _Words(beam.DoFn):
    def __init__(self, do_lower_case: bool):
        self.do_lower_case = do_lower_case

    def setup(self):
        self.words = WordTokenizer(self.do_lower_case)

    def process(self, line: bytes):
        # Invalid UTF-8 becomes U+FFFD, which the tokenizer's cleaning drops (as the local path).
        yield from self.words.tokenize(line.decode("utf-8", "replace"))


def beam_word_counts(input_patterns, output, do_lower_case: bool = True, runner: str = "DirectRunner",
                     flags: str = "") -> collections.Counter:
    """{word: count} over the input, counted by a Beam pipeline on `runner`.

    Example:
    >>> counts = beam_word_counts(["gs://bucket/corpus/*.txt"], "gs://bucket/vocab.txt",
    ...                           runner="DataflowRunner", flags="--project=P --region=R")  # doctest: +SKIP
    """
    options = pipeline_options(runner, flags)
    input_files = expand_inputs(input_patterns)
    for path in input_files:  # a binary or compressed file is refused before the job starts
        with open_file(path) as f:
            check_head_is_text(path, f.read(TEXT_CHECK_BYTES))
    counts_prefix = f"{os.fspath(output)}.counts-{uuid.uuid4().hex[:8]}"
    pipeline = beam.Pipeline(options=options)
    _ = (pipeline
         | "Files" >> beam.Create(input_files)
         | "Lines" >> beam.io.ReadAllFromText(coder=beam.coders.BytesCoder())
         | "Words" >> beam.ParDo(_Words(do_lower_case))
         | "Count" >> beam.combiners.Count.PerElement()
         | "Json" >> beam.Map(json.dumps)
         | "Write" >> beam.io.WriteToText(counts_prefix, shard_name_template="-SSSSS-of-NNNNN"))
    run(pipeline, runner)
    counts = collections.Counter()
    paths = [m.path for m in FileSystems.match([counts_prefix + "-*"])[0].metadata_list]
    try:
        for path in paths:
            with open_file(path) as f:
                for line in f:
                    word, count = json.loads(line)
                    counts[word] += count
    finally:
        FileSystems.delete(paths)
    if not counts:
        raise KbertError(f"{', '.join(input_files)}: no words to learn from; pass text files")
    return counts
