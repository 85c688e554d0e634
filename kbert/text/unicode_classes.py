"""The character classes google-research/bert's tokenizer tests, read from Python's `unicodedata`.

Both kbert tokenizers use these tables: the Python one as `str.translate` tables and regexes,
the in-graph one as RE2 character classes baked into the graph. Taking them from the same
`unicodedata` the original calls (rather than RE2's or ICU's own tables, which follow other
Unicode versions) is what makes the two agree with the original on every code point.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

# modeling.py's _is_chinese_char: the CJK Unified Ideograph blocks (not Hangul, Hiragana, Katakana).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


@functools.cache
def _categories() -> dict[str, tuple[int, ...]]:
    """Code points of the categories the tokenizer asks about, and of `str.isspace()` ("space"):
    one pass over all of Unicode, so cached, once per process (its time: docs/performance.md,
    "Tokenizer")."""
    wanted = {"Cc": [], "Cf": [], "Zs": [], "Mn": [], "P": []}
    every_char = "".join(map(chr, range(sys.maxunicode + 1)))
    for cp, cat in enumerate(map(unicodedata.category, every_char)):
        bucket = wanted.get(cat)
        if bucket is not None:
            bucket.append(cp)
        elif cat[0] == "P":
            wanted["P"].append(cp)
    # A str pattern's \s is str.isspace(), and the regex scan is C-speed.
    wanted["space"] = [match.start() for match in re.finditer(r"\s", every_char)]
    return {k: tuple(v) for k, v in wanted.items()}


@functools.cache
def removed_chars() -> tuple[int, ...]:
    """_clean_text drops NUL, U+FFFD and control/format characters (but not tab, LF, CR)."""
    cats = _categories()
    keep = {ord("\t"), ord("\n"), ord("\r")}
    return tuple(sorted(({0, 0xFFFD} | set(cats["Cc"]) | set(cats["Cf"])) - keep))


@functools.cache
def whitespace_chars() -> tuple[int, ...]:
    """_clean_text turns these into a space: space, tab, LF, CR and category Zs."""
    return tuple(sorted({0x20, 0x09, 0x0A, 0x0D} | set(_categories()["Zs"])))


@functools.cache
def split_chars() -> tuple[int, ...]:
    """Characters that `str.split()` (the original's whitespace_tokenize) splits on and that
    survive _clean_text: a space, and U+2028/U+2029 (categories Zl/Zp, not Zs)."""
    removed, spaces = set(removed_chars()), set(whitespace_chars())
    return tuple(cp for cp in _categories()["space"] if cp not in removed and (cp not in spaces or cp == 0x20))


@functools.cache
def mark_chars() -> tuple[int, ...]:
    """Category Mn (non-spacing marks): _run_strip_accents drops them after NFD."""
    return _categories()["Mn"]


@functools.cache
def punctuation_chars() -> tuple[int, ...]:
    """_is_punctuation: all non-alphanumeric printable ASCII, plus every category P*."""
    ascii_punct = [*range(33, 48), *range(58, 65), *range(91, 97), *range(123, 127)]
    return tuple(sorted(set(ascii_punct) | set(_categories()["P"])))


def ranges(code_points) -> list[tuple[int, int]]:
    """Collapse sorted code points into inclusive (first, last) ranges."""
    out = []
    for cp in code_points:
        if out and cp == out[-1][1] + 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def python_class(code_points) -> str:
    """A Python `re` character class body, e.g. `\\u0021-\\u002f`."""
    return "".join(_py_escape(a) if a == b else f"{_py_escape(a)}-{_py_escape(b)}" for a, b in ranges(code_points))


def re2_class(code_points) -> str:
    """An RE2 character class body, e.g. `\\x{21}-\\x{2F}` (for tf.strings.regex_replace)."""
    return "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges(code_points))


def _py_escape(cp: int) -> str:
    return f"\\U{cp:08x}"
