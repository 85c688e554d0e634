"""Which columns of a pairs table hold the query, the document and the hard negative, and whether
the table holds pairs at all (`kbert finetune/evaluate --task embed`).

A first row of column names is a header: one that names the columns (query, document, negative;
sentence-transformers' anchor, positive, negative; question, answer, passage) says where each is,
in any order. A first row of other column names (text, label, sentence1, ...), or of short
one-word cells above rows of longer texts, is a header too, and is skipped: the columns are then
read by position, as in a file without one. A header that names a label column, or "documents"
that take only a handful of one-word values, are a classify file's, not pairs: refused. Which
columns were read is logged.

Example:
>>> columns = pair_columns("pairs.tsv", ["anchor", "positive"], [["how to make tea", "Put the kettle on."]])
>>> columns.indexes, columns.describe()
([0, 1], "read the query from column 'anchor' and the document from column 'positive'")
"""

from __future__ import annotations

import dataclasses
import re
import statistics

from kbert.runtime.errors import KbertError, option

# The names a header may give each column of a pair, in sentence-transformers' and common datasets' words.
ROLE_NAMES = {
    "query": ("query", "anchor", "question"),
    "document": ("document", "positive", "answer", "passage"),
    "negative": ("negative",),
}
ROLE_SAID = {"query": "query", "document": "document", "negative": "hard negative"}
# Column names of other files a pairs reader may be given: a first row of them is a header.
OTHER_COLUMNS = {"text", "text_a", "text_b", "sentence", "sentence1", "sentence2", "title", "id", "context"}
LABEL_COLUMNS = {"label", "labels", "score", "class", "target"}
# A column name: one short word (letters, digits, _ or -), as no text of a pair is.
_COLUMN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,23}")
# "Documents" of at most this many distinct one-word values, each repeated, are a label column.
_HANDFUL = 10


@dataclasses.dataclass
class PairColumns:
    """Where a table's pairs are.

    Args:
        indexes: list of int. The query's, the document's (and the hard negative's) column.
        header: list of str, or None. Line 1's cells, when it is a header.
        named: bool. Whether the header named the columns (else they are read by position).
    """

    indexes: list
    header: list | None = None
    named: bool = False

    def describe(self) -> str:
        """What was read, for the log."""
        roles = list(ROLE_SAID.values())[: len(self.indexes)]
        if self.named:
            where = [f"the {role} from column {self.header[i]!r}" for role, i in zip(roles, self.indexes, strict=True)]
        else:
            where = [f"the {role} from column {i + 1}" for role, i in zip(roles, self.indexes, strict=True)]
        read = f"read {', '.join(where[:-1])} and {where[-1]}"
        if self.header is not None and not self.named:
            return f"line 1 ({', '.join(self.header)}) is a header; {read}"
        return read if self.header is not None else f"no header; {read}"


def pair_columns(path, first: list, body: list, separator: str = "tab") -> PairColumns:
    """The columns of a table's pairs, from its first row and the rows after it.

    Args:
        path: str. The file, for messages.
        first: list of str. The first row's cells.
        body: list of lists of str. The rows after it (or some of them).
        separator: str. "tab" or "comma", for messages.

    Raises:
        KbertError: a header that names a label column, or names some of query, document and
            negative but not both query and document, or a table of other than two or three columns
            without a header that names them.

    >>> pair_columns("pairs.tsv", ["question", "answer"], [["How do I boil an egg?", "Ten minutes."]]).describe()
    "read the query from column 'question' and the document from column 'answer'"
    >>> pair_columns("pairs.tsv", ["q", "d"], [["how to make tea", "Put the kettle on."], ["sick cat", "Call the vet."]]).describe()
    'line 1 (q, d) is a header; read the query from column 1 and the document from column 2'
    """
    cells = [cell.strip() for cell in first]
    lowered = [cell.lower() for cell in cells]
    found = {role: next((i for i, c in enumerate(lowered) if c in names), None) for role, names in ROLE_NAMES.items()}
    exact = [name for name in ("query", "document", "negative") if name in lowered]
    if found["query"] is not None and found["document"] is not None:
        indexes = [found["query"], found["document"]] + ([found["negative"]] if found["negative"] is not None else [])
        return PairColumns(indexes, cells, named=True)
    if exact:
        _refuse_partial(path, cells, exact)
    header = _is_header(lowered, cells, body)
    if header and set(lowered) & LABEL_COLUMNS:
        raise KbertError(
            f"{path}: its header ({', '.join(cells[:8])}) names a label column, as a classify file's does: pairs "
            f"hold a query and its document per row; give a pairs file, or fine-tune it with "
            f"{option('task', 'classify', command='finetune')}"
        )
    width = len(cells)
    if width < 2 or width > 3:
        said = "one column" if width == 1 else f"{width} columns and no header"
        raise KbertError(
            f"{path}: {said}; a pairs file holds a query and a document per row (and a hard negative): a header "
            f"naming query, document (and negative), or two (three) {separator}-separated columns in that order"
        )
    return PairColumns(list(range(width)), cells if header else None)


def check_pairs(path, documents: list):
    """Refuse "documents" that take a handful of one-word values, each many times: a label
    column (a classify file given as pairs), not documents.

    >>> check_pairs("train.tsv", ["pos", "neg"] * 10)
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: train.tsv: its 20 documents take only 2 distinct one-word values (neg, pos), as a label column does: it does not look like pairs of a query and its document; give a pairs file, or fine-tune it with task='classify'
    """
    distinct = set(documents)
    if (
        len(distinct) <= _HANDFUL
        and len(documents) >= 4 * len(distinct)
        and all(_COLUMN_NAME.fullmatch(d.strip()) or _is_number(d) for d in distinct)
    ):
        shown = ", ".join(sorted(distinct))
        raise KbertError(
            f"{path}: its {len(documents)} documents take only {len(distinct)} distinct one-word values ({shown}), "
            f"as a label column does: it does not look like pairs of a query and its document; give a pairs file, "
            f"or fine-tune it with {option('task', 'classify', command='finetune')}"
        )


def _is_header(lowered: list, cells: list, body: list) -> bool:
    """Column names: one-word cells that name a known column, or that are short above longer rows."""
    if not all(_COLUMN_NAME.fullmatch(cell) for cell in cells):
        return False
    if set(lowered) & (OTHER_COLUMNS | LABEL_COLUMNS):
        return True
    lengths = [sum(len(cell) for cell in row) for row in body if row]
    return len(lengths) >= 2 and statistics.median(lengths) >= 2 * sum(len(cell) for cell in cells)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _refuse_partial(path, cells: list, named: list):
    raise KbertError(
        f"{path}: the header ({', '.join(cells[:8])}) names {', '.join(named)} but not both query and "
        f"document; name the columns query, document (and negative), or leave the header out"
    )
