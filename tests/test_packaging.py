"""The distribution maps cli/, converters/, serving/ into the kbert package and nothing else."""

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import TESTS

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

ROOT = os.path.dirname(TESTS)


def test_wheel_maps_folders_into_kbert(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), ROOT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    wheel = next(p for p in os.listdir(tmp_path) if p.endswith(".whl"))
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"kbert", "kbert-0.1.0.dist-info"}, top
    for module in (
        "kbert/cli/main.py",
        "kbert/converters/tf1.py",
        "kbert/converters/names.py",
        "kbert/serving/__init__.py",
        "kbert/model/bert.py",
        "kbert/text/tokenizer.py",
        "kbert/training/optimization.py",
        "kbert/pretraining/train.py",
        "kbert/finetuning/train.py",
    ):
        assert module in names
    entry_points = zipfile.ZipFile(tmp_path / wheel).read("kbert-0.1.0.dist-info/entry_points.txt").decode()
    assert "kbert = kbert.cli.main:main" in entry_points


def test_editable_install_resolves_mapped_packages():
    # The test venv is an editable install (make test): the mapped packages import from the tree.
    import kbert.cli.main
    import kbert.converters.tf1

    assert os.path.dirname(kbert.cli.main.__file__) == os.path.join(ROOT, "cli")
    assert os.path.dirname(kbert.converters.tf1.__file__) == os.path.join(ROOT, "converters")
