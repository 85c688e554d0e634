"""`kbert vocab`: learn a WordPiece vocab.txt from text, made for `kbert.Tokenizer`.

The learner is tensorflow-text's (`kbert.text.tf_text_vocab`, the one behind TF Text's BERT
vocabulary guide): tensorflow-text is already a dependency for in-graph tokenization, so this
adds none, where Hugging Face `tokenizers` would add one. It is imported only to learn, so
counting words and measuring [UNK] (`kbert extend` uses both) load no TensorFlow.

It learns from word counts, and the words are those kbert.Tokenizer hands to WordPiece: the
text cleaned, split on whitespace, lower-cased and accent-stripped (unless cased), with
punctuation and CJK ideographs split off. So every piece learned is one the tokenizer can use,
and every character the learner keeps (the 1,000 most frequent) tokenizes without [UNK].

Layout: [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4, then the learner's order: single
characters, then pieces by falling count (## continuations among them). The released BERT
vocabularies put [UNK] at 100 and reserve [unusedN] slots; kbert looks special tokens up by
name, so nothing depends on those ids, and a small --size is not swamped by 999 reserved lines.
"""

from __future__ import annotations

import collections
import logging
import os
import time

from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import TEXT_CHECK_BYTES, atomic_write_text, check_head_is_text, writes
from kbert.text.tokenizer import RESERVED_TOKENS, UNK, Tokenizer, character_tables

log = logging.getLogger("kbert")


class WordTokenizer(Tokenizer):
    """kbert.Tokenizer with WordPiece switched off: the words WordPiece would be given.

    Args:
        do_lower_case: bool. Lower-case and strip accents, as the Tokenizer does.

    Example:
    >>> WordTokenizer(do_lower_case=True).tokenize("Héllo, wörld!  北京")
    ['hello', ',', 'world', '!', '北', '京']
    """

    def __init__(self, do_lower_case: bool = True):
        # No vocabulary to load; the cleaning tables and word cache are the Tokenizer's own.
        self.vocab_file, self.vocab, self.inv_vocab = None, {}, {}
        self.do_lower_case = bool(do_lower_case)
        self._tables = character_tables()
        self._cache = {}

    def wordpiece(self, token: str) -> list[str]:
        return [token]


_PROGRESS_BYTES = 1 << 20  # bytes read between two calls of a progress callback


def _lines(input_files, on_progress=None):
    total = sum(os.path.getsize(path) for path in input_files) if on_progress else 0
    done = reported = 0
    for path in input_files:
        with open(path, "rb") as f:
            for raw in f:
                # Invalid UTF-8 becomes U+FFFD, which the tokenizer's cleaning drops.
                yield raw.decode("utf-8", "replace")
                done += len(raw)
                if on_progress and done - reported >= _PROGRESS_BYTES:
                    on_progress(done, total)
                    reported = done
    if on_progress:
        on_progress(done, total)


def count_words(input_files, do_lower_case: bool = True, on_progress=None) -> collections.Counter:
    """How often each word (as kbert.Tokenizer splits text before WordPiece) occurs.

    Args:
        input_files: list of str. Text files.
        do_lower_case: bool. Lower-case and strip accents.
        on_progress: callable(bytes_read, bytes_in_all) or None: called every MiB read, and at the end.

    Example:
    >>> count_words(["tests/fixtures/sample_text.txt"]).most_common(3)
    [(',', 73), ('the', 59), ('of', 34)]
    """
    words, counts = WordTokenizer(do_lower_case), collections.Counter()
    for line in _lines(input_files, on_progress):
        counts.update(words.tokenize(line))
    return counts


def unk_rate(input_files, vocab_file, do_lower_case: bool = True) -> float:
    """Share of the tokens kbert.Tokenizer makes of the text that are [UNK].

    Example:
    >>> unk_rate(["tests/fixtures/sample_text.txt"], "tests/fixtures/vocab-uncased.txt")
    0.0
    """
    tokenizer, tokens, unknown = Tokenizer(vocab_file, do_lower_case), 0, 0
    for line in _lines(input_files):
        pieces = tokenizer.tokenize(line)
        tokens += len(pieces)
        unknown += pieces.count(UNK)
    return unknown / max(tokens, 1)


