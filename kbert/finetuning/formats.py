"""Which layout a fine-tuning file has, and whether it has the shape its task reads.

The header names of generic and GLUE files, the format told by a file's extension and a
TSV's header, and the checks that tell a CoNLL file from a file of one text per row, for
`kbert.finetuning.readers` (which describes the formats).
"""

from __future__ import annotations

import os

from kbert.runtime.errors import KbertError, option

TEXT_FORMATS = ("csv", "tsv", "jsonl", "mrpc", "cola", "sst2", "stsb", "mnli", "qnli", "qqp", "rte")
TEXT_NAMES = ("text", "text_a")  # generic files: the column or key of the (first) text
TEXT_B_NAMES = ("text_b",)
LABEL_NAMES = ("label",)

# GLUE layouts: (text, text_b, label) header names. The label column is absent in test sets.
GLUE_COLUMNS = {
    "mrpc": ("#1 String", "#2 String", "Quality"),
    "cola": ("sentence", None, None),  # test.tsv; train/dev have no header, see COLA_WIDTH
    "sst2": ("sentence", None, "label"),
    "stsb": ("sentence1", "sentence2", "score"),
    "mnli": ("sentence1", "sentence2", "gold_label"),
    "qnli": ("question", "sentence", "label"),
    "qqp": ("question1", "question2", "is_duplicate"),
    "rte": ("sentence1", "sentence2", "label"),
}
# CoLA train/dev rows: source, label, original label, sentence (ColaProcessor's line[1], line[3]).
COLA_WIDTH, COLA_TEXT, COLA_LABEL = 4, 3, 1
_STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
_MNLI_HEADER = ["index", "promptID", "pairID", "genre"]
# Column names of text-per-row files (generic and GLUE headers), lower-cased: a first line naming
# two of them is a classify/regress file's header, never a CoNLL line.
_TABLE_HEADER_NAMES = {n.lower() for n in TEXT_NAMES + TEXT_B_NAMES + LABEL_NAMES} | {
    n.lower() for names in GLUE_COLUMNS.values() for n in names if n
}
CONLL_FORMAT = 'CoNLL: one word and its tag per line ("EU\\tB-ORG"), a blank line between sentences'


def header_columns(path: str, format: str, header: list[str], conll: bool = False) -> tuple:
    """(text, text_b, label) column indices from the header; text_b and label may be None."""
    if format in GLUE_COLUMNS:
        names = GLUE_COLUMNS[format]
        found = [header.index(n) if n and n in header else None for n in names]
        accepted = repr(names[0])
    else:
        lower = [h.lower() for h in header]
        found = [
            next((lower.index(n) for n in group if n in lower), None)
            for group in (TEXT_NAMES, TEXT_B_NAMES, LABEL_NAMES)
        ]
        accepted = (
            f"{' or '.join(TEXT_NAMES)} for the text, optionally {' '.join(TEXT_B_NAMES)} and {' '.join(LABEL_NAMES)}"
        )
    if found[0] is None:
        if conll:
            raise KbertError(
                f"{path}: looks like CoNLL (a word and its tag per line), which {_task('tag')} reads; "
                f"classify and regress read one text per row under a header naming the columns: "
                f"{accepted}"
            )
        raise KbertError(
            f"{path}: the header names no text column (found: {', '.join(header)}); "
            f"the first row of a {format} file must name the columns: {accepted}"
        )
    return tuple(found)


def format_from_extension(path: str, text: str) -> str:
    """The format a file's extension (or, for an unknown one, a JSON first line) tells."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        return "csv"
    if ext in (".jsonl", ".json"):
        return "jsonl"
    if ext not in (".tsv", ".txt") and text.lstrip().startswith("{"):
        return "jsonl"
    return "tsv"  # refined by the header in readers._read_table


def glue_layout(header: list[str]) -> str:
    """The GLUE layout a TSV's first row announces, or "tsv" for a generic one."""
    if "#1 String" in header and "#2 String" in header:
        return "mrpc"
    if header[: len(_STSB_HEADER)] == _STSB_HEADER:
        return "stsb"
    if header[: len(_MNLI_HEADER)] == _MNLI_HEADER:
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
    if len(header) == COLA_WIDTH and header[COLA_LABEL] in ("0", "1") and not names & set(TEXT_NAMES):
        return "cola"  # a headerless first row: source, 0/1, original label, sentence
    return "tsv"


def looks_like_conll(text: str) -> bool:
    """Short lines of single words, and blank lines between groups of them: a CoNLL file."""
    lines = [line for line in text.strip().splitlines() if not line.startswith("-DOCSTART-")]
    words = [line.split("\t")[0] if "\t" in line else line.split()[0] for line in lines if line.strip()]
    return "" in (line.strip() for line in lines) and all(len(w.split()) == 1 for w in words)


def refuse_text_rows(path: str, text: str):
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
        raise KbertError(
            f"{path}: {why}: a file of one text per row, which {_task('classify')} or regress reads; "
            f"{_task('tag')} reads {CONLL_FORMAT}"
        )


def _task(name: str) -> str:
    # `kbert finetune --task`; predict and evaluate read the task the model recorded.
    return option("task", name, command="finetune")
