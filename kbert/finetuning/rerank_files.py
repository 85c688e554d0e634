"""The files a reranker reads: training pairs or groups (`read_rerank_examples`), and candidate
lists, a query with the documents a first stage found for it (`read_candidate_lists`).

Training files are TSV, CSV (both with a header row) or JSON Lines, in one of two layouts:

- labelled pairs: columns `query`, `document`, `label`, the label a number in [0, 1] (1
  relevant, 0 not, or a grade between), as sentence-transformers' BinaryCrossEntropyLoss reads
  them;
- groups: columns `query`, `document` (the relevant one), then `negative`, `negative_2`, ...
  (or `negative_1`, `negative_2`, ..., as sentence-transformers' mine_hard_negatives writes
  them); JSON Lines may hold the negatives as one list, `"negatives": [...]`. A group may carry a
  teacher's scores of its documents (document first, then each negative) in a column named by
  `--teacher-scores`: numbers separated by spaces or commas, or a JSON list.

Headers may also say anchor, question (the query) and positive, answer, passage (the document),
as sentence-transformers' datasets do.

Candidate lists are JSON Lines, a query per line: `{"query": ..., "documents": [...]}`, the
documents in the first stage's order; for evaluation also `"positive": [...]`, the relevant ones
(CrossEncoderRerankingEvaluator's samples). `{"query", "positive", "negative"}` rows, as that
evaluator also takes, are read as the documents positive first.

Example:
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "train.tsv")
>>> with open(path, "w") as f:
...     _ = f.write("query\\tpositive\\tnegative\\nhow to make tea\\tPut the kettle on.\\tCall the vet.\\n")
>>> examples = read_rerank_examples(path)
>>> examples.queries, examples.groups, examples.labels
(['how to make tea'], [['Put the kettle on.', 'Call the vet.']], [[1.0, 0.0]])
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from kbert.finetuning.formats import format_from_extension
from kbert.finetuning.pair_columns import ROLE_NAMES
from kbert.finetuning.readers import Rows, before_last, check_bad_rows, json_lines, read_file, table_rows
from kbert.runtime.errors import KbertError, option

LABEL_NAMES = ("label", "score")
# negative, negative_1, negative_2, ...: a group's negatives, in the order of their numbers.
_NEGATIVE = re.compile(r"negative(?:_(\d+))?$")
_MAX_LISTED = 10


@dataclasses.dataclass
class RerankExamples(Rows):
    """Queries with their documents, as read from a training or dev file.

    Args:
        queries: list of str.
        groups: list of lists of str. Each query's documents: its one document (labelled pairs),
            or its relevant document then its negatives (groups), as many for every query.
        labels: list of lists of float. Each document's label in [0, 1] (groups: 1, then 0s).
        teacher: list of lists of float, or None. A teacher's score of each document.
        grouped: bool. The file holds groups (else labelled pairs).
        format: str. csv, tsv or jsonl.
    """

    queries: list[str]
    groups: list[list[str]]
    labels: list[list[float]]
    teacher: list[list[float]] | None
    grouped: bool
    format: str
    _PER_EXAMPLE = ("queries", "groups", "labels", "teacher", "lines")


@dataclasses.dataclass
class CandidateLists(Rows):
    """A query per row with the documents to rerank, as read from JSON Lines.

    Args:
        queries: list of str.
        documents: list of lists of str. Each query's candidates, in the first stage's order.
        positives: list of lists of str, or None. Each query's relevant documents (evaluation).
        ranked: bool. The documents are in a first stage's order (a "documents" list), so the
            metrics before reranking mean something.
    """

    queries: list[str]
    documents: list[list[str]]
    positives: list[list[str]] | None
    ranked: bool = True
    _PER_EXAMPLE = ("queries", "documents", "positives", "lines")


# === Training and dev files ===


def read_rerank_examples(
    path,
    format: str = "auto",
    skip_bad_rows: bool = False,
    teacher_scores: str | None = None,
    positives_only: bool = False,
) -> RerankExamples:
    """Read a reranker's training or dev file: labelled pairs or groups (see the module).

    Args:
        path: str or PathLike. The file.
        format: str. "auto" (by extension: .csv, .jsonl/.json, anything else TSV), "csv", "tsv"
            or "jsonl".
        skip_bad_rows: bool. Skip bad rows (listed in `skipped_rows`) instead of failing.
        teacher_scores: str or None. The column of a teacher's scores (groups only).
        positives_only: bool. The file holds (query, document) pairs, each document relevant, and
            no label or negative (their negatives are mined: `kbert.finetuning.first_stage`).

    Raises:
        KbertError: a missing or empty file, a header without the columns, a file with both
            labels and negatives, teacher scores on pairs, or bad rows (an empty text, a label
            that is not a number in [0, 1], teacher scores that are not one number per
            document) without `skip_bad_rows`.
    """
    path = os.fspath(path)
    if format not in ("auto", "csv", "tsv", "jsonl"):
        raise KbertError(f"{option('format', format)}: reranking files are csv, tsv or jsonl (or auto, by extension)")
    text, replaced = read_file(path)
    if format == "auto":
        format = format_from_extension(path, text)
    blank: list = []
    records = _jsonl_records(path, text, blank) if format == "jsonl" else _table_records(path, text, format, blank)
    layout = _Layout.of(path, records, teacher_scores, positives_only)
    rows, bad = [], []
    for line_no, record in records:
        if isinstance(record, str):
            bad.append((line_no, record))
            continue
        try:
            rows.append((line_no, layout.read(record)))
        except ValueError as error:
            bad.append((line_no, str(error)))
    bad.sort()
    check_bad_rows(path, bad, skip_bad_rows, len(rows))
    lines = [n for n, _ in rows]
    return RerankExamples(
        queries=[row[0] for _, row in rows],
        groups=[row[1] for _, row in rows],
        labels=[row[2] for _, row in rows],
        teacher=[row[3] for _, row in rows] if teacher_scores else None,
        grouped=layout.grouped,
        format=format,
        skipped_rows=[n for n, _ in bad],
        replaced_bytes=replaced,
        lines=lines,
        blank_lines=before_last(blank, lines),
    )


def _table_records(path, text, format, blank):
    """[(line, {column: cell} or the reason the row is bad)] of a CSV/TSV with a header."""
    quoting = format == "csv"
    separator = "comma" if quoting else "tab"
    rows = table_rows(text, "," if quoting else "\t", quoting, blank)
    header = [cell.strip() for cell in rows[0][1] or []]
    if not any(cell.lower() in ROLE_NAMES["query"] for cell in header):
        raise KbertError(
            f"{path}: line 1 names no query column; start the file with a header row, such as "
            f"query, document, label (labelled pairs) or query, document, negative (groups)"
        )
    records = []
    for line_no, fields, complaint in rows[1:]:
        if fields is None:
            records.append((line_no, complaint))
        elif len(fields) != len(header):
            records.append((line_no, f"expected {len(header)} {separator}-separated columns, found {len(fields)}"))
        else:
            records.append((line_no, dict(zip(header, fields))))
    return records


def _jsonl_records(path, text, blank):
    """[(line, object or the reason the row is bad)] of JSON Lines."""
    return [
        (line_no, not_json or (row if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"))
        for line_no, row, not_json in json_lines(text, blank)
    ]


@dataclasses.dataclass
class _Layout:
    """Which keys of a file's rows hold what, found from the first row."""

    query: str
    document: str
    label: str | None
    negatives: list
    teacher: str | None
    positives_only: bool = False

    @property
    def grouped(self) -> bool:
        return self.label is None and not self.positives_only

    @classmethod
    def of(cls, path, records, teacher, positives_only=False):
        first = next((record for _, record in records if isinstance(record, dict)), None)
        if first is None:
            raise KbertError(f"{path}: no rows to read; add a query and its documents per row")
        keys = {key.lower(): key for key in first}
        query = next((keys[name] for name in ROLE_NAMES["query"] if name in keys), None)
        document = next((keys[name] for name in ROLE_NAMES["document"] if name in keys), None)
        label = next((keys[name] for name in LABEL_NAMES if name in keys), None)
        numbered = sorted((int(m.group(1) or 1), key) for key in first if (m := _NEGATIVE.match(key.lower())))
        negatives = [key for _, key in numbered] or (["negatives"] if "negatives" in keys else [])
        said = ", ".join(list(first)[:_MAX_LISTED])
        if query is None or document is None:
            raise KbertError(
                f"{path}: its rows have no query and document (they have {said}); name them query and "
                f"document (or anchor and positive)"
            )
        if positives_only:
            if label is not None or negatives:
                raise KbertError(
                    f"{option('mine_negatives')} mines negatives for (query, document) pairs, each document the "
                    f"query's relevant one; {path} has {'a ' + label + ' column' if label else 'negatives'}: "
                    f"drop {option('mine_negatives')}, or give pairs without them"
                )
            return cls(query, document, None, [], None, True)
        if label is not None and negatives:
            raise KbertError(
                f"{path}: has both a {label} column and negatives; give labelled pairs (query, document, label) "
                f"or groups (query, document, negative, ...), not both"
            )
        if label is None and not negatives:
            raise KbertError(
                f"{path}: has a query and a document but no label or negative (it has {said}); add a label "
                f"column (0 or 1) or negative columns"
            )
        if teacher is not None:
            if label is not None:
                raise KbertError(
                    f"{option('teacher_scores', teacher)} scores a group's documents against each other; "
                    f"{path} holds labelled pairs: give groups (query, document, negative, ...)"
                )
            if teacher not in first:
                raise KbertError(f"{option('teacher_scores', teacher)}: {path} has no such column (it has {said})")
        return cls(query, document, label, negatives, teacher)

    def read(self, record: dict):
        """(query, documents, labels, teacher scores) of one row; ValueError says why it is bad."""
        query, document = record.get(self.query), record.get(self.document)
        for name, value in ((self.query, query), (self.document, document)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"empty {name}" if isinstance(value, str) else f"no {name} string")
        if self.positives_only:
            return query, [document], [1.0], None
        if not self.grouped:
            return query, [document], [_label(record.get(self.label), self.label)], None
        negatives = []
        for key in self.negatives:
            value = record.get(key)
            values = value if key == "negatives" and isinstance(value, list) else [value]
            if not values or not all(isinstance(v, str) and v.strip() for v in values):
                raise ValueError(f"an empty {key}" if values else f"no {key}")
            negatives.extend(values)
        documents = [document, *negatives]
        teacher = None if self.teacher is None else _scores(record.get(self.teacher), self.teacher, len(documents))
        return query, documents, [1.0] + [0.0] * len(negatives), teacher


