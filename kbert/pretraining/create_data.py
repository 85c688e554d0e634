"""Pretraining data: google-research/bert's create_pretraining_data.py, streamed and in parallel.

The algorithm is the original's, drawing the same random numbers in the same order from a
`random.Random`: documents are separated by blank lines and hold one sentence per line;
`dupe_factor` passes each make fresh instances and masks; an instance targets
max_seq_length - 3 tokens (with probability short_seq_prob a random length from 2); segment A
ends at a random sentence boundary; B is the actual continuation, or half the time (always
when only one sentence is pending) the start of a random other document, and then the
sentences not used for A go back into the stream; the longer of A and B loses tokens from a
random end until both fit; masked LM takes min(max_predictions_per_seq,
max(1, round(len * masked_lm_prob))) positions, 80% [MASK], 10% kept, 10% a random vocab
word, optionally whole words (## pieces join the preceding candidate).

Where it differs, and why. The original holds the whole corpus in memory and shuffles all of
it; this module streams it in chunks of a few thousand documents (`chunk_docs`, `chunk_bytes`),
which is what bounds memory on corpora larger than RAM and lets worker processes share the
work. That has three consequences:
- the random next segment comes from another document of the same chunk, not the whole
  corpus (the one statistical difference in what an instance is made of);
- instances are shuffled within their chunk, so the output is chunk-ordered: all
  `dupe_factor` copies of a document sit within one chunk's span of records (training's
  shuffle buffer and several --shards mix them further);
- the end of an input file ends a document (the original runs the last document of one file
  into the first of the next unless the file ends with a blank line).
Chunk k draws from `random.Random(seed + k * 2**64)`, so the output does not depend on the
number of workers, and chunk 0 draws exactly what the original draws with
`--random_seed=seed`: a corpus that fits in one chunk gives the original's records, in the
original's order (the tests check this against the original code).

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

import array
import codecs
import collections
import dataclasses
import multiprocessing
import os
import random
import resource
import signal
import struct
import time
from concurrent.futures import ProcessPoolExecutor

import google_crc32c

from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.errors import KbertError
from kbert.outputs import claim_output
from kbert.processes import die_with_parent
from kbert.files import TEXT_CHECK_BYTES, check_text, count_control, expand_inputs, sweep_stale_temporaries, temporary_name
from kbert.text.tokenizer import Tokenizer, load_vocab

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")
CHUNK_DOCS = 5000
CHUNK_BYTES = 1 << 20
_SEED_STRIDE = 1 << 64

# Invalid UTF-8 becomes U+FFFD, as errors="replace" does, and is counted (parent process only).
_REPLACED = [0]


def _count_and_replace(error: UnicodeDecodeError):
    _REPLACED[0] += 1
    return "\ufffd", error.end


codecs.register_error("kbert.count_replace", _count_and_replace)


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """The flags of create_pretraining_data.py that shape an instance.

    Args:
        max_seq_length: int. Tokens per instance, [CLS] and both [SEP] included.
        max_predictions_per_seq: int. Masked positions per instance at most.
        masked_lm_prob: float. Share of an instance's tokens to mask.
        dupe_factor: int. Passes over each document, each with fresh instances and masks.
        short_seq_prob: float. Probability of a shorter target length.
        whole_word_mask: bool. Mask all WordPiece pieces of a word together.
        seed: int. Seed of chunk 0's `random.Random` (the original's --random_seed).
    """

    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    dupe_factor: int = 10
    short_seq_prob: float = 0.1
    whole_word_mask: bool = False
    seed: int = 12345

    def check(self):
        """Raise a one-line `KbertError` for a value the algorithm cannot work with."""
        problems = [
            (self.max_seq_length < 5, "--max-seq-length must be at least 5 ([CLS], [SEP], [SEP] "
                                      "and two tokens)"),
            (self.max_predictions_per_seq < 1, "--max-predictions-per-seq must be at least 1"),
            (not 0 < self.masked_lm_prob <= 1, "--masked-lm-prob must be in (0, 1]"),
            (self.dupe_factor < 1, "--dupe-factor must be at least 1"),
            (not 0 <= self.short_seq_prob <= 1, "--short-seq-prob must be in [0, 1]"),
            (not 0 <= self.seed < _SEED_STRIDE, "--seed must be in [0, 2**64)"),
        ]
        for bad, message in problems:
            if bad:
                raise KbertError(message)


def shuffle(items: list, rng: random.Random) -> None:
    """`rng.shuffle(items)`: the same permutation from the same draws, about twice as fast.

    Args:
        items: list. Shuffled in place.
        rng: random.Random. Left in the state `rng.shuffle` would leave it in.

    Example:
    >>> a, b = list(range(10)), list(range(10))
    >>> random.Random(1).shuffle(a); shuffle(b, random.Random(1)); a == b
    True
    """
    # random.shuffle calls _randbelow(i + 1) per position, which draws getrandbits(k) until
    # the value is below i + 1; doing that inline saves a Python call per element, and masked
    # LM shuffles every instance's ~125 candidate positions.
    getrandbits, bits = rng.getrandbits, _bit_lengths(len(items))
    for i in range(len(items) - 1, 0, -1):
        j = getrandbits(bits[i + 1])
        while j > i:
            j = getrandbits(bits[i + 1])
        items[i], items[j] = items[j], items[i]


_BIT_LENGTHS = [0]


def _bit_lengths(n: int) -> list:
    """[m.bit_length() for m in range(n + 1)] (grown as needed, shared)."""
    while len(_BIT_LENGTHS) <= n:
        _BIT_LENGTHS.extend(m.bit_length() for m in range(len(_BIT_LENGTHS), 2 * len(_BIT_LENGTHS)))
    return _BIT_LENGTHS


def _randbelow(rng: random.Random, n: int) -> int:
    """`rng.randint(0, n - 1)`, or `rng.randint(a, a + n - 1) - a`: the same draws, no Python
    layers of randint -> randrange -> _randbelow."""
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return r


# --- tf.train.Example bytes -------------------------------------------------------------------
# An Example is Features{map<string, Feature>}; a map entry is {1: key, 2: Feature}; a Feature
# holds {2: FloatList | 3: Int64List}; each list is {1: packed values}. Every field here is
# length-delimited (wire type 2), so the tags are (field << 3) | 2.

def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _ExampleBytes:
    """Serialized tf.train.Example records for one (max_seq_length, max_predictions_per_seq).

    Values only vary in a few places, so the fixed parts (tags, lengths, padding, the
    input_mask / weights / label entries) are built once and a record is one bytes.join.
    """

    def __init__(self, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int):
        self.seq, self.preds = max_seq_length, max_predictions_per_seq
        self.varint = [_varint(v) for v in range(max(vocab_size, max_seq_length) + 1)]
        self.zeros = [b"\x00" * n for n in range(4 * max(max_seq_length, max_predictions_per_seq) + 1)]
        self.ones = [b"\x01" * n for n in range(max_seq_length + 1)]
        self._prefixes = {}
        seq, preds = max_seq_length, max_predictions_per_seq
        self.input_mask = [self.entry("input_mask", self.ones[n] + self.zeros[seq - n])
                           for n in range(seq + 1)]
        one = b"\x00\x00\x80\x3f"  # 1.0 as a little-endian float32
        self.weights = [self.entry("masked_lm_weights", one * k + self.zeros[4 * (preds - k)], float_list=True)
                        for k in range(preds + 1)]
        self.labels = [self.entry("next_sentence_labels", b"\x00"), self.entry("next_sentence_labels", b"\x01")]
        # The prefixes of the entries whose size varies, indexed by the size of their values.
        widest = len(self.varint[-1])
        self.ids_prefix = [self.prefix("input_ids", size) for size in range(seq * widest + 1)]
        self.positions_prefix = [self.prefix("masked_lm_positions", size) for size in range(preds * widest + 1)]
        self.labels_prefix = [self.prefix("masked_lm_ids", size) for size in range(preds * widest + 1)]
        self.segment_prefix = self.prefix("segment_ids", seq)

    def _length(self, n: int) -> bytes:
        return self.varint[n] if n < len(self.varint) else _varint(n)

    def prefix(self, name: str, size: int, float_list: bool = False) -> bytes:
        """Everything of a map entry before its packed values, for `size` bytes of values."""
        key = (name, size, float_list)
        if key not in self._prefixes:
            values = b"\x0a" + self._length(size)
            feature = (b"\x12" if float_list else b"\x1a") + self._length(len(values) + size) + values
            name_field = b"\x0a" + self._length(len(name)) + name.encode()
            entry = name_field + b"\x12" + self._length(len(feature) + size) + feature
            self._prefixes[key] = b"\x0a" + self._length(len(entry) + size) + entry
        return self._prefixes[key]

    def entry(self, name: str, payload: bytes, float_list: bool = False) -> bytes:
        return self.prefix(name, len(payload), float_list) + payload

    def record(self, tokens: list, len_a: int, positions: list, labels: list, is_random_next: bool) -> bytes:
        """One Example from tokens held as their ids' varint bytes (`self.varint[id]`).

        Args:
            tokens: list of bytes. [CLS] A [SEP] B [SEP], after masking.
            len_a: int. Tokens in A.
            positions: list of int. Masked positions, ascending.
            labels: list of bytes. The original tokens at `positions`.
            is_random_next: bool. The next_sentence_label.
        """
        n, k, zeros = len(tokens), len(positions), self.zeros
        ids = b"".join(tokens)
        pos = b"".join(map(self.varint.__getitem__, positions))
        lab = b"".join(labels)
        ids_pad, preds_pad = self.seq - n, self.preds - k  # padding: one 0x00 byte per zero
        features = b"".join((
            self.ids_prefix[len(ids) + ids_pad], ids, zeros[ids_pad],
            self.input_mask[n],
            self.segment_prefix, zeros[len_a + 2], self.ones[n - len_a - 2], zeros[ids_pad],
            self.positions_prefix[len(pos) + preds_pad], pos, zeros[preds_pad],
            self.labels_prefix[len(lab) + preds_pad], lab, zeros[preds_pad],
            self.weights[k],
            self.labels[is_random_next]))
        return b"\x0a" + self._length(len(features)) + features


# --- instances --------------------------------------------------------------------------------

class InstanceCounts:
    """How many instances, documents, tokens and masks a chunk made, summed so that the parent
    can merge chunks in order."""

    # Slots: the counts are updated for every instance, and slot attributes are the fastest to update.
    __slots__ = ("instances", "documents", "empty_documents", "tokens", "masked_share_sum",
                 "masked", "mask_token", "kept", "random_next")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def add(self, other: "InstanceCounts"):
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def statistics(self) -> dict:
        n, masked = max(self.instances, 1), max(self.masked, 1)
        return {
            "instances": self.instances,
            "mean_length": self.tokens / n,
            "masked_share": self.masked_share_sum / n,
            "mask_token_share": self.mask_token / masked,
            "kept_share": self.kept / masked,
            "random_share": (self.masked - self.mask_token - self.kept) / masked,
            "random_next_share": self.random_next / n,
        }


class InstanceBuilder:
    """Builds a chunk's training instances as serialized records; one per process (the
    vocabulary and byte tables are built once)."""

    def __init__(self, vocab_file: str, do_lower_case: bool, options: DataOptions):
        self.tokenizer = Tokenizer(vocab_file, do_lower_case)
        vocab = self.tokenizer.vocab
        self.options = options
        self.bytes = _ExampleBytes(options.max_seq_length, options.max_predictions_per_seq,
                                   max(vocab.values()) + 1)
        # A token is held as the varint bytes of its id, one shared object per id: a record's
        # input_ids are then one bytes.join, and equal tokens are the same object.
        self.token = {word: self.bytes.varint[index] for word, index in vocab.items()}
        self.cls, self.sep, self.mask = self.token["[CLS]"], self.token["[SEP]"], self.token["[MASK]"]
        # The original draws a random word from list(vocab.keys()) and looks its id up.
        self.vocab_words = [self.token[word] for word in vocab]
        self.pieces = {self.token[word] for word in vocab if word.startswith("##")}

    def chunk(self, index: int, raw_documents: list) -> tuple[list, InstanceCounts]:
        """Records (serialized, shuffled) and counts of one chunk of documents."""
        opts, counts = self.options, InstanceCounts()
        rng = random.Random(opts.seed + index * _SEED_STRIDE)
        tokenize, token = self.tokenizer.tokenize, self.token
        documents = []
        for lines in raw_documents:
            document = []
            for line in lines:
                tokens = tokenize(line)
                if tokens:
                    document.append([token[t] for t in tokens])
            if document:
                documents.append(document)
            else:
                counts.empty_documents += 1
        counts.documents = len(documents)
        shuffle(documents, rng)
        records = []
        for _ in range(opts.dupe_factor):
            for document_index in range(len(documents)):
                self.document(documents, document_index, rng, records, counts)
        shuffle(records, rng)
        return records, counts

    def document(self, documents: list, document_index: int, rng: random.Random, records: list,
                 counts: InstanceCounts):
        """Append the records of one document's pass (create_instances_from_document)."""
        document = documents[document_index]
        max_num_tokens = self.options.max_seq_length - 3
        target_length = max_num_tokens
        if rng.random() < self.options.short_seq_prob:
            target_length = 2 + _randbelow(rng, max_num_tokens - 1)  # rng.randint(2, max_num_tokens)
        pending, pending_length, i = [], 0, 0
        while i < len(document):
            pending.append(document[i])
            pending_length += len(document[i])
            if i == len(document) - 1 or pending_length >= target_length:
                a_end = 1 + _randbelow(rng, len(pending) - 1) if len(pending) >= 2 else 1
                tokens_a = _joined(pending[:a_end])
                if len(pending) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_length - len(tokens_a)
                    # Ten tries at another document; with one document it is itself.
                    for _ in range(10):
                        random_index = _randbelow(rng, len(documents))
                        if random_index != document_index:
                            break
                    random_document = documents[random_index]
                    tokens_b = []
                    for j in range(_randbelow(rng, len(random_document)), len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    # The sentences after A were not used: put them back into the stream.
                    i -= len(pending) - a_end
                else:
                    is_random_next = False
                    tokens_b = _joined(pending[a_end:])
                tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                records.append(self.instance(tokens_a, tokens_b, is_random_next, rng, counts))
                pending, pending_length = [], 0
            i += 1

    def instance(self, tokens_a: list, tokens_b: list, is_random_next: bool, rng: random.Random,
                 counts: InstanceCounts) -> bytes:
        """Mask [CLS] A [SEP] B [SEP] (create_masked_lm_predictions) and serialize it."""
        opts = self.options
        tokens = [self.cls, *tokens_a, self.sep, *tokens_b, self.sep]
        n, len_a = len(tokens), len(tokens_a)
        num_to_predict = min(opts.max_predictions_per_seq, max(1, int(round(n * opts.masked_lm_prob))))
        # Candidates are all positions but [CLS] and the two [SEP]s. The original tests the token
        # text instead; the same positions, as basic tokenization splits "[" from any word.
        if opts.whole_word_mask:
            chosen = self.whole_word_candidates(tokens, len_a, num_to_predict, rng)
        else:
            candidates = [*range(1, len_a + 1), *range(len_a + 2, n - 1)]
            shuffle(candidates, rng)
            chosen = candidates[:num_to_predict]
        output = tokens[:]
        random_draw, mask = rng.random, self.mask
        mask_token = kept = 0
        for index in chosen:
            if random_draw() < 0.8:
                output[index] = mask
                mask_token += 1
            elif random_draw() < 0.5:
                kept += 1  # the original token stays
            else:
                word = self.vocab_words[_randbelow(rng, len(self.vocab_words))]
                output[index] = word
                # Counted as compute_statistics reads the record: by what the input shows.
                mask_token += word is mask
                kept += word is tokens[index]
        chosen.sort()

        counts.instances += 1
        counts.tokens += n
        counts.masked += len(chosen)
        counts.masked_share_sum += len(chosen) / n
        counts.mask_token += mask_token
        counts.kept += kept
        counts.random_next += is_random_next
        return self.bytes.record(output, len_a, chosen, [tokens[p] for p in chosen], is_random_next)

    def whole_word_candidates(self, tokens: list, len_a: int, num_to_predict: int, rng) -> list:
        """The positions whole-word masking picks, in the order the original draws their masks."""
        groups, pieces = [], self.pieces
        for i in [*range(1, len_a + 1), *range(len_a + 2, len(tokens) - 1)]:
            # As in the original, a ## piece at the start of B joins A's last word: [SEP] is
            # skipped, not a word boundary.
            if groups and tokens[i] in pieces:
                groups[-1].append(i)
            else:
                groups.append([i])
        shuffle(groups, rng)
        chosen = []
        for group in groups:
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(group) > num_to_predict:
                continue  # the whole word does not fit: try a shorter one
            chosen.extend(group)  # groups never overlap, so none is already covered
        return chosen


def _joined(sentences: list) -> list:
    """The sentences' tokens in one list (list += runs in C; a comprehension per token does not)."""
    tokens = []
    for sentence in sentences:
        tokens += sentence
    return tokens


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random):
    """Trim the longer of A and B, one token from a random end at a time, until both fit.

    The same draws as the original's truncate_seq_pair, but the cuts are counted and made as
    two slices at the end: deleting from the front one token at a time is quadratic, and a
    10 MB line is one sentence of millions of tokens.

    Args:
        tokens_a: list. Segment A.
        tokens_b: list. Segment B.
        max_num_tokens: int. Tokens A and B may hold together.
        rng: random.Random. One draw per removed token.

    Returns:
        (tokens_a, tokens_b), trimmed (new lists when cut).

    Example:
    >>> truncate_seq_pair([1, 2, 3, 4], [5], 3, random.Random(0))
    ([1, 2], [5])
    """
    len_a, len_b = len(tokens_a), len(tokens_b)
    cuts = [0, 0, 0, 0]  # a front, a back, b front, b back
    random_draw = rng.random
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            cuts[0 if random_draw() < 0.5 else 1] += 1
            len_a -= 1
        else:
            cuts[2 if random_draw() < 0.5 else 3] += 1
            len_b -= 1
    if cuts[0] or cuts[1]:
        tokens_a = tokens_a[cuts[0]:cuts[0] + len_a]
    if cuts[2] or cuts[3]:
        tokens_b = tokens_b[cuts[2]:cuts[2] + len_b]
    return tokens_a, tokens_b


