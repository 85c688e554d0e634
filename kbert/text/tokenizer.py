"""`Tokenizer`: the same tokens and ids as google-research/bert's `tokenization.FullTokenizer`.

The steps are the original's: clean the text (drop control characters, map whitespace to
spaces), put spaces around CJK ideographs, split on whitespace, lower-case and strip
accents (only when lower-casing), split off punctuation, then greedy longest-match-first
WordPiece with `##` continuations and `[UNK]` for words over 200 characters or with no match.

It is faster than the original because the per-character Python loops become `str.translate`
tables and regexes built once, and because each distinct whitespace-separated word is
tokenized once and then looked up.
"""

from __future__ import annotations

import os
import re
import unicodedata

from kbert.config import VOCAB_FILE, load_config
from kbert.runtime.errors import KbertError
from kbert.text import unicode_classes

UNK = "[UNK]"
# The reserved tokens every BERT vocabulary starts with, and the prefix of a piece that continues a word.
RESERVED_TOKENS = ["[PAD]", UNK, "[CLS]", "[SEP]", "[MASK]"]
JOINER = "##"
MAX_CHARS_PER_WORD = 200
_CACHE_LIMIT = 500_000


def vocab_tokens(vocab_file) -> list[str]:
    """Every id's token (id -> token): line `id` of vocab.txt, stripped, as tokenization.load_vocab reads it.

    A token on several lines keeps each of its ids here, so every id a model predicts has a
    token, where the original's `inv_vocab` (built from `load_vocab`) lacks the earlier ones.

    Example:
    >>> vocab_tokens("tests/fixtures/tf1-tiny/vocab.txt")[16:18], load_vocab("tests/fixtures/tf1-tiny/vocab.txt")["4"]
    (['4', ':'], 185)
    """
    if not os.path.isfile(vocab_file):
        raise KbertError(f"{vocab_file}: no such vocab file; pass the vocab.txt of the model")
    # As the original's tf.gfile readline reads them: lines end at "\n" only (as `count_lines`
    # counts them), and TensorFlow's line reader drops every "\r", inside a line too.
    with open(vocab_file, encoding="utf-8", newline="\n") as f:
        return [line.replace("\r", "").strip() for line in f]


def load_vocab(vocab_file) -> dict[str, int]:
    """{token: id} as tokenization.load_vocab reads it: one token per line, stripped; a token on
    several lines gets the last line's id (the original assigns them in order, so the last wins).

    Example:
    >>> load_vocab("tests/fixtures/tf1-tiny/vocab.txt")["a"]
    106
    """
    return {token: index for index, token in enumerate(vocab_tokens(vocab_file))}


def convert_to_unicode(text) -> str:
    """str as is; bytes decoded as UTF-8 with invalid bytes dropped, as the original does."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8", "ignore")
    raise TypeError(f"expected str or bytes, got {type(text).__name__}")


class _Tables:
    """Translate tables and regexes, built once per process from `unicode_classes`."""

    def __init__(self):
        clean = dict.fromkeys(unicode_classes.removed_chars())
        clean.update(dict.fromkeys(unicode_classes.whitespace_chars(), " "))
        self.clean = clean
        self.ascii_clean = {cp: v for cp, v in clean.items() if cp < 128}
        self.strip_marks = dict.fromkeys(unicode_classes.mark_chars())
        cjk = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in unicode_classes.CJK_RANGES)
        self.cjk = re.compile(f"([{cjk}])")
        punct = unicode_classes.python_class(unicode_classes.punctuation_chars())
        self.punct_split = re.compile(f"[{punct}]|[^{punct}]+")


_TABLES = None


def character_tables() -> _Tables:
    global _TABLES
    if _TABLES is None:
        _TABLES = _Tables()
    return _TABLES


class Tokenizer:
    """google-research/bert's FullTokenizer: basic tokenization, then WordPiece.

    Args:
        vocab_file: str. A vocab.txt, one token per line (the line number is the id).
        do_lower_case: bool. Lower-case and strip accents (True for "uncased" models).

    Example:
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
    >>> tokenizer.tokenize("Hello, world!")
    ['hello', ',', 'world', '!']
    >>> tokenizer.convert_tokens_to_ids(["hello", "[UNK]"])
    [7592, 100]
    >>> tokenizer.tokenize("unaffable Ünïcödé")
    ['una', '##ffa', '##ble', 'unicode']
    """

    def __init__(self, vocab_file, do_lower_case: bool = True):
        self.vocab_file = os.fspath(vocab_file)
        tokens = vocab_tokens(self.vocab_file)
        self.vocab = {token: index for index, token in enumerate(tokens)}  # load_vocab: the last id wins
        # id -> token from the lines themselves: an earlier copy of a repeated token keeps its token.
        self.inv_vocab = dict(enumerate(tokens))
        self.do_lower_case = bool(do_lower_case)
        self._tables = character_tables()
        self._cache: dict[str, list[str]] = {}

    @classmethod
    def from_model_dir(cls, model_dir) -> Tokenizer:
        """The tokenizer of a kbert model directory (its vocab.txt and do_lower_case)."""
        config = load_config(model_dir)
        return cls(os.path.join(model_dir, VOCAB_FILE), config.extras.get("do_lower_case", True))

    # --- FullTokenizer's API ---
    def tokenize(self, text) -> list[str]:
        """WordPiece tokens of `text` (str, or UTF-8 bytes)."""
        text = convert_to_unicode(text)
        tables = self._tables
        if text.isascii():
            text = text.translate(tables.ascii_clean)
        else:
            text = tables.cjk.sub(r" \1 ", text.translate(tables.clean))
        out = []
        cache = self._cache
        for word in text.split():
            pieces = cache.get(word)
            if pieces is None:
                pieces = self._tokenize_word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = pieces
            out.extend(pieces)
        return out

    def convert_tokens_to_ids(self, tokens) -> list[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.inv_vocab[int(i)] for i in ids]

    # --- the steps ---
    def basic_tokens(self, word: str) -> list[str]:
        """One whitespace-free word -> lower-cased, accent-stripped, punctuation-split tokens."""
        if self.do_lower_case:
            word = word.lower()
            if not word.isascii():
                word = unicodedata.normalize("NFD", word).translate(self._tables.strip_marks)
        return self._tables.punct_split.findall(word)

    def wordpiece(self, token: str) -> list[str]:
        """Greedy longest-match-first WordPiece of one token; [UNK] if any part has no match."""
        if len(token) > MAX_CHARS_PER_WORD:
            return [UNK]
        vocab = self.vocab
        if token in vocab:
            return [token]
        pieces, start = [], 0
        while start < len(token):
            end = len(token)
            while end > start:
                piece = token[start:end] if start == 0 else JOINER + token[start:end]
                if piece in vocab:
                    break
                end -= 1
            else:
                return [UNK]
            pieces.append(piece)
            start = end
        return pieces

    def _tokenize_word(self, word: str) -> list[str]:
        return [piece for token in self.basic_tokens(word) for piece in self.wordpiece(token)]
