"""Fine-tuning data: read labelled text, CoNLL and SWAG files into examples.

`kbert finetune/predict/evaluate --task classify|regress` read one example per row:

- CSV (`.csv`): a header row naming a `text` column (or `text_a`), optionally `text_b`
  (sentence pairs) and `label`; normal CSV quoting.
- TSV (`.tsv`, `.txt`, and any other extension): the same header names, tab-separated, read
  as run_classifier.py reads its TSVs: `csv.reader(delimiter="\\t", quotechar=None)`, so a
  `"` is an ordinary character.
- JSON Lines (`.jsonl`, `.json`): one object per line with a `text` string (or `text_a`),
  optionally `text_b` and `label`.
- The GLUE layouts that run_classifier.py and the GLUE download script use, recognised by
  their headers in a TSV: MRPC, SST-2, STS-B, MNLI, QNLI, QQP and RTE (WNLI has RTE's
  layout), train, dev and test files. Columns are found by their header names.
  CoLA's train and dev files have no header (source, label, original label, sentence): a
  headerless TSV is read as CoLA when its first row has 4 columns and a 0/1 second column,
  or when `format="cola"` says so. CoLA's test.tsv has SST-2's test header
  ("index\\tsentence") and reads the same either way (it is reported as "sst2").

`--task choice` reads SWAG's CSV (`train.csv`, `val.csv`, `test.csv` of rowanz/swagaf): a
header naming `sent1` (the context), `sent2` (the start of every ending), `ending0`..`endingN-1`
and, in labelled files, `label` (the index of the right ending). Each choice is the pair
(sent1, sent2 + " " + ending), as the BERT paper and Hugging Face's run_swag build it. A CSV
whose header names `context` and `ending0`.. (no `sent2`) reads the same way.

`--task tag` reads CoNLL: one word per line, the word in the first column and its tag in
the last (tab- or space-separated), a blank line between sentences, `-DOCSTART-` lines
ignored.

Blank lines in CSV/TSV/JSONL files are skipped. A row that cannot be read (wrong number of
columns, a JSONL line that is not an object with a `text` string, a missing label or a
regression label that is not a number) stops the read with one line naming the file and the
bad lines, unless `skip_bad_rows` is set; then those rows are skipped and listed. Invalid
UTF-8 is replaced with U+FFFD and counted, not refused.

Which format a file is in, and the checks that it has the shape its task reads, are in
`kbert.finetuning.formats`; `kbert.finetuning.encoding` turns the examples into model features.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import json
import logging
import math
import os
from collections import Counter
from typing import ClassVar

from kbert.finetuning.formats import (
    COLA_LABEL,
    COLA_TEXT,
    COLA_WIDTH,
    GLUE_COLUMNS,
    TEXT_FORMATS,
    TEXT_NAMES,
    format_from_extension,
    glue_layout,
    header_columns,
    looks_like_conll,
    refuse_text_rows,
)
from kbert.finetuning.pair_columns import check_pairs, pair_columns
from kbert.runtime.errors import KbertError, option

log = logging.getLogger("kbert")

_MAX_LISTED = 10  # bad rows and JSON keys named in an error message
_HEADER_SAMPLE = 101  # the first rows, a pairs file's first included, that tell a header from a pair


@dataclasses.dataclass(kw_only=True)
class Rows:
    """What every file's examples share: their count, the line each starts on, and a slice of
    them (prediction runs over a file a batch at a time). Each kind's own fields come first; these
    three are given by keyword.

    Args:
        skipped_rows: list of int. 1-based line numbers of the rows skipped as bad (tag: of the
            bad lines whose sentences were skipped).
        replaced_bytes: int. Invalid UTF-8 sequences replaced with U+FFFD.
        lines: list of int. The 1-based line each example starts on (tag: each sentence's first
            word).
        blank_lines: list of int. The blank lines skipped before the last example: each moves the
            examples after it off their line numbers (`report_skipped` says so).
    """

    skipped_rows: list[int]
    replaced_bytes: int
    lines: list[int] = dataclasses.field(default_factory=list)
    blank_lines: list[int] = dataclasses.field(default_factory=list)

    _PER_EXAMPLE: ClassVar[tuple] = ()  # the fields that hold one entry per example

    def __len__(self) -> int:
        return len(self.lines)

    def select(self, first: int, stop: int):
        """The examples `first` to `stop` (exclusive), as the same kind of object."""
        return dataclasses.replace(
            self,
            **{name: getattr(self, name)[first:stop] for name in self._PER_EXAMPLE if getattr(self, name) is not None},
        )


@dataclasses.dataclass
class TextExamples(Rows):
    """Examples for `--task classify` or `regress`, as read from one file.

    Args:
        texts: list of str. The first (or only) text of each example.
        texts_b: list of str, or None. The second text of sentence pairs ("" where a row has
            none); None when the file holds single sentences.
        labels: list, or None. str class names (classify) or floats (regress); None when the
            file has no labels (prediction input, GLUE test sets).
        format: str. The format that was read: one of `TEXT_FORMATS`.
        skipped_rows, replaced_bytes, lines: keywords, as every kind's (`Rows`).
    """

    texts: list[str]
    texts_b: list[str] | None
    labels: list | None
    format: str
    _PER_EXAMPLE = ("texts", "texts_b", "labels", "lines")


@dataclasses.dataclass
class TaggedExamples(Rows):
    """Sentences for `--task tag`, as read from one CoNLL file.

    Args:
        words: list of list of str. The words of each sentence.
        tags: list of list of str, or None. One tag per word; None when the file has no tags.
        skipped_rows, replaced_bytes, lines: keywords, as every kind's (`Rows`).
    """

    words: list[list[str]]
    tags: list[list[str]] | None
    _PER_EXAMPLE = ("words", "tags", "lines")


@dataclasses.dataclass
class ChoiceExamples(Rows):
    """Questions for `--task choice` (SWAG), as read from one CSV file.

    Args:
        contexts: list of str. The context of each question (SWAG's `sent1`).
        endings: list of list of str. The full candidate endings of each question (SWAG's
            `sent2 + " " + endingK`), the same number for every question.
        labels: list of int, or None. The index of the right ending; None without labels.
        skipped_rows, replaced_bytes, lines: keywords, as every kind's (`Rows`).
    """

    contexts: list[str]
    endings: list[list[str]]
    labels: list[int] | None
    _PER_EXAMPLE = ("contexts", "endings", "labels", "lines")


@dataclasses.dataclass
class PairExamples(Rows):
    """(query, document) pairs for `--task embed`, as read from one file.

    Args:
        queries: list of str. Each row's query.
        documents: list of str. The document that answers it (the positive).
        negatives: list of str, or None. A hard negative per row: a document that does not
            answer it; None when the file has no negative column.
        format: str. The format that was read: csv, tsv or jsonl.
        skipped_rows, replaced_bytes, lines: keywords, as every kind's (`Rows`).
    """

    queries: list[str]
    documents: list[str]
    negatives: list[str] | None
    format: str
    _PER_EXAMPLE = ("queries", "documents", "negatives", "lines")


# The columns (JSON keys) of a pairs file, in the order a headerless file holds them.
PAIR_COLUMNS = ("query", "document", "negative")


# === Reading ===


def read_text_examples(
    path, scores: bool = False, format: str = "auto", skip_bad_rows: bool = False, require_labels: bool = True
) -> TextExamples:
    """Read a classification or regression file (CSV, TSV, JSON Lines or a GLUE TSV).

    Args:
        path: str or PathLike. The file.
        scores: bool. Labels are numbers (floats: regress), not str class names (classify).
        format: str. "auto" (by extension, then by a TSV's header) or one of `TEXT_FORMATS`.
        skip_bad_rows: bool. Skip rows that cannot be read, and list them in `skipped_rows`,
            instead of failing.
        require_labels: bool. Fail when the file has no label column or a row has no valid
            label. With False, labels are optional: `labels` is None unless every row has a
            valid one, and a missing or invalid label never makes a row bad.

    Returns:
        TextExamples.

    Raises:
        KbertError: a missing or empty file, a header without a text column, no label column
            when labels are required, or bad rows without `skip_bad_rows`.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "train.tsv")
    >>> with open(path, "w") as f:
    ...     _ = f.write("text\\tlabel\\nA gripping film.\\tpos\\nDull.\\tneg\\n")
    >>> examples = read_text_examples(path)
    >>> examples.texts, examples.texts_b, examples.labels, examples.format
    (['A gripping film.', 'Dull.'], None, ['pos', 'neg'], 'tsv')
    >>> with open(path, "w") as f:  # MRPC's own header: recognised as MRPC
    ...     _ = f.write("Quality\\t#1 ID\\t#2 ID\\t#1 String\\t#2 String\\n1\\t7\\t8\\tHi.\\tHello.\\n")
    >>> examples = read_text_examples(path)
    >>> examples.texts, examples.texts_b, examples.labels, examples.format
    (['Hi.'], ['Hello.'], ['1'], 'mrpc')
    """
    path = os.fspath(path)
    if format != "auto" and format not in TEXT_FORMATS:
        raise KbertError(f"unknown data format {format!r}; use auto or one of {', '.join(TEXT_FORMATS)}")
    text, replaced = read_file(path)
    detect = format == "auto"
    if detect:
        format = format_from_extension(path, text)
    reader = _TextExampleCollector(path, scores, skip_bad_rows, require_labels)
    if format == "jsonl":
        _read_jsonl(reader, text)
    else:
        _read_table(reader, text, format, detect_glue=detect and format == "tsv")
    return reader.examples(replaced)


def read_tagged_examples(path, skip_bad_rows: bool = False, require_labels: bool = True) -> TaggedExamples:
    """Read a CoNLL file: a word per line (first column) with its tag (last column).

    Sentences are separated by blank lines; `-DOCSTART-` lines are ignored. Columns are split
    on tabs when a line has one, otherwise on spaces. Every line must have as many columns as
    most lines do; a sentence with a bad line is skipped whole with `skip_bad_rows`.

    Args:
        path: str or PathLike. The file.
        skip_bad_rows: bool. Skip sentences with bad lines (listed in `skipped_rows`) instead
            of failing.
        require_labels: bool. Lines need a tag column. With False, one-column files are read
            with `tags` None.

    Returns:
        TaggedExamples.

    Raises:
        KbertError: a missing or empty file, no tag column when tags are required, or bad
            lines without `skip_bad_rows`.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "train.conll")
    >>> with open(path, "w") as f:
    ...     _ = f.write("-DOCSTART- -X- O O\\n\\nEU NNP B-ORG\\nrejects VBZ O\\n\\nPeter NNP B-PER\\n")
    >>> examples = read_tagged_examples(path)
    >>> examples.words, examples.tags
    ([['EU', 'rejects'], ['Peter']], [['B-ORG', 'O'], ['B-PER']])
    """
    path = os.fspath(path)
    text, replaced = read_file(path)
    refuse_text_rows(path, text)
    sentences, current, lines = [], [], []
    for line_no, line in enumerate(io.StringIO(text, newline=None), 1):
        line = line.rstrip("\n")
        if not line.strip():
            if current:
                sentences.append(current)
                current = []
            continue
        if line.startswith("-DOCSTART-"):
            continue
        fields = [f.strip() for f in line.split("\t")] if "\t" in line else line.split()
        current.append((line_no, fields))
        lines.append(len(fields))
    if current:
        sentences.append(current)
    if not sentences:
        raise KbertError(
            f"{path}: no sentences; a CoNLL file has one word and its tag per line and a blank line between sentences"
        )

    # The usual width decides, so one bad first line does not make every other line bad.
    width = Counter(lines).most_common(1)[0][0]
    if width == 1 and require_labels:
        raise KbertError(
            f'{path}: no tag column; each line needs a word and its tag ("EU B-ORG"), separated by a tab or space'
        )
    bad, words, tags, starts = [], [], [], []
    for sentence in sentences:
        wrong = [
            (n, f"expected {width} columns like most lines, found {len(fields)}")
            for n, fields in sentence
            if len(fields) != width
        ]
        if wrong:
            bad.extend(wrong)
            continue
        words.append([fields[0] for _, fields in sentence])
        tags.append([fields[-1] for _, fields in sentence])
        starts.append(sentence[0][0])
    check_bad_rows(path, bad, skip_bad_rows, len(words))
    return TaggedExamples(
        words=words,
        tags=tags if width > 1 else None,
        skipped_rows=[n for n, _ in bad],
        replaced_bytes=replaced,
        lines=starts,
    )


def read_choice_examples(path, skip_bad_rows: bool = False, require_labels: bool = True) -> ChoiceExamples:
    """Read a SWAG CSV file: a context, N endings and the right ending's index per row.

    Args:
        path: str or PathLike. The file.
        skip_bad_rows: bool. Skip bad rows (listed in `skipped_rows`) instead of failing.
        require_labels: bool. Rows need a `label` (0..N-1). With False, a file without a
            label column (SWAG's test.csv) reads with `labels` None.

    Returns:
        ChoiceExamples.

    Raises:
        KbertError: a missing or empty file, a header without the context or ending
            columns, or bad rows without `skip_bad_rows`.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "val.csv")
    >>> with open(path, "w") as f:
    ...     _ = f.write(",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,label\\n"
    ...                 "0,v1,5,x,A man sits.,He,gold,smiles.,flies away.,0\\n")
    >>> examples = read_choice_examples(path)
    >>> examples.contexts, examples.endings, examples.labels
    (['A man sits.'], [['He smiles.', 'He flies away.']], [0])
    """
    path = os.fspath(path)
    text, replaced = read_file(path)
    rows = table_rows(text, ",", quoting=True)
    if not rows or rows[0][1] is None:
        raise KbertError(
            f"{path}: no readable header; a SWAG CSV starts with a header naming sent1, "
            f"sent2, ending0, ending1, ... and label"
        )
    header = [name.strip() for name in rows[0][1]]
    column = {name: i for i, name in enumerate(header)}
    context = "sent1" if "sent1" in column else "context" if "context" in column else None
    endings = []
    while f"ending{len(endings)}" in column:
        endings.append(column[f"ending{len(endings)}"])
    if context is None or len(endings) < 2:
        raise KbertError(
            f"{path}: the header ({', '.join(header[:12])}) needs a sent1 (or context) column "
            f"and at least ending0 and ending1: pass a SWAG CSV"
        )
    has_label = "label" in column
    if require_labels and not has_label:
        raise KbertError(
            f"{path}: no label column; training and evaluation need the right ending's index in a column named label"
        )
    contexts, choices, labels, bad, lines = [], [], [], [], []
    for line_no, fields, complaint in rows[1:]:
        if fields is None or len(fields) != len(header):
            bad.append((line_no, complaint or f"expected {len(header)} columns, found {len(fields or [])}"))
            continue
        start = fields[column["sent2"]].strip() if "sent2" in column else ""
        label = None
        if has_label:
            raw = fields[column["label"]].strip()
            if raw.isdigit() and int(raw) < len(endings):
                label = int(raw)
            elif require_labels or raw:
                bad.append((line_no, f"label {raw[:20]!r} is not an ending index 0..{len(endings) - 1}"))
                continue
        contexts.append(fields[column[context]].strip())
        choices.append([f"{start} {fields[i].strip()}".strip() for i in endings])
        labels.append(label)
        lines.append(line_no)
    check_bad_rows(path, bad, skip_bad_rows, len(contexts))
    if not has_label or any(label is None for label in labels):
        labels = None
    return ChoiceExamples(
        contexts=contexts,
        endings=choices,
        labels=labels,
        skipped_rows=[n for n, _ in bad],
        replaced_bytes=replaced,
        lines=lines,
    )


def read_pair_examples(path, format: str = "auto", skip_bad_rows: bool = False) -> PairExamples:
    """Read (query, document[, negative]) pairs: a TSV, CSV or JSON Lines file.

    A table whose first row names `query` and `document` (and optionally `negative`; or
    sentence-transformers' anchor, positive, negative; or question, answer) is read by those
    names, in any order, other columns ignored. Any other table's columns are read by position:
    the first is the query, the second the document, a third the hard negative; a first row of
    other column names (text, label, ...), or of one-word cells above longer rows, is a header
    and skipped (`kbert.finetuning.pair_columns`). The log says which columns were read. A
    header naming a label column, or documents of a handful of one-word values (a classify
    file), are refused. JSON Lines
    hold one object per line with `query` and `document` strings (and `negative`), or a list
    of two (three) strings. TSV is read as for classify (a `"` is an ordinary character), CSV
    with normal quoting.

    A row with the wrong number of columns, an empty query, document or negative (a file
    with negatives needs one in every row), or a JSON line of another shape is bad: it stops
    the read with one line naming the file and the lines, unless `skip_bad_rows` is set.

    Args:
        path: str or PathLike. The file.
        format: str. "auto" (by extension: .csv, .jsonl/.json, anything else TSV), "csv",
            "tsv" or "jsonl".
        skip_bad_rows: bool. Skip bad rows (listed in `skipped_rows`) instead of failing.

    Returns:
        PairExamples.

    Raises:
        KbertError: a missing or empty file, a file of one column (or more than three
            without a header), a header naming some of the columns but not query and
            document, or bad rows without `skip_bad_rows`.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "pairs.tsv")
    >>> with open(path, "w") as f:
    ...     _ = f.write("document\\tquery\\nPut the kettle on.\\thow to make tea\\nCall the vet.\\tsick cat\\n")
    >>> examples = read_pair_examples(path)
    >>> examples.queries, examples.documents, examples.negatives, examples.lines
    (['how to make tea', 'sick cat'], ['Put the kettle on.', 'Call the vet.'], None, [2, 3])
    >>> with open(path, "w") as f:  # no header: query, document, negative
    ...     _ = f.write("how to make tea\\tPut the kettle on.\\tBuy a kettle.\\n")
    >>> read_pair_examples(path).negatives
    ['Buy a kettle.']
    """
    path = os.fspath(path)
    if format not in ("auto", "csv", "tsv", "jsonl"):
        raise KbertError(f"{option('format', format)}: pairs are read from csv, tsv or jsonl (or auto, by extension)")
    text, replaced = read_file(path)
    if format == "auto":
        format = format_from_extension(path, text)
    columns, blank = None, []
    if format == "jsonl":
        rows, bad, has_negative = _pair_rows_jsonl(path, text, blank)
    else:
        rows, bad, has_negative, columns = _pair_rows_table(path, text, format, blank)
    kept = []
    for line_no, fields in rows:
        empty = next((name for name, value in zip(PAIR_COLUMNS, fields) if not value.strip()), None)
        if empty:
            bad.append((line_no, f"empty {empty}"))
        else:
            kept.append((line_no, fields))
    rows = kept
    bad.sort()
    check_bad_rows(path, bad, skip_bad_rows, len(rows))
    check_pairs(path, [fields[1] for _, fields in rows])
    if columns is not None:
        log.info("%s: %s", path, columns.describe())
    return PairExamples(
        queries=[fields[0] for _, fields in rows],
        documents=[fields[1] for _, fields in rows],
        negatives=[fields[2] for _, fields in rows] if has_negative else None,
        format=format,
        skipped_rows=[n for n, _ in bad],
        replaced_bytes=replaced,
        lines=[n for n, _ in rows],
        blank_lines=before_last(blank, [n for n, _ in rows]),
    )


def _pair_rows_table(path: str, text: str, format: str, blank: list):
    """([(line, [query, document(, negative)])], bad rows, whether there are negatives, `PairColumns`)
    of a CSV/TSV."""
    quoting = format == "csv"
    rows = table_rows(text, "," if quoting else "\t", quoting, blank)
    if not rows:
        raise KbertError(f"{path}: the file is empty; pass a file with a query and a document per row")
    separator = "comma" if quoting else "tab"
    first = rows[0][1] or []
    columns = pair_columns(path, first, [fields for _, fields, _ in rows[1:_HEADER_SAMPLE] if fields], separator)
    body = rows[1:] if columns.header is not None else rows
    if not body:
        raise KbertError(f"{path}: has a header but no rows; add a query and its document per row")
    width = len(first)
    pairs, bad = [], []
    for line_no, fields, complaint in body:
        if fields is None:
            bad.append((line_no, complaint))
        elif len(fields) != width:
            bad.append((line_no, f"expected {width} {separator}-separated columns, found {len(fields)}"))
        else:
            pairs.append((line_no, [fields[i] for i in columns.indexes]))
    return pairs, bad, len(columns.indexes) == 3, columns


def _pair_rows_jsonl(path: str, text: str, blank: list):
    """As `_pair_rows_table`, for JSON Lines: objects with query, document (negative), or lists."""
    stripped = text.lstrip()
    if stripped.startswith("["):  # a list of strings per line is a row; a whole file's JSON array is not
        try:
            first = json.loads(stripped.split("\n", 1)[0])
        except ValueError:
            first = None
        if not (isinstance(first, list) and all(isinstance(value, str) for value in first)):
            raise KbertError(
                f"{path}: holds a JSON array; write JSON Lines instead, one object per line such as "
                '{"query": "...", "document": "..."}'
            )
    found, bad = [], []
    for line_no, row, not_json in json_lines(text, blank):
        if not_json:
            bad.append((line_no, not_json))
            continue
        if isinstance(row, dict):
            fields = [row.get(name) for name in PAIR_COLUMNS]
            if fields[2] is None:
                fields.pop()
        elif isinstance(row, list) and 2 <= len(row) <= 3:
            fields = row
        else:
            what = f"a list of {len(row)}" if isinstance(row, list) else f"a JSON {type(row).__name__}"
            bad.append((line_no, f'{what}, not an object with "query" and "document" strings'))
            continue
        if not all(isinstance(value, str) for value in fields[:2]):
            keys = ", ".join(list(row)[:_MAX_LISTED]) if isinstance(row, dict) else "a list"
            bad.append((line_no, f'no "query" and "document" strings (keys: {keys or "none"})'))
            continue
        if len(fields) == 3 and not isinstance(fields[2], str):
            bad.append((line_no, '"negative" is not a string'))
            continue
        found.append((line_no, fields))
    has_negative = any(len(fields) == 3 for _, fields in found)
    if has_negative:  # every row of a file with negatives needs one: a batch holds one per query
        bad.extend((n, "no negative, which other rows have") for n, fields in found if len(fields) == 2)
        found = [(n, fields) for n, fields in found if len(fields) == 3]
    return found, bad, has_negative


def report_skipped(path, examples):
    """Log (to stderr) the rows `skip_bad_rows` dropped, the blank lines skipped before the last
    example, and the invalid UTF-8 that was replaced."""
    skipped = examples.skipped_rows
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        log.warning("%s: skipped %d bad rows (lines %s)", path, len(skipped), shown)
    if examples.replaced_bytes:
        log.warning("%s: replaced %d invalid UTF-8 byte sequences with U+FFFD", path, examples.replaced_bytes)
    blank = getattr(examples, "blank_lines", None)
    if blank:  # every command says it: a row's number is then not its line's
        log.warning(
            "%s: skipped %d blank line%s (%s %s); the rows follow the other lines, in order",
            path,
            len(blank),
            "" if len(blank) == 1 else "s",
            "line" if len(blank) == 1 else "lines",
            ", ".join(map(str, blank[:10])) + (f" and {len(blank) - 10} more" if len(blank) > 10 else ""),
        )


def read_feature_texts(path, format: str = "auto", skip_bad_rows: bool = False) -> TextExamples:
    """The texts an encoder embeds: a table's text column(s), or one text per line.

    A CSV or JSON Lines file, a TSV whose first row is a header naming a text column (`text`,
    `text_a`, a GLUE layout's), or any file with an explicit `format`, is read as
    `read_text_examples` reads it, labels optional, so a header is never embedded as a text.
    Any other file is extract_features.py's input: one text per line, `text_a ||| text_b` for pairs.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "test.tsv")
    >>> _ = open(path, "w").write("text\\tlabel\\nA gripping film.\\tpos\\n")
    >>> examples = read_feature_texts(path)
    >>> examples.texts, examples.lines
    (['A gripping film.'], [2])
    >>> _ = open(path, "w").write("A gripping film.\\nDull. ||| Very.\\n")
    >>> examples = read_feature_texts(path)
    >>> examples.texts, examples.texts_b, examples.lines
    (['A gripping film.', 'Dull.'], ['', 'Very.'], [1, 2])
    """
    path = os.fspath(path)
    if format != "auto" and format not in TEXT_FORMATS:
        raise KbertError(f"unknown data format {format!r}; use auto or one of {', '.join(TEXT_FORMATS)}")
    text, _ = read_file(path)
    detected = format_from_extension(path, text) if format == "auto" else format
    first = text.lstrip("\ufeff").split("\n", 1)[0].rstrip("\r").split("\t")
    header = {name.strip().lower() for name in first} & {n.lower() for n in TEXT_NAMES}
    if (
        format != "auto"
        or detected != "tsv"
        or header
        or glue_layout([f.strip() for f in first]) not in ("tsv", "cola")
    ):
        return read_text_examples(path, format=format, skip_bad_rows=skip_bad_rows, require_labels=False)
    return _read_plain_lines(path)


def _read_plain_lines(path: str) -> TextExamples:
    text, replaced = read_file(path)
    texts, texts_b, lines, blank = [], [], [], []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            pair = line.strip().split(" ||| ", 1)
            texts.append(pair[0])
            texts_b.append(pair[1] if len(pair) > 1 else "")
            lines.append(line_no)
        else:
            blank.append(line_no)
    return TextExamples(
        texts,
        texts_b if any(texts_b) else None,
        None,
        "lines",
        skipped_rows=[],
        replaced_bytes=replaced,
        lines=lines,
        blank_lines=before_last(blank, lines),
    )


def read_file(path: str) -> tuple[str, int]:
    """The file's text and how many invalid UTF-8 sequences became U+FFFD."""
    if not os.path.exists(path):
        raise KbertError(f"{path}: no such file; check the path")
    if os.path.isdir(path):
        raise KbertError(f"{path} is a directory; pass the data file itself")
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):  # Excel and MRPC's files start with one
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        text, replaced = raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "replace")
        # A valid EF BF BD is a U+FFFD of the text itself; every other one is a replacement
        # (no invalid sequence can swallow its EF, which is not a continuation byte).
        replaced = text.count("\ufffd") - raw.count("\ufffd".encode())
    if not text.strip():
        raise KbertError(f"{path}: the file is empty; pass a file with one example per row")
    return text, replaced


