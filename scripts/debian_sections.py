"""A real labelled text set: Debian package descriptions -> the package's archive section.

Reads apt's own lists on this machine (run `apt-get -o Acquire::Languages=en update` first):
`*_Packages` gives each package's Section, `*_Translation-en` its English description. Eight
topical sections are kept (games, science, sound, graphics, net, text, admin, math), at most
600 packages each, split 60/20/20 into train/dev/test by a hash of the package name, so the
split is stable across runs and machines with the same lists.

usage: python scripts/debian_sections.py OUT_DIR   -> OUT_DIR/{train,dev,test}.tsv (text, label)
"""

import hashlib
import os
import re
import sys

# apt's lists, read and split as the corpus script reads them (scripts/ is on the path when run).
from debian_corpus import _read_lists as read_lists
from debian_corpus import _stanzas as stanzas

SECTIONS = ("games", "science", "sound", "graphics", "net", "text", "admin", "math")
PER_SECTION = 600


def description_text(desc):
    summary, _, body = desc.partition("\n")
    paragraphs = [p.replace("\n", " ").strip() for p in body.split("\n.\n")]
    text = " ".join([summary.strip() + "."] + [p for p in paragraphs if p and p != "."])
    return re.sub(r"\s+", " ", text).replace("\t", " ")


def bucket(name):
    return int(hashlib.md5(name.encode()).hexdigest(), 16) % 10


def main(out_dir):
    sections = {s["Package"]: s.get("Section", "").split("/")[-1] for s in stanzas(read_lists("*_Packages*"))}
    descriptions = {
        s["Package"]: s["Description-en"] for s in stanzas(read_lists("*Translation-en*")) if "Description-en" in s
    }
    if not sections or not descriptions:
        sys.exit("no apt lists with English descriptions: run apt-get -o Acquire::Languages=en update")
    by_section, seen = {s: [] for s in SECTIONS}, set()
    for name in sorted(descriptions, key=lambda n: hashlib.md5(n.encode()).hexdigest()):
        section = sections.get(name)
        text = description_text(descriptions[name])
        if section in by_section and len(by_section[section]) < PER_SECTION and text not in seen:
            seen.add(text)  # identical descriptions (e.g. -data packages) would leak across splits
            by_section[section].append((name, text))
    os.makedirs(out_dir, exist_ok=True)
    splits = {"train": [], "dev": [], "test": []}
    for section, rows in by_section.items():
        for name, text in rows:
            b = bucket(name)
            splits["train" if b < 6 else "dev" if b < 8 else "test"].append((text, section))
    for split, rows in splits.items():
        with open(os.path.join(out_dir, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            f.writelines(f"{text}\t{label}\n" for text, label in rows)
        print(f"{split}: {len(rows)} rows", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
