"""BertAdamW + the warmup/decay schedule + global-norm clipping against the original's
optimization.create_optimizer, on the same variables and loss. The private Keras hooks BertAdamW
relies on are checked in tests/test_compat.py."""

import contextlib
import json
import os
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

from conftest import REFERENCE
from kbert.training.optimization import WarmupLinearDecay, make_optimizer

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
