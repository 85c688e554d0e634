"""`--long-text windows`: documents longer than the window, read whole in overlapping windows.

The references are google-research/bert's own run_squad.py (its doc-span loop and
`_check_is_max_context`, read from the installed original and run unmodified), windows packed
here by hand from `kbert.Tokenizer`'s tokens (FullTokenizer's), and numpy: the windowed answer
must be the mean (classify, regress) or the max-context choice (tag) of what the model computes
on those hand-made windows.
"""

import ast
import importlib.util
import json
import os
import textwrap

import numpy as np
import pytest

from conftest import FIXTURES, TINY, UNCASED_VOCAB, assert_user_error, run_kbert
from helpers import FILLER, NEGATIVE, POSITIVE, write_conll, write_tsv
from kbert.finetuning import encoding
from kbert.finetuning.options import FinetuneOptions, window_stride
from kbert.finetuning.tasks import TASKS
from kbert.finetuning.windows import Windows, containing_windows, document_mean, max_context_windows
from kbert.runtime.errors import KbertError
from kbert.text.graph_packer import BertPreprocessor, window_starts
from kbert.text.tokenizer import Tokenizer

TINY_VOCAB = os.path.join(TINY, "vocab.txt")


# === The original's rules, run from run_squad.py itself ===


def _run_squad_source() -> str:
    spec = importlib.util.find_spec("bert")  # bert-tensorflow==1.0.4: google-research/bert as published
    with open(os.path.join(spec.submodule_search_locations[0], "run_squad.py")) as f:
        return f.read()


def _original_functions():
    """run_squad.py's doc-span loop (inside convert_examples_to_features) and _check_is_max_context,
    as written there, made callable without importing TensorFlow 1."""
    source = _run_squad_source()
    lines = source.splitlines()
    begin = next(i for i, line in enumerate(lines) if line.strip() == "doc_spans = []")
    end = next(i for i in range(begin, len(lines)) if "start_offset += min(length, doc_stride)" in lines[i])
    loop = textwrap.dedent("\n".join(lines[begin : end + 1]))
    namespace = {}
    exec(
        "import collections\n"
        "_DocSpan = collections.namedtuple('DocSpan', ['start', 'length'])\n"
        "def doc_spans(all_doc_tokens, max_tokens_for_doc, doc_stride):\n"
        + textwrap.indent(loop, "    ")
        + "\n    return doc_spans\n",
        namespace,
    )
    tree = ast.parse(source)
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_check_is_max_context")
    exec(ast.get_source_segment(source, check), namespace)
    return namespace["doc_spans"], namespace["_check_is_max_context"]


ORIGINAL_DOC_SPANS, ORIGINAL_IS_MAX_CONTEXT = _original_functions()


def original_spans(num_tokens, room, stride):
    """[(start, length)] of run_squad.py's windows; one empty window for an empty document, as
    truncation packs it (the original's loop makes none: a SQuAD context always has words)."""
    spans = ORIGINAL_DOC_SPANS(list(range(num_tokens)), room, stride)
    return [(s.start, s.length) for s in spans] or [(0, 0)]


def original_max_context(num_tokens, room, stride):
    """For each token, the window run_squad.py reads it in."""
    spans = ORIGINAL_DOC_SPANS(list(range(num_tokens)), room, stride)
    return [next(i for i in range(len(spans)) if ORIGINAL_IS_MAX_CONTEXT(spans, i, t)) for t in range(num_tokens)]


def hand_windows(tokens, sequence_length, stride, vocab):
    """(input_ids, input_mask, segment_ids, spans) of one document, packed by hand: "[CLS] window [SEP]"."""
    rows = []
    spans = original_spans(len(tokens), sequence_length - 2, stride)
    for start, length in spans:
        ids = [vocab["[CLS]"]] + [vocab[t] for t in tokens[start : start + length]] + [vocab["[SEP]"]]
        rows.append(ids + [0] * (sequence_length - len(ids)))
    ids = np.asarray(rows, np.int32)
    return ids, (ids > 0).astype(np.int32), np.zeros_like(ids), spans


# === The windows ===


