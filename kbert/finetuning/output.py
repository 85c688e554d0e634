"""`kbert predict --output FILE`: one JSON line per example, written so that a crash loses
nothing and a rerun repeats nothing.

Rows go to `FILE.partial` beside FILE, each line in one write as soon as it is predicted; at
the end the partial file is synced and renamed to FILE in one step, so FILE is either absent
(or the old one) or complete. A run that dies (kill -9, a server that never came back, a power
cut) leaves FILE.partial; `--resume` keeps its complete lines, drops a last line cut off in
the middle, and goes on from the next example, so every example comes out exactly once, in
order. One process writes a partial file at a time (it holds a lock on it, which the kernel
drops if the process dies).

An `--output` that is a symbolic link is written through: the file it points to is replaced,
the link stays. SIGTERM or Ctrl-C keeps the rows written so far, and says how many.

Beside the partial file, `FILE.partial.input` records which input the rows are of (its path,
size and a hash of its first and last MiB) and what made them: the model (`model_identity`: a
hash of its files) and every option that shapes a row (`--max-seq-length`, `--layers`,
`--pooling`, ...). `--resume` with another input, another model or another such option is
refused, naming both, where it would append other rows to these.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator

from kbert.runtime.errors import (
    Interrupted,
    KbertError,
    on_command_line,
    option,
    os_error_or,
    stop_behind,
)
from kbert.runtime.files import PARTIAL_SUFFIX, atomic_write_text, is_stream, writes

log = logging.getLogger("kbert")

INPUT_SUFFIX = ".input"  # FILE.partial.input: the identity of the input FILE.partial's rows are of
_HASHED = 1 << 20  # bytes hashed at each end of an input for its identity
_CHUNK = 1 << 20  # bytes read at a time when counting the lines of a partial file
# A model's files are hashed at their ends and at this many blocks between: training changes every
# weight, so any block tells two models apart, and a model of gigabytes is told in a few MiB.
_SAMPLES, _SAMPLE = 16, 1 << 16


def partial_path(path) -> str:
    """Where the rows of an unfinished `--output path` are.

    >>> partial_path("out/predictions.jsonl")
    'out/predictions.jsonl.partial'
    """
    return os.fspath(path) + PARTIAL_SUFFIX


def input_identity(path) -> dict:
    """What tells one input file from another, cheaply: its path, size and a SHA-256 of its
    first and last MiB (an input edited, replaced or appended to gets another).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "in.tsv")
    >>> _ = open(path, "w").write("text\\ngold.\\n")
    >>> sorted(input_identity(path)), input_identity(path)["size"]
    (['path', 'sha256', 'size'], 11)
    """
    path = os.path.abspath(os.fspath(path))
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest.update(f.read(_HASHED))
            if size > _HASHED:
                f.seek(max(_HASHED, size - _HASHED))
                digest.update(f.read(_HASHED))
    except OSError as e:
        raise KbertError(f"{path}: cannot read the input ({e.strerror or e}); check the path") from None
    return {"path": path, "size": size, "sha256": digest.hexdigest()}


def model_identity(path) -> dict:
    """What tells one model from another, cheaply: its path and a SHA-256 over its files (names,
    sizes, the first and last MiB of each and blocks between), the weights and bert_config.json's
    head record among them. A model moved elsewhere keeps its identity; one trained further or
    written by another run gets another. A TF1 checkpoint's prefix stands for its files.

    >>> import os, tempfile
    >>> model = tempfile.mkdtemp()
    >>> _ = open(os.path.join(model, "model.weights.h5"), "wb").write(bytes(1000))
    >>> first = model_identity(model)
    >>> _ = open(os.path.join(model, "model.weights.h5"), "wb").write(bytes(999) + b"1")
    >>> sorted(first), first["sha256"] == model_identity(model)["sha256"]
    (['path', 'sha256'], False)
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        files = sorted(
            os.path.join(folder, name)
            for folder, folders, names in os.walk(path)
            for name in names
            if not name.startswith(".")  # a lock, an editor's or a system's file: not the model
        )
    elif os.path.exists(path):
        files = [path]
    else:  # a checkpoint's prefix: model.ckpt.index, model.ckpt.data-00000-of-00001
        folder, prefix = os.path.split(path)
        files = sorted(os.path.join(folder, n) for n in os.listdir(folder or ".") if n.startswith(prefix + "."))
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{os.path.relpath(file, path if os.path.isdir(path) else os.path.dirname(path))}\0".encode())
        try:
            digest.update(_sampled_digest(file))
        except OSError as e:
            raise KbertError(f"{file}: cannot read the model ({e.strerror or e}); check the path") from None
    return {"path": path, "sha256": digest.hexdigest()}


