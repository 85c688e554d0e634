"""A byte-level BPE `tokenizer.json` as TensorFlow ops: raw text -> `input_ids` and `input_mask`
inside a SavedModel, the ids `tokenizers` gives (`kbert.modernbert.tokenizer`), with the
template's special tokens and its truncation.

The steps are `tokenizers`' own, in its order:
1. the normalizer (none, or NFC);
2. the added tokens ([CLS], [MASK], ...) cut out of the text, leftmost and longest first, with
   the whitespace their `lstrip` / `rstrip` take;
3. the ByteLevel split of each other piece (the GPT-2 regex; RE2 has no look-ahead, so each
   whitespace run is cut as Oniguruma's `\\s+(?!\\S)` cuts it, by hand);
4. each piece's bytes as the ByteLevel alphabet, merged pair by pair (lowest rank, leftmost);
5. the post-processor's template around the sequences, cut to the length longest first.

keras-hub's `BytePairTokenizer` was checked first: its split differs from `tokenizers` on a
quote after punctuation ("-'s", "🙂'll"), so kbert does not build on it.

Anything else in a tokenizer.json (another model, normalizer or pre-tokenizer, BPE dropout,
`single_word` tokens) is refused by `graph_problem` in one line, never tokenized differently.

Example:
>>> tokenizer = BpeGraphPacker("out/modernbert/tokenizer.json", sequence_length=16)  # doctest: +SKIP
>>> tokenizer((tf.constant(["Hello, world!"]), tf.constant([""])))["input_ids"].shape  # doctest: +SKIP
TensorShape([1, 16])
"""

from __future__ import annotations

import json
import re

import tensorflow as tf
import tensorflow_text as tf_text

from kbert.modernbert.onig_classes import LETTER, NUMBER, WHITESPACE
from kbert.runtime.errors import KbertError

# The ByteLevel split without its look-ahead: contractions, then a letter, number or other run
# with at most one space before it, then whitespace (whose runs are cut beforehand).
OTHER = f"[^{WHITESPACE}{LETTER}{NUMBER}]"
PIECE = f"'s|'t|'re|'ve|'m|'ll|'d| ?[{LETTER}]+| ?[{NUMBER}]+| ?{OTHER}+|[{WHITESPACE}]+"
# A whitespace run with the non-space run after it, or a run at the end.
CHUNK = f"[{WHITESPACE}]*[^{WHITESPACE}]+|[{WHITESPACE}]+"


def _bytes_to_unicode() -> dict:
    """GPT-2's map of the 256 byte values to printable characters (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _template(post_processor) -> tuple:
    """(single, pair): each a list of ids and "A"/"B" for the sequences, from the post-processor."""
    if post_processor is None:
        return ["A"], ["A", "B"]
    kind = post_processor.get("type")
    if kind == "TemplateProcessing":
        specials = post_processor.get("special_tokens", {})

        def items(template):
            out = []
            for item in template:
                if "Sequence" in item:
                    out.append(item["Sequence"]["id"])
                else:
                    out.extend(specials[item["SpecialToken"]["id"]]["ids"])
            return out

        return items(post_processor["single"]), items(post_processor["pair"])
    if kind in ("BertProcessing", "RobertaProcessing"):
        sep, cls = post_processor["sep"][1], post_processor["cls"][1]
        middle = [sep, sep] if kind == "RobertaProcessing" else [sep]
        return [cls, "A", sep], [cls, "A", *middle, "B", sep]
    raise KbertError(f"post-processor {kind}")


def _pre_tokenizer(spec):
    """The ByteLevel pre-tokenizer's settings (add_prefix_space, use_regex)."""
    if spec is None:
        raise KbertError("no pre-tokenizer (a byte-level BPE splits with ByteLevel)")
    if spec.get("type") == "Sequence" and len(spec.get("pretokenizers", [])) == 1:
        spec = spec["pretokenizers"][0]
    if spec.get("type") != "ByteLevel":
        raise KbertError(f"pre-tokenizer {spec.get('type')}")
    return bool(spec.get("add_prefix_space", False)), bool(spec.get("use_regex", True))


def _normalizer(spec):
    kinds = (
        []
        if spec is None
        else [s.get("type") for s in spec.get("normalizers", [])]
        if spec.get("type") == "Sequence"
        else [spec.get("type")]
    )
    if any(kind != "NFC" for kind in kinds):
        raise KbertError(f"normalizer {', '.join(k for k in kinds if k != 'NFC')}")
    return bool(kinds)