# --- processes --------------------------------------------------------------------------------

_BUILDER: InstanceBuilder | None = None


def _start_worker(vocab_file, do_lower_case, options):
    global _BUILDER
    _BUILDER = InstanceBuilder(vocab_file, do_lower_case, options)


def _start_worker_process(parent_pid, *args):
    # A parent killed with -9 takes its workers along: they would otherwise run on, holding its
    # stdout and stderr open, and a caller waiting for its output would hang.
    die_with_parent(parent_pid)
    # Ctrl-C is the parent's to handle (it stops the pool and removes partial output); a
    # worker would only add a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _start_worker(*args)


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frames(records) -> tuple[bytes, array.array]:
    """The records framed as a TFRecord file holds them, joined, and each frame's length.

    A frame is the record's length (uint64), its masked CRC32C, the record, the record's masked
    CRC32C: frames joined in any order, or files of them concatenated, are TFRecord files.

    Example:
    >>> import tensorflow as tf, tempfile
    >>> frames, lengths = tfrecord_frames([b"first", b"second"])
    >>> list(lengths)
    [21, 22]
    >>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
    >>> _ = open(path, "wb").write(frames)
    >>> [r.numpy() for r in tf.data.TFRecordDataset(path)]
    [b'first', b'second']
    """
    pack_length, pack_crc = struct.Struct("<Q").pack, struct.Struct("<I").pack
    parts = []
    for record in records:
        length = pack_length(len(record))
        parts += (length, pack_crc(_masked_crc(length)), record, pack_crc(_masked_crc(record)))
    return b"".join(parts), array.array("Q", (len(r) + 16 for r in records))


