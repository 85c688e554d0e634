"""`kbert extend --words / --corpus`: the original tiny checkpoint (vocabulary of 300, three
[unusedN] slots) taught five words of its sample text, checked against the checkpoint's own
tables, the original code's outputs and the tokenizer; where each word goes; how the corpus
chooses them; and the model kinds and vocabularies around the tested ones."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from helpers import ENCODER_KEYS, EXPECTED, original_outputs, saved_weights
from kbert.extend import extend_vocabulary
from kbert.new_words import candidates, check_words, place_words
from kbert.text.vocab_builder import WordTokenizer, count_words

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")
TINY_VOCAB = os.path.join(TINY, "vocab.txt")
# Words of the sample text the tiny vocabulary splits into pieces: three take the [unused0..2]
# slots (ids 1, 2, 3), two are appended (ids 300, 301).
WORDS = ["Philammon", "indeed", "monk", "sand", "line"]
IDS = [1, 2, 3, 300, 301]


def checkpoint_tensor(name):
    return tf.train.load_checkpoint(os.path.join(TINY, "bert_model.ckpt")).get_tensor(name)


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """The original checkpoint taught WORDS by the command: (model dir, its JSON, its stderr)."""
    root = tmp_path_factory.mktemp("extend-vocab")
    (root / "words.txt").write_text("\n".join(WORDS) + "\n")
    out = root / "tiny-words"
    result = run_kbert("extend", TINY, out, "--words", root / "words.txt")
    return out, json.loads(result.stdout), result.stderr


def old_pieces(word):
    tokenizer = kbert.Tokenizer(TINY_VOCAB, do_lower_case=True)
    return tokenizer.convert_tokens_to_ids(tokenizer.wordpiece(word))


def test_the_command_says_where_the_words_went(extended):
    out, result, _ = extended
    assert result == {
        "model_dir": str(out),
        "kbert_model": "pretrainer",
        # 99,374 parameters, and for each appended word one row of H = 64 and one output bias.
        "parameters": 99_374 + 2 * (64 + 1),
        "new_words": {"added": 5, "slots": 3, "appended": 2, "words": [w.lower() for w in WORDS]},
        "vocab_size": {"from": 300, "to": 302},
    }
    config = json.load(open(out / "bert_config.json"))
    assert config["vocab_size"] == 302


def test_old_tokens_keep_their_ids_and_lines_byte_for_byte(extended):
    old = open(TINY_VOCAB, "rb").read().split(b"\n")[:-1]
    new = (extended[0] / "vocab.txt").read_bytes().split(b"\n")
    assert new[-1] == b"" and len(new[:-1]) == 302
    new = new[:-1]
    assert [old[i] for i in IDS[:3]] == [b"[unused0]", b"[unused1]", b"[unused2]"]
    for index, word in zip(IDS, WORDS):
        assert new[index] == word.lower().encode()
    assert [line for i, line in enumerate(new[:300]) if i not in IDS] == [
        line for i, line in enumerate(old) if i not in IDS
    ]


def test_each_new_row_and_output_bias_is_the_mean_of_the_old_pieces(extended):
    """Against the checkpoint's own tables, in numpy: every old row bit for bit, each new row
    the mean of the rows of the pieces the old vocabulary split the word into."""
    weights = saved_weights(extended[0])
    (table_key,) = [k for k in weights if "word_embeddings" in k]
    (bias_key,) = [k for k in weights if k.startswith("layers/masked_lm_head/") and weights[k].shape == (302,)]
    table, bias = checkpoint_tensor("bert/embeddings/word_embeddings"), checkpoint_tensor("cls/predictions/output_bias")
    assert weights[table_key].shape == (302, 64) and weights[bias_key].shape == (302,)
    kept = [i for i in range(300) if i not in IDS]
    np.testing.assert_array_equal(weights[table_key][kept], table[kept])
    np.testing.assert_array_equal(weights[bias_key][kept], bias[kept])
    for index, word in zip(IDS, WORDS):
        pieces = old_pieces(word.lower())
        assert len(pieces) > 1
        np.testing.assert_allclose(weights[table_key][index], table[pieces].mean(0), atol=1e-7, rtol=0)
        np.testing.assert_allclose(weights[bias_key][index], bias[pieces].mean(), atol=1e-7, rtol=0)


@pytest.mark.parametrize("name", ["embedding_output", "sequence_output", "pooled_output", "nsp_log_probs"])
def test_a_text_without_new_words_gives_the_original_codes_outputs(extended, name):
    """The fixture's real text has none of the new words: google-research/bert's own outputs
    from the checkpoint before it grew, to 1e-5 (kbert's bound against the original)."""
    ids = EXPECTED["input_ids"]
    assert not set(ids.ravel()) & set(IDS)
    got = np.asarray(original_outputs(kbert.load(extended[0]))[name])
    np.testing.assert_allclose(got, EXPECTED[name], atol=1e-5, rtol=0)


def test_a_text_without_new_words_computes_exactly_what_it_did(extended, tiny_model_dir):
    """The model before and after, on the fixture's text: every output to 1e-6, and the
    masked-LM logits of every old token (the vocabulary's other columns are the new words)."""
    inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS + ("masked_lm_positions",)}
    before = kbert.load(tiny_model_dir)(inputs, training=False)
    after = kbert.load(extended[0])(inputs, training=False)
    for name in ("sequence_output", "pooled_output", "nsp_logits"):
        np.testing.assert_allclose(np.asarray(after[name]), np.asarray(before[name]), atol=1e-6, rtol=0)
    kept = [i for i in range(300) if i not in IDS]
    assert tuple(after["mlm_logits"].shape)[-1] == 302
    np.testing.assert_allclose(
        np.asarray(after["mlm_logits"])[..., kept], np.asarray(before["mlm_logits"])[..., kept], atol=1e-6, rtol=0
    )


