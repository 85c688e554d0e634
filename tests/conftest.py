"""Shared test helpers: fixture paths, and running `kbert` as a user runs it."""

import os
import shutil
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

TESTS = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(TESTS, "fixtures")
TINY = os.path.join(FIXTURES, "tf1-tiny")
UNCASED_VOCAB = os.path.join(FIXTURES, "vocab-uncased.txt")
REFERENCE = os.path.join(TESTS, "reference")


def kbert_command():
    exe = os.path.join(os.path.dirname(sys.executable), "kbert")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "kbert.cli.main"]


def run_kbert(*args, check=True, env=None):
    """Run the `kbert` console script; returns CompletedProcess with text stdout/stderr."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("KBERT_DEBUG", None)
    result = subprocess.run(kbert_command() + [str(a) for a in args], capture_output=True,
                            text=True, env=full_env, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"kbert {' '.join(map(str, args))} failed ({result.returncode}):\n"
                             f"{result.stderr}")
    return result


def assert_user_error(result, *fragments, alone=True):
    """Exit non-zero, one line on stderr that names the problem, and no traceback.

    alone=False allows progress lines before it (an error in the middle of training).
    """
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if alone:
        assert len(lines) == 1, result.stderr
    assert sum(line.startswith("kbert: error: ") for line in lines) == 1, result.stderr
    assert lines[-1].startswith("kbert: error: "), lines[-1]
    for fragment in fragments:
        assert fragment in lines[-1], (fragment, lines[-1])
    assert result.stdout == ""


@pytest.fixture
def tiny_copy(tmp_path):
    """A writable copy of the original tiny checkpoint directory."""
    dst = tmp_path / "tf1-tiny"
    shutil.copytree(TINY, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny checkpoint converted once by the CLI, shared by read-only tests."""
    out = tmp_path_factory.mktemp("converted") / "tiny"
    run_kbert("convert", "from-tf1", TINY, out)
    return out