def test_the_span_rule_on_a_hand_worked_example():
    # 11 tokens, windows of 4, stride 3: 0-3, 3-6, 6-9, then 9-10, which reaches the end.
    starts, lengths = window_starts(np.array([11, 10, 4, 5, 0]), room=4, stride=3)
    assert starts.to_list() == [[0, 3, 6, 9], [0, 3, 6], [0], [0, 3], [0]]
    assert lengths.to_list() == [[4, 4, 4, 2], [4, 4, 4], [4], [4, 2], [0]]
    assert original_spans(11, 4, 3) == [(0, 4), (3, 4), (6, 4), (9, 2)]


def test_windows_are_run_squads_and_cover_every_token():
    lengths, checked = np.arange(0, 41), 0
    for room in range(2, 13):
        for stride in range(1, room):
            starts, sizes = window_starts(lengths, room, stride)
            for n, row_starts, row_sizes in zip(lengths, starts.to_list(), sizes.to_list()):
                spans = list(zip(row_starts, row_sizes))
                assert spans == original_spans(int(n), room, stride), (n, room, stride)
                covered = np.zeros(n, int)
                for s, length in spans:
                    covered[s : s + length] += 1
                assert (covered >= 1).all() and spans[-1][0] + spans[-1][1] == n
                checked += 1
    assert checked == 41 * 66


def test_packed_windows_hold_the_document_in_order(tmp_path):
    # Real text (the whole sample corpus, CJK and all) and the real vocabulary: each window is
    # [CLS], the document's next tokens, [SEP].
    text = open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8").read()
    tokenizer = Tokenizer(UNCASED_VOCAB, do_lower_case=True)
    tokens = tokenizer.tokenize(text)
    assert len(tokens) > 900
    preprocessor = BertPreprocessor(UNCASED_VOCAB, sequence_length=32)
    features, windows = encoding.encode_text_windows(preprocessor, [text, "Short."], doc_stride=10)
    ids, mask, segments, spans = hand_windows(tokens, 32, 10, tokenizer.vocab)
    n = len(spans)
    np.testing.assert_array_equal(features["input_ids"][:n], ids)
    np.testing.assert_array_equal(features["input_mask"][:n], mask)
    np.testing.assert_array_equal(features["segment_ids"], 0)
    assert windows.document.tolist() == [0] * n + [1]
    assert list(zip(windows.start[:n].tolist(), windows.length[:n].tolist())) == spans
    assert windows.num_tokens.tolist() == [len(tokens), 2]


def test_a_document_of_one_window_is_packed_as_truncation_packs_it():
    texts = [line for line in open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8") if line.strip()]
    preprocessor = BertPreprocessor(UNCASED_VOCAB, sequence_length=128)
    fits = [t for t in texts if len(Tokenizer(UNCASED_VOCAB).tokenize(t)) <= 126] + [""]
    truncated, cut = encoding.encode_texts(preprocessor, fits)
    windowed, windows = encoding.encode_text_windows(preprocessor, fits, doc_stride=63)
    assert cut == 0 and len(fits) > 20
    for name in truncated:
        np.testing.assert_array_equal(windowed[name], truncated[name])
    assert windows.document.tolist() == list(range(len(fits)))


def test_max_context_is_run_squads():
    for n, room, stride in [(40, 6, 1), (40, 6, 2), (40, 6, 5), (37, 8, 3), (9, 8, 4), (5, 8, 3), (26, 5, 4)]:
        spans = original_spans(n, room, stride)
        windows = Windows.from_starts([[s for s, _ in spans]], [n], room)
        window, position = max_context_windows(windows, np.zeros(n, int), np.arange(n))
        assert window.tolist() == original_max_context(n, room, stride), (n, room, stride)
        assert (position == np.arange(n) - windows.start[window] + 1).all()
        which, holding = containing_windows(windows, np.zeros(n, int), np.arange(n))
        expected = [(t, i) for t in range(n) for i, (s, length) in enumerate(spans) if s <= t < s + length]
        assert list(zip(which.tolist(), holding.tolist())) == expected


def test_max_context_over_several_documents_at_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 60, size=30)
    room, stride = 7, 3
    starts, _ = window_starts(lengths, room, stride)
    windows = Windows.from_starts(starts.to_list(), lengths, room)
    document = np.repeat(np.arange(30), lengths)
    token = np.concatenate([np.arange(n) for n in lengths])
    window, _ = max_context_windows(windows, document, token)
    first = windows.first_window
    expected = [first[d] + w for d, n in enumerate(lengths) for w in original_max_context(int(n), room, stride)]
    assert window.tolist() == expected


