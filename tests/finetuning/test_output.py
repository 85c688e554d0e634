"""`kbert predict --output FILE`: atomic, resumable JSON lines (kbert/finetuning/output.py).

The files are real and so is the lock; a crash is played by an exception from the rows (a
killed process is tests/finetuning/test_predict.py's kill -9 test)."""

import fcntl
import json
import os

import pytest

from conftest import assert_user_error, run_kbert
from kbert.finetuning.output import model_identity, partial_path, skip_rows, write_rows
from kbert.runtime.errors import Interrupted, KbertError, command_line_names

# The flags of `kbert predict` that its messages about --output name.
FLAGS = {"--input", "--output", "--resume", "--overwrite"}


def numbered(n, starts=None, fail_after=None):
    """make_rows for write_rows: rows {"n": i} from the start it is given to n; records each
    start in `starts`; raises after yielding `fail_after` rows (a run that dies)."""

    def make_rows(start):
        if starts is not None:
            starts.append(start)
        for count, i in enumerate(range(start, n)):
            if count == fail_after:
                raise RuntimeError("the run died")
            yield {"n": i}

    return make_rows


def lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def test_writes_every_row_then_renames(tmp_path):
    out = tmp_path / "sub" / "out.jsonl"
    result = write_rows(out, numbered(5))
    assert result == {"output": str(out), "rows": 5, "rows_kept": 0}
    assert lines(out) == [{"n": i} for i in range(5)]
    assert not os.path.exists(partial_path(out))


def test_resume_with_nothing_to_resume_says_it_starts_at_the_first_row(tmp_path, caplog):
    out = tmp_path / "out.jsonl"
    with caplog.at_level("INFO", logger="kbert"):
        result = write_rows(out, numbered(3), resume=True)
    assert result["rows_kept"] == 0 and lines(out) == [{"n": i} for i in range(3)]
    assert f"{out}: no rows of an earlier run to resume from; starting at the first row" in caplog.messages


def test_a_run_that_dies_keeps_its_rows_and_resume_goes_on_exactly_once(tmp_path):
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        write_rows(out, numbered(10, fail_after=4))
    assert not out.exists()
    assert lines(partial_path(out)) == [{"n": i} for i in range(4)]
    # A crash in the middle of a line: the cut line is written again, never kept or skipped.
    with open(partial_path(out), "a") as f:
        f.write('{"n": 4, "half')
    starts = []
    result = write_rows(out, numbered(10, starts), resume=True)
    assert starts == [4] and result == {"output": str(out), "rows": 10, "rows_kept": 4}
    assert lines(out) == [{"n": i} for i in range(10)]
    assert not os.path.exists(partial_path(out))


def test_kept_rows_are_not_predicted_again(tmp_path):
    """--resume keeps the earlier run's lines as they are: marker lines stay, and the rows
    start after them."""
    out = tmp_path / "out.jsonl"
    open(partial_path(out), "w").write('{"kept": 0}\n{"kept": 1}\n')
    write_rows(out, numbered(4), resume=True)
    assert lines(out) == [{"kept": 0}, {"kept": 1}, {"n": 2}, {"n": 3}]


def test_a_run_that_dies_before_any_row_leaves_nothing(tmp_path):
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        write_rows(out, numbered(10, fail_after=0))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "partial, complete, flags, fragment, on_the_command_line",
    [
        (
            True,
            False,
            {},
            "pass resume=True to go on from them, or overwrite=True to start again",
            "pass --resume to go on from them, or --overwrite to start again",
        ),
        (
            False,
            True,
            {},
            "out.jsonl exists; pass overwrite=True to replace it, or choose another path",
            "out.jsonl exists; pass --overwrite to replace it, or choose another --output",
        ),
        (
            False,
            True,
            {"resume": True},
            "is complete, with no unfinished run to resume; pass overwrite=True",
            "is complete, with no unfinished run to resume; pass --overwrite",
        ),
        (
            True,
            True,
            {"resume": True},
            "pass overwrite=True too, to replace it when the run ends",
            "pass --overwrite too, to replace it when the run ends",
        ),
    ],
)
def test_refusals_name_the_flag(tmp_path, partial, complete, flags, fragment, on_the_command_line):
    out = tmp_path / "out.jsonl"
    if partial:
        open(partial_path(out), "w").write('{"old": 0}\n')
    if complete:
        out.write_text('{"done": 0}\n')
    # A Python caller is told the argument to pass; `kbert predict --output` the flag.
    with pytest.raises(KbertError) as raised:
        write_rows(out, numbered(3), **flags)
    assert fragment in str(raised.value)
    with command_line_names(FLAGS), pytest.raises(KbertError) as raised:
        write_rows(out, numbered(3), **flags)
    assert on_the_command_line in str(raised.value)
    # Nothing was touched.
    assert sorted(os.listdir(tmp_path)) == sorted(["out.jsonl.partial"] * partial + ["out.jsonl"] * complete)
    if partial:
        assert open(partial_path(out)).read() == '{"old": 0}\n'
    if complete:
        assert out.read_text() == '{"done": 0}\n'


