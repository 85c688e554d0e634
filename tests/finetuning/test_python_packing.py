"""Fine-tuning's packing on JAX and PyTorch (`kbert.text.packing.PythonPreprocessor`: the
Python tokenizer and numpy) gives the ids of the in-graph packer that TensorFlow runs, every export
included: on the real vocabulary and real text, for every kind of example. (Fine-tuning on those
backends themselves: tests/test_without_tensorflow.py.)
"""

import json
import os

import numpy as np
import pytest

from conftest import FIXTURES, UNCASED_VOCAB
from kbert.runtime.errors import KbertError

# === The Python packer against the in-graph one ===


def _real_texts():
    with open(os.path.join(FIXTURES, "tokenizer-sample.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    with open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8") as f:
        texts += [line.strip() for line in f]
    # An empty text, and one of only a control character.
    return texts + ["", "\x00"]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_the_python_packer_gives_the_in_graph_packers_ids(lower):
    from kbert.finetuning import encoding
    from kbert.text.graph_packer import BertPreprocessor
    from kbert.text.packing import PythonPreprocessor

    texts = _real_texts()
    pairs = texts[1:] + texts[:1]
    words = [text.split() for text in texts]
    tags = [["O"] * len(sentence) for sentence in words]
    for length in (8, 40):
        graph, python = (
            BertPreprocessor(UNCASED_VOCAB, lower, length),
            PythonPreprocessor(UNCASED_VOCAB, lower, length),
        )
        for name, run in {
            "single": lambda p: encoding.encode_texts(p, texts),
            "pairs": lambda p: encoding.encode_texts(p, texts, pairs),
            "tagged": lambda p: encoding.encode_tagged(p, words, tags, {"O": 3}),
            "windows": lambda p: encoding.encode_text_windows(p, texts, doc_stride=3),
            "tagged windows": lambda p: encoding.encode_tagged_windows(p, words, tags, {"O": 3}, doc_stride=2),
            "choices": lambda p: encoding.encode_choices(p, texts[:8], [pairs[i : i + 3] for i in range(8)]),
        }.items():
            _assert_same(run(graph), run(python), f"{name} at {length}")


def _assert_same(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}: {key}")
    elif isinstance(a, (tuple, list)) and not (a and isinstance(a[0], (int, np.integer))):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}: [{i}]")
    elif hasattr(a, "document"):  # Windows
        for field in ("document", "start", "length", "num_tokens"):
            _assert_same(getattr(a, field), getattr(b, field), f"{where}: {field}")
    else:
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype, f"{where}: {a.dtype} and {b.dtype}"
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)


def test_both_packers_answer_the_packer_methods_alike():
    """The `Packer` methods encoding.py calls: the same arrays, `Rows` and dtypes from either packer."""
    from kbert.text.graph_packer import BertPreprocessor
    from kbert.text.packing import PythonPreprocessor, Rows

    texts = _real_texts()
    words = [text.split() for text in texts]
    graph, python = (
        BertPreprocessor(UNCASED_VOCAB, sequence_length=12),
        PythonPreprocessor(UNCASED_VOCAB, sequence_length=12),
    )
    for name, run in {
        "encode": lambda p: p.encode(texts, texts[::-1]),
        "encode_words": lambda p: p.encode_words(words),
        "encode_windows": lambda p: p.encode_windows(texts, 4),
        "encode_word_windows": lambda p: p.encode_word_windows(words, 4),
    }.items():
        got, want = run(graph), run(python)
        assert [type(part) for part in got] == [type(part) for part in want], name
        rows = [(g, w) for g, w in zip(got, want) if isinstance(g, Rows)]
        for g, w in rows:
            np.testing.assert_array_equal(g.lengths, w.lengths, err_msg=name)
            np.testing.assert_array_equal(g.values, w.values, err_msg=name)
            assert g.to_list() == w.to_list(), name
        _assert_same(
            [part for part in got if not isinstance(part, Rows)],
            [part for part in want if not isinstance(part, Rows)],
            name,
        )


def test_both_packers_refuse_words_without_unk_alike(tmp_path):
    from kbert.text.graph_packer import BertPreprocessor
    from kbert.text.packing import PythonPreprocessor

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[CLS]\n[SEP]\nhello\n")
    for packer in (BertPreprocessor(vocab, sequence_length=8), PythonPreprocessor(vocab, sequence_length=8)):
        with pytest.raises(KbertError, match=r"vocab.txt has no \[UNK\]; use the vocab.txt the model was trained with"):
            packer.encode_words([["hello"]])


def test_a_lone_surrogate_in_a_text_is_dropped_not_fatal():
    """JSON can carry a lone surrogate ("\\ud800"); the in-graph packer takes it as the invalid
    UTF-8 a client would send, which its tokenizer drops, rather than failing the whole file."""
    from kbert.finetuning.encoding import encode_texts
    from kbert.text.graph_packer import BertPreprocessor

    packer = BertPreprocessor(UNCASED_VOCAB, sequence_length=16)
    got, _ = encode_texts(packer, [json.loads('"great \\ud800movie"'), "fine"])
    want, _ = encode_texts(packer, ["great movie", "fine"])
    assert got["input_ids"].tolist() == want["input_ids"].tolist()
