"""kbert.training.progress: the log lines (rate, loss, ETA) when stderr is not a terminal, the rich
bar when it is, and the PNG loss curve from metrics.jsonl."""

import io
import json
import re
import struct
import sys

import pytest

from kbert.training import progress
from kbert.training.progress import Progress, write_loss_plot


def test_a_log_line_says_step_loss_rate_and_eta(capsys):
    # 19,000 steps of 256 sequences left at 1,234.5 sequences a second: 4,864,000 / 1,234.5 = 3,940.06 s.
    with Progress(total=20000, sequences_per_step=256) as bar:
        bar.update(1000, {"loss": 2.345678, "sequences_per_second": 1234.5})
    assert capsys.readouterr().err == "kbert: pretrain step 1000/20000  loss 2.3457  1,234.5 seq/s  ETA 3,940 s\n"


def _logged_steps(text):
    return [int(step) for step in re.findall(r"step (\d+)/", text)]


def test_about_twenty_lines_a_run_and_always_the_last_step(capsys):
    with Progress(total=100, description="finetune classify", rate_unit="examples/s") as bar:
        for step in range(1, 101):
            bar.update(step, {"loss": 1.0, "sequences_per_second": 10.0})
    err = capsys.readouterr().err
    assert _logged_steps(err) == list(range(5, 101, 5))
    assert err.splitlines()[0].startswith("kbert: finetune classify step 5/100  loss 1.0000  10.0 examples/s")


def test_a_resumed_run_counts_from_where_it_resumed(capsys):
    with Progress(total=100, start=37) as bar:
        for step in range(38, 101):
            bar.update(step, {"loss": 1.0, "sequences_per_second": 10.0})
    assert _logged_steps(capsys.readouterr().err) == [*range(42, 98, 5), 100]


def test_a_short_run_logs_every_step(capsys):
    with Progress(total=7) as bar:
        for step in range(1, 8):
            bar.update(step, {"loss": 1.0, "sequences_per_second": 10.0})
    assert _logged_steps(capsys.readouterr().err) == [1, 2, 3, 4, 5, 6, 7]


def test_disabled_prints_nothing(capsys):
    with Progress(total=4, enabled=False) as bar:
        for step in range(1, 5):
            bar.update(step, {"loss": 1.0, "sequences_per_second": 10.0})
        bar.log("evaluating")
    assert capsys.readouterr() == ("", "")


def test_log_messages_are_kbert_lines(capsys):
    with Progress(total=4) as bar:
        bar.log("held-out loss 2.5")
    assert capsys.readouterr() == ("", "kbert: held-out loss 2.5\n")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_a_rich_bar_instead_of_lines(monkeypatch):
    for name in ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Progress(total=10, start=3, sequences_per_step=32) as bar:
        bar.update(6, {"loss": 2.345678, "sequences_per_second": 1234.5})
        bar.log("evaluating")
        bar.update(10, {"loss": 1.5, "sequences_per_second": 1234.5})
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", terminal.getvalue())
    assert " 3/10 - seq/s loss - " in shown  # resumed at step 3, before the first update
    assert "evaluating" in re.split(r"[\r\n]", shown)  # a line of its own, above the bar
    last = shown.rstrip("\n").rsplit("\r", 1)[-1]
    assert last.startswith("pretrain ") and " 10/10 1,234.5 seq/s loss 1.5000 " in last and "ETA 0:00:00" in last
    assert "kbert: pretrain step" not in shown


# === The loss curve ===


def _png_size(path):
    data = open(path, "rb").read(24)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def figures(monkeypatch):
    """The Figures write_loss_plot draws, to read the plotted lines back."""
    made = []

    class Recorded(progress.Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(progress, "Figure", Recorded)
    return made


def _lines(figure):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in figure.axes[0].lines}


def test_the_loss_curve_keeps_the_latest_value_per_step(tmp_path, figures):
    def row(step, loss, split="train"):
        return {"step": step, "loss": loss, "mlm_loss": loss - 1, "nsp_loss": loss / 10, "split": split}

    rows = [
        row(10, 9.0),
        row(20, 8.0),
        row(30, 7.0),
        row(20, 8.0, "eval"),
        # resumed from step 20: steps 30 and 40 again, 30 with the resumed run's value
        row(30, 6.5),
        row(40, 6.0),
        row(40, 6.2, "eval"),
    ]
    history = tmp_path / "metrics.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = str(tmp_path / "loss.png")
    assert write_loss_plot(str(history), png) == png
    assert _png_size(png) == (800, 450)  # 8 x 4.5 inches at 100 dpi
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png", "metrics.jsonl"]  # no temporary file left
    [figure] = figures
    assert _lines(figure) == {
        "train loss": ([10, 20, 30, 40], [9.0, 8.0, 6.5, 6.0]),
        "train mlm_loss": ([10, 20, 30, 40], [8.0, 7.0, 5.5, 5.0]),
        "train nsp_loss": ([10, 20, 30, 40], [0.9, 0.8, 0.65, 0.6]),
        "held-out loss": ([20, 40], [8.0, 6.2]),
    }


def test_no_held_out_line_without_eval_rows(tmp_path, figures):
    history = tmp_path / "metrics.jsonl"
    history.write_text(json.dumps({"step": 5, "loss": 3.0, "mlm_loss": 2.5, "nsp_loss": 0.5}) + "\n")
    write_loss_plot(str(history), str(tmp_path / "loss.png"))
    assert sorted(_lines(figures[0])) == ["train loss", "train mlm_loss", "train nsp_loss"]


def test_no_history_no_plot(tmp_path):
    assert write_loss_plot(str(tmp_path / "metrics.jsonl"), str(tmp_path / "loss.png")) is None
    assert list(tmp_path.iterdir()) == []
