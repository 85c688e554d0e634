"""What a person watching training sees: a progress bar on stderr and a PNG loss curve."""

from __future__ import annotations

import json
import os
import sys

from matplotlib.figure import Figure
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from kbert.runtime.files import atomic_write_text


class Progress:
    """A rich progress bar (steps, rate, loss, ETA) on stderr; plain log lines when stderr is
    not a terminal (CI logs, files), so there is always a trace of the run. The rate counts what
    a step's batch holds: sequences in pretraining (`rate_unit` "seq/s"), a task's examples in
    fine-tuning (a reranker's example is a query's whole group, an embedder's a pair of texts).

    Example:
    >>> with Progress(total=10, enabled=False) as bar:
    ...     bar.update(10, {"loss": 1.0, "sequences_per_second": 5.0})
    """

    def __init__(
        self,
        total: int,
        start: int = 0,
        enabled: bool = True,
        sequences_per_step: int = 1,
        description: str = "pretrain",
        rate_unit: str = "seq/s",
    ):
        self.total, self.start, self.enabled = total, start, enabled
        self.interactive = enabled and sys.stderr.isatty()
        self.description, self.rate_unit = description, rate_unit
        self.sequences_per_step = sequences_per_step
        self._last_logged = start
        self._progress = None

    def __enter__(self):
        if self.interactive:
            self._progress = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} " + self.rate_unit),
                TextColumn("loss {task.fields[loss]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(
                self.description, total=self.total, completed=self.start, rate="-", loss="-"
            )
        return self

    def update(self, step: int, metrics: dict):
        rate = metrics.get("sequences_per_second", 0.0)
        loss = metrics.get("loss", float("nan"))
        if self._progress is not None:
            self._progress.update(self._task, completed=step, rate=f"{rate:,.1f}", loss=f"{loss:.4f}")
        elif self.enabled and (step - self._last_logged >= max(1, self.total // 20) or step == self.total):
            self._last_logged = step
            eta = (self.total - step) * self.sequences_per_step / max(rate, 1e-9)
            print(
                f"kbert: {self.description} step {step}/{self.total}  loss {loss:.4f}  "
                f"{rate:,.1f} {self.rate_unit}  ETA {eta:,.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def log(self, message: str):
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            print(f"kbert: {message}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False


def keep_history_until(history_path: str, step: int) -> int:
    r"""Drop the rows of a metrics.jsonl past `step`, and a last row cut short (a kill mid-write):
    a run resumed from its checkpoint at `step` logs the later steps again, so that each step is
    in the file once. Returns how many rows were dropped.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
    >>> _ = open(path, "w").write('{"step": 5}\n{"step": 5, "split": "eval"}\n{"step": 6}\n{"step": 7')
    >>> keep_history_until(path, 5), open(path).read()
    (2, '{"step": 5}\n{"step": 5, "split": "eval"}\n')
    """
    if not os.path.isfile(history_path):
        return 0
    with open(history_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    kept = []
    for line in lines[:-1]:  # what follows the last newline is a row cut short, or nothing
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            pass  # not a row kbert wrote whole
    dropped = len(lines) - 1 - len(kept) + (1 if lines[-1] else 0)
    if dropped:
        atomic_write_text(history_path, "".join(kept))
    return dropped


def write_loss_plot(history_path: str, png_path: str):
    """Plot loss, MLM and NSP loss (NSP where the run trains it; held-out values, if any) against
    step into a PNG."""
    if not os.path.isfile(history_path):
        return None
    train, held_out = [], []
    with open(history_path) as f:
        for line in f:
            row = json.loads(line)
            (held_out if row.get("split") == "eval" else train).append(row)
    # A resumed run appends again from its checkpoint: keep the latest value per step.
    train = sorted({row["step"]: row for row in train}.values(), key=lambda r: r["step"])
    held_out = sorted({row["step"]: row for row in held_out}.values(), key=lambda r: r["step"])
    # A Figure of its own, not pyplot's: no global backend to set, no figure to close.
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.subplots()
    first = train[0] if train else {}
    parts = [(key, style) for key, style in (("loss", "-"), ("mlm_loss", "--"), ("nsp_loss", ":")) if key in first]
    for key, style in parts:  # a ModernBERT's run trains the masked LM alone: no nsp_loss
        ax.plot([r["step"] for r in train], [r[key] for r in train], style, label=f"train {key}")
    if held_out:
        ax.plot([r["step"] for r in held_out], [r["loss"] for r in held_out], "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("kbert pretraining (MLM)" if first and "nsp_loss" not in first else "kbert pretraining (MLM + NSP)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = png_path + ".tmp.png"
    fig.savefig(tmp)
    os.replace(tmp, png_path)
    return png_path
