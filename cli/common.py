"""What every command shares: stdout for results (JSON), stderr for logs, quiet TensorFlow."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings


def quiet_tensorflow():
    """Keep TensorFlow's C++ start-up chatter (oneDNN, CUDA probes) off the user's terminal."""
    if os.environ.get("KBERT_DEBUG") != "1":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def import_tensorflow_quietly():
    """Import TensorFlow with fd 2 pointed at /dev/null: its C++ start-up lines (oneDNN, CUDA
    probes) ignore TF_CPP_MIN_LOG_LEVEL in 2.21 and would bury the one line a user needs."""
    if os.environ.get("KBERT_DEBUG") == "1" or "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        # Imported here, inside the redirect, and only for commands that need TensorFlow: each
        # of these imports it.
        import keras  # noqa: F401
        import tensorflow
        import tensorflow_text  # noqa: F401

        from kbert.training.strategy import split_cpu_if_asked

        split_cpu_if_asked()  # must precede device set-up
        if not os.environ.get("TF_CONFIG"):  # multi-worker collectives must be set up first
            tensorflow.config.list_logical_devices()  # device set-up prints its CUDA probe here
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def setup_logging(debug: bool = False):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kbert: %(message)s"))
    log = logging.getLogger("kbert")
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if debug else logging.INFO)
    log.propagate = False
    if not debug:
        warnings.filterwarnings("ignore")
        logging.getLogger("absl").setLevel(logging.ERROR)
        logging.getLogger("tensorflow").setLevel(logging.ERROR)


def print_result(result: dict):
    """The command's result: one JSON object on stdout."""
    sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
    sys.stdout.flush()


def bytes_progress(label: str, *more_columns):
    """A rich progress bar over bytes read (bar, bytes, rate, time left) on stderr, shown only on
    a terminal: in a log file a progress bar is noise, and the JSON result says it all."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        *more_columns,
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
