"""BertAdamW + the warmup/decay schedule + global-norm clipping against the original's
optimization.create_optimizer, on the same variables and loss; and the private Keras APIs kbert
relies on (optimizer hooks, the name-scope path) still there as kbert expects them."""

import contextlib
import inspect
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import REFERENCE
from kbert.training import optimization
from kbert.training.optimization import BertAdamW, GradientsAlreadySummed, WarmupLinearDecay, make_optimizer

sys.path.insert(0, REFERENCE)
from original_optimizer import INITIAL, LR, RUN, STEPS, TARGET, WARMUP


def test_matches_original_optimizer():
    result = subprocess.run(
        [sys.executable, os.path.join(REFERENCE, "original_optimizer.py")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    original = json.loads(result.stdout.strip().splitlines()[-1])

    # kbert weight paths carry the same markers the original's decay exclusion looks for.
    paths = {"layer/dense/kernel": "kernel", "layer/LayerNorm/gamma": "gamma", "layer/dense/bias": "bias"}
    variables = {}
    for name, value in INITIAL.items():
        with contextlib.ExitStack() as scopes:
            for part in name.split("/")[:-1]:
                scopes.enter_context(keras.name_scope(part))
            variables[name] = keras.Variable(np.array(value, "float32"), name=paths[name])
        assert variables[name].path == name
    optimizer = make_optimizer("adamw", LR, STEPS, WARMUP)
    ordered = list(INITIAL)
    for step in range(RUN):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.square(variables[n] - tf.constant(TARGET[n]))) for n in ordered])
        grads = tape.gradient(loss, [variables[n] for n in ordered])
        optimizer.apply_gradients(zip(grads, [variables[n] for n in ordered]))
        for name in ordered:
            np.testing.assert_allclose(
                variables[name].numpy(), original[step][name], atol=1e-6, err_msg=f"{name} after step {step + 1}"
            )
    # The gradient here is large (norm > 1), so clipping was exercised, and the gamma/bias
    # were not decayed while the kernel was.


def test_schedule_warmup_then_linear_decay_to_zero():
    schedule = WarmupLinearDecay(1.0, total_steps=10, warmup_steps=4)
    values = [float(schedule(s)) for s in range(12)]
    np.testing.assert_allclose(values[:4], [0.0, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(values[4:], [0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0], atol=1e-7)


def test_lamb_is_offered():
    optimizer = make_optimizer("lamb", 1e-3, 100, 10)
    assert isinstance(optimizer, keras.optimizers.Lamb)


# The private Keras APIs kbert relies on (why: kbert.training.optimization's docstring), each
# with the signature kbert was written against and the Keras method expected to call it.
# keras is pinned in pyproject.toml to the minor version these were checked on.
HOOKS = [
    ("_backend_apply_gradients", "(self, grads, trainable_variables)", "apply"),
    ("_clip_gradients", "(self, grads)", "_backend_apply_gradients"),
    ("_backend_update_step", "(self, grads, trainable_variables, learning_rate)", "_backend_apply_gradients"),
    ("_all_reduce_sum_gradients", "(self, grads_and_vars)", "_backend_update_step"),
    ("_get_variable_index", "(self, variable)", None),
]
KBERT_OVERRIDES = {
    "_clip_gradients": BertAdamW,
    "_backend_update_step": BertAdamW,
    "_all_reduce_sum_gradients": GradientsAlreadySummed,
}


def changed(what: str) -> str:
    return (
        f"keras {keras.__version__} changed {what}: kbert.training.optimization relies on it "
        f"(GradientsAlreadySummed, BertAdamW); re-check them against this Keras, and "
        f"tests/training/test_optimization.py's HOOKS, before widening the keras pin in pyproject.toml"
    )


@pytest.mark.parametrize("name, signature, caller", HOOKS, ids=[h[0] for h in HOOKS])
def test_keras_optimizer_hooks_are_unchanged(name, signature, caller):
    base = keras.optimizers.Optimizer  # the TensorFlow backend's optimizer, as kbert runs it
    owners = [cls.__qualname__ for cls in base.__mro__ if name in vars(cls)]
    assert owners, changed(f"Optimizer.{name}: gone")
    method = getattr(base, name)
    assert str(inspect.signature(method)) == signature, changed(
        f"{owners[0]}.{name}: signature {inspect.signature(method)}, was {signature}"
    )
    if caller:
        source = inspect.getsource(getattr(base, caller))
        assert f"self.{name}(" in source, changed(f"{owners[0]}.{name}: no longer called from {caller}")
    if name in KBERT_OVERRIDES:
        ours = inspect.signature(getattr(KBERT_OVERRIDES[name], name))
        assert str(ours) == signature, f"{KBERT_OVERRIDES[name].__name__}.{name}{ours} no longer overrides Keras'"


def test_bert_adamw_updates_in_one_launch_through_the_hooks(monkeypatch):
    # If Keras stopped calling `_backend_update_step`, BertAdamW would neither clip nor update in one launch.
    launches = []
    one_launch = optimization._clip_and_update_all
    monkeypatch.setattr(optimization, "_clip_and_update_all", lambda *a: launches.append(1) or one_launch(*a))
    variables = [keras.Variable([1.0, 2.0]), keras.Variable([[3.0]])]
    optimizer = make_optimizer("adamw", 0.1, total_steps=10, warmup_steps=0)
    optimizer.apply_gradients(zip([tf.constant([30.0, -40.0]), tf.constant([[0.0]])], variables))
    assert launches == [1], changed("the order BaseOptimizer.apply calls its hooks in")
    # Clipped to norm 1 before the update: m = 0.1·(0.6, -0.8), v = 0.001·(0.36, 0.64).
    np.testing.assert_allclose(
        variables[0].numpy(),
        [
            1.0 - 0.1 * 0.06 / (0.001**0.5 * 0.6 + 1e-6) - 0.1 * 0.01,
            2.0 + 0.1 * 0.08 / (0.001**0.5 * 0.8 + 1e-6) - 0.1 * 0.02,
        ],
        rtol=1e-5,
    )


def test_lamb_skips_the_cross_replica_sum_through_the_hook(monkeypatch):
    calls = []
    monkeypatch.setattr(
        GradientsAlreadySummed,
        "_all_reduce_sum_gradients",
        lambda self, grads_and_vars: calls.append(1) or grads_and_vars,
    )
    variable = keras.Variable([1.0, 2.0])
    make_optimizer("lamb", 0.1, total_steps=10, warmup_steps=0).apply_gradients([(tf.constant([0.5, -0.5]), variable)])
    assert calls == [1], changed("TFOptimizer._backend_update_step: no longer calls _all_reduce_sum_gradients")