def _sampled_digest(file: str) -> bytes:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        if size <= 2 * _HASHED + _SAMPLES * _SAMPLE:
            digest.update(f.read())
            return digest.digest()
        digest.update(f.read(_HASHED))
        for k in range(1, _SAMPLES + 1):
            f.seek(_HASHED + k * (size - 2 * _HASHED) // (_SAMPLES + 1))
            digest.update(f.read(_SAMPLE))
        f.seek(size - _HASHED)
        digest.update(f.read(_HASHED))
    return digest.digest()


@writes("path", inputs=("source",))
def write_rows(
    path,
    make_rows: Callable[[int], Iterable[dict]],
    *,
    resume: bool = False,
    overwrite: bool = False,
    source=None,
    made_by: dict | None = None,
) -> dict:
    """Write `make_rows(start)` to `path` as JSON lines, atomically and resumably.

    Args:
        path: str or PathLike. The output file.
        make_rows: callable. Given the number of rows the file already has (0 unless resuming),
            returns the rows from that example on, one JSON-ready dict per example.
        resume: bool. Go on from the complete lines of `path`.partial that an earlier run
            left; without one, start at the first row.
        overwrite: bool. Replace an existing `path` at the end, or drop an earlier run's
            partial rows (without `resume`) and start again.
        source: str or PathLike. The input file the rows are predicted from: recorded beside
            the partial file, and with `resume` it must be the input the earlier run recorded.
        made_by: dict. What shapes the rows besides the input, recorded beside the partial file
            in the same way: "model" (`model_identity`, or a served model's {"server", "model"})
            and each row-shaping option by its argument name ({"max_seq_length": 16, ...}). With
            `resume`, each must be what the earlier run recorded.

    Returns:
        dict: {"output": path, "rows": rows in the file, "rows_kept": rows an earlier run wrote}.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "out.jsonl")
    >>> write_rows(path, lambda start: ({"n": n} for n in range(start, 3)))["rows"]
    3
    >>> open(path).read()
    '{"n": 0}\\n{"n": 1}\\n{"n": 2}\\n'
    >>> _ = open(partial_path(path), "w").write('{"n": 0}\\n{"n": 1}\\n{"n"')  # a run cut off
    >>> write_rows(path, lambda start: ({"n": n} for n in range(start, 3)), resume=True, overwrite=True)["rows_kept"]
    2
    >>> open(path).read()
    '{"n": 0}\\n{"n": 1}\\n{"n": 2}\\n'
    """
    if (resume or overwrite) and is_stream(path):
        refused = option("resume" if resume else "overwrite", True)
        raise KbertError(
            f"{option('path', os.fspath(path), flag='--output')} is a stream, which has no rows to resume or "
            f"replace; drop {refused}, or give a file path"
        )
    # Through a symbolic link: the file it names is the output, and the link stays a link.
    path = os.path.realpath(os.fspath(path)) if os.path.islink(os.fspath(path)) else os.fspath(path)
    partial = partial_path(path)
    _check_output(path, partial, resume, overwrite)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock(fd, partial)  # before anything touches the file: another process may be writing it
        return _write_locked(fd, path, partial, make_rows, resume, source, made_by)
    finally:
        os.close(fd)


def skip_rows(rows: Iterable[dict], start: int) -> Iterator[dict]:
    """The rows from number `start` on; an error if there are fewer (the partial output being
    resumed is then not this input's).

    >>> list(skip_rows(iter("abcd"), 2))
    ['c', 'd']
    """
    seen = 0
    for seen, row in enumerate(rows, 1):
        if seen > start:
            yield row
    if seen < start:
        raise KbertError(
            f"the output to resume already has {start} rows, but the input has only {seen} "
            f"examples: it is not this input's output; pass {option('overwrite', True)} to start again"
        )


def _write_locked(fd: int, path: str, partial: str, make_rows, resume: bool, source, made_by) -> dict:
    try:
        _record_input(partial, source, resume, made_by)
    except BaseException:
        if not os.path.getsize(partial):  # rows are kept, never an empty file this call made
            os.remove(partial)
        raise
    kept = written = 0
    try:
        kept = _keep_complete_lines(fd) if resume else _truncate(fd, 0)
        if kept:
            log.info("%s: resuming after the %d rows an earlier run wrote", path, kept)
        elif resume:
            log.info("%s: no rows of an earlier run to resume from; starting at the first row", path)
        for row in make_rows(kept):
            _write_all(fd, (json.dumps(row) + "\n").encode("utf-8"))
            written += 1
        os.fsync(fd)
        os.replace(partial, path)
    except BaseException as error:
        stop = stop_behind(error)
        if stop is not None:
            raise _interrupted(stop, partial, kept, written) from None
        _after_failure(partial, kept, written)
        raise
    _remove(partial + INPUT_SUFFIX)
    return {"output": path, "rows": kept + written, "rows_kept": kept}


def _record_input(partial: str, source, resume: bool, made_by: dict | None = None):
    """Check (resuming) and record which input the partial file's rows are of, and what made them."""
    record = partial + INPUT_SUFFIX
    if source is None and made_by is None:
        if not resume:
            _remove(record)  # an earlier run's record would not describe these rows
        return
    identity = input_identity(source) if source is not None else {}
    if made_by is not None:
        identity["made_by"] = made_by
    if resume and os.path.getsize(partial):
        try:
            with open(record, encoding="utf-8") as f:
                recorded = json.load(f)
        except FileNotFoundError:
            recorded = None  # rows written before inputs were recorded: nothing to compare
        except (OSError, ValueError) as e:
            raise os_error_or(
                e,
                f"{record} is damaged, so the input of the rows in {partial} is unknown; pass "
                f"{option('overwrite', True)} to start again",
            ) from None
        if recorded and source is not None and "sha256" in recorded:
            _check_same_input(partial, recorded, identity, source)
        if recorded and made_by is not None and isinstance(recorded.get("made_by"), dict):
            _check_made_alike(partial, recorded["made_by"], made_by)
    atomic_write_text(record, json.dumps(identity) + "\n")


def _check_same_input(partial: str, recorded: dict, identity: dict, source):
    if (recorded.get("size"), recorded.get("sha256")) != (identity["size"], identity["sha256"]):
        same_path = recorded.get("path") == identity["path"]
        earlier = "an earlier version of it" if same_path else recorded.get("path")
        raise KbertError(
            f"{option('resume', True)}: {partial} holds the rows of {earlier} ({recorded.get('size')} bytes), "
            f"not of {option('source', os.fspath(source), flag='--input')} ({identity['size']} bytes"
            f"{', changed since' if same_path else ''}); resume with the input it started on, or "
            f"pass {option('overwrite', True)} to start again"
        )


def _check_made_alike(partial: str, recorded: dict, made_by: dict):
    """Refuse rows of another model, or made with another row-shaping option, naming both."""
    model, earlier_model = made_by.get("model"), recorded.get("model")
    if model is not None and earlier_model is not None and _model_key(model) != _model_key(earlier_model):
        same_path = "path" in model and earlier_model.get("path") == model.get("path")
        earlier = "an earlier version of it" if same_path else _model_said(earlier_model)
        raise KbertError(
            f"{option('resume', True)}: {partial} holds the rows of {earlier}, not of {_model_said(model)}"
            f"{' (changed since)' if same_path else ''}: another model's rows would follow them; resume with the "
            f"model it started with, or pass {option('overwrite', True)} to start again"
        )
    changed = [name for name in made_by if name != "model" and name in recorded and recorded[name] != made_by[name]]
    if changed:
        then = " and ".join(_option_said(name, recorded[name]) for name in changed)
        now = " and ".join(_option_said(name, made_by[name]) for name in changed)
        raise KbertError(
            f"{option('resume', True)}: {partial} holds rows made with {then}, and this run has {now}: rows of "
            f"another shape would follow them; resume with the options it started with, or pass {option('overwrite', True)} "
            f"to start again"
        )


def _model_key(model: dict):
    return model.get("sha256") or (model.get("server"), model.get("model"))


def _model_said(model: dict) -> str:
    if "server" in model:
        return f"the model {model.get('model')} served at {model.get('server')}"
    return str(model.get("path"))


def _option_said(name: str, value) -> str:
    """An option's recorded value as a message says it: `--max-seq-length 16`, `no --normalize`,
    `the default --pooling`."""
    if not on_command_line():
        return option(name, value)
    if value is None:
        return f"the default {option(name)}"
    if isinstance(value, bool):
        return option(name, True) if value else f"no {option(name)}"
    return option(name, value)


def _remove(path: str):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _check_output(path: str, partial: str, resume: bool, overwrite: bool):
    """Refuse what would lose or mix up rows, with the flag that allows it."""
    if os.path.isdir(path):
        raise KbertError(f"{option('path', path, flag='--output')} is a directory; give the path of the file to write")
    if os.path.exists(partial) and not resume and not overwrite:
        raise KbertError(
            f"{partial} holds the rows of an unfinished run; pass {option('resume', True)} to go on from them, "
            f"or {option('overwrite', True)} to start again"
        )
    if os.path.exists(path) and not overwrite:
        if resume and not os.path.exists(partial):
            raise KbertError(
                f"{path} is complete, with no unfinished run to resume; pass {option('overwrite', True)} to write "
                "it again"
            )
        fix = (
            f"pass {option('overwrite', True)} too, to replace it when the run ends"
            if resume
            else f"pass {option('overwrite', True)} to replace it, or choose another {option('path', flag='--output')}"
        )
        raise KbertError(f"{path} exists; {fix}")


def _lock(fd: int, partial: str):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        output = option("path", flag="--output")
        raise KbertError(
            f"{partial} is being written by another process (another kbert predict with this {output}?); "
            f"wait for it to end, or choose another {output}"
        ) from None


def _truncate(fd: int, size: int) -> int:
    os.ftruncate(fd, size)
    os.lseek(fd, size, os.SEEK_SET)
    return 0


def _keep_complete_lines(fd: int) -> int:
    """Cut the file after its last newline (a line cut off by a crash is written again) and
    leave the offset at the end; returns the number of lines kept."""
    os.lseek(fd, 0, os.SEEK_SET)
    lines, offset, end_of_last_line = 0, 0, 0
    while chunk := os.read(fd, _CHUNK):
        count = chunk.count(b"\n")
        if count:
            lines += count
            end_of_last_line = offset + chunk.rindex(b"\n") + 1
        offset += len(chunk)
    os.ftruncate(fd, end_of_last_line)
    os.lseek(fd, end_of_last_line, os.SEEK_SET)
    return lines


def _write_all(fd: int, data: bytes):
    # One line, one write(2): a process killed between two rows leaves whole lines only.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _interrupted(stop, partial: str, kept: int, written: int) -> Interrupted:
    """The one line a stopped run ends with: what it kept, and how to go on."""
    _after_failure(partial, kept, written, quiet=True)
    if isinstance(stop, Interrupted):
        how, code = str(stop).split(";")[0], stop.exit_code  # "kbert predict stopped by SIGTERM"
    else:
        how, code = "interrupted", 130
    if kept + written:
        return Interrupted(
            f"{how}; {partial} keeps the {kept + written} rows written so far ({written} by this run): "
            f"{_again()} to go on from there",
            code,
        )
    return Interrupted(f"{how} before the first row; nothing was written", code)


def _after_failure(partial: str, kept: int, written: int, quiet: bool = False):
    """Keep the partial file for --resume if it has rows, else leave nothing behind."""
    if written:
        if not quiet:
            log.info(
                "%s keeps the %d rows written so far; %s to go on from there",
                partial,
                kept + written,
                _again(),
            )
    elif not kept and os.path.exists(partial):
        os.remove(partial)
        _remove(partial + INPUT_SUFFIX)


def _again() -> str:
    """How a stopped run goes on from its rows: the same command, or the same call, resuming."""
    return f"{'run the same command' if on_command_line() else 'call it again'} with {option('resume', True)}"
