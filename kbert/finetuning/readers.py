"""Fine-tuning data: read labelled text and CoNLL files, and turn them into model features.

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

Features are google-research/bert's: `encode_texts` builds exactly what run_classifier.py's
`convert_single_example` builds, and `encode_tagged` the same layout with each word's tag
on its first WordPiece.
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

import numpy as np

from kbert.errors import KbertError

log = logging.getLogger("kbert")

TEXT_FORMATS = ("csv", "tsv", "jsonl", "mrpc", "cola", "sst2", "stsb", "mnli", "qnli", "qqp", "rte")
TEXT_NAMES = ("text", "text_a")  # generic files: the column or key of the (first) text
TEXT_B_NAMES = ("text_b",)
LABEL_NAMES = ("label",)

# GLUE layouts: (text, text_b, label) header names. The label column is absent in test sets.
GLUE_COLUMNS = {
    "mrpc": ("#1 String", "#2 String", "Quality"),
    "cola": ("sentence", None, None),  # test.tsv; train/dev have no header, see _COLA_ROW
    "sst2": ("sentence", None, "label"),
    "stsb": ("sentence1", "sentence2", "score"),
    "mnli": ("sentence1", "sentence2", "gold_label"),
    "qnli": ("question", "sentence", "label"),
    "qqp": ("question1", "question2", "is_duplicate"),
    "rte": ("sentence1", "sentence2", "label"),
}
# CoLA train/dev rows: source, label, original label, sentence (ColaProcessor's line[1], line[3]).
_COLA_WIDTH, _COLA_TEXT, _COLA_LABEL = 4, 3, 1
_STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
                "sentence1", "sentence2"]
_MNLI_HEADER = ["index", "promptID", "pairID", "genre"]
_MAX_LISTED = 10
# Column names of text-per-row files (generic and GLUE headers), lower-cased: a first line naming
# two of them is a classify/regress file's header, never a CoNLL line.
_TABLE_HEADER_NAMES = {n.lower() for n in TEXT_NAMES + TEXT_B_NAMES + LABEL_NAMES} | {
    n.lower() for names in GLUE_COLUMNS.values() for n in names if n}
CONLL_FORMAT = ("CoNLL: one word and its tag per line (\"EU\\tB-ORG\"), a blank line between sentences")


@dataclasses.dataclass
class TextExamples:
    """Examples for `--task classify` or `regress`, as read from one file.

    Args:
        texts: list of str. The first (or only) text of each example.
        texts_b: list of str, or None. The second text of sentence pairs ("" where a row has
            none); None when the file holds single sentences.
        labels: list, or None. str class names (classify) or floats (regress); None when the
            file has no labels (prediction input, GLUE test sets).
        format: str. The format that was read: one of `TEXT_FORMATS`.
        skipped_rows: list of int. 1-based line numbers of the rows skipped as bad.
        replaced_bytes: int. Invalid UTF-8 sequences replaced with U+FFFD.
    """

    texts: list[str]
    texts_b: list[str] | None
    labels: list | None
    format: str
    skipped_rows: list[int]
    replaced_bytes: int


@dataclasses.dataclass
class TaggedExamples:
    """Sentences for `--task tag`, as read from one CoNLL file.

    Args:
        words: list of list of str. The words of each sentence.
        tags: list of list of str, or None. One tag per word; None when the file has no tags.
        skipped_rows: list of int. 1-based line numbers of the bad lines whose sentences were
            skipped.
        replaced_bytes: int. Invalid UTF-8 sequences replaced with U+FFFD.
    """

    words: list[list[str]]
    tags: list[list[str]] | None
    skipped_rows: list[int]
    replaced_bytes: int


@dataclasses.dataclass
class ChoiceExamples:
    """Questions for `--task choice` (SWAG), as read from one CSV file.

    Args:
        contexts: list of str. The context of each question (SWAG's `sent1`).
        endings: list of list of str. The full candidate endings of each question (SWAG's
            `sent2 + " " + endingK`), the same number for every question.
        labels: list of int, or None. The index of the right ending; None without labels.
        skipped_rows: list of int. 1-based line numbers of the rows skipped as bad.
        replaced_bytes: int. Invalid UTF-8 sequences replaced with U+FFFD.
    """

    contexts: list[str]
    endings: list[list[str]]
    labels: list[int] | None
    skipped_rows: list[int]
    replaced_bytes: int


# === Reading ===


def read_text_examples(path, task: str = "classify", format: str = "auto",
                       skip_bad_rows: bool = False, require_labels: bool = True) -> TextExamples:
    """Read a classification or regression file (CSV, TSV, JSON Lines or a GLUE TSV).

    Args:
        path: str or PathLike. The file.
        task: str. "classify" (labels are str class names) or "regress" (labels are floats).
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
    if task not in ("classify", "regress"):
        raise KbertError(f"task {task!r} does not read text rows; use classify or regress "
                         "(tag reads CoNLL files with read_tagged_examples)")
    if format != "auto" and format not in TEXT_FORMATS:
        raise KbertError(f"unknown data format {format!r}; use auto or one of "
                         f"{', '.join(TEXT_FORMATS)}")
    text, replaced = _read_file(path)
    detect = format == "auto"
    if detect:
        format = _format_from_extension(path, text)
    reader = _TextExampleCollector(path, task, skip_bad_rows, require_labels)
    if format == "jsonl":
        _read_jsonl(reader, text)
    else:
        _read_table(reader, text, format, detect_glue=detect and format == "tsv")
    return reader.examples(replaced)


def read_tagged_examples(path, skip_bad_rows: bool = False,
                         require_labels: bool = True) -> TaggedExamples:
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
    text, replaced = _read_file(path)
    _refuse_text_rows(path, text)
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
        raise KbertError(f"{path}: no sentences; a CoNLL file has one word and its tag per line "
                         "and a blank line between sentences")

    # The usual width decides, so one bad first line does not make every other line bad.
    width = Counter(lines).most_common(1)[0][0]
    if width == 1 and require_labels:
        raise KbertError(f"{path}: no tag column; each line needs a word and its tag "
                         "(\"EU B-ORG\"), separated by a tab or space")
    bad, words, tags = [], [], []
    for sentence in sentences:
        wrong = [(n, f"expected {width} columns like most lines, found {len(fields)}")
                 for n, fields in sentence if len(fields) != width]
        if wrong:
            bad.extend(wrong)
            continue
        words.append([fields[0] for _, fields in sentence])
        tags.append([fields[-1] for _, fields in sentence])
    _check_bad_rows(path, bad, skip_bad_rows, len(words))
    return TaggedExamples(words=words, tags=tags if width > 1 else None,
                          skipped_rows=[n for n, _ in bad], replaced_bytes=replaced)


def _refuse_text_rows(path: str, text: str):
    """A file of one text per row (classify/regress: a header, multi-word cells, JSON Lines)
    given as CoNLL would read as one long sentence of 'words' such as "gold glorious great.":
    refuse it, naming both formats."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("-DOCSTART-")]
    if not lines:
        return
    first = lines[0].strip()
    names = [f.strip() for f in first.replace(",", "\t").split("\t")]
    why = None
    if first.startswith("{"):
        why = "the first line is a JSON object"
    elif len({n.lower() for n in names} & _TABLE_HEADER_NAMES) >= 2:
        why = f"the first line is a header ({', '.join(names)[:80]})"
    else:
        # A CoNLL word rarely has spaces ("New York" may), and a CoNLL file has blank lines
        # between its sentences: a file of one block whose first column mostly holds several
        # words is rows of texts.
        texts = [line.split("\t", 1)[0].strip() for line in lines if "\t" in line]
        several = [t for t in texts if len(t.split()) > 1]
        one_block = "" not in (line.strip() for line in text.strip().splitlines())
        if one_block and len(several) * 2 > len(lines):
            why = f"its first column holds texts of several words ({several[0][:40]!r}, ...)"
    if why:
        raise KbertError(f"{path}: {why}: a file of one text per row, which --task classify or regress reads; "
                         f"--task tag reads {CONLL_FORMAT}")


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
    text, replaced = _read_file(path)
    rows = _table_rows(text, ",", quoting=True)
    if not rows or rows[0][1] is None:
        raise KbertError(f"{path}: no readable header; a SWAG CSV starts with a header naming sent1, "
                         f"sent2, ending0, ending1, ... and label")
    header = [name.strip() for name in rows[0][1]]
    column = {name: i for i, name in enumerate(header)}
    context = "sent1" if "sent1" in column else "context" if "context" in column else None
    endings = []
    while f"ending{len(endings)}" in column:
        endings.append(column[f"ending{len(endings)}"])
    if context is None or len(endings) < 2:
        raise KbertError(f"{path}: the header ({', '.join(header[:12])}) needs a sent1 (or context) column "
                         f"and at least ending0 and ending1: pass a SWAG CSV")
    has_label = "label" in column
    if require_labels and not has_label:
        raise KbertError(f"{path}: no label column; training and evaluation need the right ending's index "
                         f"in a column named label")
    contexts, choices, labels, bad = [], [], [], []
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
    _check_bad_rows(path, bad, skip_bad_rows, len(contexts))
    if not has_label or any(label is None for label in labels):
        labels = None
    return ChoiceExamples(contexts=contexts, endings=choices, labels=labels,
                          skipped_rows=[n for n, _ in bad], replaced_bytes=replaced)


def report_skipped(path, examples):
    """Log (to stderr) the rows `skip_bad_rows` dropped and the invalid UTF-8 that was replaced."""
    skipped = examples.skipped_rows
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        log.warning("%s: skipped %d bad rows (lines %s)", path, len(skipped), shown)
    if examples.replaced_bytes:
        log.warning("%s: replaced %d invalid UTF-8 byte sequences with U+FFFD", path, examples.replaced_bytes)


def read_lines(path) -> tuple[list[str], list[str] | None]:
    """extract_features.py's input: one text per line, `text_a ||| text_b` for pairs.

    Returns (texts, texts_b), texts_b None when no line has a pair.
    """
    text, _ = _read_file(os.fspath(path))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    pairs = [line.split(" ||| ", 1) for line in lines]
    texts = [p[0] for p in pairs]
    texts_b = [p[1] if len(p) > 1 else "" for p in pairs] if any(len(p) > 1 for p in pairs) else None
    return texts, texts_b


def _read_file(path: str) -> tuple[str, int]:
    """The file's text and how many invalid UTF-8 sequences became U+FFFD."""
    if not os.path.exists(path):
        raise KbertError(f"{path}: no such file; check the path")
    if os.path.isdir(path):
        raise KbertError(f"{path} is a directory; pass the data file itself")
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):  # Excel and MRPC's files start with one
        raw = raw[len(codecs.BOM_UTF8):]
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


