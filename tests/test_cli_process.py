"""`run_kbert` runs most commands inside the test process (see conftest.run_kbert); here the
same commands also run as a user's shell runs them, the `kbert` executable in a new process,
and must print the same, exit the same way and write the same files."""

import json

import pytest

from conftest import TINY, run_kbert

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them


def test_a_result_is_the_same_in_a_new_process(tmp_path):
    inside = run_kbert("convert", "inspect", TINY, own_process=False)
    outside = run_kbert("convert", "inspect", TINY, own_process=True)
    assert json.loads(inside.stdout) == json.loads(outside.stdout) and inside.stdout
    assert inside.returncode == outside.returncode == 0


def test_a_user_error_is_the_same_in_a_new_process(tmp_path):
    args = ("convert", "from-tf1", tmp_path / "nope", tmp_path / "out")
    inside, outside = (run_kbert(*args, check=False, own_process=own) for own in (False, True))
    assert (inside.returncode, inside.stdout, inside.stderr) == (outside.returncode, outside.stdout, outside.stderr)
    assert inside.returncode == 1 and inside.stderr.startswith("kbert: error: ") and inside.stdout == ""
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback_both_ways(tmp_path):
    args = ("convert", "from-tf1", tmp_path / "nope", tmp_path / "out", "--debug")
    for own in (False, True):
        result = run_kbert(*args, check=False, own_process=own)
        assert result.returncode == 1 and "Traceback" in result.stderr and "KbertError" in result.stderr, own
