"""kbert vocab: words split as the original BasicTokenizer splits them, and a vocab.txt that
kbert.Tokenizer loads and that spells the corpus without [UNK]."""

import json
import os

import pytest
from absl import flags
from bert import tokenization  # google-research/bert, PyPI bert-tensorflow 1.0.4

import kbert
from conftest import FIXTURES, assert_user_error, run_kbert
from kbert.pretraining.create_data import create_pretraining_data
from kbert.runtime.errors import KbertError, command_line_names
from kbert.text import vocab_builder
from kbert.text.tf_text_vocab import learn_vocab
from kbert.text.vocab_builder import RESERVED_TOKENS, WordTokenizer, build_vocab, count_words

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
TRICKY = [
    "Héllo, WÖRLD! naïve café — «quoted» ‘single’",
    "北京是中国的首都。日本語のテキスト 한국어",
    "tabs\tand\u00a0no-break\u3000spaces, \x00nul \ufffd replacement, \u200bzero-width",
    "math ∑ ∫ √ ≤ ≥ ≠ ± × ÷ → ⇒ ∞ ℝ and ＴＥＳＴ™ ＿ｕｎｄｅｒ",
    "[CLS] [SEP] [MASK] ##ing don't e-mail U.S.A. 3.14",
]


@pytest.fixture(scope="module")
def basic_tokenizer():
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["pytest"])
    return {lower: tokenization.BasicTokenizer(do_lower_case=lower) for lower in (True, False)}


@pytest.fixture(scope="module")
def sample_vocab(tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    return out, build_vocab([SAMPLE], out, size=300)


def corpus_lines():
    with open(SAMPLE, encoding="utf-8") as f:
        return [line for line in f if line.strip()]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_words_are_what_the_original_basic_tokenizer_makes(basic_tokenizer, lower):
    ours = WordTokenizer(do_lower_case=lower)
    for line in corpus_lines() + TRICKY:
        assert ours.tokenize(line) == basic_tokenizer[lower].tokenize(line), line


def test_vocab_layout_and_size(sample_vocab):
    path, result = sample_vocab
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == ""  # every entry ends with a newline
    vocab = lines[:-1]
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] == RESERVED_TOKENS
    assert len(vocab) == result["size"] == 300  # the learner found 518 here; the rarest went
    assert len(set(vocab)) == len(vocab) and all(v.strip() == v and v for v in vocab)
    counts = count_words([SAMPLE])
    characters = {c for word in counts for c in word}
    assert characters <= set(vocab) and {"##" + c for c in characters} <= set(vocab)
    for word in ("the", "of", "and", "his"):  # frequent words are single pieces
        assert word in vocab
    assert result["words"] == sum(counts.values()) and result["distinct_words"] == len(counts)


def test_vocab_tokenizes_the_corpus_without_unk(sample_vocab):
    path, result = sample_vocab
    tokenizer = kbert.Tokenizer(path, do_lower_case=True)
    tokens = [t for line in corpus_lines() for t in tokenizer.tokenize(line)]
    characters = sum(len(word) * n for word, n in count_words([SAMPLE]).items())
    assert "[UNK]" not in tokens and result["unk_rate"] == 0.0
    assert len(tokens) < 0.6 * characters  # pieces, not letters: 1,983 for 3,620 characters
    # A character the corpus never had is [UNK]: the rate measures something.
    assert tokenizer.tokenize("the ☃ snowman")[:2] == ["the", "[UNK]"]
    assert vocab_builder.unk_rate([SAMPLE], os.path.join(FIXTURES, "vocab-uncased.txt")) == 0.0


def test_learned_vocab_makes_pretraining_data(sample_vocab, tmp_path):
    path, result = sample_vocab
    out = create_pretraining_data([SAMPLE], path, tmp_path / "data.tfrecord", dupe_factor=2, workers=1)
    assert out["instances"] > 10
    assert 0 < out["mask_token_share"] < 1


def test_cased_vocabulary_keeps_case(tmp_path):
    result = build_vocab([SAMPLE], tmp_path / "cased.txt", size=400, do_lower_case=False)
    vocab = (tmp_path / "cased.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert "T" in vocab and "The" in vocab and result["do_lower_case"] is False
    assert result["unk_rate"] == 0.0
    uncased = learn_vocab(count_words([SAMPLE], do_lower_case=True), 400)
    assert not any(c.isupper() for token in uncased for c in token if token not in RESERVED_TOKENS)


def test_size_too_small_for_the_characters():
    counts = count_words([SAMPLE])
    characters = len({c for word in counts for c in word})
    needed = len(RESERVED_TOKENS) + 2 * characters
    assert len(learn_vocab(counts, needed)) == needed
    with pytest.raises(KbertError, match=f"^size={needed - 1} is too small: .*; use size={needed} or more$"):
        learn_vocab(counts, needed - 1)
    with command_line_names({"--size"}), pytest.raises(KbertError, match=f"^--size {needed - 1} is too small"):
        learn_vocab(counts, needed - 1)


def test_refuses_to_overwrite_and_missing_input(tmp_path):
    out = tmp_path / "vocab.txt"
    out.write_text("keep me\n")
    with pytest.raises(KbertError, match="exists and is not empty; pass overwrite=True to replace it"):
        build_vocab([SAMPLE], out, size=300)
    with command_line_names({"--overwrite"}), pytest.raises(KbertError, match="not empty; pass --overwrite to"):
        build_vocab([SAMPLE], out, size=300)
    assert out.read_text() == "keep me\n"
    with pytest.raises(KbertError, match="nothere.txt: no such input file"):
        build_vocab([tmp_path / "nothere.txt"], tmp_path / "v.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.txt"]


def test_cli(tmp_path):
    out = tmp_path / "vocab.txt"
    result = run_kbert("vocab", "--input", SAMPLE, "--output", out, "--size", "250")
    summary = json.loads(result.stdout)
    # Counts 1 and 2 give 518 and 205 entries: the learner stops at 205, below the size asked.
    assert summary["size"] == 205 == len(out.read_text(encoding="utf-8").splitlines())
    assert summary["requested_size"] == 250
    assert summary["unk_rate"] == 0.0 and summary["vocab_file"] == str(out)
    assert_user_error(
        run_kbert("vocab", "--input", SAMPLE, "--output", out, check=False), "exists and is not empty", "--overwrite"
    )
