"""The docs point only at what a clone has, and `--help` quotes no measurement.

A user reproduces a documented result from the repository alone: every repository path the
README and docs/ name in backticks exists, and none points outside the clone. Measured
numbers live in docs/performance.md and the benchmarks, never in `--help`, where they would
be read as true on every machine.
"""

import inspect
import os
import re

import pytest

from test_bad_input_sweep import commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + [
    os.path.join("docs", name) for name in sorted(os.listdir(os.path.join(ROOT, "docs"))) if name.endswith(".md")
]
TOP = ("tests/", "scripts/", "benchmarks/", "docs/", "kbert/", "cli/", "serving/", "converters/", ".ci/")


@pytest.mark.parametrize("doc", DOCS)
def test_every_repository_path_a_doc_names_exists(doc):
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    named = {m.split("::")[0].split(" ")[0].rstrip(".,:;)") for m in re.findall(r"`([^`\n]+)`", text)}
    paths = {
        p for p in named if p.startswith(TOP) and "*" not in p and "{" not in p and "<" not in p and not p.endswith("/")
    }
    missing = sorted(p for p in paths if not os.path.exists(os.path.join(ROOT, p)))
    assert missing == [], f"{doc} names files a clone does not have"
    assert "../shared" not in text and "DESIGN.md" not in text


def test_no_help_text_quotes_a_measurement():
    measured = re.compile(r"\d+(\.\d+)?x\b|\d+(\.\d+)?\s*(ms|GiB|MiB|seq/s)\b")
    for name, callback in commands().items():
        texts = [inspect.getdoc(callback) or ""]
        texts += [getattr(p.default, "help", None) or "" for p in inspect.signature(callback).parameters.values()]
        for text in texts:
            assert not measured.search(text), (name, text)
