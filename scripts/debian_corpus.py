"""Build real text data from Debian's package lists (after `apt-get -o Acquire::Languages=en update`).

Needs the English descriptions in apt's lists: run `apt-get -o Acquire::Languages=en update` first.

usage: python scripts/debian_corpus.py OUT.txt
Writes a pretraining corpus in the format of google-research/bert's create_pretraining_data.py:
one sentence per line, a blank line between documents (about 60,000 documents, 25 MB).
"""

import glob
import hashlib
import re
import subprocess
import sys


def _read_lists(pattern):
    out = []
    for path in sorted(glob.glob("/var/lib/apt/lists/" + pattern)):
        text = subprocess.run(
            ["/usr/lib/apt/apt-helper", "cat-file", path], capture_output=True, check=True
        ).stdout.decode("utf-8", "replace")
        out.append(text)
    return "\n".join(out)


def _stanzas(text):
    for block in text.split("\n\n"):
        fields, key = {}, None
        for line in block.split("\n"):
            if line.startswith(" ") and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            yield fields


def descriptions():
    docs = {}
    for s in _stanzas(_read_lists("*Translation-en*")):
        desc = s.get("Description-en")
        if desc:
            docs[s["Package"]] = desc
    return docs


def _paragraph_text(desc):
    summary, _, body = desc.partition("\n")
    paras = [p.replace("\n", " ").strip() for p in body.split("\n.\n")]
    return summary.strip(), [re.sub(r"\s+", " ", p) for p in paras if p and p != "."]


def corpus(out):
    seen = set()
    with open(out, "w", encoding="utf-8") as f:
        for _pkg, desc in sorted(descriptions().items()):
            summary, paras = _paragraph_text(desc)
            text = " ".join(paras)
            h = hashlib.md5(text.encode()).hexdigest()
            if not paras or h in seen:
                continue
            seen.add(h)
            sentences = [summary + "."] + [s for p in paras for s in re.split(r"(?<=[.!?])\s+", p) if s]
            f.write("\n".join(sentences) + "\n\n")
    print("wrote", len(seen), "documents to", out)


if __name__ == "__main__":
    corpus(sys.argv[1])
