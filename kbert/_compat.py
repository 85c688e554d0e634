"""The private APIs of Keras, typer and Apache Beam that kbert uses, all here.

Each is used because its library has no public way to do the thing, and each entry says why.
tests/test_compat.py checks every one against the installed libraries (that it is there, with the
signature and the behaviour kbert relies on) and names the hook when an upgrade changes it, so a
new version fails there first, not deep inside an export or a training step. Modules import the
hooks from here rather than reaching into a library themselves. TensorFlow's private APIs, which
only its own code (exports, int8 kernels) uses, are `kbert.backend.tensorflow_compat`'s.

Keras and typer are imported inside the functions that need them: the command line imports this
module before it knows which backend a command runs on.

Example:
>>> [error.__name__ for error in command_line_errors()]
['NoArgsIsHelpError', 'UsageError']
"""

from __future__ import annotations

import functools

# === Keras: the optimizer hooks kbert.training.optimization overrides or calls ===

# Keras 3 has no public way to say that gradients are already summed over replicas (Keras 2's
# `apply_gradients(experimental_aggregate_gradients=False)` is gone), nor to clip and update every
# variable in one launch (the public `update_step` is one launch per variable). So
# GradientsAlreadySummed overrides `_all_reduce_sum_gradients`, BertAdamW overrides
# `_clip_gradients` and `_backend_update_step` and reads `_get_variable_index`, as Keras' own
# optimizers do. Each hook: (its signature on keras.optimizers.Optimizer, the Keras method that
# must call it, or None for one kbert only calls). pyproject.toml pins keras to the minor version
# these were checked on.
KERAS_OPTIMIZER_HOOKS = {
    "_backend_apply_gradients": ("(self, grads, trainable_variables)", "apply"),
    "_clip_gradients": ("(self, grads)", "_backend_apply_gradients"),
    "_backend_update_step": ("(self, grads, trainable_variables, learning_rate)", "_backend_apply_gradients"),
    "_all_reduce_sum_gradients": ("(self, grads_and_vars)", "_backend_update_step"),
    "_get_variable_index": ("(self, variable)", None),
}


def optimizer_variable_index(optimizer, variable) -> int:
    """The index of `variable` in the optimizer's lists, which its slot variables share."""
    return optimizer._get_variable_index(variable)


# === Keras: layers a model holds before keras.Model.__init__ has run (PyTorch) ===

# kbert's models make their layers before keras.Model.__init__ builds the graph from them, as
# keras-hub's do. On PyTorch a Keras layer is a torch.nn.Module, which refuses a sub-module set
# before its own __init__; so there kbert.model.bert sets them as plain attributes and hands each
# to Keras' attribute tracker itself, as Layer.__setattr__ does on TensorFlow and JAX. The model
# then lists its layers, and so its weights, in the same order on every backend: the order of an
# optimizer's slots in a .keras file. Keras' Layer has no public way to track an attribute.


def track_attribute(layer, value):
    """Add `value` to what Keras' tracker of `layer` holds (its layers, variables, ...), creating
    the tracker if Layer.__init__ has not yet; returns what Layer.__setattr__ would store."""
    layer._initialize_tracker()
    return layer._tracker.track(value)


# === Keras: reading weights as other values while a function is traced ===


def reads_replaced(read):
    """A context within which each read of a Keras variable gives `read(variable)` instead.

    `read` is called on a variable's first read, and what it gives is kept for the later reads;
    where it gives None, the variable's own value is read (and `read` asked again next time). Keras' Variable.value asks the innermost
    `keras.StatelessScope` for a value first (`get_current_value`), and the scope keeps the values
    it gives in `state_mapping`: kbert.serving.optimize traces an export with its weights as graph
    constants this way, so only the weights the traced code reads go into the graph.

    Example:
    >>> import keras
    >>> w = keras.Variable([1.0, 2.0])
    >>> with reads_replaced(lambda v: keras.ops.zeros(v.shape) if v is w else None):
    ...     print(keras.ops.convert_to_numpy(w.value))
    [0. 0.]
    >>> keras.ops.convert_to_numpy(w.value)
    array([1., 2.], dtype=float32)
    """
    return _replacing_scope()(read)


@functools.cache
def _replacing_scope():
    import keras

    class ReplacingScope(keras.StatelessScope):
        def __init__(self, read):
            super().__init__()
            self.read = read

        def get_current_value(self, variable):
            if id(variable) not in self.state_mapping:
                value = self.read(variable)
                if value is None:
                    return None
                self.state_mapping[id(variable)] = value
            return self.state_mapping[id(variable)]

    return ReplacingScope


# === typer ===


def command_line_errors():
    """(NoArgsIsHelpError, UsageError): what typer raises for a command line it refuses.

    typer 0.2x runs on its own copy of click, `typer._click`, whose exceptions are not click's;
    typer exports neither class. Earlier typers raise click's own.
    """
    try:
        from typer._click.exceptions import NoArgsIsHelpError, UsageError
    except ImportError:  # pragma: no cover
        from click.exceptions import NoArgsIsHelpError, UsageError
    return NoArgsIsHelpError, UsageError


def typer_parameter_type(param):
    """What typer made of a command parameter's annotation (typer's TypeDescriptor): `.annotation`,
    `.is_path`, `.is_list`, `.is_ranged` and `.ranged_type_name`, for --help's value names."""
    return param.type_descriptor


# === Apache Beam ===


def add_beam_options(options_class, parser):
    """Add the flags of one PipelineOptions class (not its subclasses) to an argparse parser.

    Each PipelineOptions subclass declares its flags in `_add_argparse_args`; Beam builds its own
    parser by calling it on every subclass, and offers no public way to list the flags it knows.
    """
    options_class._add_argparse_args(parser)
