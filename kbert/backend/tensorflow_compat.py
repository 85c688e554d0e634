"""The private APIs of TensorFlow that kbert uses, all here: the C++ log's level (absl's), ops by
their registered names (the int8 kernels) and SavedModel internals (the exports).

Each is used because TensorFlow (or Keras' ExportArchive, which writes a SavedModel through it) has
no public way to do the thing, and each entry says why. tests/test_compat.py checks every one
against the installed TensorFlow and names the hook when an upgrade changes it. Only code that
runs TensorFlow imports this module; `kbert._compat` holds the private APIs of Keras, typer and
Apache Beam.

Example:
>>> op_registered("MatMul"), op_registered("NoSuchOp")
(True, False)
"""

from __future__ import annotations

import tensorflow as tf

# === TensorFlow's C++ log ===

# TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, at its first C++ log line, which `import tensorflow`
# (or `import keras`) has printed before kbert is imported; absl's SetMinLogLevel, which
# libtensorflow_framework exports under absl's versioned namespace, sets the same level later.
ABSL_SET_MIN_LOG_LEVEL = "_ZN4absl{namespace}14SetMinLogLevelENS0_18LogSeverityAtLeastE"
ABSL_MIN_LOG_LEVEL = "_ZN4absl{namespace}11MinLogLevelEv"
ABSL_NAMESPACES = ("12lts_20250814",)  # TensorFlow 2.21's absl (lts_20250814), length-prefixed as C++ names are
LOG_ERRORS = 2  # absl::LogSeverityAtLeast::kError: errors and fatal errors print, warnings and info do not


def _absl_function(template: str):
    import ctypes
    import os

    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(tf.__file__), "libtensorflow_framework.so.2"))
    except OSError:
        return None
    for namespace in ABSL_NAMESPACES:
        try:
            return getattr(library, template.format(namespace=namespace))
        except AttributeError:
            continue
    return None


def set_native_log_level(level: int) -> bool:
    """Set the lowest severity TensorFlow's C++ code logs from now on (0 info, 1 warning, 2 error),
    as TF_CPP_MIN_LOG_LEVEL does before TensorFlow's first log line; False where this build
    exports no such function (the level is then left as it was)."""
    import ctypes

    function = _absl_function(ABSL_SET_MIN_LOG_LEVEL)
    if function is None:
        return False
    function.argtypes, function.restype = [ctypes.c_int], None
    function(level)
    return True


def native_log_level() -> int | None:
    """The lowest severity TensorFlow's C++ code logs now (None where this build does not say).

    >>> native_log_level() in (0, 1, 2, 3)
    True
    """
    import ctypes

    function = _absl_function(ABSL_MIN_LOG_LEVEL)
    if function is None:
        return None
    function.argtypes, function.restype = [], ctypes.c_int
    return function()


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
    return tf.__internal__.tracking.AutoTrackable()


# === Keras' ExportArchive: a SavedModel with each signature traced once ===


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
    archive._filter_and_track_resources()
    signatures = {}
    for name in archive._endpoint_names:
        function = getattr(archive._tf_trackable, name)
        concrete = function.get_concrete_function() if hasattr(function, "get_concrete_function") else function
        setattr(archive._tf_trackable, name, concrete)
        signatures[name] = concrete
    signatures.setdefault("serving_default", signatures[archive._endpoint_names[0]])
    tf.saved_model.save(archive._tf_trackable, filepath, signatures=signatures)
