"""New words for a model's vocabulary: checked against its tokenizer, or chosen from a corpus,
and the ids they take.

A domain's key terms ("kubernetes", "systemd", "dpkg") fall into WordPiece pieces under a
general vocabulary. `kbert extend --words FILE` adds the words a user names; `--corpus FILES
--max-new N` adds the N words the corpus would gain most from: occurrences × pieces saved,
each word counted as the model's own tokenizer splits the text. Words go into the vocabulary's
`[unusedN]` slots first, in id order, as google-research/bert's README advises for a handful of
words, and are appended after the last id once the slots are used up. No existing token changes
its id.

This module is plain Python (no TensorFlow): `kbert.extend` grows the weights to match.
"""

from __future__ import annotations

import dataclasses
import re

from kbert.runtime.errors import KbertError, option
from kbert.text.tokenizer import MAX_CHARS_PER_WORD, Tokenizer
from kbert.text.vocab_builder import WordTokenizer

# google-research/bert's vocabularies reserve these lines for users' own tokens (994 in the
# uncased English one); a text never produces them: the basic tokenizer splits "[" and "]" off.
UNUSED_SLOT = re.compile(r"\[unused\d+\]")
_SHOWN = 10  # words listed in an error at most


def _listing(words) -> str:
    words = list(words)
    shown = ", ".join(repr(w) for w in words[:_SHOWN])
    return shown + (f" and {len(words) - _SHOWN} more" if len(words) > _SHOWN else "")


def read_words(path) -> list[str]:
    """The words of a file, one a line: stripped, blank lines skipped, in file order.

    An empty file is an error: there is nothing to add.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        words = [line.strip() for line in f if line.strip()]
    if not words:
        raise KbertError(f"{option('words_file', flag='--words')} {path}: the file has no words; write one word a line")
    return words


def check_words(words, tokenizer: Tokenizer, flag: str | None = None) -> list[str]:
    """`words` as the tokenizer will see them in text (lower-cased and accents stripped for an
    uncased model), duplicates dropped; a one-line error naming every word that cannot be added.

    A word can be added when the basic tokenizer leaves it as one word (no space or punctuation
    inside: "e-mail" reaches WordPiece as "e", "-", "mail") and the vocabulary lacks it.

    Example:
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
    >>> check_words(["Kubernetes", "systemd", "kubernetes"], tokenizer)
    ['kubernetes', 'systemd']
    >>> check_words(["e-mail", "the"], tokenizer)
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: words_file: 'e-mail' is not one word to the tokenizer (it reads 'e', '-', 'mail'): give words without spaces or punctuation
    """
    flag = flag or option("words_file", flag="--words")
    basic = WordTokenizer(tokenizer.do_lower_case)
    split, known, too_long, kept = [], [], [], {}
    for word in words:
        seen = basic.tokenize(word)
        if len(seen) != 1:
            split.append((word, seen))
        elif len(seen[0]) > MAX_CHARS_PER_WORD:
            too_long.append(word)
        elif seen[0] in tokenizer.vocab:
            known.append(word)
        else:
            kept.setdefault(seen[0], word)
    if split:
        word, seen = split[0]
        reads = ", ".join(repr(s) for s in seen) if seen else "nothing"
        more = f" (and {_listing(w for w, _ in split[1:])})" if len(split) > 1 else ""
        raise KbertError(
            f"{flag}: {word!r} is not one word to the tokenizer (it reads {reads}){more}: give words without "
            "spaces or punctuation"
        )
    if too_long:
        raise KbertError(
            f"{flag}: {_listing(too_long)}: longer than {MAX_CHARS_PER_WORD} characters, which the tokenizer "
            "reads as [UNK]; leave them out"
        )
    if known:
        raise KbertError(f"{flag}: already in the vocabulary: {_listing(known)}; leave them out")
    return list(kept)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A word the corpus has, with its count and the pieces the model splits it into now."""

    word: str
    count: int
    pieces: tuple[str, ...]

    @property
    def saves(self) -> int:
        """Tokens the corpus loses when the word becomes one token."""
        return self.count * (len(self.pieces) - 1)

    def to_dict(self) -> dict:
        return {"word": self.word, "count": self.count, "pieces": list(self.pieces), "saves": self.saves}


def candidates(word_counts, tokenizer: Tokenizer, min_count: int = 1, exclude=()) -> list[Candidate]:
    """Every word of `word_counts` ({word: count}, as `kbert.text.vocab_builder.count_words`
    counts under the model's casing) that the vocabulary splits, seen at least `min_count`
    times, best first: most tokens saved, then most frequent, then alphabetical.

    Words WordPiece cannot spell ([UNK]) save no token and are left out, as are `exclude`.

    Example:
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
    >>> for c in candidates({"systemd": 3, "the": 9, "dpkg": 2}, tokenizer):
    ...     print(c.to_dict())
    {'word': 'dpkg', 'count': 2, 'pieces': ['d', '##p', '##k', '##g'], 'saves': 6}
    {'word': 'systemd', 'count': 3, 'pieces': ['system', '##d'], 'saves': 3}
    """
    exclude, found = set(exclude), []
    for word, count in word_counts.items():
        if count < min_count or word in tokenizer.vocab or word in exclude or len(word) > MAX_CHARS_PER_WORD:
            continue
        pieces = tuple(tokenizer.wordpiece(word))
        if len(pieces) > 1:
            found.append(Candidate(word, int(count), pieces))
    found.sort(key=lambda c: (-c.saves, -c.count, c.word))
    return found


def unused_slots(tokens) -> list[int]:
    """Ids of the vocabulary's `[unusedN]` lines, in id order."""
    return [index for index, token in enumerate(tokens) if UNUSED_SLOT.fullmatch(token)]


def place_words(tokens, words) -> tuple[list[str], list[int], int]:
    """The vocabulary with `words` in it: into the `[unusedN]` slots first, in id order, then
    appended. Returns (new tokens, each word's id, how many went into slots).

    Example:
    >>> place_words(["[PAD]", "[unused0]", "a", "[unused1]"], ["x", "y", "z"])
    (['[PAD]', 'x', 'a', 'y', 'z'], [1, 3, 4], 2)
    """
    tokens, slots = list(tokens), unused_slots(tokens)
    ids = []
    for word in words:
        if len(ids) < len(slots):
            tokens[slots[len(ids)]] = word
            ids.append(slots[len(ids)])
        else:
            ids.append(len(tokens))
            tokens.append(word)
    return tokens, ids, min(len(words), len(slots))


def old_piece_ids(words, tokenizer: Tokenizer) -> list[list[int]]:
    """The ids each word was split into by the model's WordPiece (its new row starts as their mean)."""
    return [tokenizer.convert_tokens_to_ids(tokenizer.wordpiece(word)) for word in words]
