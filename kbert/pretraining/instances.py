"""create_pretraining_data.py's algorithm: documents -> masked-LM + next-sentence instances.

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
it; create-data streams it in chunks of a few thousand documents (`chunk_docs`, `chunk_bytes`;
`create_data.read_chunks`) and builds each chunk alone, which is what bounds memory on corpora
larger than RAM and lets worker processes share the work. That has three consequences:
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

Read it beside google-research/bert's create_pretraining_data.py; the parts come in the
original's order:
- its flags: `DataOptions`;
- create_training_instances: `InstanceBuilder.chunk` (one chunk, not the whole corpus);
- create_instances_from_document: `InstanceBuilder.document`;
- create_masked_lm_predictions: `InstanceBuilder.instance` and `whole_word_candidates`;
- truncate_seq_pair: `truncate_seq_pair`.
There is no TrainingInstance: `instance` serializes each one at once (kbert.pretraining.record_encoder),
and `InstanceCounts` keeps what the statistics need. Every document is tokenized once, not once
per `dupe_factor` pass.
"""

from __future__ import annotations

import dataclasses
import random

from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.pretraining.python_random import randbelow, shuffle
from kbert.pretraining.record_encoder import ExampleBytes
from kbert.runtime.errors import KbertError, option
from kbert.text.tokenizer import Tokenizer

_SEED_STRIDE = 1 << 64


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
            (
                self.max_seq_length < 5,
                f"{option('max_seq_length')} must be at least 5 ([CLS], [SEP], [SEP] and two tokens)",
            ),
            (self.max_predictions_per_seq < 1, f"{option('max_predictions_per_seq')} must be at least 1"),
            (not 0 < self.masked_lm_prob <= 1, f"{option('masked_lm_prob')} must be in (0, 1]"),
            (self.dupe_factor < 1, f"{option('dupe_factor')} must be at least 1"),
            (not 0 <= self.short_seq_prob <= 1, f"{option('short_seq_prob')} must be in [0, 1]"),
            (not 0 <= self.seed < _SEED_STRIDE, f"{option('seed')} must be in [0, 2**64)"),
        ]
        for bad, message in problems:
            if bad:
                raise KbertError(message)


class InstanceCounts:
    """How many instances, documents, tokens and masks a chunk made, summed so that the parent
    can merge chunks in order."""

    # Slots: the counts are updated for every instance, and slot attributes are the fastest to update.
    __slots__ = (
        "instances",
        "documents",
        "empty_documents",
        "tokens",
        "masked_share_sum",
        "masked",
        "mask_token",
        "kept",
        "random_next",
    )

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def add(self, other: InstanceCounts):
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
        self.bytes = ExampleBytes(options.max_seq_length, options.max_predictions_per_seq, max(vocab.values()) + 1)
        # A token is held as the varint bytes of its id, one shared object per id: a record's
        # input_ids are then one bytes.join, and equal tokens are the same object.
        self.token = {word: self.bytes.varint[index] for word, index in vocab.items()}
        self.cls, self.sep, self.mask = self.token["[CLS]"], self.token["[SEP]"], self.token["[MASK]"]
        # The original draws a random word from list(vocab.keys()) and looks its id up.
        self.vocab_words = [self.token[word] for word in vocab]
        self.pieces = {self.token[word] for word in vocab if word.startswith("##")}

    def chunk(self, index: int, raw_documents: list) -> tuple[list, InstanceCounts]:
        """Records (serialized, shuffled) and counts of one chunk of documents
        (create_training_instances)."""
        tokenize, token = self.tokenizer.tokenize, self.token

        def read(lines):  # a document: its sentences' tokens, empty sentences left out
            return [ids for ids in ([token[t] for t in tokenize(line)] for line in lines) if ids]

        return chunk_records(index, raw_documents, self.options, read, self.document)

    def document(self, documents: list, document_index: int, rng: random.Random, records: list, counts: InstanceCounts):
        """Append the records of one document's pass (create_instances_from_document)."""
        document = documents[document_index]
        max_num_tokens = self.options.max_seq_length - 3
        target_length = max_num_tokens
        if rng.random() < self.options.short_seq_prob:
            target_length = 2 + randbelow(rng, max_num_tokens - 1)  # rng.randint(2, max_num_tokens)
        pending, pending_length, i = [], 0, 0
        while i < len(document):
            pending.append(document[i])
            pending_length += len(document[i])
            if i == len(document) - 1 or pending_length >= target_length:
                a_end = 1 + randbelow(rng, len(pending) - 1) if len(pending) >= 2 else 1
                tokens_a = _joined(pending[:a_end])
                if len(pending) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_length - len(tokens_a)
                    # Ten tries at another document; with one document it is itself.
                    for _ in range(10):
                        random_index = randbelow(rng, len(documents))
                        if random_index != document_index:
                            break
                    random_document = documents[random_index]
                    tokens_b = []
                    for j in range(randbelow(rng, len(random_document)), len(random_document)):
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

    def instance(
        self, tokens_a: list, tokens_b: list, is_random_next: bool, rng: random.Random, counts: InstanceCounts
    ) -> bytes:
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
        output = mask_chosen(tokens, chosen, self.mask, self.vocab_words, rng, counts)
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


