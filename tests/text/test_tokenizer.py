"""kbert.Tokenizer and GraphTokenizer against google-research/bert's FullTokenizer."""

import collections
import json
import os
import random
import sys

import pytest
import tensorflow as tf
from absl import flags
from bert import tokenization  # google-research/bert, PyPI bert-tensorflow 1.0.4

import kbert
from conftest import FIXTURES, UNCASED_VOCAB
from kbert.text.tokenizer import load_vocab, vocab_tokens

SAMPLE = [json.loads(line) for line in open(os.path.join(FIXTURES, "tokenizer-sample.jsonl"), encoding="utf-8")]

HARD = [
    "Ｆｕｌｌ－ｗｉｄｔｈ　ｆｏｒｍｓ！ ＡＢＣ１２３？",  # full-width letters, space, punctuation
    "Trade™ marks® and © signs, ½ fractions, ² superscripts",
    "naïve café résumé Ångström Œuvre straße ﬁancé",  # accents, ligatures
    "e\u0301 a\u0308\u0304 combining marks \u0301alone",  # combining marks, a lone mark
    "zero\u200bwidth\u200cjoin\u200d and\ufeffbom \u2060word joiner",
    "ctrl\x00nul\x01\x1f\x7f\x85del tab\tnew\nline\r\x0bvt\x0cff",
    "line\u2028sep para\u2029sep nbsp\u00a0here thin\u2009space ideo\u3000space",
    "中文字符测试，北京欢迎你。 日本語のテキスト、カタカナ。 한국어 텍스트입니다.",
    "emoji 😀🎉👍🏽 flags 🇺🇸 zwj 👨‍👩‍👧 ♥️",
    "mojibake: CafÃ© â€™ Ã¼ber â€œquotesâ€\x9d Ã©tÃ©",
    "ΟΔΟΣ Σίσυφος ΣΑΣ; İstanbul ǅ ﬀ ẞ",  # sigma, dotted I, titlecase digraph
    "Привет, мир! Ёжик. Ελληνικά. עברית. العربية",
    "¿Qué? ¡Sí! «guillemets» „quotes“ ‘single’ — dashes – … ellipsis",
    "math ∑ ∫ √ ≤ ≥ ≠ ± × ÷ → ⇒ ∞ ℝ",
    "x" * 201 + " " + "y" * 200 + " " + "é" * 150 + " " + "ж" * 199 + " " + "日" * 3,  # the 200-character rule
    "unaffable unbelievable antidisestablishmentarianism",
    "\ufffd replacement \ud7ff\ue000 private use \U000f0000 plane 15",
    "",
    "   \t\n  ",
    "[CLS] [SEP] [MASK] [UNK] ##ing",
    "𠀀𠀁 CJK ext B 𪜀 ext C 丽 compat",
    "ＴＥＳＴ™ ＿ｕｎｄｅｒ ﹏ ︵ 〔bracket〕 【lenticular】",
]


@pytest.fixture(scope="module")
def original():
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["pytest"])
    return {lower: tokenization.FullTokenizer(UNCASED_VOCAB, do_lower_case=lower) for lower in (True, False)}


@pytest.fixture(scope="module")
def ours():
    return {lower: kbert.Tokenizer(UNCASED_VOCAB, do_lower_case=lower) for lower in (True, False)}


@pytest.fixture(scope="module")
def graph():
    return {lower: kbert.GraphTokenizer(UNCASED_VOCAB, do_lower_case=lower) for lower in (True, False)}


def test_fixture_tokens_and_ids(ours):
    for row in SAMPLE:
        assert ours[True].tokenize(row["text"]) == row["uncased"]
        assert ours[True].convert_tokens_to_ids(row["uncased"]) == row["uncased_ids"]
        assert ours[False].tokenize(row["text"]) == row["cased"]
        assert ours[True].convert_ids_to_tokens(row["uncased_ids"]) == row["uncased"]


def test_graph_fixture_ids(graph):
    texts = [row["text"] for row in SAMPLE]
    assert graph[True](tf.constant(texts)).to_list() == [row["uncased_ids"] for row in SAMPLE]


