"""Where a benchmark's JSON goes: one file per run, `benchmarks/results/DATE-MACHINE-NAME.json`.

docs/performance.md shows each benchmark's current table; every run, current or not, stays a file
here that a script can read back or plot. A file holds the benchmark's own report plus the run's
`date`, `machine_name` (the CPU family and its widest vector instructions, e.g. `epyc-avx512`),
`machine` (what the CPU is), `command` and `code` (the git commit, `-dirty` when the tree had
changes, or kbert's installed version outside a clone).

Standard library only: the benchmarks' parent processes import no ML library.

>>> machine_name("model name : AMD EPYC 7B13\\nflags : fpu sse avx2 fma avx512f avx512_bf16\\n")
'epyc-avx512'
"""

import datetime
import json
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
OUTPUT_HELP = "where to write the JSON (default: benchmarks/results/DATE-MACHINE-NAME.json)"

# The CPU families a machine name starts with, by a word of /proc/cpuinfo's model name.
FAMILIES = (("EPYC", "epyc"), ("Ryzen", "ryzen"), ("Xeon", "xeon"), ("Core", "core"))


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _field(cpuinfo: str, name: str) -> str:
    match = re.search(rf"^{name}\s*:\s*(.*)$", cpuinfo, flags=re.M)
    return match.group(1).strip() if match else ""


def cpu_flags() -> list[str]:
    """Which of the instruction sets that decide the kernels' speed this CPU has (from /proc/cpuinfo)."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in wanted if flag in flags]


def machine_name(cpuinfo: str | None = None) -> str:
    """A short name for this CPU: its family and the widest vector instructions it has.

    The instruction set picks the kernels TensorFlow and oneDNN run (AMX, AVX-512 or AVX2), so two
    runs under one name are comparable.

    Args:
        cpuinfo: str. The text of /proc/cpuinfo; read from this machine when None.

    Example:
    >>> machine_name("model name : Intel(R) Xeon(R) Platinum 8480+\\nflags : avx2 avx512f amx_tile\\n")
    'xeon-amx'
    >>> machine_name("model name : AMD EPYC 7B12\\nflags : avx2 fma\\n")
    'epyc-avx2'
    """
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    model = _field(cpuinfo, "model name")
    flags = set(_field(cpuinfo, "flags").split())
    family = next((short for word, short in FAMILIES if word in model), platform.machine().lower() or "cpu")
    if flags & {"amx_tile", "amx_int8", "amx_bf16"}:
        return f"{family}-amx"
    for flag, short in (("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return f"{family}-{short}"
    return family


def code_version() -> str:
    """The git commit of the code that ran (`-dirty` if the tree had changes), else kbert's version."""
    try:
        found = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import version

        return "kbert " + version("kbert")
    except Exception:  # not installed either: say so rather than guess
        return "unknown"


def default_path(name: str, date: str, machine: str) -> str:
    """`benchmarks/results/DATE-MACHINE-NAME.json`, with `-2`, `-3`, ... for later runs of the same day.

    Example:
    >>> os.path.basename(default_path("serving-base", "2026-11-27", "epyc-avx2"))  # doctest: +SKIP
    '2026-11-27-epyc-avx2-serving-base.json'
    """
    stem = os.path.join(RESULTS, f"{date}-{machine}-{name}")
    path, n = stem + ".json", 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}.json"
    return path


def emit(report: dict, name: str, output: str | None = None, indent: int | None = 1) -> str:
    """Print `report` as JSON on stdout and write it, with the run's date, machine, command and code.

    Args:
        report: dict. The benchmark's results, as it prints them.
        name: str. The benchmark's part of the file name, e.g. "serving-base".
        output: str. The file to write; by default `default_path(name, ...)`.
        indent: int. JSON indentation, for stdout and the file alike.

    Returns:
        The path written. The file appears whole or not at all (written beside it, then renamed).

    Example:
    >>> emit({"seq_per_s": 54.3}, "pretrain", output="/tmp/run.json")  # doctest: +SKIP
    """
    machine = machine_name()
    cpuinfo = _cpuinfo()
    described = {
        "description": _field(cpuinfo, "model name") or platform.processor() or "unknown",
        "cpus": os.cpu_count(),
    }
    if isinstance(report.get("machine"), dict):
        described.update(report["machine"])
    record = {
        "date": datetime.date.today().isoformat(),
        "machine_name": machine,
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "python"] + sys.argv[1:]),
        "code": code_version(),
        **report,
        "machine": described,
    }
    text = json.dumps(record, indent=indent)
    print(text, flush=True)
    path = os.path.abspath(output or default_path(name, record["date"], machine))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.tmp-{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(partial, path)
    print(f"written to {path}", file=sys.stderr)
    return path
