"""BertPreprocessor (in-graph) against the original's packing and truncation."""

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, UNCASED_VOCAB
from kbert.finetuning.readers import encode_texts
from kbert.text.preprocessing import BertPreprocessor, truncated_pair_lengths
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


@pytest.mark.parametrize("length", [5, 8, 16, 64])
def test_matches_the_original_packing_on_real_text(length):
    lines = [line.strip() for line in open(f"{FIXTURES}/sample_text.txt", encoding="utf-8") if line.strip()]
    texts, texts_b = lines[:-1], lines[1:]
    tokenizer = Tokenizer(UNCASED_VOCAB, do_lower_case=True)
    layer = BertPreprocessor(UNCASED_VOCAB, do_lower_case=True, sequence_length=length)
    for b in (None, texts_b):
        expected, _ = encode_texts(tokenizer, texts, b, length)  # == run_classifier.convert_single_example
        got = layer(tf.constant(texts) if b is None else (tf.constant(texts), tf.constant(b)))
        for name in ("input_ids", "input_mask", "segment_ids"):
            np.testing.assert_array_equal(got[name].numpy(), expected[name], err_msg=f"{name} b={b is not None}")


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