def _label(value, name) -> float:
    given = value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} {given!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} {given!r}: give a number from 0 (not relevant) to 1 (relevant)")
    return float(value)


def _scores(value, name, count) -> list[float]:
    if isinstance(value, str):
        value = [v for v in re.split(r"[\s,]+", value.strip()) if v]
    if not isinstance(value, list):
        raise ValueError(f"no {name} list")
    try:
        scores = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{name} holds something that is not a number") from None
    if len(scores) != count or not all(math.isfinite(s) for s in scores):
        raise ValueError(f"{name} holds {len(scores)} numbers; give one finite score per document ({count})")
    return scores


# === Candidate lists ===


def read_candidate_lists(
    path, skip_bad_rows: bool = False, require_positives: bool = False, queries_only: bool = False
) -> CandidateLists:
    """Read JSON Lines of queries with their candidate documents (see the module).

    Args:
        path: str or PathLike. The file.
        skip_bad_rows: bool. Skip bad rows instead of failing.
        require_positives: bool. Each row must name its relevant documents (evaluation).
        queries_only: bool. Rows need only a query (a first stage finds the documents): any
            documents given are not read.

    Raises:
        KbertError: a missing, empty or non-JSON-Lines file, or bad rows (no query, no
            documents, a document that is not a string; with `require_positives`, no relevant
            document) without `skip_bad_rows`.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "candidates.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"query": "tea", "documents": ["Call the vet.", "Put the kettle on."]}\\n')
    >>> read_candidate_lists(path).documents
    [['Call the vet.', 'Put the kettle on.']]
    """
    path = os.fspath(path)
    text, replaced = read_file(path)
    blank: list = []
    rows, bad = [], []
    for line_no, record in _jsonl_records(path, text, blank):
        try:
            if isinstance(record, str):
                raise ValueError(record)
            rows.append((line_no, _query_only(record) if queries_only else _candidates(record, require_positives)))
        except ValueError as error:
            bad.append((line_no, str(error)))
    check_bad_rows(path, bad, skip_bad_rows, len(rows))
    lines = [n for n, _ in rows]
    ranked = {row[3] for _, row in rows}
    if len(ranked) > 1:
        raise KbertError(
            f"{path}: some rows give documents, others positive and negative lists; give every query the same kind"
        )
    return CandidateLists(
        queries=[row[0] for _, row in rows],
        documents=[row[1] for _, row in rows],
        positives=[row[2] for _, row in rows] if require_positives else None,
        ranked=ranked.pop(),
        skipped_rows=[n for n, _ in bad],
        replaced_bytes=replaced,
        lines=lines,
        blank_lines=before_last(blank, lines),
    )


def _candidates(record: dict, require_positives: bool):
    """(query, documents, positives, ranked) of one JSON object; ValueError says why it is bad."""
    query = record.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError('no "query" string' if not isinstance(query, str) else "an empty query")
    positives = _texts(record, "positive", required=require_positives)
    if "documents" in record:
        documents, ranked = _texts(record, "documents", required=True), True
    elif "negative" in record and positives:
        documents, ranked = positives + _texts(record, "negative", required=False), False
    else:
        raise ValueError('no "documents" list to rerank')
    if require_positives and not positives:
        raise ValueError('an empty "positive" list: name the query\'s relevant documents')
    return query, documents, positives, ranked


def _query_only(record: dict):
    query = record.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError('no "query" string' if not isinstance(query, str) else "an empty query")
    return query, [], [], True


def _texts(record: dict, key: str, required: bool) -> list[str]:
    value = record.get(key)
    if value is None and not required:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f'no "{key}" list')
    if required and not value:
        raise ValueError(f'an empty "{key}" list')
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f'"{key}" holds something that is not a string')
    return value
