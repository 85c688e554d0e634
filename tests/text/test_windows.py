"""kbert.text.windows against google-research/bert's run_squad.py: its doc-span loop and
`_check_is_max_context`, transcribed below in plain Python, over a grid of small cases and many
random ones (empty documents, documents of exactly one window, strides longer than the window,
windows of over 100 tokens, where 0.01 x the length decides between a long and a short window),
run as numpy, as eager TensorFlow ops and inside a tf.function."""

import numpy as np
import pytest
import tensorflow as tf

from kbert.text.windows import holding_windows, sliding_windows

# === run_squad.py, as written there (convert_examples_to_features' loop, _check_is_max_context) ===


def original_doc_spans(num_tokens, max_tokens_for_doc, doc_stride):
    doc_spans = []
    start_offset = 0
    while start_offset < num_tokens:
        length = num_tokens - start_offset
        if length > max_tokens_for_doc:
            length = max_tokens_for_doc
        doc_spans.append((start_offset, length))
        if start_offset + length == num_tokens:
            break
        start_offset += min(length, doc_stride)
    return doc_spans


def original_check_is_max_context(doc_spans, cur_span_index, position):
    best_score = None
    best_span_index = None
    for span_index, (start, length) in enumerate(doc_spans):
        end = start + length - 1
        if position < start:
            continue
        if position > end:
            continue
        num_left_context = position - start
        num_right_context = end - position
        score = min(num_left_context, num_right_context) + 0.01 * length
        if best_score is None or score > best_score:
            best_score = score
            best_span_index = span_index
    return cur_span_index == best_span_index


def expected(num_tokens, room, stride):
    """(spans, owner, position) for one document: its windows, and for each token the window
    whose token_is_max_context run_squad.py sets, and the token's index there."""
    spans = original_doc_spans(num_tokens, room, stride)
    owner = [None] * num_tokens
    for i, (start, length) in enumerate(spans):
        for p in range(start, start + length):
            if original_check_is_max_context(spans, i, p):
                assert owner[p] is None
                owner[p] = i
    return spans, owner, [p - spans[i][0] for p, i in enumerate(owner)]


# === The cases ===

GRID = [(room, stride, list(range(0, 21))) for room in range(1, 7) for stride in range(1, 9)]


def random_cases(count=150, seed=0):
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(count):
        room = int(rng.choice([rng.integers(1, 12), rng.integers(12, 64), rng.integers(100, 260)]))
        stride = int(rng.integers(max(1, room // 6), room + 20))  # up to longer than the window
        lengths = rng.integers(0, 3 * room + 10, size=5).tolist()
        lengths += [0, room, room + 1]  # empty, exactly one window, just over one
        cases.append((room, stride, lengths))
    return cases


def check(got, room, stride, lengths, empty_window):
    """`got` (one sliding_windows call over `lengths`, every token asked about) against run_squad.py."""
    count, document, start, length, owner, position = (np.asarray(a).tolist() for a in got)
    assert document == [d for d, c in enumerate(count) for _ in range(c)]
    row, token = 0, 0  # the document's first window and first token
    for d, n in enumerate(lengths):
        spans, want_owner, want_position = expected(n, room, stride)
        if empty_window and n == 0:
            spans = [(0, 0)]
        case = (n, room, stride)
        assert count[d] == len(spans), case
        assert list(zip(start[row : row + len(spans)], length[row : row + len(spans)])) == spans, case
        assert [w - row for w in owner[token : token + n]] == want_owner, case
        assert position[token : token + n] == want_position, case
        row, token = row + len(spans), token + n
    assert (row, token) == (len(start), len(owner))


def every_token(lengths):
    """(document, index) of every token of documents of these lengths."""
    index = [np.arange(n, dtype=np.int64) for n in lengths]
    return np.repeat(np.arange(len(lengths)), lengths), np.concatenate(index + [np.zeros(0, np.int64)])


@tf.function(
    input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)]
    + [tf.TensorSpec([None], tf.int64)] * 2
)
def in_graph(num_tokens, room, stride, document, token):
    return sliding_windows(num_tokens, room, stride, (document, token), empty_window=True)


def run(way, lengths, room, stride, empty_window):
    document, token = every_token(lengths)
    if way == "numpy":
        return sliding_windows(np.asarray(lengths), room, stride, (document, token), empty_window=empty_window)
    if way == "eager":
        tensors = [tf.constant(lengths, tf.int32), room, stride, tf.constant(document), tf.constant(token, tf.int64)]
        return sliding_windows(*tensors[:3], tuple(tensors[3:]), empty_window=empty_window)
    assert empty_window  # the graph's callers pack an empty document as one empty window
    return in_graph(lengths, room, stride, document, token.astype(np.int64))


@pytest.mark.parametrize("way, empty_window", [("numpy", False), ("numpy", True), ("eager", False), ("graph", True)])
def test_windows_and_owners_are_run_squads(way, empty_window):
    cases = GRID + random_cases()
    for room, stride, lengths in cases:
        check(run(way, lengths, room, stride, empty_window), room, stride, lengths, empty_window)


def test_numpy_inputs_give_numpy_and_tensors_give_int32_tensors():
    got = sliding_windows([7], 4, 2, ([0], [3]))
    assert all(isinstance(a, np.ndarray) for a in got)
    got = sliding_windows(tf.constant([7]), 4, 2, (tf.constant([0]), tf.constant([3])))
    assert all(tf.is_tensor(a) and a.dtype == tf.int32 for a in got)


def test_holding_windows_is_every_window_that_holds_each_token():
    for room, stride, lengths in GRID[::5] + random_cases(30, seed=1):
        windows = sliding_windows(lengths, room, stride)
        which, window = holding_windows(windows, every_token(lengths))
        want, row, token = [], 0, 0
        for n in lengths:
            spans = original_doc_spans(n, room, stride)
            want += [(token + t, row + i) for t in range(n) for i, (s, m) in enumerate(spans) if s <= t < s + m]
            row, token = row + len(spans), token + n
        assert list(zip(which.tolist(), window.tolist())) == want, (room, stride, lengths)


@pytest.mark.parametrize("room, stride", [(0, 1), (3, 0), (-1, 2)])
def test_a_window_or_stride_under_one_is_refused(room, stride):
    with pytest.raises(ValueError, match="must both be at least 1"):
        sliding_windows([5], room, stride)