def _make_chunk(chunk):
    """(framed records joined, the frames' lengths, counts, (pid, peak RSS in KiB)) of one chunk.

    One bytes object and an array of lengths cross the process boundary much faster than a
    list of a hundred thousand small bytes objects (pickling each costs microseconds).
    """
    index, documents = chunk[:2]
    records, counts = _BUILDER.chunk(index, documents)
    frames, lengths = tfrecord_frames(records)
    return frames, lengths, counts, (os.getpid(), own_peak_kib())


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
                if not line and (chunk_docs is not None and len(documents) >= chunk_docs or (
                        chunk_bytes is not None and documents and size >= chunk_bytes)):
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


def _chunk_results(chunks, workers: int, start_args: tuple):
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
    others = set(multiprocessing.active_children())
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker_process,
                             initargs=(os.getpid(), *start_args)) as pool:
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
            # for every chunk already handed to a worker.
            for _, future in pending:
                future.cancel()
            for process in set(multiprocessing.active_children()) - others:
                process.terminate()
            raise


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
        raise KbertError("no input files; pass --input FILE (text, one sentence per line, "
                         "blank lines between documents)")
    for path in input_files:
        if not os.path.isfile(path):
            what = "is a directory, not a text file" if os.path.isdir(path) else "no such input file"
            raise KbertError(f"{path}: {what}; pass text files with one sentence per line and a "
                             f"blank line between documents")
    if not os.path.isfile(vocab_file):
        raise KbertError(f"{vocab_file}: no such vocab file; pass the vocab.txt of the model "
                         f"(or make one with `kbert vocab`)")
    for path in outputs:
        if os.path.isdir(path):
            raise KbertError(f"{path} is a directory; give a file path for the output")
        if os.path.exists(path) and os.path.getsize(path) > 0 and not overwrite:
            raise KbertError(f"{path} exists and is not empty; pass --overwrite to replace it, "
                             f"or choose a new output path")


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