def test_the_new_words_are_one_token_each_and_other_words_split_as_before(extended):
    old = kbert.Tokenizer(TINY_VOCAB, do_lower_case=True)
    new = kbert.Tokenizer.from_model_dir(extended[0])
    text = "Philammon the monk walked in the sand, indeed; the lines' line."
    tokens = new.tokenize(text)
    for index, word in zip(IDS, WORDS):
        assert new.convert_tokens_to_ids([word.lower()]) == [index]
        assert tokens.count(word.lower()) >= 1
    # A word that begins with a new word now starts with it ("lines" -> "line", "##s"):
    # WordPiece matches the longest prefix; every other word splits as before.
    assert old.tokenize("lines") == ["l", "##i", "##n", "##e", "##s"] and new.tokenize("lines") == ["line", "##s"]
    lines = open(SAMPLE, encoding="utf-8").read().splitlines()
    for line in lines:
        words = WordTokenizer(True).tokenize(line)
        if not any(w.startswith(n.lower()) for w in words for n in WORDS):
            assert new.tokenize(line) == old.tokenize(line), line


def test_the_corpus_chooses_by_occurrences_times_pieces_saved(tmp_path):
    """--dry-run over the sample text, against the score computed here with the tokenizer;
    and the corpus's token count after, against tokenizing it with the model the command writes."""
    result = json.loads(
        run_kbert(
            "extend", TINY, tmp_path / "out", "--corpus", SAMPLE, "--max-new", 4, "--min-count", 2, "--dry-run"
        ).stdout
    )
    assert not (tmp_path / "out").exists()
    tokenizer = kbert.Tokenizer(TINY_VOCAB, do_lower_case=True)
    counts = count_words([SAMPLE])
    scored = sorted(
        (-(n * (len(tokenizer.wordpiece(w)) - 1)), -n, w)
        for w, n in counts.items()
        if n >= 2 and w not in tokenizer.vocab and len(tokenizer.wordpiece(w)) > 1
    )
    assert [w["word"] for w in result["words"]] == [w for _, _, w in scored[:4]]
    assert [w["saves"] for w in result["words"]] == [-s for s, _, _ in scored[:4]]
    assert (result["slots"], result["appended"], result["vocab_size"]) == (3, 1, {"from": 300, "to": 301})

    made = json.loads(
        run_kbert("extend", TINY, tmp_path / "out", "--corpus", SAMPLE, "--max-new", 4, "--min-count", 2).stdout
    )
    assert made["new_words"]["words"] == [w["word"] for w in result["words"]]
    text = open(SAMPLE, encoding="utf-8").read()
    before = len(tokenizer.tokenize(text))
    after = len(kbert.Tokenizer.from_model_dir(tmp_path / "out").tokenize(text))
    assert made["corpus_tokens"] == result["corpus_tokens"] == {"before": before, "after": after}
    assert after < before - sum(w["saves"] for w in result["words"]) / 2


def test_more_new_words_asked_than_the_corpus_has_adds_those_it_has_and_says_so(tmp_path):
    tokenizer = kbert.Tokenizer(TINY_VOCAB, do_lower_case=True)
    qualified = [w for w, n in count_words([SAMPLE]).items() if n >= 2 and len(tokenizer.wordpiece(w)) > 1]
    qualified = [w for w in qualified if w not in tokenizer.vocab]
    ran = run_kbert("extend", TINY, tmp_path / "out", "--corpus", SAMPLE, "--max-new", 10_000, "--min-count", 2)
    assert json.loads(ran.stdout)["new_words"]["added"] == len(qualified) < 10_000
    assert f"--max-new 10000: only {len(qualified)} words are seen 2 times or more" in ran.stderr