def test_document_mean_by_hand():
    windows = Windows.from_starts([[0, 3, 6], [0], [0, 2]], [10, 2, 5], 6)
    values = np.arange(12, dtype=np.float32).reshape(6, 2) / 7
    expected = np.stack([values[0:3].mean(0), values[3], values[4:6].mean(0)])
    np.testing.assert_allclose(document_mean(values, windows), expected, rtol=1e-7)
    assert document_mean(values, windows)[1].tobytes() == values[3].tobytes()  # one window: its row, bit for bit


# === Options ===


def test_the_default_stride_is_half_the_window_and_bad_strides_are_refused():
    assert window_stride(None, 128) == 63 and window_stride(None, 16) == 7 and window_stride(5, 16) == 5
    for stride, length in [(126, 128), (200, 128), (14, 16)]:
        with pytest.raises(KbertError, match=f"^doc_stride={stride} must be less than the {length - 2} tokens"):
            window_stride(stride, length)
    with pytest.raises(KbertError, match="^doc_stride=14 must be less than the 14 tokens"):
        FinetuneOptions(long_text="windows", doc_stride=14, max_seq_length=16)
    with pytest.raises(KbertError, match="^doc_stride must be at least 1, got 0"):
        FinetuneOptions(long_text="windows", doc_stride=0)
    with pytest.raises(KbertError, match="^long_text='chunks': use truncate"):
        FinetuneOptions(long_text="chunks")
    with pytest.raises(KbertError, match="max_seq_length=4 or more"):
        window_stride(None, 3)
    assert FinetuneOptions().long_text == "truncate" and FinetuneOptions().doc_stride is None


def test_the_model_directory_checks_what_it_records(tmp_path, tiny_model_dir):
    import kbert
    from kbert.finetuning.tasks import head_task_info

    base = kbert.load(tiny_model_dir)
    classifier = kbert.bert_classifier(base, 2)
    good = {"task": "classify", "max_seq_length": 16, "long_text": "windows", "doc_stride": 7}
    classifier.task_info = good
    assert head_task_info(classifier) == {**good, "labels": ["0", "1"]}
    for bad, message in [
        (
            {"doc_stride": 14},
            "doc_stride 14: a model that reads long texts in windows needs the stride between them, 1 to 13",
        ),
        ({"doc_stride": None}, "doc_stride None"),
        ({"long_text": "chunks"}, "long_text 'chunks': give 'truncate' or 'windows'"),
        ({"text_pairs": True}, "reads single texts"),
    ]:
        classifier.task_info = {**good, **bad}
        with pytest.raises(KbertError, match=message):
            head_task_info(classifier)
    squad = kbert.bert_span_predictor(base, task_info={"task": "squad", "long_text": "windows", "doc_stride": 8})
    with pytest.raises(KbertError, match="long_text applies to classify, regress and tag; a squad model has none"):
        head_task_info(squad)
    # Saved and loaded, the keys come back; a directory without them truncates.
    classifier.task_info = good
    kbert.save(classifier, tmp_path / "windows")
    assert {k: kbert.load(tmp_path / "windows").task_info.get(k) for k in ("long_text", "doc_stride")} == {
        "long_text": "windows",
        "doc_stride": 7,
    }


# === Answers: one per document, from the model's windows ===