class _TextExampleCollector:
    """Collects examples and bad rows while a file is read."""

    def __init__(self, path, scores, skip_bad_rows, require_labels):
        self.path, self.scores = path, scores
        self.skip_bad_rows, self.require_labels = skip_bad_rows, require_labels
        self.texts, self.texts_b, self.labels, self.bad, self.lines = [], [], [], [], []
        self.blank = []  # blank lines' numbers
        self.has_b = False
        self.has_label_column = False
        self.format = None

    def label(self, value):
        """(label, None) or (None, why it is not a valid label)."""
        if value is None:
            return None, "no label"
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None, "empty label"
        if self.scores:
            if isinstance(value, str):
                try:
                    number = float(value)
                except ValueError:
                    return None, f"label {value[:40]!r} is not a number"
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                number = float(value)
            else:
                return None, f"label {value!r} is not a number"
            if not math.isfinite(number):
                return None, f"label {value!r} is not a finite number"
            return number, None
        if isinstance(value, str):
            return value, None
        if isinstance(value, bool):
            return str(value).lower(), None
        if isinstance(value, (int, float)):
            return str(value), None
        return None, f"label {value!r} is not a string or number"

    def add(self, line_no, text, text_b, raw_label):
        """Keep one row, or record it as bad when its label is required and invalid."""
        label = None
        if self.has_label_column:
            label, why = self.label(raw_label)
            if why and self.require_labels:
                self.bad.append((line_no, why))
                return
        self.texts.append(text)
        self.texts_b.append(text_b or "")
        self.labels.append(label)
        self.lines.append(line_no)

    def examples(self, replaced) -> TextExamples:
        self.bad.sort()
        if self.scores and not self.texts and self.bad and all(why.endswith("is not a number") for _, why in self.bad):
            raise KbertError(
                f"{self.path}: no label is a number (line {self.bad[0][0]}: {self.bad[0][1]}); "
                f"{option('task', 'regress', command='finetune')} needs a number per row (a score such as 3.8): "
                f"for class names use {option('task', 'classify', command='finetune')}"
            )
        check_bad_rows(self.path, self.bad, self.skip_bad_rows, len(self.texts))
        labels = self.labels if self.has_label_column else None
        if labels is not None and any(label is None for label in labels):
            labels = None  # only when labels are optional: a partial set is no set
        return TextExamples(
            texts=self.texts,
            texts_b=self.texts_b if self.has_b else None,
            labels=labels,
            format=self.format,
            skipped_rows=[n for n, _ in self.bad],
            replaced_bytes=replaced,
            lines=self.lines,
            blank_lines=before_last(self.blank, self.lines),
        )


