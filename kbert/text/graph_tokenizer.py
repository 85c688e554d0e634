"""`GraphTokenizer`: `Tokenizer`'s ids computed inside the TensorFlow graph, for tf.data and SavedModels.

tf.text's `BertTokenizer` and `FastBertTokenizer` disagree with the original on about one
hard line in ten: they case-fold with NFKC (which turns full-width letters into ASCII and
"™" into "tm"), read character classes from ICU's Unicode version, and limit words by bytes
rather than characters. So this layer composes lower-level ops into the original's steps:

1. drop invalid UTF-8 bytes (as `bytes.decode("utf-8", "ignore")`);
2. remove control/format characters, turn whitespace into spaces (`_clean_text`);
3. put spaces around CJK ideographs;
4. lower-case (`tf.strings.lower`, the full Unicode mapping `str.lower` uses), NFD, drop
   non-spacing marks (only when lower-casing);
5. split on whitespace and punctuation, keeping the punctuation;
6. WordPiece with tf.text's `WordpieceTokenizer`, with words over 200 *characters* made [UNK].

The character classes in steps 2, 3, 4 and 5 are written into the graph from Python's
`unicodedata` (`kbert.text.unicode_classes`), the same tables the original reads.
"""

from __future__ import annotations

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from kbert.text import unicode_classes
from kbert.text.tokenizer import MAX_CHARS_PER_WORD, UNK, load_vocab

# tf.text limits words by bytes; 4 bytes per character covers MAX_CHARS_PER_WORD characters,
# and longer words are replaced with [UNK] before the lookup.
_MAX_BYTES_PER_WORD = 4 * MAX_CHARS_PER_WORD


class GraphTokenizer(keras.layers.Layer):
    """Strings [batch] -> WordPiece ids as an int32 `tf.RaggedTensor` [batch, (tokens)].

    Gives the same ids as `kbert.Tokenizer` (and so as google-research/bert's
    FullTokenizer); runs in tf.data, `tf.function` and exported SavedModels.

    Args:
        vocab_file: str. The vocab.txt (line number = id).
        do_lower_case: bool. Lower-case and strip accents.

    Example:
    >>> tokenizer = GraphTokenizer("tests/fixtures/vocab-uncased.txt")
    >>> tokenizer(tf.constant(["Hello, world!"])).to_list()
    [[7592, 1010, 2088, 999]]
    """

    def __init__(self, vocab_file, do_lower_case: bool = True, **kwargs):
        kwargs.setdefault("dtype", "int32")
        super().__init__(trainable=False, **kwargs)
        self.vocab_file = str(vocab_file)
        self.do_lower_case = bool(do_lower_case)
        vocab = load_vocab(self.vocab_file)
        tokens = sorted(vocab, key=vocab.get)
        self._unk_id = vocab.get(UNK, -1)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(tokens), tf.constant([vocab[t] for t in tokens], dtype=tf.int64)
            ),
            default_value=-1,
        )
        self._wordpiece = tf_text.WordpieceTokenizer(
            self._table,
            suffix_indicator="##",
            max_bytes_per_word=_MAX_BYTES_PER_WORD,
            token_out_type=tf.int64,
            unknown_token=UNK,
        )
        self._removed = f"[{unicode_classes.re2_class(unicode_classes.removed_chars())}]"
        breaks = sorted(set(unicode_classes.whitespace_chars()) | set(unicode_classes.split_chars()))
        self._chunk_break = f"[{unicode_classes.re2_class(breaks)}]+"
        self._cjk = "([" + "".join(f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in unicode_classes.CJK_RANGES) + "])"
        self._marks = f"[{unicode_classes.re2_class(unicode_classes.mark_chars())}]"
        punct = f"[{unicode_classes.re2_class(unicode_classes.punctuation_chars())}]"
        self._split = f"[{unicode_classes.re2_class(unicode_classes.split_chars())}]+|{punct}"
        self._keep = punct

    @property
    def table(self) -> tf.lookup.StaticHashTable:
        """The token -> id lookup table (an exported SavedModel must track it)."""
        return self._table

    def words(self, texts):
        """The basic tokens (before WordPiece) as a string RaggedTensor [batch, (words)].

        >>> GraphTokenizer("tests/fixtures/vocab-uncased.txt").words(tf.constant(["Héllo, wörld!"])).to_list()
        [[b'hello', b',', b'world', b'!']]
        """
        chunks, distinct, index = self._distinct_chunks(texts)
        words = tf.gather(self._basic_tokens(distinct), index)  # [chunks, (words)]
        return chunks.with_flat_values(words).merge_dims(1, 2)

    def word_pieces(self, texts):
        """The ids word by word: an int32 RaggedTensor [batch, (words), (pieces)], the shape
        TF Hub's BERT preprocessors give from `tokenize`.

        >>> GraphTokenizer("tests/fixtures/vocab-uncased.txt").word_pieces(tf.constant(["Hello, worldly"])).to_list()
        [[[7592], [1010], [2088, 2135]]]
        """
        chunks, distinct, index = self._distinct_chunks(texts)
        words = self._basic_tokens(distinct)  # [distinct chunks, (words)]
        pieces = words.with_flat_values(self._wordpiece.tokenize(words.flat_values))  # [.., (words), (pieces)]
        pieces = tf.gather(pieces, index)  # [chunks, (words), (pieces)]
        return tf.cast(chunks.with_flat_values(pieces).merge_dims(1, 2), tf.int32)

    def _distinct_chunks(self, texts):
        """(texts split at whitespace [batch, (chunks)], the distinct chunks, each chunk's index
        among them).

        Every later step (cleaning, lower-casing, accents, punctuation, WordPiece) acts within a
        whitespace-separated chunk, as the original's BasicTokenizer acts token by token, so
        each distinct chunk goes through them once: text repeats its words, and those steps
        are nearly all of the cost. Control and format characters are dropped first, so
        "a\\x00b" is one chunk "ab" as in the original (and the split never sees a NUL); the
        split is at the characters that end a token after `_clean_text`: whitespace, and
        U+2028/U+2029.
        """
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        texts = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="ignore")
        texts = tf.strings.regex_replace(texts, self._removed, "")
        chunks = tf_text.regex_split(texts, self._chunk_break, "")
        distinct, index = tf.unique(chunks.flat_values)
        return chunks, distinct, index

    def _basic_tokens(self, chunks):
        """Chunks without whitespace or control characters [n] -> the original's basic tokens,
        a string RaggedTensor [n, (words)]."""
        chunks = tf.strings.regex_replace(chunks, self._cjk, " \\1 ")
        if self.do_lower_case:
            chunks = tf.strings.lower(chunks, encoding="utf-8")
            chunks = tf_text.normalize_utf8(chunks, "NFD")
            chunks = tf.strings.regex_replace(chunks, self._marks, "")
        words = tf_text.regex_split(chunks, self._split, self._keep)
        # The original makes a word of more than 200 characters a single [UNK].
        too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
        return words.with_flat_values(tf.where(too_long, UNK, words.flat_values))

    def call(self, texts):
        return self.word_pieces(texts).merge_dims(1, 2)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_file=self.vocab_file, do_lower_case=self.do_lower_case)
        return config