def test_documented_example(ours):
    assert ours[True].tokenize("Hello, world!") == ["hello", ",", "world", "!"]


@pytest.mark.parametrize("lower", [True, False])
def test_hard_text_matches_original(original, ours, graph, lower):
    for text in HARD:
        want = original[lower].tokenize(text)
        assert ours[lower].tokenize(text) == want, text
    want_ids = [original[lower].convert_tokens_to_ids(original[lower].tokenize(t)) for t in HARD]
    assert graph[lower](tf.constant(HARD)).to_list() == want_ids


def test_accents_stripped_only_when_lowercasing(ours):
    assert ours[True].tokenize("Café") == ["cafe"]
    assert ours[False].tokenize("Café") != ours[True].tokenize("Café")


def test_long_words_are_unk_by_characters_not_bytes(ours, graph):
    text = "ж" * 150  # 150 characters, 300 UTF-8 bytes: not [UNK] in the original
    assert ours[True].tokenize(text) == ["ж"] + ["##ж"] * 149
    assert ours[True].tokenize("a" * 201) == ["[UNK]"]
    ids = graph[True](tf.constant([text, "a" * 201, "ж" * 201])).to_list()
    assert ids == [ours[True].convert_tokens_to_ids(ours[True].tokenize(t)) for t in (text, "a" * 201, "ж" * 201)]
    assert ids[2] == [100]


def test_bytes_and_invalid_utf8(original, ours, graph):
    raw = [b"caf\xc3\xa9 ok", b"bad \xff\xfe bytes \xc3", b"\xe6\x97\xa5\xe6\x9c truncated"]
    for text in raw:
        assert ours[True].tokenize(text) == original[True].tokenize(text)
    want = [ours[True].convert_tokens_to_ids(ours[True].tokenize(t)) for t in raw]
    assert graph[True](tf.constant(raw)).to_list() == want


def _random_texts(n, seed):
    rng = random.Random(seed)
    pools = [
        (0x20, 0x7E),
        (0xA0, 0x24F),
        (0x300, 0x36F),
        (0x370, 0x52F),
        (0x2000, 0x206F),
        (0x3000, 0x30FF),
        (0x4E00, 0x4E80),
        (0xAC00, 0xAC80),
        (0xFF00, 0xFFEF),
        (0x1F300, 0x1F64F),
        (0x0, 0x1F),
    ]
    texts = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(pools)
            chars.append(chr(rng.randint(lo, hi)) if rng.random() < 0.6 else rng.choice(" abcXYZ,.!"))
        texts.append("".join(chars))
    return texts


@pytest.mark.parametrize("lower", [True, False])
def test_random_hard_text_matches_original(original, ours, graph, lower):
    texts = _random_texts(2000, seed=int(lower))
    want = [original[lower].tokenize(t) for t in texts]
    assert [ours[lower].tokenize(t) for t in texts] == want
    want_ids = [original[lower].convert_tokens_to_ids(w) for w in want]
    assert graph[lower](tf.constant(texts)).to_list() == want_ids


@pytest.mark.parametrize("lower", [True, False])
def test_every_bmp_code_point_matches_original(original, ours, lower):
    texts = ["a" + chr(cp) + "b " + chr(cp) + " x" + chr(cp) for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF]
    mismatches = [t for t in texts if ours[lower].tokenize(t) != original[lower].tokenize(t)]
    assert mismatches == []


@pytest.mark.parametrize("lower", [True, False])
def test_graph_matches_python_on_every_code_point(ours, graph, lower):
    # All of the BMP, and every 7th code point above it.
    cps = [cp for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF] + list(range(0x10000, sys.maxunicode + 1, 7))
    texts = ["a" + chr(cp) + "b " + chr(cp) + " x" + chr(cp) for cp in cps]
    mismatches = []
    for start in range(0, len(texts), 50_000):
        chunk = texts[start : start + 50_000]
        got = graph[lower](tf.constant([t.encode() for t in chunk])).to_list()
        for text, ids in zip(chunk, got):
            if ids != ours[lower].convert_tokens_to_ids(ours[lower].tokenize(text)):
                mismatches.append(hex(ord(text[1])))
    assert mismatches == []