def _long_documents(n, seed, cue_words=5):
    """Texts over the tiny vocabulary, most longer than a 16-token window."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        cues = POSITIVE if i % 2 else NEGATIVE
        words = list(rng.choice(FILLER, size=int(rng.integers(0, 45))))
        for _ in range(cue_words):
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(cues)))
        rows.append((" ".join(words) + ".", "pos" if i % 2 else "neg", float(i % 5)))
    return rows


@pytest.fixture(scope="module")
def saved_heads(tmp_path_factory, tiny_model_dir):
    """An untrained classifier, regressor and tagger on tf1-tiny, saved twice: reading long
    texts in windows of 16 (stride 5), and by truncation."""
    import keras

    import kbert

    keras.utils.set_random_seed(3)
    work = tmp_path_factory.mktemp("heads")
    base = kbert.load(tiny_model_dir)
    heads = {
        "classify": (kbert.bert_classifier(base, 3), ["a", "b", "c"]),
        "regress": (kbert.bert_classifier(base, 1), None),
        "tag": (kbert.bert_tagger(base, 3), ["B-LOC", "B-PER", "O"]),
    }
    for task, (model, labels) in heads.items():
        info = {"task": task, "max_seq_length": 16, **({"labels": labels} if labels else {})}
        model.task_info = {**info, "long_text": "windows", "doc_stride": 5}
        kbert.save(model, work / f"{task}-windows")
        model.task_info = info
        kbert.save(model, work / f"{task}-truncate")
    return work, {task: model for task, (model, _) in heads.items()}


def _hand_outputs(model, texts, stride=5, length=16):
    """Per-window logits of the model on windows packed by hand, and each document's windows."""
    tokenizer = Tokenizer(TINY_VOCAB, do_lower_case=True)
    rows, spans = [], []
    for text in texts:
        ids, mask, segments, doc_spans = hand_windows(tokenizer.tokenize(text), length, stride, tokenizer.vocab)
        rows.append((ids, mask, segments))
        spans.append(doc_spans)
    inputs = {
        name: np.concatenate([r[i] for r in rows]) for i, name in enumerate(("input_ids", "input_mask", "segment_ids"))
    }
    return np.asarray(model(inputs, training=False)["logits"]), spans


@pytest.mark.parametrize("task", ["classify", "regress"])
def test_the_windowed_answer_is_the_mean_over_the_models_windows(saved_heads, task, tmp_path):
    from kbert.finetuning.predict import predict

    work, models = saved_heads
    rows = _long_documents(12, 0)
    path = write_tsv(tmp_path / "docs.tsv", [(text,) for text, _, _ in rows], header=("text",))
    logits, spans = _hand_outputs(models[task], [text for text, _, _ in rows])
    assert sum(len(s) for s in spans) > 3 * len(rows)  # most documents take several windows
    predicted = list(predict(work / f"{task}-windows", path))
    assert len(predicted) == len(rows)
    at = 0
    for row, doc_spans in zip(predicted, spans):
        mean = logits[at : at + len(doc_spans)].astype(np.float64).mean(0)
        at += len(doc_spans)
        if task == "classify":
            probabilities = np.exp(mean - mean.max()) / np.exp(mean - mean.max()).sum()
            assert list(row) == ["label", "probabilities"]
            assert row["label"] == ["a", "b", "c"][int(np.argmax(probabilities))]
            np.testing.assert_allclose(list(row["probabilities"].values()), probabilities, atol=2e-6)
        else:
            assert list(row) == ["prediction"]
            assert row["prediction"] == pytest.approx(mean[0], abs=2e-6)


def test_a_tagged_document_longer_than_the_window_has_every_word_tagged_once(saved_heads, tmp_path):
    from kbert.finetuning.predict import predict

    work, models = saved_heads
    tokenizer = Tokenizer(TINY_VOCAB, do_lower_case=True)
    rng = np.random.default_rng(1)
    # "cassius" is two pieces; "ছ" (in the vocabulary) and "\u200b" (no pieces: [UNK]) odd ones.
    vocabulary = FILLER + ["cassius", "great", "ছ", "\u200b"]
    documents = [[str(w) for w in rng.choice(vocabulary, size=size)] for size in (3, 14, 40, 75)]
    path = write_conll(tmp_path / "docs.conll", [(words, ["O"] * len(words)) for words in documents])
    predicted = list(predict(work / "tag-windows", path))
    assert [row["words"] for row in predicted] == documents
    assert [len(row["tags"]) for row in predicted] == [len(words) for words in documents]

    # By hand: each word's pieces ([UNK] for none), windows of 14 pieces every 5, the word read in
    # the window run_squad.py's _check_is_max_context picks, at its first piece.
    for words, row in zip(documents, predicted):
        pieces, firsts = [], []
        for word in words:
            firsts.append(len(pieces))
            pieces += tokenizer.tokenize(word) or ["[UNK]"]
        ids, mask, segments, spans = hand_windows(pieces, 16, 5, tokenizer.vocab)
        logits = np.asarray(models["tag"]({"input_ids": ids, "input_mask": mask, "segment_ids": segments})["logits"])
        span_objects = ORIGINAL_DOC_SPANS(pieces, 14, 5)
        expected = []
        for first in firsts:
            best = [i for i in range(len(span_objects)) if ORIGINAL_IS_MAX_CONTEXT(span_objects, i, first)]
            assert len(best) == 1  # one window per word
            start = spans[best[0]][0]
            expected.append(["B-LOC", "B-PER", "O"][int(np.argmax(logits[best[0], first - start + 1]))])
        assert row["tags"] == expected
        if len(pieces) > 14:
            assert len(spans) > 1


