"""SQuAD answers from the model's logits, as google-research/bert's run_squad.py writes them.

    squad_predictions       write_predictions: n-best spans over the model's start/end logits,
                            mapped back to the original text (get_final_text); v2's null answer
    write_predictions_json  the predictions file the official evaluation scripts read

The examples and features come from `kbert.finetuning.squad`. The n-best order (ties broken
the same way) and probabilities are the original's, which tests/finetuning/test_squad.py checks
against run_squad.py itself. Plain Python and numpy, without TensorFlow.
"""

from __future__ import annotations

import collections
import json
import math
import unicodedata

import numpy as np

from kbert.runtime.files import atomic_write_text
from kbert.text.tokenizer import character_tables


# long: run_squad.py's write_predictions, step for step, to read beside it
def squad_predictions(
    examples,
    features,
    start_logits,
    end_logits,
    n_best_size=20,
    max_answer_length=30,
    do_lower_case=True,
    version_2_with_negative=False,
    null_score_diff_threshold=0.0,
) -> tuple[dict, dict]:
    """Answer texts from the model's logits, as run_squad.py's write_predictions.

    For each example, every (start, end) pair among the `n_best_size` highest start and end
    logits of each of its features is a candidate if both are in the window, start is where
    the token has its most context, start <= end and the span has at most
    `max_answer_length` tokens. Candidates are ranked by start + end logit and mapped back
    to the paragraph's own text ("Steve Smith" for tokens `steve smith` in "Steve Smith's").
    With `version_2_with_negative`, the null answer scores the smallest [CLS] start + end
    over the features, and the example gets "" when that score minus the best non-null
    candidate's is above `null_score_diff_threshold`.

    Args:
        examples: list[SquadExample]. As given to `squad_features`.
        features: list[SquadFeature]. From `squad_features`.
        start_logits: np.ndarray. float [F, max_seq_length], one row per feature.
        end_logits: np.ndarray. float [F, max_seq_length].
        n_best_size: int. Candidates kept per example (and logits tried per feature).
        max_answer_length: int. Longest answer, in tokens.
        do_lower_case: bool. The tokenizer's casing, for mapping back to the text.
        version_2_with_negative: bool. SQuAD v2.0: allow "no answer".
        null_score_diff_threshold: float. v2.0: predict "" above this margin.

    Returns:
        (predictions, nbest): `{qas_id: answer text}` ("" for no answer) and
        `{qas_id: [{"text", "probability", "start_logit", "end_logit"}, ...]}`, best first,
        probabilities a softmax over the n-best's start + end logits.

    Example:
    >>> from kbert.finetuning.squad import SquadExample, squad_features
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
    >>> example = SquadExample("q1", "When was Marie Curie born?",
    ...                        "Marie Curie was born in Warsaw in 1867.".split())
    >>> _, features = squad_features([example], tokenizer, max_seq_length=24, max_query_length=16)
    >>> start, end = np.zeros((2, 1, 24), np.float32)
    >>> year = features[0].tokens.index("1867")
    >>> start[0, year], end[0, year], end[0, year + 1] = 5.0, 5.0, 3.0  # year + 1 is "."
    >>> predictions, nbest = squad_predictions([example], features, start, end, n_best_size=2)
    >>> predictions
    {'q1': '1867'}
    >>> [(entry["text"], round(entry["probability"], 4)) for entry in nbest["q1"]]
    [('1867', 0.8808), ('1867.', 0.1192)]
    """
    start_logits = np.asarray(start_logits)
    end_logits = np.asarray(end_logits)
    if start_logits.ndim != 2 or start_logits.shape[0] != len(features) or end_logits.shape != start_logits.shape:
        raise ValueError(
            f"start_logits {start_logits.shape} and end_logits {end_logits.shape} must both "
            f"be [{len(features)} features, max_seq_length]"
        )
    rows_of_example = collections.defaultdict(list)
    for row, feature in enumerate(features):
        rows_of_example[feature.example_index].append(row)

    predictions, all_nbest = {}, {}
    for example_index, example in enumerate(examples):
        candidates = []  # (row, start_index, end_index, start_logit, end_logit)
        score_null = 1000000.0  # the smallest [CLS] start + end logit over the features
        null_row, null_start_logit, null_end_logit = None, 0.0, 0.0
        for row in rows_of_example[example_index]:
            feature = features[row]
            starts = start_logits[row].tolist()
            ends = end_logits[row].tolist()
            if version_2_with_negative and starts[0] + ends[0] < score_null:
                score_null = starts[0] + ends[0]
                null_row, null_start_logit, null_end_logit = row, starts[0], ends[0]
            first = feature.doc_offset
            last = first + len(feature.orig_index) - 1
            for start_index in _best_indexes(start_logits[row], n_best_size):
                if not (first <= start_index <= last and feature.max_context[start_index - first]):
                    continue
                for end_index in _best_indexes(end_logits[row], n_best_size):
                    if (
                        first <= end_index <= last
                        and start_index <= end_index
                        and end_index - start_index + 1 <= max_answer_length
                    ):
                        candidates.append((row, start_index, end_index, starts[start_index], ends[end_index]))
        if version_2_with_negative:
            candidates.append((null_row, 0, 0, null_start_logit, null_end_logit))
        candidates.sort(key=lambda c: c[3] + c[4], reverse=True)  # stable, as the original's sorted()

        nbest, seen = [], set()
        for row, start_index, end_index, start_logit, end_logit in candidates:
            if len(nbest) >= n_best_size:
                break
            if start_index > 0:
                text = _candidate_text(example, features[row], start_index, end_index, do_lower_case)
                if text in seen:
                    continue
            else:
                text = ""
            seen.add(text)
            nbest.append((text, start_logit, end_logit))
        if version_2_with_negative and "" not in seen:
            nbest.append(("", null_start_logit, null_end_logit))
        if not nbest:  # no valid span at all (the original's rare edge case)
            nbest.append(("empty", 0.0, 0.0))

        probabilities = _softmax([s + e for _, s, e in nbest])
        all_nbest[example.qas_id] = [
            {"text": text, "probability": p, "start_logit": s, "end_logit": e}
            for (text, s, e), p in zip(nbest, probabilities)
        ]
        if not version_2_with_negative:
            predictions[example.qas_id] = nbest[0][0]
        else:
            best = next((entry for entry in nbest if entry[0]), None)
            if best is None or score_null - best[1] - best[2] > null_score_diff_threshold:
                predictions[example.qas_id] = ""
            else:
                predictions[example.qas_id] = best[0]
    return predictions, all_nbest


