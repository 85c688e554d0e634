"""A real long-document task: the English man pages installed on this machine -> their section.

Made for a long-document comparison (truncation against windows against a model
extended to 512 positions): nearly every page runs far past one 128-token window, and the
section is told by the whole page (OPTIONS or RETURN VALUE and ERRORS, FILES, who runs it),
not by its first window. `--stats` measures both. On the 2-core AVX2 VM of docs/real-data.md:
median 1,226 WordPiece tokens per test page (p90 4,405), every page longer than one window
and a median 90% of a page's tokens past it; TF-IDF + logistic regression scored 0.801 on test
(dev 0.775) from the words that fit in the first window and 0.855 (dev 0.871) from the whole
page. Sections 1 and 8 (user and admin commands) stay the hardest to tell apart either way.

What is read: /usr/share/man/man{1,2,3,5,7,8}/*.gz, regular files only (symlinks and `.so`
stubs are other names for pages already read), English only (not the language subfolders).
Sections 4 and 6 have too few pages. Each page is rendered by `groff -mandoc -Tutf8` (with tbl
and preconv, no hyphenation, one very long line per paragraph), in a pool of 2 processes:
about a minute for the whole build.

What is removed, because it names the section without reading the page:
- the .TH/.Dt line (title, section number, "Linux Programmer's Manual", source and date) and
  with it the rendered header and footer; mdoc's .Dd and .Os too;
- every cross-reference's section number: "open(2)" becomes "open", everywhere (SEE ALSO
  lists nothing but such references, and section 2 pages cite section 2 pages);
- SYNOPSIS and LIBRARY, and SYNTAX where it takes SYNOPSIS' place (X11's pages): a C
  prototype or "Standard C library (libc, -lc)" says 2 or 3, a command line 1 or 8, within the
  first few tokens;
- NAME: its one-line summary ("open - open and possibly create a file", "crontab - tables for
  driving cron") is a summary of the page in the first window. Measured: without it the
  first-window baseline loses about 3 points and the whole-page one nothing.
The first window is then the start of DESCRIPTION: a fair clue, but only part of the page.

What is kept: at most PER_SECTION pages per section, picked in the order of a hash of the file
name, so that sections are balanced-ish (section 5 has the fewest pages); at most a tenth of a
section from one family (the name's leading word: gcloud_*, git-*, XtFoo, EVP_*), because
man1 here holds 16,000 gcloud pages that would otherwise make section 1 "pages that say
gcloud". Perl's module pages (3pm, 3perl) are kept as section 3, which is what they are (a
library's API), but count as one family "perl", so that a machine with thousands of them does
not turn section 3 into Perl. Pages shorter than MIN_WORDS words are dropped; pages longer than
MAX_WORDS words are cut to their first MAX_WORDS words, to keep the file small (bash(1) alone
is 50,000 words): a tenth of the pages are cut. Identical texts are kept once. The split is
60/20/20 train/dev/test by a hash of the page's name without its section (crontab.1 and
crontab.5 land in the same split), stable across runs and machines with the same pages.

usage: python scripts/man_sections.py OUT_DIR [--stats]
  -> OUT_DIR/{train,dev,test}.tsv (text, label), one page per line; counts on stderr.
  --stats also prints the test pages' lengths in kbert WordPiece tokens and the TF-IDF
  baseline on the first window against the whole page (scikit-learn, the `bench` extra).
"""

import gzip
import hashlib
import multiprocessing
import os
import re
import subprocess
import sys
import time

import numpy as np

MAN_DIR = "/usr/share/man"
SECTIONS = ("1", "2", "3", "5", "7", "8")
PER_SECTION = 400
PER_FAMILY = PER_SECTION // 10
MIN_WORDS, MAX_WORDS = 300, 3000
DROPPED = ("NAME", "LIBRARY", "SYNOPSIS")  # and SYNTAX where it stands for SYNOPSIS, right after these
PERL = ("3pm", "3perl")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "QQQMANQQQ"  # replaces the title and dates, so the rendered header and footer can be found

GROFF = ["groff", "-k", "-t", "-Tutf8", "-mandoc", "-rLL=5000n", "-rHY=0", "-P-cbou"]
HEADER = re.compile(r"^\.(TH|Dt|Dd|Os)\b.*$", re.M)
CROSS_REFERENCE = re.compile(r"(?<=[\w>*])\(\d[a-zA-Z]{0,6}\)")


def bucket(key):
    return int(hashlib.md5(key.encode()).hexdigest(), 16)


def family(name):
    """gcloud_beta_... -> gcloud, XtAddCallback -> xt, EVP_MD_fetch -> evp, *.3pm -> perl."""
    page, _, ext = name.rpartition(".")
    return "perl" if ext in PERL else re.match(r"[A-Z]*[a-z0-9]*", page).group().lower() or page


def candidates(section):
    """The section's page files, as (file name without .gz, path), in hash order."""
    folder = os.path.join(MAN_DIR, f"man{section}")
    pages = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".gz") and entry.is_file(follow_symlinks=False):
            pages.append((entry.name[: -len(".gz")], entry.path))
    return sorted(pages, key=lambda page: bucket(page[0]))