def test_words_and_corpus_together_with_more_positions(tmp_path):
    (tmp_path / "words.txt").write_text("hermit\n")
    result = json.loads(
        run_kbert(
            "extend",
            TINY,
            tmp_path / "out",
            "--words",
            tmp_path / "words.txt",
            "--corpus",
            SAMPLE,
            "--max-new",
            2,
            "--min-count",
            2,
            "--max-position-embeddings",
            100,
        ).stdout
    )
    assert result["new_words"]["words"][0] == "hermit" and result["new_words"]["added"] == 3
    assert result["max_position_embeddings"] == {"from": 64, "to": 100}
    model = kbert.load(tmp_path / "out")
    assert model.config.vocab_size == 300 and model.config.max_position_embeddings == 100


def test_a_vocabulary_without_unused_slots_only_appends_and_says_so(tmp_path):
    vocab = [line for line in open(TINY_VOCAB, encoding="utf-8").read().split("\n")[:-1] if "unused" not in line]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = kbert.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    encoder = kbert.bert_encoder(config, vocabulary={"file": str(tmp_path / "vocab.txt"), "do_lower_case": True})
    kbert.save(encoder, tmp_path / "encoder")
    (tmp_path / "words.txt").write_text("monk\nsand\n")
    ran = run_kbert("extend", tmp_path / "encoder", tmp_path / "out", "--words", tmp_path / "words.txt")
    result = json.loads(ran.stdout)
    assert result["new_words"] == {"added": 2, "slots": 0, "appended": 2, "words": ["monk", "sand"]}
    assert result["kbert_model"] == "encoder" and result["vocab_size"] == {"from": 297, "to": 299}
    assert "no [unusedN] slots" in ran.stderr and "appended" in ran.stderr


def test_a_fine_tuned_classifier_keeps_its_head_and_its_answers(tiny_model_dir, tmp_path):
    task = {"labels": ["neg", "pos"], "max_seq_length": 48}
    classifier = kbert.bert_classifier(kbert.load(tiny_model_dir), 2, task_info=task)
    grown, placement = extend_vocabulary(classifier, ["monk", "sand"], tmp_path / "vocab.txt")
    assert type(grown) is type(classifier) and grown.task_info == classifier.task_info
    assert placement["ids"] == [1, 2] and grown.vocab_file == str(tmp_path / "vocab.txt")
    inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS}
    before, after = classifier(inputs, training=False), grown(inputs, training=False)
    for name in before:
        np.testing.assert_allclose(np.asarray(after[name]), np.asarray(before[name]), atol=1e-6, rtol=0)


def test_a_cased_model_keeps_the_words_case(tmp_path):
    vocab = open(TINY_VOCAB, encoding="utf-8").read().split("\n")[:-1]
    tokenizer = kbert.Tokenizer(TINY_VOCAB, do_lower_case=False)
    assert check_words(["Philammon", "philammon", "Philammon"], tokenizer) == ["Philammon", "philammon"]
    uncased = kbert.Tokenizer(TINY_VOCAB, do_lower_case=True)
    assert check_words(["Philammon", "philammon", "PHILAMMON"], uncased) == ["philammon"]
    assert place_words(vocab, ["x"])[1] == [1]


@pytest.mark.parametrize(
    "words,fragment",
    [
        (["the", "monk"], "already in the vocabulary: 'the'"),
        (["monk", "e-mail"], "'e-mail' is not one word"),
        (["gold dust"], "'gold dust' is not one word"),
        (["x" * 201], "longer than 200 characters"),
    ],
)
def test_words_that_cannot_be_added_are_named_in_one_line(words, fragment):
    with pytest.raises(kbert.KbertError) as raised:
        check_words(words, kbert.Tokenizer(TINY_VOCAB, do_lower_case=True))
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


def test_bad_words_leave_nothing_behind(tmp_path):
    (tmp_path / "words.txt").write_text("monk\nthe\n")
    result = run_kbert("extend", TINY, tmp_path / "out", "--words", tmp_path / "words.txt", check=False)
    assert_user_error(result, "already in the vocabulary: 'the'", alone=False)
    assert not (tmp_path / "out").exists()


def test_candidates_skip_words_wordpiece_cannot_spell():
    tokenizer = kbert.Tokenizer(TINY_VOCAB, do_lower_case=True)
    assert tokenizer.wordpiece("ζωή") == ["[UNK]"]
    found = candidates({"ζωή": 40, "monk": 3, "sand": 3, "the": 50, "line": 1}, tokenizer, min_count=2)
    assert [(c.word, c.saves) for c in found] == [("monk", 9), ("sand", 9)]