def _format_from_extension(path: str, text: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        return "csv"
    if ext in (".jsonl", ".json"):
        return "jsonl"
    if ext not in (".tsv", ".txt") and text.lstrip().startswith("{"):
        return "jsonl"
    return "tsv"  # refined by the header in _read_table


class _TextExampleCollector:
    """Collects examples and bad rows while a file is read."""

    def __init__(self, path, task, skip_bad_rows, require_labels):
        self.path, self.task = path, task
        self.skip_bad_rows, self.require_labels = skip_bad_rows, require_labels
        self.texts, self.texts_b, self.labels, self.bad = [], [], [], []
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
        if self.task == "regress":
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

    def examples(self, replaced) -> TextExamples:
        self.bad.sort()
        if (self.task == "regress" and not self.texts and self.bad
                and all(why.endswith("is not a number") for _, why in self.bad)):
            raise KbertError(f"{self.path}: no label is a number (line {self.bad[0][0]}: {self.bad[0][1]}); "
                             f"--task regress needs a number per row (a score such as 3.8): for class names "
                             f"use --task classify")
        _check_bad_rows(self.path, self.bad, self.skip_bad_rows, len(self.texts))
        labels = self.labels if self.has_label_column else None
        if labels is not None and any(label is None for label in labels):
            labels = None  # only when labels are optional: a partial set is no set
        return TextExamples(texts=self.texts, texts_b=self.texts_b if self.has_b else None,
                            labels=labels, format=self.format,
                            skipped_rows=[n for n, _ in self.bad], replaced_bytes=replaced)


def _check_bad_rows(path, bad, skip_bad_rows, kept):
    if bad and not skip_bad_rows:
        numbers = ", ".join(str(n) for n, _ in bad[:_MAX_LISTED])
        more = f" and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        first_line, first_why = bad[0]
        raise KbertError(f"{path}: bad rows at line{'s' if len(bad) > 1 else ''} {numbers}{more} "
                         f"(line {first_line}: {first_why}); fix them, or pass --skip-bad-rows "
                         "to skip them")
    if not kept:
        raise KbertError(f"{path}: no usable rows (all {len(bad)} are bad, e.g. line {bad[0][0]}: "
                         f"{bad[0][1]}); fix the file" if bad else f"{path}: no rows")


def _table_rows(text: str, delimiter: str, quoting: bool) -> list[tuple[int, list | None, str]]:
    """[(first line number, fields or None, csv's complaint)] for each non-blank row."""
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


def _read_table(reader: _TextExampleCollector, text: str, format: str, detect_glue: bool):
    path = reader.path
    quoting = format == "csv"
    rows = _table_rows(text, "," if quoting else "\t", quoting)
    if not rows:
        raise KbertError(f"{path}: the file is empty; pass a file with one example per row")
    first = [f.strip() for f in rows[0][1] or []]
    if detect_glue:
        format = _glue_layout(first)
    reader.format = format

    if format == "cola" and "sentence" not in first:  # train/dev: no header
        width, (text_col, b_col, label_col) = _COLA_WIDTH, (_COLA_TEXT, None, _COLA_LABEL)
        body = rows
    else:
        width, (text_col, b_col, label_col) = len(first), _columns(path, format, first, _looks_like_conll(text))
        body = rows[1:]
        if not body:
            raise KbertError(f"{path}: has a header but no rows; add one example per row")
    reader.has_b = b_col is not None
    reader.has_label_column = label_col is not None
    if label_col is None and reader.require_labels:
        names = GLUE_COLUMNS[format][2] if format in GLUE_COLUMNS else "label"
        raise KbertError(f"{path}: no label column (columns: {', '.join(first)}); add a "
                         f"{names!r} column with each row's label")

    separator = "comma" if quoting else "tab"
    for line_no, fields, complaint in body:
        if fields is None:
            reader.bad.append((line_no, complaint))
        elif len(fields) != width:
            reader.bad.append((line_no, f"expected {width} {separator}-separated columns, "
                                        f"found {len(fields)}"))
        else:
            reader.add(line_no, fields[text_col], fields[b_col] if b_col is not None else None,
                       fields[label_col] if label_col is not None else None)


def _glue_layout(header: list[str]) -> str:
    """The GLUE layout a TSV's first row announces, or "tsv" for a generic one."""
    if "#1 String" in header and "#2 String" in header:
        return "mrpc"
    if header[:len(_STSB_HEADER)] == _STSB_HEADER:
        return "stsb"
    if header[:len(_MNLI_HEADER)] == _MNLI_HEADER:
        return "mnli"
    if header[:3] == ["index", "question", "sentence"]:
        return "qnli"
    if header[:4] == ["id", "qid1", "qid2", "question1"] or header == ["id", "question1", "question2"]:
        return "qqp"
    if header[:3] == ["index", "sentence1", "sentence2"]:
        return "rte"
    if header in (["sentence", "label"], ["index", "sentence"]):
        return "sst2"
    names = {h.lower() for h in header}
    if (len(header) == _COLA_WIDTH and header[_COLA_LABEL] in ("0", "1")
            and not names & set(TEXT_NAMES)):
        return "cola"  # a headerless first row: source, 0/1, original label, sentence
    return "tsv"


def _looks_like_conll(text: str) -> bool:
    """Short lines of single words, and blank lines between groups of them: a CoNLL file."""
    lines = [line for line in text.strip().splitlines() if not line.startswith("-DOCSTART-")]
    words = [line.split("\t")[0] if "\t" in line else line.split()[0] for line in lines if line.strip()]
    return "" in (line.strip() for line in lines) and all(len(w.split()) == 1 for w in words)


def _columns(path: str, format: str, header: list[str], conll: bool = False) -> tuple:
    """(text, text_b, label) column indices from the header; text_b and label may be None."""
    if format in GLUE_COLUMNS:
        names = GLUE_COLUMNS[format]
        found = [header.index(n) if n and n in header else None for n in names]
        accepted = repr(names[0])
    else:
        lower = [h.lower() for h in header]
        found = [next((lower.index(n) for n in group if n in lower), None)
                 for group in (TEXT_NAMES, TEXT_B_NAMES, LABEL_NAMES)]
        accepted = (f"{' or '.join(TEXT_NAMES)} for the text, optionally "
                    f"{' '.join(TEXT_B_NAMES)} and {' '.join(LABEL_NAMES)}")
    if found[0] is None:
        if conll:
            raise KbertError(f"{path}: looks like CoNLL (a word and its tag per line), which --task tag reads; "
                             f"classify and regress read one text per row under a header naming the columns: "
                             f"{accepted}")
        raise KbertError(f"{path}: the header names no text column (found: {', '.join(header)}); "
                         f"the first row of a {format} file must name the columns: {accepted}")
    return tuple(found)


def _read_jsonl(reader: _TextExampleCollector, text: str):
    path = reader.path
    reader.format = "jsonl"
    stripped = text.lstrip()
    if stripped.startswith("["):
        raise KbertError(f"{path}: holds a JSON array; write JSON Lines instead, one object "
                         "per line such as {\"text\": \"...\", \"label\": \"...\"}")
    rows = []
    for line_no, line in enumerate(io.StringIO(text, newline=None), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            reader.bad.append((line_no, f"not JSON ({getattr(error, 'msg', error)})"))
            continue
        if not isinstance(row, dict):
            reader.bad.append((line_no, f"a JSON {type(row).__name__}, not an object"))
            continue
        key = next((k for k in TEXT_NAMES if k in row), None)
        if key is None or not isinstance(row[key], str):
            keys = ", ".join(list(row)[:_MAX_LISTED]) or "none"
            reader.bad.append((line_no, f"no \"text\" string (keys: {keys})"))
            continue
        text_b = row.get("text_b")
        if text_b is not None and not isinstance(text_b, str):
            reader.bad.append((line_no, "\"text_b\" is not a string"))
            continue
        rows.append((line_no, row[key], text_b, row))
    reader.has_b = any(text_b is not None for _, _, text_b, _ in rows)
    # Labels are a column of the file: required rows lack one if any row has one, or if
    # labels are required at all.
    reader.has_label_column = reader.require_labels or any("label" in row for *_, row in rows)
    for line_no, text_a, text_b, row in rows:
        reader.add(line_no, text_a, text_b, row.get("label"))


# === Features ===


def _special_ids(tokenizer, *tokens) -> list[int]:
    missing = [t for t in tokens if t not in tokenizer.vocab]
    if missing:
        raise KbertError(f"the vocab has no {', '.join(missing)}; use the vocab.txt the model "
                         "was trained with")
    return [tokenizer.vocab[t] for t in tokens]


def _features(n: int, max_seq_length: int) -> dict[str, np.ndarray]:
    return {name: np.zeros((n, max_seq_length), np.int32)
            for name in ("input_ids", "input_mask", "segment_ids")}


def encode_texts(tokenizer, texts, texts_b, max_seq_length: int) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for single texts or pairs, exactly as run_classifier.py builds them.

    "[CLS] a [SEP]" or "[CLS] a [SEP] b [SEP]", segment 0 for the first part and 1 for
    "b [SEP]", mask 1 on real tokens, zero padding. A pair that does not fit loses tokens
    from the end of its longer text, one at a time (`_truncate_seq_pair`); a single text
    keeps its first max_seq_length - 2 tokens. An empty second text (or one with no tokens,
    or none left after cutting at a tiny max_seq_length) makes a single-text example, as in
    the original.

    Args:
        tokenizer: kbert.Tokenizer.
        texts: list of str. The first texts.
        texts_b: list of str, or None. The second texts of pairs ("" or None for none).
        max_seq_length: int. Tokens per example, special tokens included: at least 2, or 3
            with `texts_b`.

    Returns:
        (features, truncated): a dict of int32 [N, max_seq_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many examples lost tokens.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt")
    >>> features, truncated = encode_texts(tokenizer, ["Is it?"], ["Yes."], 8)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0])
    ['[CLS]', 'is', 'it', '?', '[SEP]', 'yes', '.', '[SEP]']
    >>> features["segment_ids"][0].tolist(), truncated
    ([0, 0, 0, 0, 0, 1, 1, 1], 0)
    >>> features, truncated = encode_texts(tokenizer, ["Is it?"], None, 4)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0]), truncated
    (['[CLS]', 'is', 'it', '[SEP]'], 1)
    """
    n = len(texts)
    if texts_b is not None and len(texts_b) != n:
        raise ValueError(f"{n} texts but {len(texts_b)} texts_b")
    least = 2 if texts_b is None else 3
    if max_seq_length < least:
        raise KbertError(f"max sequence length {max_seq_length} is too short; it must be at "
                         f"least {least} ([CLS] and [SEP]{', [SEP]' if least == 3 else ''})")
    cls_id, sep_id = _special_ids(tokenizer, "[CLS]", "[SEP]")
    vocab = tokenizer.vocab
    features = _features(n, max_seq_length)
    input_ids, input_mask, segment_ids = (features[k] for k in ("input_ids", "input_mask", "segment_ids"))
    truncated = 0
    for i in range(n):
        tokens_a = tokenizer.tokenize(texts[i])
        text_b = texts_b[i] if texts_b is not None else None
        tokens_b = tokenizer.tokenize(text_b) if text_b else None
        if tokens_b:
            # _truncate_seq_pair: pop from the longer list (b on ties) until both fit.
            room = max_seq_length - 3
            len_a, len_b = len(tokens_a), len(tokens_b)
            if len_a + len_b > room:
                truncated += 1
                while len_a + len_b > room:
                    if len_a > len_b:
                        len_a -= 1
                    else:
                        len_b -= 1
            ids = [cls_id] + [vocab[t] for t in tokens_a[:len_a]] + [sep_id]
            if len_b:  # as the original, which asks `if tokens_b` again after cutting
                ids += [vocab[t] for t in tokens_b[:len_b]] + [sep_id]
                segment_ids[i, len_a + 2:len(ids)] = 1
        else:
            if len(tokens_a) > max_seq_length - 2:
                truncated += 1
                tokens_a = tokens_a[:max_seq_length - 2]
            ids = [cls_id] + [vocab[t] for t in tokens_a] + [sep_id]
        input_ids[i, :len(ids)] = ids
        input_mask[i, :len(ids)] = 1
    return features, truncated


def encode_tagged(tokenizer, words, tags, label_ids: dict[str, int], max_seq_length: int):
    """Model inputs and per-token labels for tagging, each word's tag on its first WordPiece.

    "[CLS] pieces [SEP]" with segment 0, mask 1 on real tokens, zero padding. A word that
    tokenizes to nothing (only control characters, say) becomes "[UNK]", so every word has a
    first piece. A sentence with more than max_seq_length - 2 pieces keeps its first
    max_seq_length - 2; words whose first piece is cut off get position -1 and no label.

    Args:
        tokenizer: kbert.Tokenizer.
        words: list of list of str. The words of each sentence.
        tags: list of list of str, or None. One tag per word; None for prediction.
        label_ids: dict of str to int. The tags the model was trained on, and their ids.
        max_seq_length: int. Tokens per example, [CLS] and [SEP] included (at least 3).

    Returns:
        (features, labels, word_positions, truncated): features as `encode_texts` returns
        them; labels, int32 [N, max_seq_length], the tag id on each word's first piece and
        -1 everywhere else (all -1 when `tags` is None); per sentence, each word's first
        piece position (-1 for a cut word); and how many sentences lost pieces.

    Raises:
        KbertError: a tag is not in `label_ids`.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt")
    >>> features, labels, positions, truncated = encode_tagged(
    ...     tokenizer, [["Peter", "is", "unaffable"]], [["B-PER", "O", "O"]], {"O": 0, "B-PER": 1}, 8)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0])
    ['[CLS]', 'peter', 'is', 'una', '##ffa', '##ble', '[SEP]', '[PAD]']
    >>> labels[0].tolist(), positions, truncated
    ([-1, 1, 0, 0, -1, -1, -1, -1], [[1, 2, 3]], 0)
    """
    n = len(words)
    if tags is not None:
        if len(tags) != n:
            raise ValueError(f"{n} sentences but {len(tags)} tag lists")
        unseen = {t for sentence in tags for t in sentence if t not in label_ids}
        if unseen:
            listed = sorted(unseen)
            more = f" and {len(listed) - _MAX_LISTED} more" if len(listed) > _MAX_LISTED else ""
            known = ", ".join(sorted(label_ids)[:_MAX_LISTED])
            raise KbertError(f"tags {', '.join(listed[:_MAX_LISTED])}{more} were not in the "
                             f"training data (the model knows {known}"
                             f"{', ...' if len(label_ids) > _MAX_LISTED else ''}); evaluate "
                             "with data tagged with the training set's tags")
    if max_seq_length < 3:
        raise KbertError(f"max sequence length {max_seq_length} is too short for tagging; it "
                         "must be at least 3 ([CLS], a word, [SEP])")
    cls_id, sep_id, unk_id = _special_ids(tokenizer, "[CLS]", "[SEP]", "[UNK]")
    vocab = tokenizer.vocab
    room = max_seq_length - 2
    features = _features(n, max_seq_length)
    input_ids, input_mask = features["input_ids"], features["input_mask"]
    labels = np.full((n, max_seq_length), -1, np.int32)
    all_positions, truncated = [], 0
    for i, sentence in enumerate(words):
        if tags is not None and len(tags[i]) != len(sentence):
            raise ValueError(f"sentence {i} has {len(sentence)} words but {len(tags[i])} tags")
        ids, positions = [cls_id], []
        for word in sentence:
            positions.append(len(ids) if len(ids) <= room else -1)
            ids.extend([vocab[t] for t in tokenizer.tokenize(word)] or [unk_id])
        if len(ids) > room + 1:
            truncated += 1
            del ids[room + 1:]
        ids.append(sep_id)
        input_ids[i, :len(ids)] = ids
        input_mask[i, :len(ids)] = 1
        if tags is not None:
            for position, tag in zip(positions, tags[i]):
                if position >= 0:
                    labels[i, position] = label_ids[tag]
        all_positions.append(positions)
    return features, labels, all_positions, truncated


def encode_choices(tokenizer, contexts, endings, max_seq_length: int) -> tuple[dict[str, np.ndarray], int]:
    """Model inputs for multiple choice: each (context, ending) pair packed as `encode_texts`
    packs a sentence pair, as the BERT paper fine-tuned on SWAG.

    Args:
        tokenizer: kbert.Tokenizer.
        contexts: list of str. One context per question.
        endings: list of list of str. The endings of each question, the same number for all.
        max_seq_length: int. Tokens per (context, ending) pair, special tokens included.

    Returns:
        (features, truncated): int32 [N, choices, max_seq_length] arrays "input_ids",
        "input_mask" and "segment_ids", and how many pairs lost tokens.

    Example:
    >>> from kbert.text.tokenizer import Tokenizer
    >>> tokenizer = Tokenizer("tests/fixtures/vocab-uncased.txt")
    >>> features, truncated = encode_choices(tokenizer, ["A man sits."], [["He smiles.", "He flies."]], 10)
    >>> features["input_ids"].shape, truncated
    ((1, 2, 10), 0)
    >>> tokenizer.convert_ids_to_tokens(features["input_ids"][0, 1])
    ['[CLS]', 'a', 'man', 'sits', '.', '[SEP]', 'he', 'flies', '.', '[SEP]']
    """
    n = len(contexts)
    choices = len(endings[0]) if endings else 0
    if any(len(row) != choices for row in endings):
        raise KbertError("every question needs the same number of endings")
    flat, truncated = encode_texts(tokenizer, [c for c in contexts for _ in range(choices)],
                                   [e for row in endings for e in row], max_seq_length)
    return {k: v.reshape(n, choices, max_seq_length) for k, v in flat.items()}, truncated
