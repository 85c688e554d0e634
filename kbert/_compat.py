"""The private APIs of TensorFlow, Keras, typer and Apache Beam that kbert uses, all here.

Each is used because its library has no public way to do the thing, and each entry says why.
tests/test_compat.py checks every one against the installed libraries (that it is there, with the
signature and the behaviour kbert relies on) and names the hook when an upgrade changes it, so a
new version fails there first, not deep inside an export or a training step. Modules import the
hooks from here rather than reaching into a library themselves.

TensorFlow, Keras and typer are imported inside the functions that need them: the command line
imports this module before it knows whether the command needs TensorFlow at all.

Example:
>>> op_registered("MatMul"), op_registered("NoSuchOp")
(True, False)
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


# === TensorFlow: ops that tf.raw_ops does not offer ===

# An op whose name starts with an underscore (oneDNN's `_QuantizedMatMul`, kbert.serving.int8's
# int8 kernel) has no tf.raw_ops function: it is looked up, added to a graph and run eagerly by
# its registered name through TensorFlow's own op machinery, as the generated raw_ops do.


def op_registered(op_type: str) -> bool:
    """Whether this TensorFlow build registers the op `op_type` (a build without oneDNN lacks its ops)."""
    from tensorflow.python.framework import op_def_registry

    return op_def_registry.get(op_type) is not None


def add_op_to_graph(op_type: str, name: str, **inputs_and_attrs):
    """Add an `op_type` op named `name` to the graph being built; returns the tf.Operation.

    Inputs and attrs are given by their names in the op's registration, as for tf.raw_ops;
    attrs TensorFlow can infer from the inputs may be left out.
    """
    from tensorflow.python.framework import op_def_library

    return op_def_library._apply_op_helper(op_type, name=name, **inputs_and_attrs)[2]


def run_op_eagerly(op_type: str, num_outputs: int, inputs: list, attrs: tuple) -> list:
    """Run the op `op_type` eagerly; returns its output tensors.

    attrs: every attr, the inferred ones too, flat as (name, value, name, value, ...), with
    dtypes as their enums (`tf.float32.as_datatype_enum`).
    """
    from tensorflow.python.eager import context, execute

    return execute.execute(op_type, num_outputs, inputs, tuple(attrs), context.context())


# === TensorFlow: SavedModel internals ===


def write_saved_model_fingerprint(saved_model_dir: str):
    """Write `saved_model_dir`'s fingerprint.pb anew from its saved_model.pb, after that was edited.

    TensorFlow writes the fingerprint as it saves; `tf.saved_model.experimental` can only read one.
    """
    from tensorflow.python.saved_model import fingerprinting_utils

    fingerprinting_utils.write_fingerprint(saved_model_dir)


def auto_trackable():
    """A bare trackable object: its attributes (variables, assets, tf.functions) are saved with it.

    What Keras' ExportArchive saves too; not tf.train.Checkpoint, which adds a `save_counter`
    variable to each object, nor tf.Module, whose `variables` is read-only.
    """
    import tensorflow as tf

    return tf.__internal__.tracking.AutoTrackable()


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


def write_export_archive(archive, filepath):
    """`keras.export.ExportArchive.write_out`, with every signature traced once.

    write_out hands tf.saved_model.save the endpoints as tf.functions with input signatures; the
    save retraces each of them, as its context changes their cache key (tf.function's
    `_list_all_concrete_functions_for_serialization` "re-creates" them), and an export's
    signatures hold the whole tokenizer graph. Here each endpoint's concrete function, traced
    already when the archive listed the variables it uses, is what is saved, as an attribute
    (so `loaded.serving_default(...)` still works) and as the signature.
    Private: `_filter_and_track_resources`, `_endpoint_names` and `_tf_trackable`
    (tests/test_compat.py: test_export_archive_internals).
    """
    import tensorflow as tf

    archive._filter_and_track_resources()
    signatures = {}
    for name in archive._endpoint_names:
        function = getattr(archive._tf_trackable, name)
        concrete = function.get_concrete_function() if hasattr(function, "get_concrete_function") else function
        setattr(archive._tf_trackable, name, concrete)
        signatures[name] = concrete
    signatures.setdefault("serving_default", signatures[archive._endpoint_names[0]])
    tf.saved_model.save(archive._tf_trackable, filepath, signatures=signatures)
