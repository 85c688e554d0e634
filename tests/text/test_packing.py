"""kbert.pack_texts against the original's packing (run_classifier.convert_single_example, run in a
subprocess), on real text, real and hand-made vocabularies, and its one-line errors."""

import subprocess
import sys

import numpy as np
import pytest

import kbert
from conftest import FIXTURES, TINY, UNCASED_VOCAB
from helpers import original_packing
from kbert.runtime.errors import KbertError

LINES = [line.strip() for line in open(f"{FIXTURES}/sample_text.txt", encoding="utf-8") if line.strip()]
# Pairs whose truncation takes from a, from b, from both on a tie; an empty b (a single text, as in
# the original); accents, case and words outside the vocabulary.
HARD = [
    ("a b c d e f g h i j k l", "x y", 8),
    ("x y", "a b c d e f g h i j k l", 8),
    ("one two three four", "five six seven eight", 7),
    ("Héllo, WORLD! Ünïcödé zzqqxx", "", 9),
    ("", "only b", 6),
]


def as_cases(texts, texts_b, length):
    return [(a, b, length) for a, b in zip(texts, texts_b or [None] * len(texts))]


@pytest.mark.parametrize("vocab", [UNCASED_VOCAB, f"{TINY}/vocab.txt"])
def test_matches_the_original_packing(vocab, tmp_path):
    texts, texts_b = LINES[:-1], LINES[1:]
    runs = [(texts, None, 16), (texts, texts_b, 16), (texts, texts_b, 64)] + [([a], [b], n) for a, b, n in HARD]
    cases = [case for texts_a, b, n in runs for case in as_cases(texts_a, b, n)]
    expected = iter(original_packing(cases, vocab, tmp_path))
    tokenizer = kbert.Tokenizer(vocab, do_lower_case=True)
    for texts_a, b, length in runs:
        got = kbert.pack_texts(tokenizer, texts_a, b, sequence_length=length)
        want = np.array([next(expected) for _ in texts_a], np.int32)
        for k, name in enumerate(("input_ids", "input_mask", "segment_ids")):
            assert got[name].dtype == np.int32
            np.testing.assert_array_equal(got[name], want[:, k], err_msg=f"{name} {texts_a[0][:30]!r} {length}")


def test_imports_no_tensorflow():
    code = "import sys, kbert; kbert.pack_texts; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]


def test_bad_inputs_are_one_line(tmp_path):
    tokenizer = kbert.Tokenizer(UNCASED_VOCAB)
    with pytest.raises(KbertError, match=r"texts_b has 1 texts and texts 2; pass one second text per text"):
        kbert.pack_texts(tokenizer, ["a", "b"], ["c"])
    with pytest.raises(
        KbertError, match=r"sequence_length=2 cannot hold \[CLS\] and two \[SEP\]s; pass sequence_length=3 or more"
    ):
        kbert.pack_texts(tokenizer, ["a"], ["b"], sequence_length=2)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[SEP]\nhello\n")
    with pytest.raises(KbertError, match=r"vocab.txt has no \[CLS\]; pack_texts needs a BERT vocab.txt that has both"):
        kbert.pack_texts(kbert.Tokenizer(vocab), ["hello"])


def test_both_packers_are_packers_and_pack_as_pack_texts():
    from kbert.text.graph_packer import BertPreprocessor
    from kbert.text.packing import Packer, PythonPreprocessor

    texts, texts_b = LINES[:-1], LINES[1:]
    python = PythonPreprocessor(UNCASED_VOCAB, sequence_length=16)
    assert isinstance(python, Packer) and isinstance(BertPreprocessor(UNCASED_VOCAB, sequence_length=16), Packer)
    features, truncated = python.pack(texts, texts_b)
    want = kbert.pack_texts(kbert.Tokenizer(UNCASED_VOCAB), texts, texts_b, sequence_length=16)
    for name in want:
        np.testing.assert_array_equal(features[name], want[name], err_msg=name)
    tokens = [len(python.tokenizer.tokenize(a)) + len(python.tokenizer.tokenize(b)) for a, b in zip(texts, texts_b)]
    assert truncated.tolist() == [n > 16 - 3 for n in tokens]
    _, truncated = python.pack(
        ["One two.", "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."]
    )
    assert truncated.tolist() == [False, True]


def test_rows_hold_ragged_lists_and_give_them_back():
    from kbert.text.packing import Rows

    for lists in ([], [[]], [[1, 2], [], [3]], [[-1], [0, 5, 7]]):
        rows = Rows.from_lists(lists)
        assert rows.lengths.dtype == rows.values.dtype == np.int64
        assert rows.to_list() == lists
        assert all(type(v) is int for row in rows.to_list() for v in row)