def test_flags_that_allow_what_was_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    open(partial_path(out), "w").write('{"old": 0}\n')
    out.write_text('{"done": 0}\n')
    assert write_rows(out, numbered(2), overwrite=True)["rows_kept"] == 0  # drops the old partial rows
    assert lines(out) == [{"n": 0}, {"n": 1}]
    open(partial_path(out), "w").write('{"n": 0}\n')
    assert write_rows(out, numbered(3), resume=True, overwrite=True)["rows_kept"] == 1
    assert lines(out) == [{"n": 0}, {"n": 1}, {"n": 2}]
    # --resume with nothing to resume starts at the first row (a retrying script may always pass it).
    assert write_rows(tmp_path / "new.jsonl", numbered(2), resume=True)["rows"] == 2


def test_a_partial_file_being_written_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    open(partial_path(out), "w").write('{"n": 0}\n')
    holder = os.open(partial_path(out), os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # as a running kbert predict holds it
        with pytest.raises(KbertError, match="is being written by another process"):
            write_rows(out, numbered(3), resume=True)
    finally:
        os.close(holder)
    assert open(partial_path(out)).read() == '{"n": 0}\n'
    assert write_rows(out, numbered(3), resume=True)["rows_kept"] == 1


def test_a_stopped_run_says_how_to_go_on_as_its_caller_would(tmp_path):
    def stopped_after_two(start):
        yield from ({"n": i} for i in range(start, 2))
        raise Interrupted("kbert predict stopped by SIGTERM; at the batch in flight", 143)

    out = tmp_path / "out.jsonl"
    partial = partial_path(out)
    with pytest.raises(Interrupted) as raised:
        write_rows(out, stopped_after_two)
    assert raised.value.exit_code == 143 and str(raised.value) == (
        f"kbert predict stopped by SIGTERM; {partial} keeps the 2 rows written so far (2 by this run): call it "
        f"again with resume=True to go on from there"
    )
    with command_line_names(FLAGS), pytest.raises(Interrupted) as raised:
        write_rows(out, stopped_after_two, resume=True)
    assert str(raised.value) == (
        f"kbert predict stopped by SIGTERM; {partial} keeps the 2 rows written so far (0 by this run): run the "
        f"same command with --resume to go on from there"
    )
    assert lines(partial) == [{"n": 0}, {"n": 1}]


def test_an_error_raised_while_a_stop_unwinds_is_reported_as_the_stop(tmp_path):
    # SIGTERM's exception can land inside Thread.start (the packer's thread pool), whose clean-up
    # then raises KeyError with the stop as its context: the run was still stopped by the signal.
    def stopped_inside_a_library(start):
        yield from ({"n": i} for i in range(start, 2))
        try:
            raise Interrupted("kbert predict stopped by SIGTERM; at the batch in flight", 143)
        except Interrupted:
            raise KeyError("<Thread(ThreadPoolExecutor-1_0)>") from None

    out = tmp_path / "out.jsonl"
    with pytest.raises(Interrupted) as raised:
        write_rows(out, stopped_inside_a_library)
    assert raised.value.exit_code == 143 and "keeps the 2 rows written so far" in str(raised.value)
    assert lines(partial_path(out)) == [{"n": 0}, {"n": 1}]


def test_resuming_more_rows_than_the_input_has_is_refused(tmp_path):
    out = tmp_path / "out.jsonl"
    open(partial_path(out), "w").write("{}\n" * 5)
    with pytest.raises(KbertError, match="already has 5 rows, but the input has only 3 examples"):
        write_rows(out, lambda start: skip_rows(({"n": i} for i in range(3)), start), resume=True)
    assert open(partial_path(out)).read() == "{}\n" * 5


def test_local_predict_output_and_resume(tmp_path, tiny_model_dir):
    """`kbert predict MODEL_DIR --output`: the same lines as stdout; --resume after a cut-off run."""
    texts = tmp_path / "in.txt"
    texts.write_text("gold.\ndead dust.\nthe city.\na camp.\nfire ||| rain.\n")
    printed = run_kbert("predict", tiny_model_dir, "--input", texts, "--max-seq-length", "16").stdout.splitlines()
    out = tmp_path / "out.jsonl"
    result = run_kbert("predict", tiny_model_dir, "--input", texts, "--max-seq-length", "16", "--output", out)
    assert json.loads(result.stdout) == {"output": str(out), "rows": 5, "rows_kept": 0}
    assert out.read_text().splitlines() == printed
    again = run_kbert("predict", tiny_model_dir, "--input", texts, "--output", out, check=False)
    assert_user_error(again, f"{out} exists; pass --overwrite to replace it")
    out.unlink()
    open(partial_path(out), "w").write(printed[0] + "\n" + printed[1][:20])
    result = run_kbert(
        "predict", tiny_model_dir, "--input", texts, "--max-seq-length", "16", "--output", out, "--resume"
    )
    assert json.loads(result.stdout)["rows_kept"] == 1
    assert out.read_text().splitlines() == printed
    alone = run_kbert("predict", tiny_model_dir, "--input", texts, "--resume", check=False)
    assert_user_error(alone, "--resume applies to an --output file; give --output FILE")


# === --resume goes on only with the input the rows are of ===


def test_resume_with_another_input_is_refused_naming_both(tmp_path):
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    first.write_text("text\ngold.\ndead.\nfire.\n")
    second.write_text("text\nrain.\ncamp.\ncity.\nstream.\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        write_rows(out, numbered(3, fail_after=2), source=first)
    record = json.load(open(partial_path(out) + ".input"))
    assert record["path"] == str(first) and record["size"] == first.stat().st_size
    with pytest.raises(KbertError) as raised:
        write_rows(out, numbered(4), resume=True, source=second)
    message = str(raised.value)
    assert message == (
        f"resume=True: {partial_path(out)} holds the rows of {first} (23 bytes), not of source={str(second)!r} "
        f"(31 bytes); resume with the input it started on, or pass overwrite=True to start again"
    )
    with command_line_names(FLAGS), pytest.raises(KbertError) as raised:  # as `kbert predict` says it
        write_rows(out, numbered(4), resume=True, source=second)
    assert str(raised.value) == (
        f"--resume: {partial_path(out)} holds the rows of {first} (23 bytes), not of --input "
        f"{second} (31 bytes); resume with the input it started on, or pass --overwrite to start again"
    )
    assert lines(partial_path(out)) == [{"n": 0}, {"n": 1}]  # kept, not extended
    # The same bytes under another name are the same input; the record follows the file.
    moved = tmp_path / "moved.tsv"
    os.rename(first, moved)
    assert write_rows(out, numbered(3), resume=True, source=moved) == {"output": str(out), "rows": 3, "rows_kept": 2}
    assert not os.path.exists(partial_path(out) + ".input")  # gone with the partial file


def test_resume_after_the_input_changed_is_refused(tmp_path):
    data = tmp_path / "in.tsv"
    data.write_text("text\ngold.\ndead.\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        write_rows(out, numbered(2, fail_after=1), source=data)
    data.write_text("text\ngold.\ndead.\nfire.\n")  # appended to
    with pytest.raises(
        KbertError,
        match=r"holds the rows of an earlier version of it \(17 bytes\), not of source="
        r".*in\.tsv' \(23 bytes, changed since\)",
    ):
        write_rows(out, numbered(3), resume=True, source=data)
    # --overwrite starts again, recording the new input.
    assert write_rows(out, numbered(3), overwrite=True, source=data)["rows"] == 3


def test_partials_without_a_record_still_resume(tmp_path):
    """Rows an earlier kbert wrote before inputs were recorded: nothing to compare, so go on."""
    data = tmp_path / "in.tsv"
    data.write_text("text\ngold.\ndead.\n")
    out = tmp_path / "out.jsonl"
    open(partial_path(out), "w").write('{"n": 0}\n')
    assert write_rows(out, numbered(2), resume=True, source=data)["rows_kept"] == 1
    with pytest.raises(KbertError, match="cannot read the input"):
        write_rows(tmp_path / "other.jsonl", numbered(2), source=tmp_path / "missing.tsv")
    assert not os.path.exists(partial_path(tmp_path / "other.jsonl"))


# === --resume goes on only with the model and the options the rows were made with ===


def _model(folder, weights: bytes, head: str = "classify"):
    folder.mkdir()
    (folder / "model.weights.h5").write_bytes(weights)
    (folder / "bert_config.json").write_text(json.dumps({"task": head}))
    return folder


def test_resume_with_another_model_is_refused_naming_both(tmp_path):
    data = tmp_path / "in.tsv"
    data.write_text("text\ngold.\ndead.\nfire.\n")
    first = _model(tmp_path / "first", bytes(3 << 20))
    # The same bytes but one in the middle of a large weights file; the same weights, another head.
    retrained = _model(tmp_path / "retrained", bytes(3 << 19) + b"\1" + bytes((3 << 19) - 1))
    other_head = _model(tmp_path / "other-head", bytes(3 << 20), head="regress")
    out = tmp_path / "out.jsonl"
    made_by = {"model": model_identity(first), "max_seq_length": None}
    with pytest.raises(RuntimeError):
        write_rows(out, numbered(3, fail_after=2), source=data, made_by=made_by)
    kept = open(partial_path(out), "rb").read()
    for other in (retrained, other_head):
        with command_line_names(FLAGS), pytest.raises(KbertError) as raised:
            write_rows(out, numbered(3), resume=True, source=data, made_by=dict(made_by, model=model_identity(other)))
        assert str(raised.value) == (
            f"--resume: {partial_path(out)} holds the rows of {first}, not of {other}: another model's rows would "
            f"follow them; resume with the model it started with, or pass --overwrite to start again"
        )
    (first / "bert_config.json").write_text(json.dumps({"task": "tag"}))  # the same folder, changed since
    with pytest.raises(
        KbertError, match=r"holds the rows of an earlier version of it, not of .*first \(changed since\)"
    ):
        write_rows(out, numbered(3), resume=True, source=data, made_by=dict(made_by, model=model_identity(first)))
    assert open(partial_path(out), "rb").read() == kept  # untouched
    # The model moved elsewhere is the same model.
    (first / "bert_config.json").write_text(json.dumps({"task": "classify"}))
    moved = tmp_path / "moved"
    os.rename(first, moved)
    same = dict(made_by, model=model_identity(moved))
    assert write_rows(out, numbered(3), resume=True, source=data, made_by=same)["rows_kept"] == 2


@pytest.mark.parametrize(
    "then, now, said",
    [
        (
            {"max_seq_length": None},
            {"max_seq_length": 16},
            "made with the default --max-seq-length, and this run has --max-seq-length 16",
        ),
        (
            {"pooling": "mean", "normalize": None},
            {"pooling": "cls", "normalize": False},
            "made with --pooling mean and the default --normalize, and this run has --pooling cls and no --normalize",
        ),
        (
            {"skip_bad_rows": True},
            {"skip_bad_rows": False},
            "made with --skip-bad-rows, and this run has no --skip-bad-rows",
        ),
    ],
)
def test_resume_with_other_row_shaping_options_is_refused(tmp_path, then, now, said):
    data = tmp_path / "in.tsv"
    data.write_text("text\ngold.\ndead.\nfire.\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        write_rows(out, numbered(3, fail_after=2), source=data, made_by=then)
    with (
        command_line_names(FLAGS | {f"--{name.replace('_', '-')}" for name in now}),
        pytest.raises(KbertError) as raised,
    ):
        write_rows(out, numbered(3), resume=True, source=data, made_by=now)
    assert str(raised.value) == (
        f"--resume: {partial_path(out)} holds rows {said}: rows of another shape would follow them; resume with "
        f"the options it started with, or pass --overwrite to start again"
    )
    assert lines(partial_path(out)) == [{"n": 0}, {"n": 1}]
    with pytest.raises(
        KbertError, match=r"holds rows made with .*=.*, and this run has .*=.*; resume with the options"
    ):
        write_rows(out, numbered(3), resume=True, source=data, made_by=now)  # as Python callers are told
    assert write_rows(out, numbered(3), resume=True, source=data, made_by=then)["rows_kept"] == 2


# === a stream has no rows to resume or replace ===


def test_a_stream_output_refuses_resume_and_overwrite_from_python_and_the_command_line(
    tmp_path, tiny_model_dir, monkeypatch
):
    """write_rows refuses before claiming or writing anything: no lock, no partial file."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "pipe")  # what /dev/stdout is when a shell pipes it
    called = []
    for stream, flag in (("-", "resume"), (str(tmp_path / "pipe"), "overwrite")):
        with pytest.raises(KbertError) as error:
            write_rows(stream, called.append, **{flag: True})
        assert str(error.value) == (
            f"path={stream!r} is a stream, which has no rows to resume or replace; drop {flag}=True, or give a file path"
        )
        with command_line_names({"--output", f"--{flag}"}), pytest.raises(KbertError) as error:
            write_rows(stream, called.append, **{flag: True})
        assert str(error.value).startswith(f"--output {stream} is a stream") and f"drop --{flag}," in str(error.value)
    assert called == [] and os.listdir(tmp_path) == ["pipe"]
    texts = tmp_path / "texts.txt"
    texts.write_text("gold city\n")
    refused = run_kbert("predict", tiny_model_dir, "--input", texts, "--output", "-", "--overwrite", check=False)
    assert_user_error(
        refused, "--output - is a stream, which has no rows to resume or replace; drop --overwrite, or give a file path"
    )
    assert sorted(os.listdir(tmp_path)) == ["pipe", "texts.txt"]
