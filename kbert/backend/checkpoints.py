"""Training checkpoints that any Keras backend writes and reads: no TensorFlow needed.

A checkpoint is a directory `CKPT_DIR/ckpt-STEP/` holding `state.npz` (the model's weights, the
optimizer's variables by path, its iteration count among them, the model's seed-generator
states, and the backend's own generators that dropout draws from beside them: PyTorch's) and
`manifest.json` (the step, each array's name, shape and dtype, and the caller's `extra`). It is built under a temporary name beside its final one and
renamed into place once complete, so a kill mid-save leaves the previous checkpoint as it was;
only the newest `keep` are kept. `latest_training_state` finds the newest complete one and
`restore_training_state` puts it back into a model and optimizer of the same architecture.

Example:
>>> import tempfile, keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> optimizer = keras.optimizers.Adam()
>>> folder = tempfile.mkdtemp()
>>> os.path.basename(save_training_state(folder, 5, model, optimizer, extra={"epoch": 1}))
'ckpt-5'
>>> restore_training_state(latest_training_state(folder), model, optimizer)
{'epoch': 1}
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import zipfile

import keras
import numpy as np

from kbert.runtime.errors import KbertError, first_line, op_error_text, option, os_error_parts
from kbert.runtime.files import give_umask_mode, sweep_stale_temporaries, temporary_name

STATE_FILE = "state.npz"
MANIFEST_FILE = "manifest.json"
_NAME = re.compile(r"ckpt-(\d+)")
# The three groups of variables a checkpoint holds, in the order `_groups` lists them.
GROUPS = ("model", "optimizer", "seeds")


def save_training_state(ckpt_dir: str, step: int, model, optimizer, extra: dict | None = None, keep: int = 3) -> str:
    """Write `ckpt_dir/ckpt-{step}/` atomically; keep the newest `keep` checkpoints.

    Args:
        ckpt_dir: str. The folder of a run's checkpoints (made if missing).
        step: int. The training step reached: the checkpoint's number.
        model: keras.Model. Its weights and seed-generator states are saved, with the backend's
            own generators that its dropout draws from (`kbert.backend.generator_states`).
        optimizer: keras.optimizers.Optimizer. Its variables (slots, iteration count) are saved.
        extra: dict. Anything JSON can hold that the caller needs back on restore.
        keep: int. How many checkpoints to keep, the newest.

    Returns: the checkpoint's path.

    A write that fails (a full disk, a permission) raises the one-line `KbertError` of
    `kbert.training.interruption.checkpoint_write_failed`; the previous checkpoint is intact.
    """
    ckpt_dir = os.fspath(ckpt_dir)
    path = os.path.join(ckpt_dir, f"ckpt-{int(step)}")
    previous = latest_training_state(ckpt_dir)
    previous_step = _step_of(previous) if previous else None
    if not optimizer.built:  # its slots, zero, so that the checkpoint restores into a built one
        optimizer.build(model.trainable_variables)
    arrays, manifest = {}, {"step": int(step), "extra": extra or {}, "variables": {}}
    for group, variables in _groups(model, optimizer).items():
        rows = manifest["variables"][group] = []
        for i, (name, variable) in enumerate(variables):
            value = np.asarray(keras.ops.convert_to_numpy(variable))
            key = f"{group}/{i}"
            rows.append({"name": name, "key": key, "shape": list(value.shape), "dtype": value.dtype.name})
            # Types numpy does not know by name (bfloat16) travel as their bits: `_array` views them back.
            arrays[key] = value.view(f"u{value.dtype.itemsize}") if value.dtype.kind == "V" else value
    # Read last: the same moment as the variables, after the step that drew from them.
    manifest["generators"] = []
    for i, (name, value) in enumerate(sorted(backend_generator_states().items())):
        key = f"generators/{i}"
        manifest["generators"].append({"name": name, "key": key, "shape": list(value.shape), "dtype": value.dtype.name})
        arrays[key] = value
    manifest_text = json.dumps(manifest, indent=1)
    tmp = None
    try:
        os.makedirs(ckpt_dir, exist_ok=True)
        sweep_stale_temporaries(path)
        tmp = temporary_name(path)
        os.mkdir(tmp)
        give_umask_mode(tmp, directory=True)
        with open(os.path.join(tmp, STATE_FILE), "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        with open(os.path.join(tmp, MANIFEST_FILE), "w") as f:
            f.write(manifest_text)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):  # the same step saved again: the new one replaces it
            shutil.rmtree(path)
        os.rename(tmp, path)
        tmp = None
        _fsync_dir(ckpt_dir)
    except OSError as e:
        raise checkpoint_write_failed(int(step), previous_step, e) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in _checkpoints(ckpt_dir)[: -max(int(keep), 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def latest_training_state(ckpt_dir: str) -> str | None:
    """The newest complete checkpoint in `ckpt_dir` (the highest step), or None if it holds none.

    Only complete checkpoints carry the name `ckpt-STEP` (a save in progress has a hidden
    temporary name until it is renamed), so this never returns a half-written one.
    """
    found = _checkpoints(os.fspath(ckpt_dir))
    return found[-1] if found else None


def restore_training_state(path: str, model, optimizer) -> dict:
    """Assign the checkpoint at `path` to `model` and `optimizer`; return its `extra`.

    The optimizer's variables are built first if they are not yet. Every variable of the model,
    the optimizer and the seed generators must be in the checkpoint with its shape: a checkpoint
    of another architecture, or a truncated or damaged one, raises a one-line `KbertError`.
    The backend's own generators are put back too, as the checkpoint holds them.
    """
    path = os.fspath(path)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        with open(os.path.join(path, MANIFEST_FILE)) as f:
            manifest = json.load(f)
        with np.load(os.path.join(path, STATE_FILE), allow_pickle=False) as stored:
            values = {}
            for group, variables in _groups(model, optimizer).items():
                rows = manifest["variables"][group]
                by_name = {row["name"]: row for row in rows}
                names = [name for name, _ in variables]
                if len(rows) != len(variables):
                    raise KbertError(
                        f"{path}: this checkpoint holds {len(rows)} {_GROUP_WORDS[group]}, this model "
                        f"{len(variables)}; resume with the model and options the run was started with, or start over"
                    )
                # By path, where the paths are the checkpoint's (Keras names a model's variables apart);
                # by order otherwise: the same architecture built twice in one process has its
                # automatically named layers numbered anew (dense_1, dense_2), and the shapes are checked.
                by_path = len(set(names)) == len(names) == len(by_name) and set(names) == set(by_name)
                for i, (name, variable) in enumerate(variables):
                    row = by_name[name] if by_path else rows[i]
                    value = _array(stored[row["key"]], row)
                    if tuple(value.shape) != tuple(variable.shape):
                        raise KbertError(
                            f"{path}: {name} has shape {tuple(value.shape)} in this checkpoint, "
                            f"{tuple(variable.shape)} in the model; resume with the model and options the run was "
                            "started with, or start over"
                        )
                    values[id(variable)] = (variable, value)
            # A checkpoint written before these were kept has none: its run goes on from fresh ones.
            generators = {row["name"]: _array(stored[row["key"]], row) for row in manifest.get("generators", [])}
    except KbertError:
        raise
    except FileNotFoundError as e:
        raise KbertError(
            f"{path}: not a complete training checkpoint ({os.path.basename(e.filename or '')} is missing); "
            "resume from another checkpoint, or start over"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
        raise KbertError(
            f"{path}: the training checkpoint is damaged or truncated ({first_line(e, 120)}); "
            "resume from another checkpoint, or start over"
        ) from None
    # Assigned only once every value has been read and checked: a bad checkpoint changes nothing.
    for variable, value in values.values():
        variable.assign(value)
    backend_restore_generator_states(generators)
    return manifest.get("extra", {})


_GROUP_WORDS = {"model": "weights", "optimizer": "optimizer variables", "seeds": "seed-generator states"}


def _groups(model, optimizer) -> dict:
    """{group: [(name, variable)]}: what a checkpoint holds, each variable named by its path."""
    return {
        "model": [(w.path, w) for w in model.weights],
        "optimizer": [(v.path, v) for v in optimizer.variables],
        "seeds": [(v.path, v) for v in random_state_variables(model)],
    }


def _array(value: np.ndarray, row: dict) -> np.ndarray:
    if value.dtype.name == row["dtype"]:
        return value
    import ml_dtypes  # Keras' own dependency: it names bfloat16 and the float8 types for numpy

    return value.view(getattr(ml_dtypes, row["dtype"]))


def _checkpoints(ckpt_dir: str) -> list:
    """The checkpoints in `ckpt_dir`, oldest first."""
    try:
        entries = os.listdir(ckpt_dir)
    except OSError:
        return []
    found = sorted((int(m.group(1)), e) for e in entries if (m := _NAME.fullmatch(e)))
    return [os.path.join(ckpt_dir, e) for _, e in found if os.path.isdir(os.path.join(ckpt_dir, e))]


def _step_of(path: str) -> int:
    return int(_NAME.fullmatch(os.path.basename(path)).group(1))


def _fsync_dir(path: str):
    """Make a rename in `path` survive a power loss, where the file system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def backend_generator_states() -> dict:
    """The backend's own random states beside Keras' seed generators (`kbert.backend.generator_states`)."""
    from kbert import backend  # imported here: kbert.backend's TensorFlow module imports this one

    return backend.generator_states()


