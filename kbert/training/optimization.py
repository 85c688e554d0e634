"""google-research/bert's optimizer: AdamW without bias correction, warmup then linear decay.

`optimization.py` of the original: β1 0.9, β2 0.999, ε 1e-6, weight decay 0.01 except on
LayerNorm and bias variables, learning rate rising linearly over the warmup steps and then
falling linearly to 0 at the last step; gradients clipped to global norm 1.0. The arithmetic is
`keras.ops`, the same on TensorFlow, JAX and PyTorch; on TensorFlow with one device the clip and
every variable's update run as one XLA launch (the one TensorFlow-only path, whose kernels
`kbert.backend.adamw_kernels` gives). `kbert pretrain` sums gradients over
replicas before the optimizer sees them, so its clip sees the global gradient; under Keras'
`fit` with mirrored variables, Keras clips each replica's gradient before the cross-replica
sum, as the original's CrossShardOptimizer did. LAMB (keras.optimizers.Lamb) is offered for
large batches.

Three private hooks of Keras' optimizer are overridden, because Keras 3 has no public way to do
either thing: `_all_reduce_sum_gradients` (GradientsAlreadySummed), to say the gradients are
already summed over replicas (Keras 2's `apply_gradients(experimental_aggregate_gradients=False)`
is gone), and `_clip_gradients` with `_backend_update_step` (BertAdamW), to clip and update every
variable in one XLA launch; the public `update_step` is one launch per variable, and each launch
has a fixed cost that BERT-base's some 200 variables multiply (measured in docs/performance.md,
"What makes kbert's step faster"). BertAdamW also reads
`_get_variable_index`, as Keras' own optimizers do. kbert._compat lists these hooks with the
others kbert relies on; pyproject.toml pins keras to the minor version tested, and
tests/test_compat.py fails, naming the hook, if Keras changes one.
"""

from __future__ import annotations

import keras
from keras import ops

from kbert._compat import optimizer_variable_index
from kbert.backend import adamw_kernels
from kbert.runtime.errors import KbertError

NO_DECAY = ("layer_norm", "LayerNorm", "bias")


@keras.saving.register_keras_serializable(package="kbert")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = peak·step/warmup during warmup, then peak·(1 - step/total), 0 after `total`.

    Example:
    >>> schedule = WarmupLinearDecay(1e-4, total_steps=100, warmup_steps=10)
    >>> [round(float(schedule(s)), 7) for s in (0, 5, 10, 55, 100)]
    [0.0, 5e-05, 9e-05, 4.5e-05, 0.0]
    """

    def __init__(self, peak: float, total_steps: int, warmup_steps: int = 0):
        self.peak, self.total_steps, self.warmup_steps = float(peak), int(total_steps), int(warmup_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        decayed = self.peak * (1.0 - ops.minimum(step, self.total_steps) / max(self.total_steps, 1))
        if self.warmup_steps <= 0:
            return decayed
        warmup = self.peak * step / self.warmup_steps
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps}


class GradientsAlreadySummed:
    """For optimizers fed gradients that the training step already summed over replicas.

    kbert's step sums gradients itself (so that clipping sees the global gradient, as on a
    single device); Keras' TF optimizer would otherwise sum them across replicas again.
    """

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return grads_and_vars


@keras.saving.register_keras_serializable(package="kbert")
class BertAdamW(keras.optimizers.Optimizer):
    """AdamWeightDecayOptimizer of google-research/bert, as a Keras optimizer.

    m ← β1·m + (1-β1)·g;  v ← β2·v + (1-β2)·g²;  u = m / (√v + ε) (+ wd·w unless the weight is
    a LayerNorm or bias);  w ← w - lr·u. No bias correction, as in the original. The slots are
    named `adam_m` and `adam_v`, the original's names.

    Args:
        learning_rate: float or schedule.
        weight_decay_rate: float. 0.01 in the original.
        beta_1, beta_2, epsilon: floats. 0.9, 0.999, 1e-6 in the original.

    Example:
    >>> opt = BertAdamW(learning_rate=0.1, weight_decay_rate=0.0)
    >>> w = keras.Variable([1.0, 2.0])
    >>> _ = opt.apply_gradients([(keras.ops.convert_to_tensor([1.0, -1.0]), w)])
    >>> [round(float(x), 4) for x in w.numpy()]  # no bias correction: u = 0.1·g / (√0.001·|g|) = ±3.162
    [0.6838, 2.3162]
    """

    def __init__(
        self,
        learning_rate=1e-4,
        weight_decay_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        name="bert_adamw",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.weight_decay_rate = weight_decay_rate
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._m = [self.add_variable_from_reference(v, "adam_m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "adam_v") for v in var_list]
        self._decay = [not any(tag in v.path for tag in NO_DECAY) for v in var_list]
        # On TensorFlow with one device, the clip and all the updates run as one XLA launch.
        # Mirrored variables keep Keras' path: it clips each replica's gradient before the
        # cross-replica sum (the original CrossShardOptimizer's order), then updates variable by
        # variable; so do JAX and PyTorch, whose Keras clip is tf.clip_by_global_norm's arithmetic.
        self._one_launch = _clip_and_update_all is not None and not any(_is_mirrored(v) for v in var_list)

    def _clip_gradients(self, grads):
        if self._one_launch:
            return grads  # clipped inside `_clip_and_update_all`
        return super()._clip_gradients(grads)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._one_launch:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        indices = [optimizer_variable_index(self, v) for v in trainable_variables]
        new = _clip_and_update_all(
            [ops.cast(_tensor(g), v.dtype) for g, v in zip(grads, trainable_variables)],
            [_tensor(self._m[i]) for i in indices],
            [_tensor(self._v[i]) for i in indices],
            [_tensor(v) for v in trainable_variables],
            ops.cast(learning_rate, "float32"),
            float(self.global_clipnorm or 0.0),
            self._hyper(),
            tuple(self._decay_rate(i) for i in indices),
        )
        for i, variable, (m, v, w) in zip(indices, trainable_variables, new):
            self.assign(self._m[i], m)
            self.assign(self._v[i], v)
            self.assign(variable, w)

    def update_step(self, gradient, variable, learning_rate):
        index = optimizer_variable_index(self, variable)
        m, v = self._m[index], self._v[index]
        new_m, new_v, new_w = _update_one(
            ops.cast(_tensor(gradient), variable.dtype),
            _tensor(m),
            _tensor(v),
            _tensor(variable),
            ops.cast(learning_rate, variable.dtype),
            self._hyper(),
            self._decay_rate(index),
        )
        self.assign(m, new_m)
        self.assign(v, new_v)
        self.assign(variable, new_w)

    def _hyper(self):
        # 1 - β in Python's double precision, then float32, as the original's constants are.
        return ops.convert_to_tensor(
            [self.beta_1, 1.0 - self.beta_1, self.beta_2, 1.0 - self.beta_2, self.epsilon], "float32"
        )

    def _decay_rate(self, index: int) -> float:
        return self.weight_decay_rate if self._decay[index] else 0.0

    def get_config(self):
        config = super().get_config()
        config.update(
            weight_decay_rate=self.weight_decay_rate, beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon
        )
        return config


def _adamw(g, m, v, w, lr, hyper, decay):
    """One AdamW step on one variable; returns (m, v, w). The arithmetic is the original's, op for op."""
    beta_1, one_minus_beta_1, beta_2, one_minus_beta_2, epsilon = ops.unstack(hyper)
    m = beta_1 * m + one_minus_beta_1 * g
    v = beta_2 * v + one_minus_beta_2 * ops.square(g)
    update = m / (ops.sqrt(v) + epsilon) + decay * w
    return m, v, w - lr * update


# On TensorFlow, XLA-compiled: `clip_and_update_all` clips and updates every variable in one
# launch. On JAX and PyTorch: Keras' clip, then `_adamw` on each variable in Keras' own step
# (which JAX compiles whole), and no one-launch path.
_update_one, _clip_and_update_all, _tensor, _is_mirrored = adamw_kernels(_adamw)


def make_optimizer(
    name: str, learning_rate: float, total_steps: int, warmup_steps: int, weight_decay_rate: float = 0.01
):
    """The optimizer `kbert pretrain --optimizer NAME` uses: "adamw" (the original) or "lamb"."""
    schedule = WarmupLinearDecay(learning_rate, total_steps, warmup_steps)
    # global_clipnorm: the original's tf.clip_by_global_norm(grads, 1.0), applied to the summed gradient.
    if name == "adamw":
        return _SummedBertAdamW(schedule, weight_decay_rate=weight_decay_rate, global_clipnorm=1.0)
    if name == "lamb":
        return _SummedLamb(schedule, beta_1=0.9, beta_2=0.999, epsilon=1e-6, global_clipnorm=1.0)
    raise KbertError(f"unknown optimizer {name!r}; use adamw (the original's) or lamb (large batches)")


class _SummedBertAdamW(GradientsAlreadySummed, BertAdamW):
    pass


class _SummedLamb(GradientsAlreadySummed, keras.optimizers.Lamb):
    pass
