"""Fine-tuning inputs: the in-graph packer against a Python one, on the same examples.

Packs N sentence pairs (run_classifier's `convert_single_example`: [CLS] a [SEP] b [SEP],
`_truncate_seq_pair`) and N sentences of words to tag (each word's tag on its first
WordPiece), two ways:
  graph   what kbert runs: `kbert.finetuning.encoding.encode_texts` / `encode_tagged`, i.e.
          `BertPreprocessor.pack` / `pack_words` in batches on two threads
  python  the anchor: `kbert.Tokenizer` (the original FullTokenizer's tokens, with its per-word
          cache) and the original's packing loop, one example at a time, written out below
Both start cold: the preprocessor or tokenizer is made inside the timing (vocabulary, lookup
table, regexes), as a `kbert finetune` process makes it once. TensorFlow itself and the
Unicode tables both tokenizers share are made before any timing, as a fine-tuning process
always makes them. Each output is
checked to be identical to the other's; the report gives seconds, examples/s and
`graph_over_python_seconds` (below 1: the graph packer is faster).

Run from the repository root:
    .venv/bin/python benchmarks/packing_bench.py [--corpus PATH] [--examples N] [--length L]
Without --corpus the lines of tests/fixtures/sample_text.txt are used; a real corpus gives
numbers worth quoting (`python scripts/debian_corpus.py corpus.txt`). Progress goes to
stderr, one JSON object to stdout.
"""

import argparse
import os
import random
import sys
import time

import record

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

from kbert.finetuning.encoding import encode_tagged, encode_texts
from kbert.text import unicode_classes
from kbert.text.graph_packer import BertPreprocessor
from kbert.text.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "fixtures", "vocab-uncased.txt")
SAMPLE = os.path.join(ROOT, "tests", "fixtures", "sample_text.txt")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def python_pairs(texts, texts_b, length):
    """run_classifier.convert_single_example's packing, example by example."""
    tokenizer = Tokenizer(VOCAB, do_lower_case=True)
    cls, sep = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    out = np.zeros((3, len(texts), length), np.int32)
    for i, (a, b) in enumerate(zip(texts, texts_b)):
        tokens_a = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(a))
        tokens_b = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(b))
        if tokens_b:
            while len(tokens_a) + len(tokens_b) > length - 3:  # _truncate_seq_pair
                (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()
        else:
            tokens_a = tokens_a[: length - 2]
        ids = [cls, *tokens_a, sep] + ([*tokens_b, sep] if tokens_b else [])
        segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1 if tokens_b else 0)
        out[0, i, : len(ids)], out[1, i, : len(ids)], out[2, i, : len(ids)] = ids, 1, segments
    return out


def python_tagged(words, tags, label_ids, length):
    """Each word tokenized on its own ([UNK] for none), pieces cut at length - 2, the tag on
    each word's first piece."""
    tokenizer = Tokenizer(VOCAB, do_lower_case=True)
    cls, sep, unk = (tokenizer.vocab[t] for t in ("[CLS]", "[SEP]", "[UNK]"))
    ids_out = np.zeros((len(words), length), np.int32)
    labels = np.full((len(words), length), -1, np.int32)
    for i, (sentence, sentence_tags) in enumerate(zip(words, tags)):
        ids, first = [], []
        for word in sentence:
            first.append(len(ids) + 1)
            ids.extend(tokenizer.convert_tokens_to_ids(tokenizer.tokenize(word)) or [unk])
        ids = [cls, *ids[: length - 2], sep]
        ids_out[i, : len(ids)] = ids
        for position, tag in zip(first, sentence_tags):
            if position <= length - 2:
                labels[i, position] = label_ids[tag]
    return ids_out, labels


def compared(graph_s, python_s, examples, identical) -> dict:
    return {
        "graph_seconds": round(graph_s, 3),
        "python_seconds": round(python_s, 3),
        "graph_examples_per_s": round(examples / graph_s),
        "python_examples_per_s": round(examples / python_s),
        "graph_over_python_seconds": round(graph_s / python_s, 2),
        "identical": bool(identical),
    }


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", help="text file, one line per text (default: the sample text)")
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    with open(args.corpus or SAMPLE, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    rng = random.Random(0)
    # Each text joins three lines, as a fine-tuning example is a few sentences.
    texts = [" ".join(rng.sample(lines, min(3, len(lines)))) for _ in range(2 * args.examples)]
    a, b = texts[: args.examples], texts[args.examples :]
    words = [text.split()[:40] for text in a]
    tags = [["O" if rng.random() < 0.8 else "B-X" for _ in sentence] for sentence in words]
    label_ids = {"O": 0, "B-X": 1}
    _ = (tf.constant([1.0]) * 2).numpy()  # TensorFlow initialised before any timing
    # Both tokenizers read the same Unicode tables, made once per process: made here, so
    # neither pays for the other.
    for table in (unicode_classes.removed_chars, unicode_classes.split_chars, unicode_classes.mark_chars):
        table()
    report = {"examples": args.examples, "length": args.length, "corpus": args.corpus or SAMPLE}

    log(f"pairs: {args.examples:,} ...")
    graph_s, (features, _) = timed(lambda: encode_texts(BertPreprocessor(VOCAB, True, args.length), a, b))
    python_s, anchor = timed(lambda: python_pairs(a, b, args.length))
    graph = np.stack([features[k] for k in ("input_ids", "input_mask", "segment_ids")])
    report["pairs"] = compared(graph_s, python_s, args.examples, np.array_equal(graph, anchor))
    log(f"  {report['pairs']}")

    log(f"tagged sentences: {args.examples:,} ...")
    graph_s, (features, labels, _, _) = timed(
        lambda: encode_tagged(BertPreprocessor(VOCAB, True, args.length), words, tags, label_ids)
    )
    python_s, (anchor_ids, anchor_labels) = timed(lambda: python_tagged(words, tags, label_ids, args.length))
    identical = np.array_equal(features["input_ids"], anchor_ids) and np.array_equal(labels, anchor_labels)
    report["tagged"] = compared(graph_s, python_s, args.examples, identical)
    log(f"  {report['tagged']}")
    record.emit(report, "packing", args.output, indent=None)


if __name__ == "__main__":
    main()