def _peak_rss_mib(worker_peaks: dict) -> dict:
    """Peak resident memory of this process plus each worker's own peak.

    Workers report their own peaks because RUSAGE_CHILDREN gives the largest child of this
    process ever, not a sum (and TensorFlow's import starts a child of its own).
    """
    own = own_peak_kib() / 1024
    workers = [kib / 1024 for pid, kib in worker_peaks.items() if pid != os.getpid()]
    return {"peak_rss_mib": round(own + sum(workers), 1), "peak_rss_mib_main": round(own, 1),
            "peak_rss_mib_largest_worker": round(max(workers, default=0.0), 1)}


def create_pretraining_data(input_files, vocab_file, output, *, do_lower_case: bool = True,
                            max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH, max_predictions_per_seq: int = 20,
                            masked_lm_prob: float = 0.15, dupe_factor: int = 10,
                            short_seq_prob: float = 0.1, seed: int = 12345,
                            whole_word_mask: bool = False, shards: int = 1, workers: int | None = None,
                            overwrite: bool = False, chunk_docs: int = CHUNK_DOCS,
                            chunk_bytes: int = CHUNK_BYTES, on_progress=None) -> dict:
    """Write pretraining TFRecords from text, as create_pretraining_data.py does (see the module doc).

    Args:
        input_files: list of str. Text: one sentence per line, a blank line between documents.
        vocab_file: str. The vocab.txt to tokenize with.
        output: str. The TFRecord file; with `shards` > 1 the prefix of OUT-0000i-of-0000N.
        do_lower_case: bool. Lower-case and strip accents (uncased vocabularies).
        max_seq_length: int. Tokens per instance.
        max_predictions_per_seq: int. Masked positions per instance at most.
        masked_lm_prob: float. Share of tokens to mask.
        dupe_factor: int. Passes over the data, each with fresh masks.
        short_seq_prob: float. Probability of a shorter target length.
        seed: int. Random seed; the output is the same for the same seed whatever `workers` is.
        whole_word_mask: bool. Mask whole words.
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
        largest worker), and the statistics of `compute_statistics`.

    Example:
    >>> import tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "sample.tfrecord")
    >>> result = create_pretraining_data(["tests/fixtures/sample_text.txt"],
    ...     "tests/fixtures/vocab-uncased.txt", out, dupe_factor=2, workers=1)
    >>> result["instances"], result["documents"], result["output_files"] == [out]
    (23, 3, True)
    """
    started = time.perf_counter()
    options = DataOptions(max_seq_length, max_predictions_per_seq, masked_lm_prob, dupe_factor,
                          short_seq_prob, bool(whole_word_mask), seed)
    options.check()
    if shards < 1:
        raise KbertError("--shards must be at least 1")
    if workers is None:
        workers = len(os.sched_getaffinity(0))
    if workers < 1:
        raise KbertError("--workers must be at least 1")
    input_files = expand_inputs([os.fspath(p) for p in input_files]) if input_files else []
    vocab_file = os.fspath(vocab_file)
    outputs = shard_paths(output, shards)
    _check_paths(input_files, vocab_file, outputs, overwrite)
    with claim_output(output, inputs=[*input_files, vocab_file]):
        return _create_pretraining_data(input_files, vocab_file, outputs, options, do_lower_case, workers,
                                        chunk_docs, chunk_bytes, on_progress, started)