def test_tag_training_labels_sit_on_every_window_holding_a_words_first_piece():
    tokenizer = Tokenizer(TINY_VOCAB, do_lower_case=True)
    preprocessor = BertPreprocessor(TINY_VOCAB, sequence_length=10)
    rng = np.random.default_rng(2)
    documents = [[str(w) for w in rng.choice(FILLER + ["cassius"], size=size)] for size in (2, 9, 30)]
    tags = [[str(t) for t in rng.choice(["B-LOC", "O"], size=len(words))] for words in documents]
    ids = {"B-LOC": 0, "O": 1}
    features, labels, windows, _ = encoding.encode_tagged_windows(preprocessor, documents, tags, ids, doc_stride=3)
    at = 0
    for words, word_tags in zip(documents, tags):
        pieces, expected_tag = [], {}
        for word, tag in zip(words, word_tags):
            expected_tag[len(pieces)] = ids[tag]
            pieces += tokenizer.tokenize(word)
        for start, length in original_spans(len(pieces), 8, 3):
            expected = [-1] * 10
            for piece in range(start, start + length):
                if piece in expected_tag:
                    expected[piece - start + 1] = expected_tag[piece]
            assert labels[at].tolist() == expected
            at += 1
    assert at == len(labels)


def test_a_document_of_one_window_gives_todays_answer_bit_for_bit(saved_heads, tmp_path):
    from kbert.finetuning.tasks.classify import document_logits

    work, models = saved_heads
    texts = [" ".join(FILLER[i : i + 9]) + "." for i in range(0, 13)]  # all fit in 14 tokens
    path = write_tsv(tmp_path / "short.tsv", [(t, "a", 1.0) for t in texts], header=("text", "label", "score"))
    preprocessor = BertPreprocessor(TINY_VOCAB, sequence_length=16)
    for task in ("classify", "regress"):
        answers = []
        for long_text in ("truncate", "windows"):
            options = FinetuneOptions(long_text=long_text, doc_stride=5 if long_text == "windows" else None)
            data = TASKS[task].read(
                str(path), preprocessor=preprocessor, labels=["a", "b", "c"] if task == "classify" else None,
                options=options, require_labels=False, training=False,
            )  # fmt: skip
            assert data.truncated == 0 and data.size == len(texts)
            answers.append(document_logits(data, TASKS[task].outputs(models[task], data, 32)))
        assert answers[0].tobytes() == answers[1].tobytes()
    from kbert.finetuning.predict import predict

    conll = write_conll(tmp_path / "short.conll", [(t.rstrip(".").split(), ["O"] * 9) for t in texts])
    assert list(predict(work / "tag-windows", conll)) == list(predict(work / "tag-truncate", conll))
    assert list(predict(work / "classify-windows", path)) == list(predict(work / "classify-truncate", path))


def test_a_model_without_the_keys_truncates(saved_heads, tmp_path):
    from kbert.finetuning.predict import predict

    work, _ = saved_heads
    config = json.load(open(work / "classify-truncate" / "bert_config.json"))
    assert "long_text" not in config and "doc_stride" not in config
    rows = _long_documents(4, 5)
    path = write_tsv(tmp_path / "docs.tsv", [(text,) for text, _, _ in rows], header=("text",))
    assert len(list(predict(work / "classify-truncate", path))) == 4


def test_windows_refuse_pairs_and_a_stride_the_window_cannot_take(saved_heads, tmp_path):
    from kbert.finetuning.predict import predict

    work, _ = saved_heads
    pairs = write_tsv(tmp_path / "pairs.tsv", [("the city", "a camp", "a")], header=("text", "text_b", "label"))
    with pytest.raises(
        KbertError,
        match=r"holds sentence pairs \(text_b\), and this model reads one text per row \(it was fine-tuned with "
        r"long_text='windows'\): join the two texts into the text column$",
    ):
        list(predict(work / "classify-windows", pairs))
    single = write_tsv(tmp_path / "one.tsv", [("the city",)], header=("text",))
    with pytest.raises(KbertError, match="^doc_stride=5 must be less than the 5 tokens"):
        list(predict(work / "classify-windows", single, max_seq_length=7))


