"""Benchmark results are data, the results page says what is true today, and no page speaks of process.

Every run is a file `benchmarks/results/DATE-MACHINE-NAME.json` holding its date, machine, command
and code version; each benchmark writes one there by default (`benchmarks/record.py`).
docs/performance.md holds each benchmark's current table with its date, machine and command, and
links only to files and sections that exist. Nothing a user reads (README, docs, code, tests,
scripts, benchmarks) names an issue number, a work "stop", a CI date, or a commit hash in prose.
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
RESULTS = os.path.join(BENCHMARKS, "results")
PAGE = os.path.join(ROOT, "docs", "performance.md")
NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z0-9]+-[a-z0-9]+|[a-z0-9]+)-([a-z0-9]+(?:-[a-z0-9]+)*)\.json$")

sys.path.insert(0, BENCHMARKS)
import record  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_machine_name_is_the_cpu_family_and_its_widest_vector_instructions():
    cases = {
        "model name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma avx512f avx512_vnni avx512_bf16\n": "epyc-avx512",
        "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2 fma\n": "epyc-avx2",
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 avx512f amx_bf16 amx_tile\n": "xeon-amx",
        "model name\t: Intel(R) Core(TM) i7-8700\nflags\t\t: sse4_2 avx2\n": "core-avx2",
    }
    assert {text: record.machine_name(text) for text in cases} == cases


def test_emit_prints_and_writes_a_dated_file_per_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(record, "RESULTS", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [os.path.join(BENCHMARKS, "pretrain_bench.py"), "--steps", "3"])
    first = record.emit({"seq_per_s": 54.3, "machine": {"cpus": 2}}, "pretrain")
    second = record.emit({"seq_per_s": 55.0}, "pretrain")
    printed = [json.loads(text) for text in re.split(r"(?m)^(?=\{)", capsys.readouterr().out) if text.strip()]

    date, machine = printed[0]["date"], record.machine_name()
    assert os.path.basename(first) == f"{date}-{machine}-pretrain.json"
    assert os.path.basename(second) == f"{date}-{machine}-pretrain-2.json"  # a later run never overwrites
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (first, second))  # no temporaries
    saved = json.loads(read(first))
    assert saved == printed[0]
    assert saved["seq_per_s"] == 54.3 and saved["machine"]["cpus"] == 2 and saved["machine"]["description"]
    assert saved["command"] == "benchmarks/pretrain_bench.py --steps 3"
    assert saved["machine_name"] == machine and saved["code"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)

    chosen = record.emit({"x": 1}, "pretrain", output=str(tmp_path / "elsewhere" / "run.json"))
    assert chosen == str(tmp_path / "elsewhere" / "run.json") and json.loads(read(chosen))["x"] == 1


def test_each_benchmark_that_prints_a_report_writes_it_to_the_results_folder():
    """The scripts print one JSON report; each sends it through record.emit and takes --output."""
    scripts = sorted(name for name in os.listdir(BENCHMARKS) if name.endswith(".py") and name != "record.py")
    reporting = {
        "convert_bench.py",
        "create_data_bench.py",
        "export_ab.py",
        "finetune_bench.py",
        "forward_bench.py",
        "int8_matmul_bench.py",
        "int8_probe.py",
        "packing_bench.py",
        "pretrain_bench.py",
        "request_profile.py",
        "retrieval_bench.py",
        "serving_bench.py",
        "tokenizer_bench.py",
    }
    assert reporting <= set(scripts)
    for name in sorted(reporting):
        source = read(os.path.join(BENCHMARKS, name))
        assert "record.emit(" in source and "--output" in source, name


def test_the_results_option_is_in_the_help():
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "pretrain_bench.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert "benchmarks/results/DATE-MACHINE-NAME.json" in re.sub(r"-\s+", "-", result.stdout)  # argparse wraps it


@pytest.mark.parametrize("name", sorted(os.listdir(RESULTS)))
def test_every_results_file_is_named_by_its_date_and_machine(name):
    match = NAME.match(name)
    assert match, f"{name}: name it DATE-MACHINE-NAME.json"
    data = json.loads(read(os.path.join(RESULTS, name)))
    assert data["date"] == match.group(1)
    assert name.startswith(f"{data['date']}-{data['machine_name']}-")
    assert data["command"] and "code" in data and data["machine"]["description"]


def sections(text: str) -> dict:
    parts = re.split(r"(?m)^## ", text)
    return {part.splitlines()[0]: part for part in parts[1:]}


def test_the_results_page_gives_each_benchmark_its_date_machine_command_and_files():
    text = read(PAGE)
    assert not re.search(r"(?m)^#+ .*\b20\d\d-\d\d-\d\d", text), "dated runs belong in benchmarks/results/"
    benchmarks = {
        "Pretraining": "pretrain_bench.py",
        "Fine-tuning": "finetune_bench.py",
        "Retrieval": ("retrieval_bench.py", "rerank_bench.py"),
        "create-data": "create_data_bench.py",
        "Serving latency": "serving_bench.py",
        "int8 serving": "serving_bench.py",
        "Checkpoint conversion": "convert_bench.py",
        "Tokenizer": "tokenizer_bench.py",
    }
    found = sections(text)
    machines = set(re.findall(r"\*\*Machine ([A-Z])\*\*", found["Machines and method"]))
    for title, scripts in benchmarks.items():
        section = found[title]
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), title
        assert set(re.findall(r"machine ([A-Z])\b", section)) & machines, title  # a machine the page describes
        for script in (scripts,) if isinstance(scripts, str) else scripts:
            assert f"`benchmarks/{script}" in section, title
        assert "](../benchmarks/results/" in section, title
        assert "|---" in section, title  # its table


def anchors(text: str) -> set:
    """GitHub's ids for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    ids, seen = set(), {}
    for heading in re.findall(r"(?m)^#+ (.+)$", text):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