def backend_restore_generator_states(states: dict):
    from kbert import backend

    backend.restore_generator_states(states)


def random_state_variables(model) -> list:
    """The model's random-number states (Keras seed generators, which draw dropout masks).

    `model.weights` leaves them out; a checkpoint that keeps them resumes with the same
    dropout draws as an uninterrupted run.
    """
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def checkpoint_write_failed(step: int, previous_step: int | None, error: BaseException) -> KbertError:
    """The one line for a checkpoint that could not be written (disk full, permission denied):
    TensorFlow records a checkpoint as complete last, so the previous one is still the latest.

    `previous_step`: the step of the last checkpoint saved, None (or 0) if none was.

    >>> print(checkpoint_write_failed(8, 4, OSError(28, "No space left on device", "run/checkpoints/ckpt-8_temp/x")))
    writing the checkpoint for step 8 failed: run/checkpoints: no space left on device; the previous checkpoint (step 4) is intact: free some space there (or choose a path on another disk), then resume=True
    >>> print(checkpoint_write_failed(2, None, RuntimeError("disk on fire")))
    writing the checkpoint for step 2 failed (disk on fire); no checkpoint was saved: fix the cause, then run again
    """
    parts = os_error_parts(error)
    what = f": {parts[0]}: {parts[1]}" if parts else f" ({op_error_text(error)})"
    fix = parts[2].replace(", then run again", "") if parts else "fix the cause"
    if previous_step:
        return KbertError(
            f"writing the checkpoint for step {step} failed{what}; the previous checkpoint (step {previous_step}) "
            f"is intact: {fix}, then {option('resume', True)}"
        )
    return KbertError(
        f"writing the checkpoint for step {step} failed{what}; no checkpoint was saved: {fix}, then run again"
    )
