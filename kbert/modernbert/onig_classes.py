"""The character classes of the byte-level BPE split, as Hugging Face's `tokenizers` sees them.

`tokenizers` splits text with the regex `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+` run by Oniguruma, whose Unicode tables are newer than
RE2's (the engine TensorFlow's regex ops run). Letters and numbers that Oniguruma knows and RE2
does not are listed here, so that the graph's classes are `tokenizers`' own; its whitespace is
Unicode's White_Space, which RE2 spells out below. `probe_classes` reads the tables back from
the installed library (tests/modernbert checks them against it).

Example:
>>> LETTER.startswith("\\\\p{L}")
True
"""

from __future__ import annotations

WHITESPACE = r"\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"

# Code point ranges (first, last) that Oniguruma's \p{L} and \p{N} hold and RE2's do not.
LETTERS_BEYOND_RE2 = (
    (0x1C89, 0x1C8A), (0xA7CB, 0xA7CD), (0xA7DA, 0xA7DC), (0x105C0, 0x105F3), (0x10D4A, 0x10D65),
    (0x10D6F, 0x10D85), (0x10EC2, 0x10EC4), (0x11380, 0x11389), (0x1138B, 0x1138B), (0x1138E, 0x1138E),
    (0x11390, 0x113B5), (0x113B7, 0x113B7), (0x113D1, 0x113D1), (0x113D3, 0x113D3), (0x11BC0, 0x11BE0),
    (0x13460, 0x143FA), (0x16100, 0x1611D), (0x16D40, 0x16D6C), (0x18CFF, 0x18CFF), (0x1E5D0, 0x1E5ED),
    (0x1E5F0, 0x1E5F0), (0x2EBF0, 0x2EE5D),
)  # fmt: skip
NUMBERS_BEYOND_RE2 = (
    (0x10D40, 0x10D49), (0x116D0, 0x116E3), (0x11BF0, 0x11BF9), (0x16130, 0x16139), (0x16D70, 0x16D79),
    (0x1CCF0, 0x1CCF9), (0x1E5F1, 0x1E5FA),
)  # fmt: skip


def _ranges(ranges) -> str:
    return "".join(rf"\x{{{a:X}}}-\x{{{b:X}}}" for a, b in ranges)


LETTER = r"\p{L}" + _ranges(LETTERS_BEYOND_RE2)
NUMBER = r"\p{N}" + _ranges(NUMBERS_BEYOND_RE2)


def probe_classes() -> dict:
    """{"L": ranges, "N": ranges, "S": ranges}: every code point the installed `tokenizers`
    splits as a letter, a number or whitespace, read from its ByteLevel pre-tokenizer one code
    point at a time (about a million; some seconds)."""
    from tokenizers import pre_tokenizers

    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True).pre_tokenize_str
    found = {"L": [], "N": [], "S": []}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        # Joined to a letter, a digit or a mark, a character stays in one piece only with its own kind.
        kind = next((k for k, lead in (("L", "a"), ("N", "1"), ("O", "!")) if len(split(lead + c)) == 1), "S")
        if kind != "O":
            if found[kind] and found[kind][-1][1] == cp - 1:
                found[kind][-1][1] = cp
            else:
                found[kind].append([cp, cp])
    return {kind: [tuple(r) for r in ranges] for kind, ranges in found.items()}