def test_fine_tuning_windows_on_pairs_names_the_choice(tmp_path, tiny_model_dir):
    from kbert.finetuning.train import finetune

    pairs = write_tsv(tmp_path / "pairs.tsv", [("the city", "a camp", "a")] * 4, header=("text", "text_b", "label"))
    with pytest.raises(KbertError) as raised:
        finetune(tiny_model_dir, "classify", pairs, tmp_path / "out", long_text="windows")
    assert str(raised.value) == (
        f"{pairs} holds sentence pairs (text_b), and long_text='windows' reads one text per row: join the two "
        f"texts into the text column, or use long_text='truncate'"
    )
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", pairs, "--output", tmp_path / "out",
        "--long-text", "windows", check=False,
    )  # fmt: skip
    assert_user_error(result, "and --long-text windows reads one text per row", "or use --long-text truncate")
    assert not (tmp_path / "out").exists()


def test_the_epochs_order_shuffles_every_window_as_truncation_shuffles_examples():
    import tensorflow as tf

    from kbert.finetuning.train import window_order

    lengths = np.random.default_rng(4).integers(0, 30, size=50)
    starts, _ = window_starts(lengths, 8, 3)
    windows = Windows.from_starts(starts.to_list(), lengths, 8)
    n = len(windows.document)
    assert n > 100
    order = window_order(windows, seed=7)
    assert sorted(order.tolist()) == list(range(n))
    # The windows in the order truncation shuffles its examples, with the same seed: a file
    # whose documents are one window each trains as with --long-text truncate.
    shuffled = tf.data.Dataset.range(n).shuffle(n, seed=7, reshuffle_each_iteration=False)
    assert order.tolist() == [int(i) for i in shuffled]
    # Long documents' windows are spread over the epoch, not left in runs of one label.
    documents = windows.document[order]
    runs = 1 + int(np.sum(documents[1:] != documents[:-1]))
    assert runs > n * 0.8
    assert window_order(windows, seed=7).tolist() == order.tolist()
    assert window_order(windows, seed=8).tolist() != order.tolist()


# === From the shell ===


