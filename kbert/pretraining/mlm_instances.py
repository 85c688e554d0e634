"""Masked-LM-only instances from a `tokenizer.json`: ModernBERT's continued pretraining.

There is no next-sentence task and there are no segments, so an instance is not two segments
but one piece of a document's text, as transformers' run_mlm.py makes them: each line of a
document is encoded on its own, without special tokens, and the lines' tokens are concatenated;
the document is cut into consecutive pieces of max_seq_length - (the template's special tokens)
tokens (with probability short_seq_prob a piece gets a random shorter target, drawn as the BERT
builder draws it), and each piece becomes `[CLS] piece [SEP]` (the tokenizer's own template:
`<s> piece </s>` for RoBERTa's). Instances never cross documents.

Masking is the BERT builder's: every position but the template's specials is a candidate;
min(max_predictions_per_seq, max(1, round(length * masked_lm_prob))) of them are chosen; of
those, 80% become the mask token, 10% stay, 10% become a random id of the BPE model's own
vocabulary (never an added or special token). Chunks are seeded and shuffled as
`InstanceBuilder.chunk` does, so the records do not depend on the number of workers.
"""

from __future__ import annotations

import json
import random

from kbert.pretraining.instances import DataOptions, InstanceCounts, chunk_records, mask_chosen
from kbert.pretraining.python_random import randbelow, shuffle
from kbert.pretraining.record_encoder import ExampleBytes
from kbert.runtime.errors import KbertError, option

MASK_TOKENS = ("[MASK]", "<mask>")  # ModernBERT's, RoBERTa's
_PROBE = "a"  # a text whose tokens sit between the template's prefix and suffix


def mask_token_id(tokenizer) -> int:
    """The id of the tokenizer's mask token ("[MASK]" or "<mask>"), or one line refusing it."""
    for token in MASK_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise KbertError(
        f"{tokenizer.tokenizer_file} has no mask token ({' or '.join(MASK_TOKENS)}); pass the tokenizer.json "
        "of a masked language model (a ModernBERT's)"
    )


def template(tokenizer) -> tuple:
    """(prefix ids, suffix ids): the special tokens the tokenizer's template puts around one text.

    Example:
    >>> from kbert.modernbert.tokenizer import BpeTokenizer
    >>> template(BpeTokenizer("tests/fixtures/hf-tiny/tokenizer.json"))  # [CLS] ... [SEP]
    ([5], [6])
    """
    whole, inner = tokenizer.encode([_PROBE])[0], tokenizer.tokens_only(_PROBE)
    for start in range(len(whole) - len(inner) + 1):
        if whole[start : start + len(inner)] == inner:
            prefix, suffix = whole[:start], whole[start + len(inner) :]
            if (prefix or suffix) and tokenizer.encode([""])[0] == prefix + suffix:
                return prefix, suffix
    raise KbertError(
        f"{tokenizer.tokenizer_file} adds no special tokens around a text (its post_processor); pass the "
        "tokenizer.json of a masked language model (a ModernBERT's, whose template is [CLS] ... [SEP])"
    )


def vocabulary(tokenizer_file: str) -> tuple:
    """(the ids of the tokenizer model's own vocabulary without its added and special tokens: the
    ids a random replacement is drawn from; one more than the largest id of any token).

    Example:
    >>> regular, size = vocabulary("tests/fixtures/hf-tiny/tokenizer.json")
    >>> regular[:4], size  # [PAD] 0, [UNK] 4, [CLS] 5, [SEP] 6, [MASK] 7 are added tokens
    ([1, 2, 3, 8], 300)
    """
    with open(tokenizer_file, encoding="utf-8") as f:
        data = json.load(f)
    vocab = data.get("model", {}).get("vocab") or {}
    ids = set(vocab.values() if isinstance(vocab, dict) else range(len(vocab)))  # Unigram's is a list
    added = {token["id"] for token in data.get("added_tokens") or ()}
    return sorted(ids - added), max(ids | added, default=-1) + 1


class MlmInstanceBuilder:
    """Builds a chunk's masked-LM-only instances as serialized records (`ExampleBytes.mlm_record`);
    one per process.

    Args:
        tokenizer_file: str. The model's tokenizer.json.
        options: DataOptions. whole_word_mask must be off (byte-level BPE has no word pieces).

    Example:
    >>> builder = MlmInstanceBuilder("tests/fixtures/hf-tiny/tokenizer.json", DataOptions(16, 5, 0.3, 1))
    >>> records, counts = builder.chunk(0, [["Hello there, world.", "And more text here."]])
    >>> counts.instances >= 1, counts.documents
    (True, 1)
    """

    def __init__(self, tokenizer_file: str, options: DataOptions):
        from kbert.modernbert.tokenizer import BpeTokenizer  # its `tokenizers` import: only when used

        self.tokenizer = BpeTokenizer(tokenizer_file)
        self.options = options
        mask = mask_token_id(self.tokenizer)
        prefix, suffix = template(self.tokenizer)
        self.regular, vocab_size = vocabulary(tokenizer_file)
        if not self.regular:
            raise KbertError(
                f"{tokenizer_file}: its model has no vocabulary of its own; pass a ModernBERT's tokenizer.json"
            )
        self.bytes = ExampleBytes(options.max_seq_length, options.max_predictions_per_seq, vocab_size)
        varint = self.bytes.varint
        self.prefix, self.suffix = [varint[i] for i in prefix], [varint[i] for i in suffix]
        self.mask = varint[mask]
        self.vocab_words = [varint[i] for i in self.regular]  # a random replacement's choices
        self.max_piece = options.max_seq_length - len(prefix) - len(suffix)
        if self.max_piece < 2:
            raise KbertError(
                f"{option('max_seq_length', options.max_seq_length)} leaves fewer than two tokens beside the template's "
                f"{len(prefix) + len(suffix)} special tokens; pass a larger one"
            )

    def chunk(self, index: int, raw_documents: list) -> tuple[list, InstanceCounts]:
        """Records (serialized, shuffled) and counts of one chunk of documents."""
        varint, tokens_only = self.bytes.varint, self.tokenizer.tokens_only

        def read(lines):  # a document: its lines' tokens, one after another
            return [varint[i] for line in lines for i in tokens_only(line)]

        return chunk_records(index, raw_documents, self.options, read, self.document)

    def document(self, documents: list, document_index: int, rng: random.Random, records: list, counts: InstanceCounts):
        """Append the records of one document's pass: its consecutive pieces, in order."""
        document = documents[document_index]
        start, max_piece, short_seq_prob = 0, self.max_piece, self.options.short_seq_prob
        while start < len(document):
            target = max_piece
            if rng.random() < short_seq_prob:
                target = 2 + randbelow(rng, max_piece - 1)  # rng.randint(2, max_piece), as BERT's builder
            records.append(self.instance(document[start : start + target], rng, counts))
            start += target

    def instance(self, piece: list, rng: random.Random, counts: InstanceCounts) -> bytes:
        """Mask prefix + piece + suffix and serialize it."""
        opts = self.options
        tokens = [*self.prefix, *piece, *self.suffix]
        n = len(tokens)
        num_to_predict = min(opts.max_predictions_per_seq, max(1, int(round(n * opts.masked_lm_prob))))
        candidates = list(range(len(self.prefix), len(self.prefix) + len(piece)))
        shuffle(candidates, rng)
        chosen = candidates[:num_to_predict]
        output = mask_chosen(tokens, chosen, self.mask, self.vocab_words, rng, counts)
        return self.bytes.mlm_record(output, chosen, [tokens[p] for p in chosen])