def json_lines(text: str, blank: list):
    """(line number, the line's JSON value or None, why it is not JSON or "") for each non-blank
    line of JSON Lines; the blank lines' numbers go to `blank`.

    >>> blank = []
    >>> list(json_lines('{"a": 1}\\n\\n{oops\\n', blank)), blank
    ([(1, {'a': 1}, ''), (3, None, 'not JSON (Expecting property name enclosed in double quotes)')], [2])
    """
    for line_no, line in enumerate(io.StringIO(text, newline=None), 1):
        if not line.strip():
            blank.append(line_no)
            continue
        try:
            yield line_no, json.loads(line), ""
        except ValueError as error:
            yield line_no, None, f"not JSON ({getattr(error, 'msg', error)})"


def before_last(blank: list, lines: list) -> list:
    """The blank lines that come before the last example (those after it move no example).

    >>> before_last([1, 4, 9], [2, 3, 5, 6])
    [1, 4]
    """
    return [n for n in blank if lines and n < lines[-1]]


def check_bad_rows(path, bad, skip_bad_rows, kept):
    if bad and not skip_bad_rows:
        numbers = ", ".join(str(n) for n, _ in bad[:_MAX_LISTED])
        more = f" and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        first_line, first_why = bad[0]
        raise KbertError(
            f"{path}: bad rows at line{'s' if len(bad) > 1 else ''} {numbers}{more} "
            f"(line {first_line}: {first_why}); fix them, or pass {option('skip_bad_rows', True)} to skip them"
        )
    if not kept:
        raise KbertError(
            f"{path}: no usable rows (all {len(bad)} are bad, e.g. line {bad[0][0]}: {bad[0][1]}); fix the file"
            if bad
            else f"{path}: no rows"
        )