def read_graph_spec(tokenizer_file) -> dict:
    """What the graph needs of a tokenizer.json, or one line saying what it holds that the graph
    cannot run (tokenizing it otherwise would give other ids than `tokenizers`)."""
    with open(tokenizer_file, encoding="utf-8") as f:
        spec = json.load(f)
    model = spec.get("model") or {}
    try:
        if model.get("type") != "BPE":
            raise KbertError(f"model {model.get('type')}")
        if model.get("dropout"):
            raise KbertError("BPE dropout")
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            raise KbertError("subword prefixes or suffixes")
        vocab = dict(model["vocab"])
        merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
        alphabet = _bytes_to_unicode()
        if any(c not in vocab for c in alphabet.values()):
            raise KbertError("a vocabulary without every byte")
        added = spec.get("added_tokens") or []
        if any(token.get("single_word") for token in added):
            raise KbertError("single_word added tokens")
        add_prefix_space, use_regex = _pre_tokenizer(spec.get("pre_tokenizer"))
        nfc = _normalizer(spec.get("normalizer"))
        single, pair = _template(spec.get("post_processor"))
    except KbertError as e:
        raise KbertError(
            f"{tokenizer_file}: its {e} is not something the export's in-graph byte-level BPE runs; "
            f"serve it with `kbert predict` or `kbert embed` instead"
        ) from None
    return {
        "vocab": vocab,
        "merges": merges,
        "ignore_merges": bool(model.get("ignore_merges", False)),
        "alphabet": alphabet,
        "added": added,
        "add_prefix_space": add_prefix_space,
        "use_regex": use_regex,
        "nfc": nfc,
        "single": single,
        "pair": pair,
    }


def graph_problem(tokenizer_file) -> str | None:
    """None if the graph tokenizes `tokenizer_file` exactly, else the one line that says why not."""
    try:
        read_graph_spec(tokenizer_file)
    except KbertError as e:
        return str(e)
    return None


def _table(keys, values, default):
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(values)), default_value=default
    )


