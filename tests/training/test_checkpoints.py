"""kbert.backend.checkpoints: a training checkpoint saved and restored bit for bit, its rotation,
and one line for a damaged checkpoint or a failed write. (On JAX and PyTorch, in a Python without
TensorFlow: tests/test_without_tensorflow.py.)"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import without_tensorflow_env


def test_a_checkpoint_round_trips_bit_for_bit_on_tensorflow(tmp_path):
    import keras

    import kbert
    from kbert.backend.checkpoints import (
        latest_training_state,
        random_state_variables,
        restore_training_state,
        save_training_state,
    )
    from kbert.training.optimization import BertAdamW

    def fresh():
        config = kbert.BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32)  # fmt: skip
        model = kbert.bert_classifier(config, num_classes=2)
        model.compile(optimizer=BertAdamW(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def values(model):
        groups = (model.weights, model.optimizer.variables, random_state_variables(model))
        return [np.asarray(v.numpy()) for group in groups for v in group]

    rng = np.random.default_rng(1)
    x = {
        "input_ids": rng.integers(1, 300, (4, 10)).astype("int32"),
        "input_mask": np.ones((4, 10), "int32"),
        "segment_ids": np.zeros((4, 10), "int32"),
    }
    model = fresh()
    model.fit(x, np.array([0, 1, 1, 0]), batch_size=2, verbose=0)
    save_training_state(tmp_path, 2, model, model.optimizer, extra={"best": [1.5, None]})
    restored = fresh()  # its optimizer not built yet: restoring builds it
    assert restore_training_state(latest_training_state(tmp_path), restored, restored.optimizer) == {
        "best": [1.5, None]
    }
    before, after = values(model), values(restored)
    assert len(before) == len(after) and all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(restored.optimizer.iterations.numpy()) == 2


@pytest.fixture(scope="module")
def small_model():
    """A Dense model and its Adam, one step in: the format is the same whatever the model."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    model.fit(np.ones((2, 3)), np.ones((2, 2)), verbose=0)
    return model


def test_no_checkpoint_yet(tmp_path):
    from kbert.backend.checkpoints import latest_training_state

    assert latest_training_state(tmp_path / "none") is None
    (tmp_path / ".ckpt-7.tmp-1-abcdef01").mkdir()  # a save that never finished
    assert latest_training_state(tmp_path) is None


def test_a_damaged_or_truncated_checkpoint_is_one_line(small_model, tmp_path):
    from kbert.backend.checkpoints import restore_training_state, save_training_state
    from kbert.runtime.errors import KbertError

    path = save_training_state(tmp_path, 1, small_model, small_model.optimizer)
    state = os.path.join(path, "state.npz")
    whole = open(state, "rb").read()
    cases = {
        "truncated": lambda: open(state, "wb").write(whole[: len(whole) // 2]),
        "garbled": lambda: open(state, "wb").write(whole[:100] + bytes(len(whole) - 200) + whole[-100:]),
        "manifest": lambda: open(os.path.join(path, "manifest.json"), "w").write("{not json"),
        "missing": lambda: os.remove(state),
    }
    for name, damage in cases.items():
        damage()
        with pytest.raises(KbertError) as caught:
            restore_training_state(path, small_model, small_model.optimizer)
        message = str(caught.value)
        assert "\n" not in message and path in message, (name, message)
        assert "resume from another checkpoint, or start over" in message, (name, message)
        shutil.rmtree(path)
        save_training_state(tmp_path, 1, small_model, small_model.optimizer)


def test_a_checkpoint_of_another_model_is_one_line(small_model, tmp_path):
    import keras

    from kbert.backend.checkpoints import restore_training_state, save_training_state
    from kbert.runtime.errors import KbertError

    path = save_training_state(tmp_path, 1, small_model, small_model.optimizer)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5)])
    other.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    with pytest.raises(KbertError, match=r"has shape \(3, 2\) in this checkpoint, \(3, 5\) in the model"):
        restore_training_state(path, other, other.optimizer)


def test_a_failed_write_keeps_the_previous_checkpoint(small_model, tmp_path):
    from kbert.backend.checkpoints import latest_training_state, save_training_state
    from kbert.runtime.errors import KbertError

    folder = tmp_path / "ckpt"
    save_training_state(folder, 4, small_model, small_model.optimizer)
    os.chmod(folder, 0o555)
    try:
        script = (
            "import sys, keras, numpy as np\n"
            "from kbert.backend.checkpoints import save_training_state\n"
            "m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]); m.compile(optimizer='adam', loss='mse')\n"
            "m.fit(np.ones((2, 3)), np.ones((2, 2)), verbose=0)\n"
            "save_training_state(sys.argv[1], 8, m, m.optimizer)\n"
        )
        done = subprocess.run(
            [
                "setpriv",
                "--inh-caps=-dac_override",
                "--bounding-set=-dac_override",
                sys.executable,
                "-c",
                script,
                folder,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=without_tensorflow_env(tmp_path, "jax"),  # JAX starts sooner than TensorFlow
        )
    finally:
        os.chmod(folder, 0o755)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "KbertError" in last, done.stderr[-2000:]
    assert "writing the checkpoint for step 8 failed" in last and "permission denied" in last
    assert "the previous checkpoint (step 4) is intact" in last
    assert latest_training_state(folder) == str(folder / "ckpt-4")
    with pytest.raises(KbertError, match="writing the checkpoint for step 9 failed"):
        open(folder / "ckpt-9", "w").close()  # a file where the checkpoint's folder goes
        save_training_state(folder, 9, small_model, small_model.optimizer)