def table_rows(
    text: str, delimiter: str, quoting: bool, blank: list | None = None
) -> list[tuple[int, list | None, str]]:
    """[(first line number, fields or None, csv's complaint)] for each non-blank row; the blank
    rows' line numbers go to `blank`, if given."""
    # A long text (a whole document in one cell) is not an error; csv's default cap is 128 KiB.
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    options = {"delimiter": delimiter} if quoting else {"delimiter": delimiter, "quotechar": None}
    reader = csv.reader(io.StringIO(text, newline=""), **options)
    rows = []
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return rows
        except csv.Error as error:
            rows.append((start, None, str(error)))
            continue
        if fields:
            rows.append((start, fields, ""))
        elif blank is not None:
            blank.append(start)


def _read_table(reader: _TextExampleCollector, text: str, format: str, detect_glue: bool):
    path = reader.path
    quoting = format == "csv"
    rows = table_rows(text, "," if quoting else "\t", quoting, reader.blank)
    if not rows:
        raise KbertError(f"{path}: the file is empty; pass a file with one example per row")
    first = [f.strip() for f in rows[0][1] or []]
    if detect_glue:
        format = glue_layout(first)
    reader.format = format

    if format == "cola" and "sentence" not in first:  # train/dev: no header
        width, (text_col, b_col, label_col) = COLA_WIDTH, (COLA_TEXT, None, COLA_LABEL)
        body = rows
    else:
        width, (text_col, b_col, label_col) = len(first), header_columns(path, format, first, looks_like_conll(text))
        body = rows[1:]
        if not body:
            raise KbertError(f"{path}: has a header but no rows; add one example per row")
    reader.has_b = b_col is not None
    reader.has_label_column = label_col is not None
    if label_col is None and reader.require_labels:
        names = GLUE_COLUMNS[format][2] if format in GLUE_COLUMNS else "label"
        raise KbertError(
            f"{path}: no label column (columns: {', '.join(first)}); add a {names!r} column with each row's label"
        )

    separator = "comma" if quoting else "tab"
    for line_no, fields, complaint in body:
        if fields is None:
            reader.bad.append((line_no, complaint))
        elif len(fields) != width:
            reader.bad.append((line_no, f"expected {width} {separator}-separated columns, found {len(fields)}"))
        else:
            reader.add(
                line_no,
                fields[text_col],
                fields[b_col] if b_col is not None else None,
                fields[label_col] if label_col is not None else None,
            )