def render(path):
    """The page as plain text sections [(heading, body)], or None for a .so stub or a failure."""
    with gzip.open(path, "rb") as f:
        source = f.read()
    text = source.decode("utf-8", "replace")
    if re.search(r"^\.so\s", text, re.M) and len(text) < 500:
        return None
    text = HEADER.sub(
        lambda m: f".{m.group(1)} {MARK} 0" if m.group(1) in ("TH", "Dt") else f".{m.group(1)} {MARK}", text
    )
    try:
        out = subprocess.run(GROFF, input=text.encode(), capture_output=True, timeout=120, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    sections, heading, body = [], "", []
    for line in out.decode("utf-8", "replace").splitlines():
        if MARK in line or not line.strip():
            continue
        if not line[0].isspace():  # a section heading starts in the first column
            sections.append((heading, body))
            heading, body = line.strip(), []
        else:
            body.append(line.strip())
    sections.append((heading, body))
    return [(h, " ".join(b)) for h, b in sections if h or b]


def document(sections):
    """One line of text from the rendered sections, without the ones that give the section away."""
    kept, opening = [], True
    for heading, body in sections:
        if heading.upper() in DROPPED or (opening and heading.upper() == "SYNTAX"):
            continue  # X11's and a few commands' pages call their synopsis SYNTAX
        opening = False
        kept.append(f"{heading} {body}")
    text = CROSS_REFERENCE.sub("", " ".join(kept))
    words = text.split()
    return " ".join(words[:MAX_WORDS]), len(words)


def _page(item):
    name, path = item
    sections = render(path)
    return name, sections and document(sections)


def collect(pool):
    """{section: [(name, text)]}, at most PER_SECTION pages each, PER_FAMILY of one family."""
    by_section, seen = {}, set()
    for section in SECTIONS:
        rows, families, pages = [], {}, iter(candidates(section))
        while len(rows) < PER_SECTION:
            batch = []  # rendered 32 at a time, so that a full section stops the rendering
            for name, path in pages:
                if families.get(family(name), 0) < PER_FAMILY:
                    batch.append((name, path))
                if len(batch) == 32:
                    break
            if not batch:
                break
            for name, result in pool.map(_page, batch):
                if not result or len(rows) >= PER_SECTION or families.get(family(name), 0) >= PER_FAMILY:
                    continue
                text, n_words = result
                if n_words < MIN_WORDS or text in seen:
                    continue
                seen.add(text)  # the same page under two names would leak across splits
                families[family(name)] = families.get(family(name), 0) + 1
                rows.append((name, text))
        by_section[section] = rows
        print(f"section {section}: {len(rows)} pages", file=sys.stderr)
    return by_section


def split_of(name):
    b = bucket(name.rpartition(".")[0]) % 10
    return "train" if b < 6 else "dev" if b < 8 else "test"


def describe(label, values):
    values = np.asarray(values)
    return f"{label}: median {np.median(values):.0f}, p90 {np.percentile(values, 90):.0f}, max {values.max()}"


def first_window(text, tokenizer, window):
    """The words whose WordPiece tokens fit in the window: what truncation shows a model."""
    words, n_tokens = text.split(), 0
    for i, word in enumerate(words):
        n_tokens += len(tokenizer.tokenize(word))
        if n_tokens > window:
            return " ".join(words[:i])
    return text


def stats(splits):
    """kbert-tokenizer lengths of the test pages, and TF-IDF + logistic regression on what fits in
    the first 128-token window against the whole page (C picked on dev, as
    scripts/tfidf_baseline.py picks it)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    sys.path.insert(0, REPO)
    import kbert

    tokenizer = kbert.Tokenizer(os.path.join(REPO, "tests/fixtures/vocab-uncased.txt"), do_lower_case=True)
    lengths = np.array([len(tokenizer.tokenize(text)) for text, _ in splits["test"]])
    window = 128 - 2  # [CLS] and [SEP]
    print(describe("test WordPiece tokens per page", lengths), file=sys.stderr)
    print(
        f"test pages past one {window + 2}-token window: {np.mean(lengths > window):.0%}; share of a page's"
        f" tokens past it: median {np.median(np.maximum(lengths - window, 0) / lengths):.0%}",
        file=sys.stderr,
    )
    for label, cut in (("first window", lambda text: first_window(text, tokenizer, window)), ("whole page", str)):
        x = {s: [cut(text) for text, _ in rows] for s, rows in splits.items()}
        y = {s: np.array([section for _, section in rows]) for s, rows in splits.items()}
        vectorizer = TfidfVectorizer(sublinear_tf=True, min_df=2)
        train = vectorizer.fit_transform(x["train"])
        best = None
        for c in (3.0, 30.0):
            model = LogisticRegression(C=c, max_iter=2000).fit(train, y["train"])
            dev = np.mean(model.predict(vectorizer.transform(x["dev"])) == y["dev"])
            if best is None or dev > best[0]:
                best = (dev, model)
        test = np.mean(best[1].predict(vectorizer.transform(x["test"])) == y["test"])
        print(f"TF-IDF + logistic regression, {label}: dev {best[0]:.3f}, test {test:.3f}", file=sys.stderr)


def main(out_dir, with_stats=False):
    start = time.time()
    with multiprocessing.Pool(2) as pool:
        by_section = collect(pool)
    splits = {"train": [], "dev": [], "test": []}
    for section, rows in by_section.items():
        for name, text in rows:
            splits[split_of(name)].append((text, section))
    os.makedirs(out_dir, exist_ok=True)
    for split, rows in splits.items():
        with open(os.path.join(out_dir, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            f.writelines(f"{text}\t{label}\n" for text, label in rows)
        print(f"{split}: {len(rows)} rows, " + describe("words", [len(t.split()) for t, _ in rows]), file=sys.stderr)
    print(f"built in {time.time() - start:.0f} s", file=sys.stderr)
    if with_stats:
        stats(splits)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--stats"]):
        sys.exit("usage: python scripts/man_sections.py OUT_DIR [--stats]")
    main(sys.argv[1], with_stats=sys.argv[2:] == ["--stats"])