@pytest.mark.parametrize(
    "doc", ["README.md"] + sorted(f"docs/{n}" for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
)
def test_links_to_files_and_sections_resolve(doc):
    text = read(os.path.join(ROOT, doc))
    base = os.path.dirname(os.path.join(ROOT, doc))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, doc)
        if not os.path.exists(file):
            broken.append(target)
        elif anchor and file.endswith(".md") and anchor not in anchors(read(file)):
            broken.append(target)
    assert broken == [], f"{doc} links to what does not exist"


# What a reader should never meet: the history of how the code was made.
PROCESS = [
    re.compile(r"\bissues? \d+", re.I),
    re.compile(r"\bstop \d+", re.I),
    re.compile(r"\(CI, " + r"20\d\d"),  # split so that this line does not match itself
    re.compile(r"\b(?:earlier|previous|this) session\b", re.I),
]
# A word of 7 to 12 hex digits with a letter and a digit, as a short commit hash is written.
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![\w/-])")
READ_BY_USERS = ("README.md", "docs/", "benchmarks/", "scripts/", "tests/", "kbert/", "cli/", "serving/", "converters/")


def user_read_files() -> list:
    listed = subprocess.run(["git", "ls-files", *READ_BY_USERS], cwd=ROOT, capture_output=True, text=True, check=True)
    return [
        name
        for name in listed.stdout.split()
        if name.endswith((".py", ".md", ".sh")) and not name.startswith("tests/fixtures/")
    ]


def test_no_page_or_source_speaks_of_issues_stops_or_commits():
    found = []
    for name in user_read_files():
        path = os.path.join(ROOT, name)
        if not os.path.exists(path):
            continue  # deleted in the working tree
        for number, line in enumerate(read(path).splitlines(), 1):
            if any(p.search(line) for p in PROCESS):
                found.append(f"{name}:{number}: {line.strip()}")
            if name.endswith(".md") and COMMIT.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []
