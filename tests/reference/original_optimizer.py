"""Run the original AdamWeightDecayOptimizer for a few steps, composed as create_optimizer
composes it (gradients -> clip_by_global_norm(1.0) -> apply), in its own process (tf1shim
switches TF to graph mode). Prints the variables after each step as JSON.

The learning rate is fed per step from the original's formula (polynomial decay to 0, linear
warmup) rather than taken from create_optimizer's graph: there the rate reads global_step
while the same run increments it, with no ordering between the two, so which step's rate the
first update gets depends on op scheduling (here it saw step 1's).

usage: python original_optimizer.py   (reads nothing; the problem is defined below and in
tests/training/test_optimization.py, which solves the same one with kbert)
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from original import load_original

# Three variables named like the original's: one decayed kernel, a LayerNorm gamma and a bias
# (both excluded from weight decay), with a loss whose gradient is large enough to be clipped.
INITIAL = {
    "layer/dense/kernel": [[0.5, -0.3], [0.2, 0.8]],
    "layer/LayerNorm/gamma": [1.0, 0.9],
    "layer/dense/bias": [0.1, -0.1],
}
TARGET = {
    "layer/dense/kernel": [[3.0, 1.0], [-2.0, 0.0]],
    "layer/LayerNorm/gamma": [0.0, 2.0],
    "layer/dense/bias": [1.0, 1.0],
}
LR, STEPS, WARMUP, RUN = 0.1, 10, 3, 6


def original_rate(step):
    """create_optimizer's rate at `step`: linear warmup, else polynomial (power 1) decay to 0."""
    if step < WARMUP:
        return LR * step / WARMUP
    return LR * (1.0 - min(step, STEPS) / STEPS)


def main():
    optimization = load_original("optimization")
    tf = optimization.tf
    variables = {}
    for name, value in INITIAL.items():
        scope, var = name.rsplit("/", 1)
        with tf.variable_scope(scope, reuse=tf.AUTO_REUSE):
            variables[name] = tf.get_variable(var, initializer=tf.constant(value, tf.float32))
    loss = tf.add_n([tf.reduce_sum(tf.square(variables[n] - tf.constant(TARGET[n]))) for n in INITIAL])
    learning_rate = tf.placeholder(tf.float32, [])
    optimizer = optimization.AdamWeightDecayOptimizer(
        learning_rate=learning_rate,
        weight_decay_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"],
    )
    tvars = tf.trainable_variables()
    grads = tf.gradients(loss, tvars)
    grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
    train_op = optimizer.apply_gradients(zip(grads, tvars))
    history = []
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for step in range(RUN):
            sess.run(train_op, {learning_rate: original_rate(step)})
            history.append({n: sess.run(v).tolist() for n, v in variables.items()})
    print(json.dumps(history))


if __name__ == "__main__":
    main()