def chunk_records(index: int, raw_documents: list, options: DataOptions, read, build) -> tuple[list, InstanceCounts]:
    """A chunk's records, shuffled, and counts, in create_training_instances' order of draws: each
    document read once (`read(lines)`: its tokens, empty if none), the documents shuffled, then
    `dupe_factor` passes each building every document's records (`build(documents, i, rng,
    records, counts)`), then the records shuffled.

    Example:
    >>> def build(documents, i, rng, records, counts):
    ...     records.append(documents[i])
    >>> records, counts = chunk_records(0, [["a"], [], ["b"]], DataOptions(dupe_factor=2), lambda lines: lines, build)
    >>> sorted(records), counts.documents, counts.empty_documents
    ([['a'], ['a'], ['b'], ['b']], 2, 1)
    """
    counts = InstanceCounts()
    rng = random.Random(options.seed + index * _SEED_STRIDE)
    documents = []
    for lines in raw_documents:
        document = read(lines)
        if document:
            documents.append(document)
        else:
            counts.empty_documents += 1
    counts.documents = len(documents)
    shuffle(documents, rng)
    records = []
    for _ in range(options.dupe_factor):
        for document_index in range(len(documents)):
            build(documents, document_index, rng, records, counts)
    shuffle(records, rng)
    return records, counts


def mask_chosen(tokens: list, chosen: list, mask, vocab_words: list, rng: random.Random, counts: InstanceCounts):
    """The instance's tokens with its `chosen` positions masked as the original masks them (80%
    `mask`, 10% kept, 10% a random word of `vocab_words`, in the original's draws); `chosen` is
    sorted in place, and `counts` adds the instance.

    Example:
    >>> counts = InstanceCounts()
    >>> chosen = [3, 1]
    >>> mask_chosen(["a", "b", "c", "d"], chosen, "[MASK]", ["x"], random.Random(0), counts), chosen
    (['a', '[MASK]', 'c', 'x'], [1, 3])
    """
    output = tokens[:]
    random_draw = rng.random
    mask_token = kept = 0
    for index in chosen:
        if random_draw() < 0.8:
            output[index] = mask
            mask_token += 1
        elif random_draw() < 0.5:
            kept += 1  # the original token stays
        else:
            word = vocab_words[randbelow(rng, len(vocab_words))]
            output[index] = word
            # Counted as compute_statistics reads the record: by what the input shows.
            mask_token += word is mask
            kept += word is tokens[index]
    chosen.sort()
    n = len(tokens)
    counts.instances += 1
    counts.tokens += n
    counts.masked += len(chosen)
    counts.masked_share_sum += len(chosen) / n
    counts.mask_token += mask_token
    counts.kept += kept
    return output


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
        tokens_a = tokens_a[cuts[0] : cuts[0] + len_a]
    if cuts[2] or cuts[3]:
        tokens_b = tokens_b[cuts[2] : cuts[2] + len_b]
    return tokens_a, tokens_b