def _read_jsonl(reader: _TextExampleCollector, text: str):
    path = reader.path
    reader.format = "jsonl"
    stripped = text.lstrip()
    if stripped.startswith("["):
        raise KbertError(
            f"{path}: holds a JSON array; write JSON Lines instead, one object "
            'per line such as {"text": "...", "label": "..."}'
        )
    rows = []
    for line_no, row, not_json in json_lines(text, reader.blank):
        if not_json:
            reader.bad.append((line_no, not_json))
            continue
        if not isinstance(row, dict):
            reader.bad.append((line_no, f"a JSON {type(row).__name__}, not an object"))
            continue
        key = next((k for k in TEXT_NAMES if k in row), None)
        if key is None or not isinstance(row[key], str):
            keys = ", ".join(list(row)[:_MAX_LISTED]) or "none"
            reader.bad.append((line_no, f'no "text" string (keys: {keys})'))
            continue
        text_b = row.get("text_b")
        if text_b is not None and not isinstance(text_b, str):
            reader.bad.append((line_no, '"text_b" is not a string'))
            continue
        rows.append((line_no, row[key], text_b, row))
    reader.has_b = any(text_b is not None for _, _, text_b, _ in rows)
    # Labels are a column of the file: required rows lack one if any row has one, or if
    # labels are required at all.
    reader.has_label_column = reader.require_labels or any("label" in row for *_, row in rows)
    for line_no, text_a, text_b, row in rows:
        reader.add(line_no, text_a, text_b, row.get("label"))