def _best_indexes(logits: np.ndarray, n_best_size: int) -> list[int]:
    """Indexes of the n largest logits, largest first, ties in index order (_get_best_indexes)."""
    return np.argsort(-logits, kind="stable")[:n_best_size].tolist()


def _softmax(scores: list[float]) -> list[float]:
    """_compute_softmax, in the same float operations."""
    max_score = max(scores)
    exp_scores = [math.exp(score - max_score) for score in scores]
    total = 0.0
    for x in exp_scores:
        total += x
    return [x / total for x in exp_scores]


def _candidate_text(example, feature, start_index, end_index, do_lower_case) -> str:
    """The paragraph's own text for a token span: WordPieces joined, then get_final_text."""
    tok_text = " ".join(feature.tokens[start_index : end_index + 1])
    tok_text = tok_text.replace(" ##", "").replace("##", "")
    tok_text = " ".join(tok_text.split())
    orig_start = int(feature.orig_index[start_index - feature.doc_offset])
    orig_end = int(feature.orig_index[end_index - feature.doc_offset])
    orig_text = " ".join(example.doc_tokens[orig_start : orig_end + 1])
    return get_final_text(tok_text, orig_text, do_lower_case)


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
    """The part of `orig_text` (whole words) that the normalized `pred_text` came from.

    run_squad.py's get_final_text: basic-tokenize `orig_text`, find `pred_text` in it, and
    map the match back character by character, ignoring spaces. When that fails (the
    lengths differ, say), the whole `orig_text`.

    Example:
    >>> get_final_text("steve smith", "Steve Smith's", do_lower_case=True)
    'Steve Smith'
    >>> get_final_text("zurich", "(Zürich),", do_lower_case=True)
    'Zürich'
    """
    tok_text = " ".join(_basic_tokenize(orig_text, do_lower_case))
    start_position = tok_text.find(pred_text)
    if start_position == -1:
        return orig_text
    end_position = start_position + len(pred_text) - 1
    if len(orig_text) - orig_text.count(" ") != len(tok_text) - tok_text.count(" "):
        return orig_text
    # Characters correspond one to one once spaces are ignored (the original's _strip_spaces maps).
    ns_start = _non_space_index(tok_text, start_position)
    ns_end = _non_space_index(tok_text, end_position)
    if ns_start is None or ns_end is None:
        return orig_text
    orig_positions = [i for i, c in enumerate(orig_text) if c != " "]
    return orig_text[orig_positions[ns_start] : orig_positions[ns_end] + 1]


def _non_space_index(text: str, position: int) -> int | None:
    """How many non-space characters precede text[position]; None for a space or outside text."""
    if not 0 <= position < len(text) or text[position] == " ":
        return None
    return position - text.count(" ", 0, position)


def _basic_tokenize(text: str, do_lower_case: bool) -> list[str]:
    """tokenization.BasicTokenizer.tokenize (no WordPiece), on kbert.Tokenizer's tables."""
    tables = character_tables()
    text = tables.cjk.sub(r" \1 ", text.translate(tables.clean))
    tokens = []
    for word in text.split():
        if do_lower_case:
            word = unicodedata.normalize("NFD", word.lower()).translate(tables.strip_marks)
        tokens.extend(tables.punct_split.findall(word))
    return tokens


def write_predictions_json(predictions, path):
    """Write `{qas_id: answer text}` as the official evaluation scripts read it, atomically.

    The file is written beside `path` and renamed over it, so a failed run never leaves a
    half-written file. Any JSON-serializable object works (the n-best dict too).

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "predictions.json")
    >>> write_predictions_json({"q1": "1867"}, path)
    >>> print(open(path).read())
    {
        "q1": "1867"
    }
    <BLANKLINE>
    """
    atomic_write_text(path, json.dumps(predictions, indent=4) + "\n")
