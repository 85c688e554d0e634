"""BertPreprocessor (in-graph) against the original's packing and truncation (run_classifier's own
code, run in a subprocess), and its packing of words to tag against hand-worked expectations."""

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, UNCASED_VOCAB
from helpers import original_packing
from kbert.text.graph_packer import BertPreprocessor, truncated_pair_lengths
from kbert.text.tokenizer import Tokenizer


def original_truncate(len_a, len_b, budget):
    """run_classifier._truncate_seq_pair, on lengths."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_closed_form_truncation_equals_the_original_loop_everywhere():
    grid = [(a, b, n) for a in range(0, 25) for b in range(0, 25) for n in range(0, 30)]
    a, b, n = (np.array(x) for x in zip(*grid))
    for budget in range(0, 30):
        pick = n == budget
        keep_a, keep_b = truncated_pair_lengths(tf.constant(a[pick]), tf.constant(b[pick]), budget)
        expected = [original_truncate(x, y, budget) for x, y in zip(a[pick], b[pick])]
        assert list(zip(keep_a.numpy().tolist(), keep_b.numpy().tolist())) == expected


LINES = [line.strip() for line in open(f"{FIXTURES}/sample_text.txt", encoding="utf-8") if line.strip()]
LENGTHS = (5, 8, 16, 64)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """run_classifier.convert_single_example's features of each line alone and paired with the
    next, at each length, by (length, paired)."""
    texts, texts_b = LINES[:-1], LINES[1:]
    cases = [
        (a, b, length)
        for length in LENGTHS
        for b_texts in (None, texts_b)
        for a, b in zip(texts, b_texts or [None] * len(texts))
    ]
    packed = iter(original_packing(cases, UNCASED_VOCAB, tmp_path_factory.mktemp("original")))
    return {
        (length, paired): np.array([next(packed) for _ in texts], np.int32)
        for length in LENGTHS
        for paired in (False, True)
    }


@pytest.mark.parametrize("length", LENGTHS)
def test_matches_the_original_packing_on_real_text(original, length):
    texts, texts_b = LINES[:-1], LINES[1:]
    layer = BertPreprocessor(UNCASED_VOCAB, do_lower_case=True, sequence_length=length)
    for b in (None, texts_b):
        expected = original[length, b is not None]  # [examples, input_ids/input_mask/segment_ids, length]
        got = layer(tf.constant(texts) if b is None else (tf.constant(texts), tf.constant(b)))
        for k, name in enumerate(("input_ids", "input_mask", "segment_ids")):
            np.testing.assert_array_equal(got[name].numpy(), expected[:, k], err_msg=f"{name} b={b is not None}")
        # What `pack` counts as truncated is what the original cut: fewer real tokens than a and b have.
        _, truncated = layer.pack(tf.constant(texts), None if b is None else tf.constant(b))
        tokenizer = Tokenizer(UNCASED_VOCAB, do_lower_case=True)
        wanted = [
            len(tokenizer.tokenize(a)) + 2 + (len(tokenizer.tokenize(t)) + 1 if b and tokenizer.tokenize(t) else 0)
            for a, t in zip(texts, b or texts)
        ]
        assert truncated.numpy().tolist() == (expected[:, 1].sum(axis=1) < wanted).tolist()


def test_pack_words_puts_each_word_on_its_first_piece():
    # Hand-worked at length 7 (5 pieces): cass ##ius crossed phil ##am | ##mon road cut, so "road"
    # has no first piece (-1); "\x00" tokenizes to nothing and becomes [UNK]; an empty sentence
    # is [CLS] [SEP].
    layer = BertPreprocessor(UNCASED_VOCAB, sequence_length=7)
    words = tf.ragged.constant([["Cassius", "crossed", "Philammon", "road"], ["\x00", "road"], []], tf.string)
    features, starts, truncated = layer.pack_words(words)
    tokens = Tokenizer(UNCASED_VOCAB).convert_ids_to_tokens
    assert [tokens(row) for row in features["input_ids"].numpy()] == [
        ["[CLS]", "cass", "##ius", "crossed", "phil", "##am", "[SEP]"],
        ["[CLS]", "[UNK]", "road", "[SEP]", "[PAD]", "[PAD]", "[PAD]"],
        ["[CLS]", "[SEP]", "[PAD]", "[PAD]", "[PAD]", "[PAD]", "[PAD]"],
    ]
    assert (
        features["input_mask"].numpy().sum(axis=1).tolist() == [7, 4, 2] and not features["segment_ids"].numpy().any()
    )
    assert starts.to_list() == [[1, 3, 4, -1], [1, 2], []]
    assert truncated.numpy().tolist() == [True, False, False]
    # Exactly 5 pieces fit: not truncated.
    _, starts, truncated = layer.pack_words(tf.ragged.constant([["Cassius", "crossed", "Phil", "road"]]))
    assert starts.to_list() == [[1, 3, 4, 5]] and truncated.numpy().tolist() == [False]


def test_runs_in_tf_data_and_on_single_strings():
    layer = BertPreprocessor(UNCASED_VOCAB, sequence_length=12)
    ds = tf.data.Dataset.from_tensor_slices((["Hello, world!", "A longer sentence about nothing."], [0, 1]))
    batch = next(iter(ds.batch(2).map(lambda x, y: (layer(x), y))))[0]
    assert batch["input_ids"].shape == (2, 12) and batch["input_ids"].dtype == tf.int32
    single = layer(tf.constant("Hello, world!"))
    assert single["input_ids"].numpy().tolist()[:6] == [101, 7592, 1010, 2088, 999, 102]


def test_config_round_trip():
    layer = BertPreprocessor(UNCASED_VOCAB, do_lower_case=False, sequence_length=16)
    again = BertPreprocessor.from_config(layer.get_config())
    assert (again.vocab_file, again.do_lower_case, again.sequence_length) == (UNCASED_VOCAB, False, 16)


def test_for_model_refuses_a_length_past_the_models_positions(tiny_model_dir):
    model = kbert.load(tiny_model_dir)  # 64 positions
    with pytest.raises(
        ValueError,
        match=r"^sequence_length 128 exceeds the model's max_position_embeddings 64; "
        r"pass sequence_length=64 or less$",
    ):
        BertPreprocessor.for_model(model, sequence_length=128)
    with pytest.raises(ValueError, match="max_position_embeddings 64"):
        BertPreprocessor.for_model(str(tiny_model_dir), sequence_length=65)
    # At the limit, and by default, it packs what the model runs.
    features = BertPreprocessor.for_model(model, sequence_length=64)(tf.constant(["the city."]))
    assert features["input_ids"].shape == (1, 64)
    assert model.encoder(features, training=False)["sequence_output"].shape == (1, 64, 64)
    assert BertPreprocessor.for_model(model).sequence_length == 64
