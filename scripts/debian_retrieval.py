"""A real retrieval task: a Debian package's one-line synopsis -> its long description.

Reads apt's own lists on this machine (run `apt-get -o Acquire::Languages=en update` first):
`*_Packages` gives each binary package's source package and description checksum,
`*_Translation-en` its English description (a Packages file that carries whole descriptions, as
some archives' do, is read as is). The query is the synopsis (the description's first line), the
document the long description after it, its paragraphs joined.

The split is by source package, so the near-identical descriptions of one source's packages
(`0ad` and `0ad-data`, a library and its `-dev`) never sit on both sides of it: sources are
ordered by a seeded hash, each keeps at most `--per-source` pairs (its main package first, the
one named after the source), and they fill the test split, then dev, then train. A pair whose
query or document (lower-cased, spaces collapsed) was already taken is dropped, so no two pairs
share either text and a query has exactly one right document. The same lists, seed and sizes
give the same files.

usage: python scripts/debian_retrieval.py OUT_DIR [--test-size 3000 --dev-size 1000 --seed 0
       --per-source 1 --min-words 8 --packages FILE --translations FILE]
writes OUT_DIR/{train,dev,test}.tsv (header `query<TAB>document`, what `kbert finetune --task embed`
reads) and prints the counts as one JSON object.
"""

import argparse
import hashlib
import json
import os
import re
import sys

# apt's lists, read and split as the corpus script reads them (scripts/ is on the path when run).
from debian_corpus import _read_lists as read_lists
from debian_corpus import _stanzas as stanzas

SPLITS = ("train", "dev", "test")


def pair_of(description):
    """(synopsis, long description as one line) of a Debian description; either may be ''.

    >>> pair_of("Tool to do X\\n It does X.\\n .\\n And Y.")
    ('Tool to do X', 'It does X. And Y.')
    """
    synopsis, _, body = description.partition("\n")
    paragraphs = [p.replace("\n", " ").strip() for p in body.split("\n.\n")]
    document = " ".join(p for p in paragraphs if p and p != ".")
    return _one_line(synopsis), _one_line(document)


def _one_line(text):
    # A TSV cell: tabs and line breaks would break the row.
    return re.sub(r"\s+", " ", text).strip()


def _key(text):
    return re.sub(r"\s+", " ", text.lower()).strip()


def _source(stanza):
    # "Source: foo (1.2-3)" names the source and, when it differs from the package's, its version.
    return (stanza.get("Source") or stanza["Package"]).split(" ")[0]


def read_pairs(packages_text, translations_text=""):
    """{source package: [(package, synopsis, document), ...]} from a Packages and a Translation-en text."""
    translated = {}
    for s in stanzas(translations_text):
        if "Description-en" in s:
            translated[s["Package"], s.get("Description-md5", "")] = s["Description-en"]
            translated.setdefault((s["Package"], None), s["Description-en"])
    by_source, seen_packages = {}, set()
    for s in stanzas(packages_text):
        name = s["Package"]
        if name in seen_packages:  # the same package in several lists (an update, another architecture)
            continue
        description = s.get("Description", "")
        if "\n" not in description:  # the long text lives in Translation-en
            description = translated.get((name, s.get("Description-md5", "")), translated.get((name, None), ""))
        if not description:
            continue
        seen_packages.add(name)
        synopsis, document = pair_of(description)
        by_source.setdefault(_source(s), []).append((name, synopsis, document))
    return by_source


def build_splits(by_source, test_size, dev_size, seed=0, per_source=1, min_words=8):
    """{"train"|"dev"|"test": [(query, document), ...]} and counts of what was dropped.

    Sources in the order of sha256(seed:source); within a source the package named after it
    first, then by name. The test split takes sources until it holds `test_size` pairs, then dev
    until `dev_size`, and train the rest.
    """
    order = sorted(by_source, key=lambda source: hashlib.sha256(f"{seed}:{source}".encode()).hexdigest())
    splits = {name: [] for name in SPLITS}
    taken_queries, taken_documents = set(), set()
    dropped = {"short": 0, "duplicate": 0, "past_per_source": 0}
    for source in order:
        split = "test" if len(splits["test"]) < test_size else "dev" if len(splits["dev"]) < dev_size else "train"
        kept = 0
        for _package, query, document in sorted(by_source[source], key=lambda p: (p[0] != source, p[0])):
            if len(document.split()) < min_words or not query:
                dropped["short"] += 1
            elif _key(query) in taken_queries or _key(document) in taken_documents:
                dropped["duplicate"] += 1
            elif kept >= per_source:
                dropped["past_per_source"] += 1
            else:
                taken_queries.add(_key(query))
                taken_documents.add(_key(document))
                splits[split].append((query, document))
                kept += 1
    return splits, dropped


def write_splits(splits, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, rows in splits.items():
        path = os.path.join(out_dir, f"{name}.tsv")
        partial = f"{path}.partial"
        with open(partial, "w", encoding="utf-8") as f:
            f.write("query\tdocument\n")
            f.writelines(f"{query}\t{document}\n" for query, document in rows)
        os.replace(partial, path)  # a file is whole or absent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="where train.tsv, dev.tsv and test.tsv go")
    parser.add_argument("--test-size", type=int, default=3000, help="pairs in the test split")
    parser.add_argument("--dev-size", type=int, default=1000, help="pairs in the dev split")
    parser.add_argument("--seed", type=int, default=0, help="orders the source packages, hence the split")
    parser.add_argument("--per-source", type=int, default=1, help="pairs kept per source package")
    parser.add_argument("--min-words", type=int, default=8, help="shorter long descriptions are left out")
    parser.add_argument("--packages", help="a Packages file (default: apt's lists on this machine)")
    parser.add_argument("--translations", help="a Translation-en file (default: apt's lists on this machine)")
    args = parser.parse_args(argv)
    if args.packages:
        with open(args.packages, encoding="utf-8") as f:
            packages = f.read()
        translations = ""
        if args.translations:
            with open(args.translations, encoding="utf-8") as f:
                translations = f.read()
    else:
        packages, translations = read_lists("*_Packages*"), read_lists("*Translation-en*")
    by_source = read_pairs(packages, translations)
    if not by_source:
        sys.exit("no package descriptions found: run apt-get -o Acquire::Languages=en update")
    splits, dropped = build_splits(
        by_source, args.test_size, args.dev_size, args.seed, per_source=args.per_source, min_words=args.min_words
    )
    write_splits(splits, args.out_dir)
    counts = {name: len(rows) for name, rows in splits.items()}
    print(json.dumps({**counts, "sources": len(by_source), "dropped": dropped, "seed": args.seed}))


if __name__ == "__main__":
    main()