class BpeGraphPacker(tf.Module):
    """Texts (and second texts, "" for none) -> int32 `input_ids` and `input_mask`
    [batch, sequence_length], as `kbert.modernbert.packing.BpePacker` packs them.

    Args:
        tokenizer_file: a byte-level BPE tokenizer.json (`read_graph_spec` says which).
        sequence_length: every row's length; longer texts are cut longest first.
        pad_token_id: the id padding gets.
    """

    NO_RANK = 2**31 - 1

    def __init__(self, tokenizer_file, sequence_length: int, pad_token_id: int = 0):
        super().__init__(name="bpe_graph_packer")
        spec = read_graph_spec(tokenizer_file)
        self.sequence_length = int(sequence_length)
        self.pad_token_id = int(pad_token_id)
        self.single, self.pair = spec["single"], spec["pair"]
        self.add_prefix_space, self.use_regex, self.nfc = spec["add_prefix_space"], spec["use_regex"], spec["nfc"]
        self.ignore_merges = spec["ignore_merges"]
        vocab = spec["vocab"]
        self._ids = _table(list(vocab), list(vocab.values()), -1)
        self._ranks = _table(spec["merges"], list(range(len(spec["merges"]))), self.NO_RANK)
        alphabet = spec["alphabet"]
        self._alphabet = _table([bytes([b]) for b in alphabet], list(alphabet.values()), "")
        added = spec["added"]
        # Leftmost, then longest: the longer of two tokens that start at one place is tried first.
        contents = sorted((t["content"] for t in added), key=len, reverse=True)
        self._added_pattern = "|".join(re.escape(c) for c in contents) if added else None
        self._added_ids = _table([t["content"] for t in added], [t["id"] for t in added], -1) if added else None
        self._lstrip = (
            _table([t["content"] for t in added], [bool(t.get("lstrip")) for t in added], False) if added else None
        )
        self._rstrip = (
            _table([t["content"] for t in added], [bool(t.get("rstrip")) for t in added], False) if added else None
        )

    # === Text -> ids of each text, no special tokens ===

    def _pieces(self, texts):
        """[batch] -> ([batch, (pieces)] strings, each piece's added token id or -1 for text)."""
        if self.nfc:
            texts = tf_text.normalize_utf8(texts, "NFC")
        if self._added_pattern is None:
            pieces = tf.RaggedTensor.from_tensor(tf.expand_dims(texts, 1))
            pieces = tf.ragged.boolean_mask(pieces, tf.strings.length(pieces) > 0)
            return pieces, tf.ones_like(pieces, tf.int32) * -1
        return self._split_added(texts)

    def _split_added(self, texts):
        """Texts cut around their added tokens as `tokenizers`' AddedVocabulary cuts them: each
        token's place, widened over the whitespace before it (lstrip, not into the token before)
        and after it (rstrip, even over a whitespace token that follows, which is then a token
        too), and the text between places that are apart."""
        found, begins, ends = tf_text.regex_split_with_offsets(texts, self._added_pattern, self._added_pattern)
        is_token = tf.strings.regex_full_match(found, self._added_pattern)
        tokens = tf.ragged.boolean_mask(found, is_token)  # [batch, (tokens)]
        begin = tf.ragged.boolean_mask(begins, is_token).flat_values
        end = tf.ragged.boolean_mask(ends, is_token).flat_values
        token = tokens.flat_values
        row = tokens.value_rowids()
        text = tf.gather(texts, row)
        before = tf.strings.regex_replace(
            tf.strings.substr(text, tf.zeros_like(begin), begin), f"(?s)^.*?([{WHITESPACE}]*)$", r"\1"
        )
        after = tf.strings.regex_replace(
            tf.strings.substr(text, end, tf.fill(tf.shape(end), tf.constant(-1, end.dtype))),
            f"(?s)^([{WHITESPACE}]*).*$",
            r"\1",
        )
        end = tf.where(self._rstrip.lookup(token), end + tf.cast(tf.strings.length(after), end.dtype), end)
        # Where the text before each token starts: the (widened) end of the token before it, in its row.
        first_in_row = tf.range(tf.size(token, out_type=tf.int64)) == tf.gather(tokens.row_starts(), row)
        previous_end = tf.where(first_in_row, tf.zeros_like(end), tf.roll(end, 1, axis=0))
        begin = tf.where(
            self._lstrip.lookup(token),
            tf.maximum(begin - tf.cast(tf.strings.length(before), begin.dtype), previous_end),
            begin,
        )
        between = tf.strings.substr(text, previous_end, tf.maximum(begin - previous_end, 0))
        ids = self._added_ids.lookup(token)
        # Each token: the text before it (maybe empty), then the token; each row ends with its rest.
        pairs = tokens.with_flat_values(tf.stack([between, token], axis=1)).merge_dims(1, 2)
        pair_ids = tokens.with_flat_values(tf.stack([tf.fill(tf.shape(ids), -1), ids], axis=1)).merge_dims(1, 2)
        last_end = tf.gather(tf.concat([tf.zeros([1], end.dtype), end], 0), tokens.row_limits())
        last_end = tf.where(tokens.row_lengths() > 0, last_end, 0)  # 0 for a row without tokens
        rest = tf.strings.substr(texts, last_end, tf.fill(tf.shape(last_end), tf.constant(-1, last_end.dtype)))
        pieces = tf.concat([pairs, tf.RaggedTensor.from_tensor(rest[:, None])], axis=1)
        piece_ids = tf.concat([pair_ids, tf.RaggedTensor.from_tensor(tf.fill([tf.shape(texts)[0], 1], -1))], axis=1)
        keep = (pieces != "") | (piece_ids >= 0)
        return tf.ragged.boolean_mask(pieces, keep), tf.ragged.boolean_mask(piece_ids, keep)

    def _words(self, pieces):
        """Pieces of text [n] -> their ByteLevel words [n, (words)]."""
        if self.add_prefix_space:
            starts_with_space = tf.strings.substr(pieces, 0, 1) == " "
            pieces = tf.where(starts_with_space | (pieces == ""), pieces, tf.strings.join([" ", pieces]))
        if not self.use_regex:
            return tf.ragged.boolean_mask(tf.expand_dims(pieces, -1), tf.expand_dims(pieces != "", -1))
        chunks = tf_text.regex_split(pieces, CHUNK, CHUNK)  # [n, chunks]: a whitespace run, then the rest
        chunk = chunks.flat_values
        run = tf.strings.regex_replace(chunk, f"(?s)^([{WHITESPACE}]*).*$", r"\1")
        rest = tf.strings.regex_replace(chunk, f"^[{WHITESPACE}]+", "")
        n = tf.strings.length(run, "UTF8_CHAR")
        last = tf.strings.substr(run, tf.maximum(n - 1, 0), tf.minimum(n, 1), "UTF8_CHAR")
        before_last = tf.strings.substr(run, tf.zeros_like(n), tf.maximum(n - 1, 0), "UTF8_CHAR")
        at_end = rest == ""
        # Oniguruma's `\s+(?!\S)` leaves a run's last whitespace to what follows: a space joins
        # the next word (` ?\p{L}+`, ...), any other whitespace is a word of its own.
        head = tf.where(at_end, "", before_last)
        middle = tf.where(at_end | (last == " "), "", last)
        tail = tf.where(at_end, run, tf.where(last == " ", tf.strings.join([" ", rest]), rest))
        parts = tf.stack([head, middle, tail], axis=1)
        parts = tf.ragged.boolean_mask(parts, parts != "")  # [chunks, (parts)]
        words = tf_text.regex_split(parts, PIECE, PIECE).merge_dims(1, 2)  # [chunks, (words)]
        return chunks.with_flat_values(words).merge_dims(1, 2)

    def _merge(self, words):
        """Words [n] -> their BPE symbols [n, symbols] (strings in the ByteLevel alphabet)."""
        symbols = self._alphabet.lookup(tf.strings.bytes_split(words)).to_tensor("")
        if self.ignore_merges:  # a word in the vocabulary is one token, merged or not
            whole = tf.strings.reduce_join(symbols, axis=1)
            known = self._ids.lookup(whole) >= 0
            first = tf.where(known[:, None] & (tf.range(tf.shape(symbols)[1]) == 0), whole[:, None], symbols)
            symbols = tf.where(known[:, None] & (tf.range(tf.shape(symbols)[1]) > 0), "", first)
        # One more empty column, so that every merge can shift what follows it left by one.
        symbols = tf.pad(symbols, [[0, 0], [0, 1]], constant_values="")

        def merge_once(symbols, _):
            left, right = symbols[:, :-1], symbols[:, 1:]
            ranks = self._ranks.lookup(tf.strings.join([left, right], " "))
            ranks = tf.where((left == "") | (right == ""), self.NO_RANK, ranks)
            best = tf.reduce_min(ranks, axis=1, keepdims=True)
            position = tf.range(tf.shape(ranks)[1])
            # The leftmost of the lowest-ranked pairs, as tokenizers' merge queue takes them.
            at = tf.reduce_min(tf.where(ranks == best, position, tf.shape(ranks)[1]), axis=1, keepdims=True)
            merging = best < self.NO_RANK
            column = tf.range(tf.shape(symbols)[1])
            source = tf.minimum(column + tf.cast(column > at, tf.int32), tf.shape(symbols)[1] - 1)
            shifted = tf.gather(symbols, source, batch_dims=1)
            merged = tf.strings.join([tf.gather(symbols, at, batch_dims=1), tf.gather(symbols, at + 1, batch_dims=1)])
            shifted = tf.where(column == at, merged, shifted)
            shifted = tf.where(column == tf.shape(symbols)[1] - 1, "", shifted)
            return tf.where(merging, shifted, symbols), tf.reduce_any(merging)

        symbols, _ = tf.while_loop(
            lambda symbols, going: going,
            merge_once,
            (symbols, tf.constant(True)),
            shape_invariants=(tf.TensorShape([None, None]), tf.TensorShape([])),
        )
        return tf.ragged.boolean_mask(symbols, symbols != "")

    def token_ids(self, texts):
        """[batch] strings -> each text's token ids, without special tokens [batch, (tokens)] int32."""
        pieces, added = self._pieces(texts)  # [batch, (pieces)]
        piece, added_id = pieces.flat_values, tf.cast(added.flat_values, tf.int64)
        is_added = added_id >= 0
        words = self._words(tf.where(is_added, "", piece))  # [pieces, (words)]
        symbols = self._merge(words.flat_values)  # [words, (symbols)]
        ids = words.with_flat_values(self._ids.lookup(symbols)).merge_dims(1, 2)  # [pieces, (ids)]
        own = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(added_id, is_added), tf.cast(is_added, tf.int64))
        ids = tf.concat([ids, tf.cast(own, ids.dtype)], axis=1)  # a piece is either text or one added token
        return tf.cast(pieces.with_flat_values(ids).merge_dims(1, 2), tf.int32)

    # === Ids -> rows: the template, cut to length longest first, padded ===

    def _room(self, template) -> int:
        return self.sequence_length - sum(1 for item in template if not isinstance(item, str))

    def _place(self, template, sequences):
        """The template's rows: its ids around `sequences` ({"A": ragged, "B": ragged})."""
        batch = tf.shape(sequences["A"].row_splits)[0] - 1
        parts = [
            sequences[item] if isinstance(item, str) else tf.RaggedTensor.from_tensor(tf.fill([batch, 1], item))
            for item in template
        ]
        return tf.concat(parts, axis=1)

    def _longest_first(self, a, b, room: int):
        """The lengths `tokenizers` cuts a pair to (TruncationStrategy::LongestFirst): the shorter
        kept whole if it leaves the longer room, else each half (the longer one the odd token)."""
        n1, n2 = a.row_lengths(), b.row_lengths()
        room = tf.constant(room, n1.dtype)
        short = tf.minimum(n1, n2)
        long_kept = tf.where(short > room, short, tf.maximum(short, room - short))
        halves = short + long_kept > room
        short_kept = tf.where(halves, room // 2, short)
        long_kept = tf.where(halves, room // 2 + room % 2, long_kept)
        over = n1 + n2 > room
        first_is_longer = n1 > n2
        k1 = tf.where(over, tf.where(first_is_longer, long_kept, short_kept), n1)
        k2 = tf.where(over, tf.where(first_is_longer, short_kept, long_kept), n2)
        return _head(a, k1), _head(b, k2)

    def __call__(self, inputs):
        """`texts` [batch], or (`texts`, `texts_b`) [batch] each (an empty second text packs as
        none) -> {"input_ids", "input_mask"} int32 [batch, sequence_length]."""
        texts, texts_b = inputs if isinstance(inputs, (tuple, list)) else (inputs, None)
        a = self.token_ids(texts)
        rows = self._place(self.single, {"A": a[:, : max(self._room(self.single), 0)]})
        if texts_b is not None:
            b = self.token_ids(texts_b)
            cut_a, cut_b = self._longest_first(a, b, max(self._room(self.pair), 0))
            pairs = self._place(self.pair, {"A": cut_a, "B": cut_b})
            has_pair = tf.strings.length(texts_b) > 0
            rows = tf.ragged.stack([rows, pairs], axis=1)
            rows = tf.gather(rows, tf.cast(has_pair, tf.int32), batch_dims=1)
        return self._padded(rows)

    def _padded(self, rows):
        shape = [None, self.sequence_length]
        ids = rows.to_tensor(self.pad_token_id, shape=shape)
        mask = tf.ones_like(rows).to_tensor(0, shape=shape)
        return {"input_ids": tf.cast(ids, tf.int32), "input_mask": tf.cast(mask, tf.int32)}

    def pack_words(self, words):
        """Words to tag, a string RaggedTensor [batch, (words)] -> (the inputs, each word's first
        token's position ([CLS] is 0; -1 for a word with no tokens or one cut off), truncated),
        as `BpePacker.encode_words` packs them: each word tokenized on its own.
        """
        pieces = self.token_ids(words.flat_values)  # [words, (tokens)]
        count = pieces.row_lengths()
        before = tf.cumsum(count, exclusive=True)
        sentence_start = tf.repeat(tf.gather(before, words.row_starts()), words.row_lengths())
        first = tf.cast(before - sentence_start, tf.int32) + 1  # [CLS] is position 0
        room = max(self._room(self.single), 0)
        first = tf.where((count > 0) & (first <= room), first, -1)
        tokens = words.with_flat_values(pieces).merge_dims(1, 2)  # [batch, (tokens)]
        rows = self._place(self.single, {"A": tokens[:, :room]})
        return self._padded(rows), words.with_flat_values(first), tokens.row_lengths() > room


def _head(rows, lengths):
    """Each row's first `lengths` values."""
    keep = tf.ragged.range(rows.row_lengths()) < tf.expand_dims(lengths, 1)
    return tf.ragged.boolean_mask(rows, keep)