def _write_lines_atomically(path: str, lines: list[str]):
    """Never a half-written vocab.txt: see `atomic_write_text`."""
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def unk_rate_of_counts(word_counts, vocab_file, do_lower_case: bool = True) -> float:
    """`unk_rate` from word counts: the tokenizer's pieces are per word, so it is the same number.

    >>> unk_rate_of_counts(count_words(["tests/fixtures/sample_text.txt"]), "tests/fixtures/vocab-uncased.txt")
    0.0
    """
    tokenizer, tokens, unknown = Tokenizer(vocab_file, do_lower_case), 0, 0
    for word, count in word_counts.items():
        pieces = tokenizer.wordpiece(word)
        tokens += count * len(pieces)
        unknown += count * pieces.count(UNK)
    return unknown / max(tokens, 1)


@writes("output")
def build_vocab(
    input_files, output, size: int = 30522, do_lower_case: bool = True, overwrite: bool = False, word_counts=None
) -> dict:
    """Learn a vocab.txt from text and check it on that text.

    Args:
        input_files: list of str. Text files (any line layout).
        output: str. The vocab.txt to write (atomically).
        size: int. Entries at most, reserved tokens included (the learner aims within 5% below).
        do_lower_case: bool. Uncased (lower-case, strip accents) or cased vocabulary.
        overwrite: bool. Replace `output` if it exists and is not empty.
        word_counts: callable(input_files, do_lower_case) -> Counter, or None for `count_words`
            (the Beam pipeline passes its own counter).

    Returns:
        dict: vocab_file, size, requested_size, do_lower_case, words, distinct_words,
        unk_rate (of kbert.Tokenizer with the new vocabulary on the same text), seconds.

    Example:
    >>> import tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "vocab.txt")
    >>> result = build_vocab(["tests/fixtures/sample_text.txt"], out, size=400)
    >>> result["size"] <= 400, result["unk_rate"]
    (True, 0.0)
    """
    started = time.perf_counter()
    input_files, output = [os.fspath(p) for p in input_files], os.fspath(output)
    if not input_files:
        raise KbertError(f"no input files; pass {option('input_files', flag='--input')} with the text to learn from")
    for path in input_files if word_counts is None else ():  # Beam checks its own paths and globs
        if not os.path.isfile(path):
            raise KbertError(f"{path}: no such input file; pass text files to learn the vocabulary from")
        with open(path, "rb") as f:
            check_head_is_text(path, f.read(TEXT_CHECK_BYTES))
    if os.path.isdir(output):
        raise KbertError(f"{output} is a directory; give a file path such as {output}/vocab.txt")
    if os.path.exists(output) and os.path.getsize(output) > 0 and not overwrite:
        raise KbertError(
            f"{output} exists and is not empty; pass {option('overwrite', True)} to replace it, or choose a new output "
            "path"
        )
    if size < len(RESERVED_TOKENS) + 2:
        raise KbertError(
            f"{option('size', size)} is too small; a vocabulary needs the "
            f"{len(RESERVED_TOKENS)} reserved tokens and the text's characters"
        )

    counts = (word_counts or count_words)(input_files, do_lower_case)
    if not counts:
        raise KbertError(f"{', '.join(input_files)}: no words to learn from; pass text files")
    log.info(
        "%s words, %s distinct; learning %s WordPieces", f"{sum(counts.values()):,}", f"{len(counts):,}", f"{size:,}"
    )
    # Here, not at the top: TF Text's learner loads TensorFlow, which counting words does not need.
    from kbert.text.tf_text_vocab import learn_vocab

    vocab = learn_vocab(counts, size)
    _write_lines_atomically(output, vocab)
    return {
        "vocab_file": output,
        "size": len(vocab),
        "requested_size": size,
        "do_lower_case": bool(do_lower_case),
        "words": sum(counts.values()),
        "distinct_words": len(counts),
        "unk_rate": unk_rate_of_counts(counts, output, do_lower_case),
        "seconds": round(time.perf_counter() - started, 3),
    }