def _create_pretraining_data(input_files, vocab_file, outputs, options, do_lower_case, workers, chunk_docs,
                             chunk_bytes, on_progress, started) -> dict:
    shards = len(outputs)
    missing = [t for t in SPECIAL_TOKENS if t not in load_vocab(vocab_file)]
    if missing:
        raise KbertError(f"{vocab_file} has no {', '.join(missing)}; pass a BERT vocab.txt "
                         f"(kbert vocab writes one)")

    total_bytes = sum(os.path.getsize(p) for p in input_files)
    for path in outputs:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for path in outputs:
        sweep_stale_temporaries(path)
    temps = [temporary_name(os.path.abspath(p)) for p in outputs]
    writers = [open(t, "wb") for t in temps]
    replaced_before = _REPLACED[0]
    counts, done_bytes, written, chunks, peaks = InstanceCounts(), 0, 0, 0, {}
    results = _chunk_results(read_chunks(input_files, chunk_docs, chunk_bytes), workers,
                             (vocab_file, do_lower_case, options))
    try:
        for (_, _, size, _), frames, lengths, chunk_counts, (pid, peak) in results:
            peaks[pid] = max(peak, peaks.get(pid, 0))
            if shards == 1:
                writers[0].write(frames)
                written += len(lengths)
            else:  # round-robin, record by record, as the original writes its output files
                view, start = memoryview(frames), 0
                for length in lengths:
                    writers[written % shards].write(view[start:start + length])
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
            raise KbertError(f"{', '.join(input_files)}: no text to make instances from; pass "
                             f"text with one sentence per line and blank lines between documents")
        for temp, path in zip(temps, outputs):
            os.replace(temp, path)
    except BaseException:
        results.close()  # stop the workers now, not when the traceback is gone
        for writer in writers:
            writer.close()
        for temp in temps:
            if os.path.exists(temp):
                os.remove(temp)
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
        **_peak_rss_mib(peaks),
        **counts.statistics(),
    }