def test_graph_tokenizer_in_tf_data(graph):
    texts = [row["text"] for row in SAMPLE[:8]]
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(4).map(graph[True])
    got = [ids for batch in ds for ids in batch.to_list()]
    assert got == [row["uncased_ids"] for row in SAMPLE[:8]]


def test_missing_vocab():
    with pytest.raises(kbert.KbertError, match="no such vocab file"):
        kbert.Tokenizer("nope/vocab.txt")


# A vocabulary with repeated tokens (tf1-tiny's has "4", "a" and "i" twice), a CRLF line, padding
# spaces and a carriage return inside a line: load_vocab's rules on each.
REPEATS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "a", "  c  ", "b", "d\r", "e\rf", "##x", "a", "c"]


def github_load_vocab(vocab_file):
    """google-research/bert's tokenization.load_vocab as github.com/google-research/bert has it
    (Apache 2.0), verbatim but for its module prefixes.

    Not PyPI's bert-tensorflow 1.0.4, which the other tests here use: its load_vocab differs. It
    keeps the first copy of a repeated token and renumbers the rest (`if token not in vocab:
    vocab[token] = len(vocab)`), so every id after a repeat is shifted; the released models, and
    the tf1-tiny fixture (made from a copy of the GitHub repository), read vocabularies as below.
    """
    vocab = collections.OrderedDict()
    index = 0
    with tf.io.gfile.GFile(vocab_file, "r") as reader:
        while True:
            token = tokenization.convert_to_unicode(reader.readline())
            if not token:
                break
            token = token.strip()
            vocab[token] = index
            index += 1
    return vocab


def test_repeated_tokens_follow_the_original_load_vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join(REPEATS).encode() + b"\n")
    original = github_load_vocab(str(path))
    original_inv = {v: k for k, v in original.items()}  # FullTokenizer.inv_vocab on GitHub
    ours = kbert.Tokenizer(path, do_lower_case=True)
    # token -> id: the original's dict exactly, so a repeated token has its last id.
    assert ours.vocab == dict(original) and load_vocab(path) == dict(original)
    assert ours.convert_tokens_to_ids(["a", "b", "c", "d", "ef"]) == [13, 9, 14, 10, 11]
    # id -> token: every id has its own line's token (stripped; lines end at "\n" only and lose
    # every "\r", as GFile reads them). The original's inv_vocab inverts load_vocab, so it has no entry for an earlier
    # copy's id (convert_ids_to_tokens raises KeyError there); where it has one, ours agrees.
    tokens = ours.convert_ids_to_tokens(range(len(REPEATS)))
    assert tokens == vocab_tokens(path) == [line.replace("\r", "").strip() for line in REPEATS]
    assert sorted(set(range(len(REPEATS))) - set(original_inv)) == [5, 6, 7, 8]  # earlier copies of a, b, c
    assert {i: tokens[i] for i in original_inv} == original_inv
    # tokens -> ids -> tokens is the identity; ids -> tokens -> ids gives each id's last copy.
    assert ours.convert_ids_to_tokens(ours.convert_tokens_to_ids(tokens)) == tokens
    assert ours.convert_tokens_to_ids(tokens) == [original[t] for t in tokens]


def test_repeated_tokens_in_the_graph_tokenizer(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "a", "##b", "a", "##b", "c"]) + "\n")
    texts = ["a ab c abb", "cab"]
    want = [[4, 4, 5, 6, 4, 5, 5], [1]]  # the last copies' ids, as github_load_vocab gives them
    assert github_load_vocab(str(path)) == {"[PAD]": 0, "[UNK]": 1, "a": 4, "##b": 5, "c": 6}
    python = kbert.Tokenizer(path)
    assert [python.convert_tokens_to_ids(python.tokenize(t)) for t in texts] == want
    assert kbert.GraphTokenizer(path)(tf.constant(texts)).to_list() == want
