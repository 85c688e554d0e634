"""SQuAD v1.1 and v2.0 for `kbert finetune --task squad` and `kbert evaluate`, without TensorFlow.

Each step is google-research/bert's run_squad.py, in plain Python and numpy:

    read_squad          read_squad_examples: whitespace words and the answer's word span
    squad_features      convert_examples_to_features: question + sliding doc_stride windows,
                        the WordPiece answer span, [CLS] for answers outside a window
    squad_evaluate      the official evaluate-v1.1.py / evaluate-v2.0.py exact match and F1

Its write_predictions (n-best spans over the model's start/end logits, mapped back to the
original text, v2's null answer) is `kbert.finetuning.squad_decoding.squad_predictions`.

The numbers are the original's: the same windows, positions and max-context flags, which
tests/finetuning/test_squad.py checks against run_squad.py itself.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import re
import string

import numpy as np

from kbert.runtime.errors import KbertError, option
from kbert.text.windows import sliding_windows

log = logging.getLogger("kbert")

# read_squad_examples' is_whitespace: the characters that separate words in a context.
_WHITESPACE = frozenset(" \t\r\n\u202f")


@dataclasses.dataclass
class SquadExample:
    """One question on one paragraph: run_squad.py's SquadExample, plus the gold answers.

    Args:
        qas_id: str. The question's "id" in the SQuAD file.
        question_text: str. The question.
        doc_tokens: list[str]. The paragraph split on whitespace (space, tab, CR, LF, U+202F).
            The questions of one paragraph share one list.
        orig_answer_text: str | None. Training only: the answer's text ("" when impossible).
        start_position: int | None. Training only: index in `doc_tokens` of the answer's
            first word (-1 when impossible).
        end_position: int | None. Training only: index of the answer's last word.
        is_impossible: bool. SQuAD v2.0: the paragraph does not answer the question.
        answers: list[str]. Every gold answer text in the file, for `squad_evaluate`
            (empty for a v2.0 question without an answer).
    """

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str | None = None
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False
    answers: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SquadFeature:
    """One window of one example, with what `squad_predictions` needs to map logits back.

    Args:
        example_index: int. Index of the example in the list given to `squad_features`.
        doc_span_index: int. Which window of that example (0, 1, ...).
        tokens: list[str]. [CLS] question [SEP] window [SEP], unpadded.
        doc_offset: int. Index in `tokens` of the window's first document token.
        orig_index: np.ndarray. int32 [window length]: for each window token, the index in
            the example's `doc_tokens` of the word it came from.
        max_context: np.ndarray. bool [window length]: this window is the one where the
            token has the most context on both sides (only there may an answer start).

    `token_to_orig_map` and `token_is_max_context` give the last two as run_squad.py's
    dicts, keyed by position in `tokens`.
    """

    example_index: int
    doc_span_index: int
    tokens: list[str]
    doc_offset: int
    orig_index: np.ndarray
    max_context: np.ndarray

    @property
    def token_to_orig_map(self) -> dict[int, int]:
        return {self.doc_offset + i: int(o) for i, o in enumerate(self.orig_index)}

    @property
    def token_is_max_context(self) -> dict[int, bool]:
        return {self.doc_offset + i: bool(m) for i, m in enumerate(self.max_context)}


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


def read_squad(path, is_training: bool) -> list[SquadExample]:
    """The questions of a SQuAD v1.1 or v2.0 JSON file, as run_squad.py's read_squad_examples.

    For training, each answerable question needs exactly one answer, and a question whose
    answer text is not found at its `answer_start` is skipped (the original does the same);
    how many were skipped is logged as one warning. A question with `"is_impossible": true`
    (SQuAD v2.0) has no answer: start and end positions -1.

    Args:
        path: str. A SQuAD JSON file (`{"data": [{"paragraphs": [{"context", "qas"}]}]}`).
        is_training: bool. Fill the answer positions and check them.

    Returns:
        list[SquadExample], in file order.

    Raises:
        KbertError: the file is missing, not JSON, or not shaped like SQuAD.

    Example:
    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "train.json")
    >>> squad = {"version": "1.1", "data": [{"title": "Curie", "paragraphs": [{
    ...     "context": "Marie Curie was born in Warsaw in 1867.",
    ...     "qas": [{"id": "q1", "question": "Where was Marie Curie born?",
    ...              "answers": [{"text": "Warsaw", "answer_start": 24}]}]}]}]}
    >>> with open(path, "w") as f:
    ...     json.dump(squad, f)
    >>> [example] = read_squad(path, is_training=True)
    >>> example.doc_tokens
    ['Marie', 'Curie', 'was', 'born', 'in', 'Warsaw', 'in', '1867.']
    >>> example.start_position, example.end_position, example.answers
    (5, 5, ['Warsaw'])
    """
    path = os.fspath(path)
    dataset = _load_squad_json(path)
    examples = []
    questions = skipped = 0
    for a, entry in enumerate(dataset["data"]):
        for p, paragraph in enumerate(_field(entry, "paragraphs", list, path, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", str, path, where)
            qas = _field(paragraph, "qas", list, path, where)
            doc_tokens, char_to_word_offset = _split_words(context)
            for q, qa in enumerate(qas):
                questions += 1
                example = _read_question(
                    qa, f"{where}.qas[{q}]", path, is_training, context, doc_tokens, char_to_word_offset
                )
                if example is None:
                    skipped += 1
                else:
                    examples.append(example)
    if questions == 0:
        raise KbertError(f"{path} has no questions: every 'qas' list is empty")
    if skipped:
        log.warning(
            "%s: skipped %d of %d training questions whose answer text is not at its "
            "answer_start (run_squad.py skips these too)",
            path,
            skipped,
            questions,
        )
    return examples


def _load_squad_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise KbertError(f"{path}: no such SQuAD file; pass a SQuAD JSON file such as train-v1.1.json or dev-v2.0.json")
    try:
        with open(path, encoding="utf-8") as f:
            dataset = json.load(f)
    except UnicodeDecodeError as e:
        raise KbertError(f"{path} is not SQuAD JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise KbertError(f"{path} is not SQuAD JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
        raise KbertError(f"{path} is not SQuAD JSON: no 'data' list")
    return dataset


_KIND_NAMES = {list: "list", str: "string", int: "integer", dict: "object"}


def _field(obj, key, kind, path, where):
    """obj[key], which must be a `kind`; otherwise a KbertError naming the file and place."""
    if not isinstance(obj, dict):
        raise KbertError(f"{path} is not SQuAD JSON: {where} is not an object")
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KbertError(f"{path} is not SQuAD JSON: {where} has no {key!r} {_KIND_NAMES[kind]}")
    return value


def _split_words(context: str) -> tuple[list[str], list[int]]:
    """The context's whitespace-separated words, and for each character its word's index."""
    doc_tokens, char_to_word_offset = [], []
    prev_is_whitespace = True
    for c in context:
        if c in _WHITESPACE:
            prev_is_whitespace = True
        else:
            if prev_is_whitespace:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


def _read_question(qa, where, path, is_training, context, doc_tokens, char_to_word_offset):
    """One SquadExample, or None for a training question whose answer is not where it says."""
    if not isinstance(qa, dict):
        raise KbertError(f"{path} is not SQuAD JSON: {where} is not an object")
    qas_id = qa.get("id")
    if not isinstance(qas_id, (str, int)) or isinstance(qas_id, bool):
        raise KbertError(f"{path} is not SQuAD JSON: {where} has no 'id' string")
    question = _field(qa, "question", str, path, where)
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        raise KbertError(f"{path} is not SQuAD JSON: {where}.answers is not a list")
    texts = [_field(answer, "text", str, path, f"{where}.answers[{i}]") for i, answer in enumerate(answers)]
    is_impossible = bool(qa.get("is_impossible", False))
    example = SquadExample(qas_id, question, doc_tokens, is_impossible=is_impossible, answers=texts)
    if not is_training:
        return example
    if is_impossible:
        example.orig_answer_text, example.start_position, example.end_position = "", -1, -1
        return example
    if len(answers) != 1:
        raise KbertError(
            f"{path}: question {qas_id!r} has {len(answers)} answers; training needs "
            f"exactly 1 per answerable question (a dev file lists several)"
        )
    text = texts[0]
    offset = _field(answers[0], "answer_start", int, path, f"{where}.answers[0]")
    if not text or offset < 0 or offset + len(text) > len(context):
        raise KbertError(
            f"{path}: question {qas_id!r} has answer_start {offset} and a "
            f"{len(text)}-character answer, outside its {len(context)}-character context"
        )
    start_position = char_to_word_offset[offset]
    end_position = char_to_word_offset[offset + len(text) - 1]
    # Only answers whose text can be recovered from the words: a mismatch is usually odd
    # Unicode or a wrong offset, and the original drops the question.
    actual_text = " ".join(doc_tokens[start_position : end_position + 1])
    if actual_text.find(" ".join(text.split())) == -1:
        return None
    example.orig_answer_text = text
    example.start_position, example.end_position = start_position, end_position
    return example


# ---------------------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------------------


# long: run_squad.py's convert_examples_to_features, step for step, to read beside it
def squad_features(
    examples, tokenizer, max_seq_length=384, doc_stride=128, max_query_length=64, is_training=False
) -> tuple[dict[str, np.ndarray], list[SquadFeature]]:
    """Model inputs for SQuAD, as run_squad.py's convert_examples_to_features.

    Each example becomes one or more features `[CLS] question [SEP] window [SEP]`: the
    question cut to `max_query_length` tokens, the paragraph's WordPiece tokens in windows
    of what is left of `max_seq_length`, each starting `doc_stride` tokens after the last.
    For training, the answer's token span (narrowed to the answer text where WordPiece splits
    punctuation off a word) is given relative to each window, or [CLS] (0, 0) for a window
    that does not hold the whole answer and for impossible questions.

    Args:
        examples: list[SquadExample]. From `read_squad` (with `is_training` the same).
        tokenizer: kbert.Tokenizer. The model's vocab and casing.
        max_seq_length: int. Length of each feature, padded with id 0.
        doc_stride: int. Tokens between the starts of two windows.
        max_query_length: int. Question tokens kept.
        is_training: bool. Also return the answer positions.

    Returns:
        (arrays, features): arrays `input_ids`, `input_mask`, `segment_ids` int32
        [F, max_seq_length], and with `is_training` `start_positions`, `end_positions` int32
        [F]; features, one SquadFeature per row, for `squad_predictions`.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
    >>> example = SquadExample("q1", "When was Marie Curie born?",
    ...                        "Marie Curie was born in Warsaw in 1867.".split(), "1867", 7, 7)
    >>> arrays, features = squad_features([example], tokenizer, max_seq_length=24,
    ...                                   max_query_length=16, is_training=True)
    >>> " ".join(features[0].tokens)
    '[CLS] when was marie cu ##rie born ? [SEP] marie cu ##rie was born in warsaw in 1867 . [SEP]'
    >>> start, end = arrays["start_positions"][0], arrays["end_positions"][0]
    >>> features[0].tokens[start:end + 1]
    ['1867']
    >>> arrays["segment_ids"][0].tolist()
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    """
    if max_seq_length <= max_query_length + 3:
        raise KbertError(
            f"max_seq_length ({max_seq_length}) must be greater than max_query_length "
            f"({max_query_length}) + 3; raise {option('max_seq_length', command='finetune')} or lower "
            f"{option('max_query_length', command='finetune')}"
        )
    if doc_stride < 1:
        raise KbertError(f"doc_stride must be at least 1, not {doc_stride}")
    missing = [t for t in ("[CLS]", "[SEP]") if t not in tokenizer.vocab]
    if missing:
        raise KbertError(
            f"{tokenizer.vocab_file} has no {' or '.join(missing)} token; pass the vocab.txt of a BERT model"
        )

    rows = {"input_ids": [], "input_mask": [], "segment_ids": []}
    if is_training:
        rows.update(start_positions=[], end_positions=[])
    features = []
    paragraph = None
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)[:max_query_length]

        # The questions of one paragraph share its words: tokenize them once.
        if example.doc_tokens is not paragraph:
            paragraph = example.doc_tokens
            tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
            for i, word in enumerate(paragraph):
                orig_to_tok_index.append(len(all_doc_tokens))
                for sub_token in tokenizer.tokenize(word):
                    tok_to_orig_index.append(i)
                    all_doc_tokens.append(sub_token)
            tok_to_orig_array = np.asarray(tok_to_orig_index, np.int32)
            doc_ids = np.asarray(tokenizer.convert_tokens_to_ids(all_doc_tokens), np.int32)

        if is_training and not example.is_impossible:
            tok_start = orig_to_tok_index[example.start_position]
            if example.end_position < len(example.doc_tokens) - 1:
                tok_end = orig_to_tok_index[example.end_position + 1] - 1
            else:
                tok_end = len(all_doc_tokens) - 1
            tok_start, tok_end = _improve_answer_span(
                all_doc_tokens, tok_start, tok_end, tokenizer, example.orig_answer_text
            )

        # The -3 accounts for [CLS], [SEP] and [SEP].
        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3
        n = len(all_doc_tokens)
        windows = sliding_windows([n], max_tokens_for_doc, doc_stride, (np.zeros(n, np.int64), np.arange(n)))
        doc_spans = list(zip(windows.start.tolist(), windows.length.tolist()))
        best_span = windows.owner  # for each document token, the window where it has the most context
        head = ["[CLS]", *query_tokens, "[SEP]"]
        head_ids = tokenizer.convert_tokens_to_ids(head)
        doc_offset = len(head)
        sep_id = head_ids[-1]

        for doc_span_index, (span_start, span_length) in enumerate(doc_spans):
            span_end = span_start + span_length
            tokens = head + all_doc_tokens[span_start:span_end] + ["[SEP]"]
            n = len(tokens)
            input_ids = np.zeros(max_seq_length, np.int32)
            input_ids[:doc_offset] = head_ids
            input_ids[doc_offset : n - 1] = doc_ids[span_start:span_end]
            input_ids[n - 1] = sep_id
            input_mask = np.zeros(max_seq_length, np.int32)
            input_mask[:n] = 1
            segment_ids = np.zeros(max_seq_length, np.int32)
            segment_ids[doc_offset:n] = 1
            rows["input_ids"].append(input_ids)
            rows["input_mask"].append(input_mask)
            rows["segment_ids"].append(segment_ids)

            if is_training:
                # A window without the whole answer, or an impossible question, points at [CLS].
                if not example.is_impossible and tok_start >= span_start and tok_end <= span_end - 1:
                    start_position = tok_start - span_start + doc_offset
                    end_position = tok_end - span_start + doc_offset
                else:
                    start_position = end_position = 0
                rows["start_positions"].append(start_position)
                rows["end_positions"].append(end_position)

            features.append(
                SquadFeature(
                    example_index=example_index,
                    doc_span_index=doc_span_index,
                    tokens=tokens,
                    doc_offset=doc_offset,
                    orig_index=tok_to_orig_array[span_start:span_end],
                    max_context=best_span[span_start:span_end] == doc_span_index,
                )
            )

    arrays = {}
    for name, values in rows.items():
        if name.endswith("_positions"):
            arrays[name] = np.asarray(values, np.int32).reshape(len(values))
        else:
            arrays[name] = np.stack(values) if values else np.zeros((0, max_seq_length), np.int32)
    return arrays, features


def _improve_answer_span(doc_tokens, input_start, input_end, tokenizer, orig_answer_text):
    """The sub-span whose tokens are exactly the answer's ("1895" in "(1895-1943)."), if any."""
    tok_answer_text = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(input_start, input_end + 1):
        for new_end in range(input_end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start : new_end + 1]) == tok_answer_text:
                return new_start, new_end
    return input_start, input_end


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