def compute_statistics(tfrecord_paths, vocab_file) -> dict:
    """What pretraining records hold, from the records themselves (any writer's).

    Args:
        tfrecord_paths: list of str. TFRecord files of pretraining Examples.
        vocab_file: str. The vocab.txt they were made with (for the id of [MASK]).

    Returns:
        dict: instances; mean_length (mean sum of input_mask); masked_share (mean of
        sum(masked_lm_weights) / sum(input_mask)); mask_token_share, kept_share, random_share
        (of all masked positions: the input id is [MASK], is the label, is another word);
        random_next_share (mean next_sentence_labels).

    Example:
    >>> import tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "sample.tfrecord")
    >>> _ = create_pretraining_data(["tests/fixtures/sample_text.txt"],
    ...     "tests/fixtures/vocab-uncased.txt", out, dupe_factor=1, workers=1)
    >>> compute_statistics([out], "tests/fixtures/vocab-uncased.txt")["instances"]
    11
    """
    import numpy as np  # not at the top, for the workers' sake (see create_pretraining_data)
    import tensorflow as tf

    paths = [os.fspath(p) for p in tfrecord_paths]
    mask_id = load_vocab(vocab_file)["[MASK]"]
    first = next(iter(tf.data.TFRecordDataset(paths[:1])), None)
    if first is None:
        raise KbertError(f"{paths[0]}: no records")
    example = tf.train.Example.FromString(first.numpy()).features.feature
    seq = len(example["input_ids"].int64_list.value)
    preds = len(example["masked_lm_ids"].int64_list.value)
    spec = {name: tf.io.FixedLenFeature([seq], tf.int64) for name in ("input_ids", "input_mask")}
    spec.update({name: tf.io.FixedLenFeature([preds], tf.int64)
                 for name in ("masked_lm_positions", "masked_lm_ids")})
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([preds], tf.float32)
    spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
    data = tf.data.TFRecordDataset(paths).batch(4096).map(lambda r: tf.io.parse_example(r, spec))
    sums = collections.Counter()
    for batch in data:
        b = {k: v.numpy() for k, v in batch.items()}
        length = b["input_mask"].sum(axis=1)
        weights = b["masked_lm_weights"] > 0
        inputs = np.take_along_axis(b["input_ids"], b["masked_lm_positions"], axis=1)
        is_mask = (inputs == mask_id) & weights
        is_kept = (inputs == b["masked_lm_ids"]) & weights & ~is_mask
        sums["instances"] += len(length)
        sums["tokens"] += int(length.sum())
        sums["masked_share"] += float((b["masked_lm_weights"].sum(axis=1) / length).sum())
        sums["masked"] += int(weights.sum())
        sums["mask_token"] += int(is_mask.sum())
        sums["kept"] += int(is_kept.sum())
        sums["random_next"] += int(b["next_sentence_labels"].sum())
    n, masked = max(sums["instances"], 1), max(sums["masked"], 1)
    return {
        "instances": sums["instances"],
        "mean_length": sums["tokens"] / n,
        "masked_share": sums["masked_share"] / n,
        "mask_token_share": sums["mask_token"] / masked,
        "kept_share": sums["kept"] / masked,
        "random_share": (sums["masked"] - sums["mask_token"] - sums["kept"]) / masked,
        "random_next_share": sums["random_next"] / n,
    }