def _sample_documents():
    """Real text: google-research's sample corpus, sentences run together into documents of 1
    to 6 sentences, labelled by whether they speak of gold anywhere."""
    sentences = [line.strip() for line in open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8")]
    sentences = [s for s in sentences if s][3:]
    rows = []
    for i in range(len(sentences)):
        text = " ".join(sentences[i : i + 1 + i % 6])
        rows.append((text, "gold" if "gold" in text.lower() else "none"))
    return rows


@pytest.mark.slow
def test_finetune_windows_then_predict_and_evaluate_from_the_shell(tmp_path, tiny_model_dir):
    rows = _sample_documents()
    train = write_tsv(tmp_path / "train.tsv", rows)
    out = tmp_path / "model"
    flags = ["--epochs", "2", "--batch-size", "8", "--max-seq-length", "24", "--learning-rate", "1e-3"]
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", train, "--dev", train, "--output", out,
        "--long-text", "windows", "--doc-stride", "8", *flags,
    )  # fmt: skip
    assert "documents longer than 22 tokens became" in result.stderr and "(stride 8)" in result.stderr
    config = json.load(open(out / "bert_config.json"))
    assert (config["long_text"], config["doc_stride"], config["max_seq_length"]) == ("windows", 8, 24)
    tokenizer = Tokenizer(TINY_VOCAB, do_lower_case=True)
    assert max(len(tokenizer.tokenize(text)) for text, _ in rows) > 100  # documents of several windows

    predicted = [json.loads(line) for line in run_kbert("predict", out, "--input", train).stdout.splitlines()]
    assert len(predicted) == len(rows) and all(list(p) == ["label", "probabilities"] for p in predicted)
    metrics = json.loads(run_kbert("evaluate", out, "--input", train).stdout)
    assert metrics["examples"] == len(rows)  # documents, not windows
    accuracy = np.mean([p["label"] == label for p, (_, label) in zip(predicted, rows)])
    assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert json.loads(result.stdout)["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_windows_learn_what_truncation_cannot_see(tmp_path, tiny_model_dir):
    # The class is in cue words after 14 to 16 filler words: past the first window of 14 tokens.
    rng = np.random.default_rng(6)

    def rows(n):
        out = []
        for i in range(n):
            filler = " ".join(rng.choice(FILLER, size=int(rng.integers(14, 17))))
            cues = " ".join(rng.choice(POSITIVE if i % 2 else NEGATIVE, size=10))
            out.append((f"{filler} {cues}.", "pos" if i % 2 else "neg"))
        return out

    train, dev = write_tsv(tmp_path / "train.tsv", rows(256)), write_tsv(tmp_path / "dev.tsv", rows(64))
    flags = ["--epochs", "3", "--batch-size", "16", "--max-seq-length", "16", "--learning-rate", "1e-3"]
    accuracy = {}
    for long_text in ("truncate", "windows"):
        out = tmp_path / long_text
        args = ["--task", "classify", "--train", train, "--dev", dev, "--output", out, "--long-text", long_text]
        run_kbert("finetune", tiny_model_dir, *args, *flags)
        accuracy[long_text] = json.loads(run_kbert("evaluate", out, "--input", dev).stdout)["accuracy"]
    assert accuracy["windows"] >= 0.95 and accuracy["truncate"] <= 0.65, accuracy


@pytest.mark.slow
def test_training_on_documents_of_one_window_is_truncations_bit_for_bit(tmp_path, tiny_model_dir):
    # Same examples, same order (the documents shuffled as truncation shuffles its examples),
    # same batches: the same weights.
    import kbert
    from helpers import sentiment_rows

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(64, 0))
    flags = ["--epochs", "2", "--batch-size", "8", "--max-seq-length", "24"]
    weights = {}
    for long_text in ("truncate", "windows"):
        out = tmp_path / long_text
        run_kbert("finetune", tiny_model_dir, "--task", "classify", "--train", train, "--output", out,
                  "--long-text", long_text, *flags)  # fmt: skip
        weights[long_text] = kbert.load(out).get_weights()
    assert len(weights["truncate"]) == len(weights["windows"]) > 40
    for a, b in zip(weights["truncate"], weights["windows"]):
        assert a.tobytes() == b.tobytes()


@pytest.mark.slow
def test_tag_windows_from_the_shell(tmp_path, tiny_model_dir):
    from helpers import conll_sentences

    # Documents of five sentences each, longer than a window of 14 pieces.
    sentences = conll_sentences(400, 0)
    documents = [
        ([w for words, _ in sentences[i : i + 5] for w in words], [t for _, tags in sentences[i : i + 5] for t in tags])
        for i in range(0, 400, 5)
    ]
    train = write_conll(tmp_path / "train.conll", documents)
    out = tmp_path / "model"
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "tag", "--train", train, "--dev", train, "--output", out,
        "--long-text", "windows", "--max-seq-length", "16",
        "--epochs", "6", "--batch-size", "16", "--learning-rate", "1e-3",
    )  # fmt: skip
    assert "80 of 80 documents longer than 14 tokens" in result.stderr
    config = json.load(open(out / "bert_config.json"))
    assert (config["long_text"], config["doc_stride"]) == ("windows", 7)
    predicted = [json.loads(line) for line in run_kbert("predict", out, "--input", train).stdout.splitlines()]
    assert [p["words"] for p in predicted] == [words for words, _ in documents]
    assert all(len(p["tags"]) == len(p["words"]) for p in predicted)
    metrics = json.loads(run_kbert("evaluate", out, "--input", train).stdout)
    assert metrics["f1"] == pytest.approx(json.loads(result.stdout)["f1"], abs=1e-6)
    assert metrics["examples"] == 80 and metrics["f1"] >= 0.8, metrics


def test_windows_are_refused_for_squad_and_choice(tmp_path, tiny_model_dir):
    train = write_tsv(tmp_path / "train.tsv", [("the city", "a")])
    for task, fragment in [("squad", "squad reads long contexts in windows already"), ("choice", "choice packs")]:
        result = run_kbert(
            "finetune", tiny_model_dir, "--task", task, "--train", train, "--output", tmp_path / "out",
            "--long-text", "windows", check=False,
        )  # fmt: skip
        assert_user_error(result, "--long-text windows applies to classify, regress and tag", fragment)
    assert not (tmp_path / "out").exists()