def squad_evaluate(examples_or_dataset_path, predictions) -> dict:
    """Exact match and F1 in percent, as the official evaluate-v1.1.py / evaluate-v2.0.py.

    Both compare normalized texts (lower case, no punctuation, no articles a/an/the, single
    spaces) and take the best over a question's gold answers; F1 is over the words in
    common. When the data has v2.0 impossible questions, v2.0's rules apply: gold answers
    that normalize to nothing are dropped, a question with none left has the gold answer
    "", and an empty prediction scores 1 there (and 0 elsewhere). The result then also
    splits the scores into `HasAns_*` and `NoAns_*`. A question without a prediction scores
    0 (as in evaluate-v1.1.py) and is logged.

    Args:
        examples_or_dataset_path: list[SquadExample] | str. The examples, or a SQuAD file.
        predictions: dict. `{qas_id: answer text}`.

    Returns:
        dict: `exact_match`, `f1` (percent), `total`; for v2.0 also `HasAns_exact`,
        `HasAns_f1`, `HasAns_total`, `NoAns_exact`, `NoAns_f1`, `NoAns_total` when present.

    Example:
    >>> gold = [SquadExample("q1", "Where?", [], answers=["Warsaw", "in Warsaw, Poland"]),
    ...         SquadExample("q2", "When?", [], answers=["1867"])]
    >>> squad_evaluate(gold, {"q1": "the warsaw!", "q2": "in 1867"})
    {'exact_match': 50.0, 'f1': 83.33333333333333, 'total': 2}
    """
    if isinstance(examples_or_dataset_path, (str, os.PathLike)):
        examples = read_squad(examples_or_dataset_path, is_training=False)
    else:
        examples = list(examples_or_dataset_path)
    if not examples:
        raise KbertError("no questions to evaluate")
    version_2 = any(example.is_impossible for example in examples)

    exact, f1, has_answer = {}, {}, {}
    missing = 0
    for example in examples:
        qid = example.qas_id
        if version_2:
            golds = [a for a in example.answers if normalize_answer(a)] or [""]
            has_answer[qid] = bool(example.answers)
        else:
            golds = example.answers
            if not golds:
                raise KbertError(
                    f"question {qid!r} has no gold answers; evaluate needs a SQuAD "
                    f"file with answers (a dev file, not a test file)"
                )
        prediction = predictions.get(qid)
        if prediction is None:
            missing += 1
            exact[qid] = f1[qid] = 0.0
            continue
        f1_score = _f1_v2 if version_2 else _f1_v1
        exact[qid] = float(max(normalize_answer(prediction) == normalize_answer(g) for g in golds))
        f1[qid] = max(f1_score(prediction, g) for g in golds)
    if missing:
        log.warning("%d of %d questions have no prediction and score 0", missing, len(exact))

    result = {
        "exact_match": 100.0 * sum(exact.values()) / len(exact),
        "f1": 100.0 * sum(f1.values()) / len(f1),
        "total": len(exact),
    }
    if version_2:
        for prefix, wanted in (("HasAns", True), ("NoAns", False)):
            qids = [qid for qid, has in has_answer.items() if has == wanted]
            if qids:
                result[f"{prefix}_exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
                result[f"{prefix}_f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
                result[f"{prefix}_total"] = len(qids)
    return result


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official scripts' normalize_answer: lower case, drop punctuation and articles, squeeze spaces.

    Example:
    >>> normalize_answer("The  Denver Broncos!")
    'denver broncos'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1_v1(prediction: str, gold: str) -> float:
    """evaluate-v1.1.py's f1_score: 0 when no word is shared (so "" vs "" is 0)."""
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _f1_v2(prediction: str, gold: str) -> float:
    """evaluate-v2.0.py's compute_f1: when either side is empty, 1 if both are, else 0."""
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)
    return _f1_v1(prediction, gold)
