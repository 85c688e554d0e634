"""Every private API kbert uses (kbert._compat, kbert.backend.tensorflow_compat) is still there in the installed libraries, with the
signature and the behaviour kbert relies on. Each test names its hook, so an upgrade that changes
one says which, and what in kbert depends on it."""

import argparse
import inspect
import os
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
import typer
from typer.testing import CliRunner

from kbert import _compat
from kbert.backend import tensorflow_compat
from kbert.training import optimization
from kbert.training.optimization import BertAdamW, GradientsAlreadySummed, make_optimizer


def changed(library, hook: str, what: str, users: str) -> str:
    where = "kbert.backend.tensorflow_compat" if library.__name__ == "tensorflow" else "kbert._compat"
    return (
        f"{library.__name__} {library.__version__} changed {hook}: {what}. {users} rely on it through "
        f"{where}: adapt {where} to this version, or keep {library.__name__} in pyproject.toml "
        f"to the versions that have it"
    )


# === Keras: the optimizer hooks ===

KBERT_OVERRIDES = {
    "_clip_gradients": BertAdamW,
    "_backend_update_step": BertAdamW,
    "_all_reduce_sum_gradients": GradientsAlreadySummed,
}
OPTIMIZERS = "GradientsAlreadySummed and BertAdamW (kbert.training.optimization)"


@pytest.mark.parametrize("name", list(_compat.KERAS_OPTIMIZER_HOOKS))
def test_keras_optimizer_hooks_are_unchanged(name):
    signature, caller = _compat.KERAS_OPTIMIZER_HOOKS[name]
    base = keras.optimizers.Optimizer  # the TensorFlow backend's optimizer, as kbert runs it
    owners = [cls.__qualname__ for cls in base.__mro__ if name in vars(cls)]
    assert owners, changed(keras, f"Optimizer.{name}", "gone", OPTIMIZERS)
    found = str(inspect.signature(getattr(base, name)))
    assert found == signature, changed(keras, f"{owners[0]}.{name}", f"signature {found}, was {signature}", OPTIMIZERS)
    if caller:
        source = inspect.getsource(getattr(base, caller))
        assert f"self.{name}(" in source, changed(
            keras, f"{owners[0]}.{name}", f"no longer called from {caller}", OPTIMIZERS
        )
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
    assert launches == [1], changed(keras, "Optimizer.apply", "the order it calls its hooks in", OPTIMIZERS)
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
    assert calls == [1], changed(
        keras, "TFOptimizer._backend_update_step", "no longer calls _all_reduce_sum_gradients", OPTIMIZERS
    )


def test_optimizer_variable_index_finds_each_variable():
    variables = [keras.Variable([1.0]), keras.Variable([2.0, 3.0]), keras.Variable([[4.0]])]
    optimizer = BertAdamW()
    optimizer.build(variables)
    found = [_compat.optimizer_variable_index(optimizer, v) for v in variables]
    assert found == [0, 1, 2], changed(keras, "Optimizer._get_variable_index", f"gave {found}", OPTIMIZERS)


# === Keras: layers tracked before Layer.__init__ ===


def test_track_attribute_lists_a_layer_set_before_init_first():
    class Early(keras.Model):
        def __init__(self):
            # Set as kbert.model.bert sets it on PyTorch: a plain attribute, tracked through the hook.
            object.__setattr__(self, "late", _compat.track_attribute(self, keras.layers.Dense(1, name="late")))
            inputs = keras.Input((3,))
            super().__init__(inputs=inputs, outputs=self.late(keras.layers.Dense(2, name="early")(inputs)))

    # The tracked layer comes first, as Layer.__setattr__ lists it; the graph alone puts it last.
    order = [v.path for v in Early().weights]
    assert order == ["late/kernel", "late/bias", "early/kernel", "early/bias"], changed(
        keras, "Layer._initialize_tracker / Layer._tracker.track", f"listed {order}", "models built on PyTorch"
    )


# === Keras: reads replaced inside a StatelessScope ===

WEIGHTS_AS_CONSTANTS = "int8, bfloat16 and --constant-weights exports (kbert.serving.optimize)"


def test_reads_replaced_gives_each_variable_its_replacement_once():
    layer = keras.layers.Dense(2, kernel_initializer="ones", bias_initializer="ones")
    layer.build((None, 3))
    reads = []

    def read(variable):
        reads.append(variable.path)
        return tf.fill(variable.shape, 2.0) if variable is layer.kernel else None

    x = np.ones((1, 3), np.float32)
    with _compat.reads_replaced(read):
        inside = [np.asarray(layer(x)), np.asarray(layer(x))]
    why = changed(keras, "StatelessScope.get_current_value", "Variable.value no longer asks it", WEIGHTS_AS_CONSTANTS)
    # kernel 2s (the replacement), bias 1s (its own value): 3·2 + 1 per output.
    np.testing.assert_array_equal(inside[0], [[7.0, 7.0]], err_msg=why)
    np.testing.assert_array_equal(inside[1], [[7.0, 7.0]], err_msg=why)
    assert reads.count(layer.kernel.path) == 1, "a replacement made more than once"
    np.testing.assert_array_equal(np.asarray(layer(x)), [[4.0, 4.0]])  # outside, the variables again


def test_reads_replaced_puts_constants_in_a_traced_graph():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    values = {id(w): w.numpy() + 1.0 for w in layer.weights}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def call(x):
        with _compat.reads_replaced(lambda v: tf.constant(values[id(v)]) if id(v) in values else None):
            return layer(x)

    graph = call.get_concrete_function().graph.as_graph_def()
    ops = {node.op for node in graph.node}
    assert "ReadVariableOp" not in ops, changed(
        keras, "StatelessScope", f"a traced read is still a variable read ({sorted(ops)})", WEIGHTS_AS_CONSTANTS
    )
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(call(x).numpy(), x @ values[id(layer.kernel)] + values[id(layer.bias)], rtol=1e-6)


# === TensorFlow: the C++ log's level ===


def test_the_native_log_level_is_set_and_read():
    """absl's SetMinLogLevel and MinLogLevel, as libtensorflow_framework exports them."""
    hook = "absl's SetMinLogLevel/MinLogLevel in libtensorflow_framework (ABSL_NAMESPACES)"
    users = "Python sessions' quiet model.fit (kbert.backend.tensorflow.quiet_native_warnings)"
    before = tensorflow_compat.native_log_level()
    assert before is not None, changed(tf, hook, "not exported", users)
    try:
        assert tensorflow_compat.set_native_log_level(1), changed(tf, hook, "not exported", users)
        assert tensorflow_compat.native_log_level() == 1, changed(tf, hook, "the level set is not read back", users)
    finally:
        tensorflow_compat.set_native_log_level(before)


# === TensorFlow: ops by their registered names ===

INT8 = "int8 exports (kbert.serving.int8)"


def test_op_registered_knows_tensorflows_ops():
    assert tensorflow_compat.op_registered("MatMul"), changed(tf, "op_def_registry.get", "finds no MatMul", INT8)
    assert not tensorflow_compat.op_registered("NoSuchOp"), changed(
        tf, "op_def_registry.get", "finds an op not there", INT8
    )


def test_add_op_to_graph_adds_an_op_by_its_name():
    graph = tf.Graph()
    with graph.as_default():
        a, b = tf.constant([1.0, 2.0]), tf.constant([10.0, 20.0])
        op = tensorflow_compat.add_op_to_graph("AddN", name="summed", inputs=[a, b])  # N and T inferred
        assert isinstance(op, tf.Operation), changed(tf, "op_def_library._apply_op_helper", f"gave {op!r}", INT8)
        assert (op.type, op.name) == ("AddN", "summed")
        with tf.compat.v1.Session(graph=graph) as session:
            np.testing.assert_array_equal(session.run(op.outputs[0]), [11.0, 22.0])


def test_run_op_eagerly_runs_an_op_by_its_name():
    inputs = [tf.constant([1.0, 2.0]), tf.constant([10.0, 20.0])]
    out = tensorflow_compat.run_op_eagerly("AddN", 1, inputs, ("N", 2, "T", tf.float32.as_datatype_enum))
    assert len(out) == 1, changed(tf, "execute.execute", f"gave {len(out)} outputs for 1", INT8)
    np.testing.assert_array_equal(out[0].numpy(), [11.0, 22.0])


@pytest.mark.skipif(
    not tensorflow_compat.op_registered("_QuantizedMatMul"), reason="this TensorFlow has no oneDNN int8 matmul"
)
def test_int8_matmul_runs_eagerly_and_in_a_graph():
    from kbert.serving.int8 import Int8Kernel, int8_matmul

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 24)).astype("float32")
    # Two kernels of one shape: TensorFlow runs eager calls with the same attrs on one cached kernel.
    for w in (rng.normal(size=(24, 12)).astype("float32"), rng.normal(size=(24, 12)).astype("float32")):
        kernel = Int8Kernel.of(w, np.zeros(12))
        eager = int8_matmul(tf.constant(x), kernel).numpy()
        graph = tf.Graph()
        with graph.as_default():
            y = int8_matmul(tf.constant(x), kernel)
            with tf.compat.v1.Session(graph=graph) as session:
                in_graph = session.run(y)
        # The int8 product is within quantization error of the float one, and the same both ways.
        assert np.abs(eager - x @ w).max() < 0.05 * np.abs(x @ w).max(), "eagerly, another kernel's weights"
        np.testing.assert_allclose(in_graph, eager, rtol=1e-5, atol=1e-5 * np.abs(eager).max())


# === TensorFlow: SavedModel internals ===


def _saved_module(path):
    module = tf.Module()
    module.v = tf.Variable(3.0)
    module.f = tf.function(lambda x: x * module.v, input_signature=[tf.TensorSpec([], tf.float32)])
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.f})
    return path


def test_write_saved_model_fingerprint_follows_an_edited_saved_model(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    path = _saved_module(tmp_path / "m")
    before = tf.saved_model.experimental.read_fingerprint(str(path)).saved_model_checksum
    saved_model = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    saved_model.meta_graphs[0].signature_def["serving_default"].method_name = "tensorflow/serving/regress"
    (path / "saved_model.pb").write_bytes(saved_model.SerializeToString())
    tensorflow_compat.write_saved_model_fingerprint(str(path))
    after = tf.saved_model.experimental.read_fingerprint(str(path)).saved_model_checksum
    users = "classify and regress signatures (kbert.serving.signatures)"
    assert after != before, changed(tf, "fingerprinting_utils.write_fingerprint", "fingerprint.pb not renewed", users)
    # A second copy of the same edited file gets the same fingerprint: it hashes saved_model.pb.
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "saved_model.pb").write_bytes((path / "saved_model.pb").read_bytes())
    os.symlink(path / "variables", tmp_path / "copy" / "variables")
    tensorflow_compat.write_saved_model_fingerprint(str(tmp_path / "copy"))
    assert tf.saved_model.experimental.read_fingerprint(str(tmp_path / "copy")).saved_model_checksum == after


def test_auto_trackable_saves_its_attributes(tmp_path):
    root = tensorflow_compat.auto_trackable()
    root.v = tf.Variable(2.0)
    root.double = tf.function(lambda x: x * root.v, input_signature=[tf.TensorSpec([], tf.float32)])
    tf.saved_model.save(root, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    users = "TF Hub exports (kbert.serving.tfhub)"
    assert float(loaded.double(tf.constant(4.0))) == 8.0, changed(tf, "__internal__.tracking.AutoTrackable", "", users)
    assert float(loaded.v.numpy()) == 2.0 and not hasattr(loaded, "save_counter")


# === typer ===

HELP = "kbert's command line (kbert.cli.main, kbert.cli.common's --help value names)"


def _app():
    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

    @app.command("go")
    def go(
        src: Path,
        steps: int = typer.Option(1, min=0),
        rate: float = typer.Option(0.5),
        files: list[Path] = typer.Option([]),
        name: str = typer.Option("x"),
    ):
        pass

    @app.command("other")
    def other():
        pass

    return app


def test_command_line_errors_are_what_typer_raises():
    no_args, usage = _compat.command_line_errors()
    app = _app()
    for argv, expected in (
        (["go", "a", "--no-such-flag"], usage),
        ([], no_args),
        (["go", "a", "--steps", "-1"], usage),
    ):
        with pytest.raises(Exception) as raised:
            app(args=argv, standalone_mode=False)
        assert isinstance(raised.value, expected), changed(
            typer, "typer._click.exceptions", f"{argv} raised {type(raised.value).__name__}", HELP
        )
    assert issubclass(no_args, usage)  # kbert.cli.main catches UsageError, then tells the two apart


def test_typer_parameter_type_describes_each_annotation():
    command = typer.main.get_command(_app()).commands["go"]
    typed = {p.name: _compat.typer_parameter_type(p) for p in command.params}
    got = {
        name: (t.annotation, t.is_path, t.is_list, t.is_ranged, t.is_ranged and "int" in t.ranged_type_name)
        for name, t in typed.items()
    }
    assert got == {
        "src": (Path, True, False, False, False),
        "steps": (int, False, False, True, True),
        "rate": (float, False, False, False, False),
        "files": (list[Path], False, True, False, False),
        "name": (str, False, False, False, False),
    }, changed(typer, "parameters' type_descriptor", f"describes them as {got}", HELP)
    assert "--steps" in CliRunner().invoke(_app(), ["go", "--help"]).output


# === Apache Beam ===


def test_add_beam_options_adds_one_classes_flags():
    options = pytest.importorskip("apache_beam.options.pipeline_options")
    parser = argparse.ArgumentParser(add_help=False)
    _compat.add_beam_options(options.StandardOptions, parser)
    known, unknown = parser.parse_known_args(["--runner", "DirectRunner", "--num_workers", "2"])
    beam = pytest.importorskip("apache_beam")
    assert known.runner == "DirectRunner" and unknown == ["--num_workers", "2"], changed(
        beam, "PipelineOptions._add_argparse_args", f"parsed {known}, left {unknown}", "kbert create-data --runner"
    )


# === Keras: the layout of a weights file, which `kbert convert inspect` reads with h5py ===


def test_weights_file_holds_each_layers_weights_under_vars(tmp_path):
    import kbert
    from kbert.converters.inspect import H5_SIZED_WEIGHTS, tf1_shapes

    config = kbert.BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=12
    )
    kbert.bert_encoder(config).save_weights(tmp_path / "model.weights.h5")
    with h5py.File(tmp_path / "model.weights.h5", "r") as f:
        shapes = {}
        f.visititems(lambda name, obj: shapes.__setitem__(name, obj.shape) if isinstance(obj, h5py.Dataset) else None)
    expected = tf1_shapes(config)
    for suffix, tf1_name in H5_SIZED_WEIGHTS:
        found = [shape for name, shape in shapes.items() if name.endswith("/" + suffix)]
        assert found == [expected[tf1_name]], changed(
            keras,
            "the weights file's layout",
            f"no {suffix} of shape {expected[tf1_name]} in {sorted(shapes)}",
            "kbert convert inspect (kbert.converters.inspect.H5_SIZED_WEIGHTS)",
        )


def test_export_archive_internals_write_each_signature_traced_once(tmp_path):
    """write_export_archive: ExportArchive's `_filter_and_track_resources`, `_endpoint_names` and
    `_tf_trackable`; each endpoint is traced once (Keras' own write_out traces it twice: once to list
    its variables, again inside the save)."""
    traces = []
    weight = tf.Variable([2.0, 3.0])

    def double(x):
        traces.append(1)
        return {"y": x * weight}

    def archive_of_two_endpoints():
        archive = keras.export.ExportArchive()
        archive.track(weight)
        for name in ("serving_default", "twice"):
            archive.add_endpoint(name, double, [tf.TensorSpec([None, 2], tf.float32, name="x")])
        return archive

    archive = archive_of_two_endpoints()
    for hook in ("_filter_and_track_resources", "_endpoint_names", "_tf_trackable"):
        assert hasattr(archive, hook), changed(keras, f"ExportArchive.{hook}", "it is gone", "kbert export")
    tensorflow_compat.write_export_archive(archive, str(tmp_path / "saved"))
    assert len(traces) == 2, changed(keras, "ExportArchive", f"{len(traces)} traces of 2 endpoints", "kbert export")
    archive_of_two_endpoints().write_out(str(tmp_path / "keras"), verbose=False)
    assert len(traces) == 2 + 4  # what the helper saves: each signature's second trace
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    x = tf.constant([[1.0, 1.0]])
    assert sorted(loaded.signatures) == ["serving_default", "twice"]
    np.testing.assert_array_equal(loaded.signatures["serving_default"](x=x)["y"], [[2.0, 3.0]])
    np.testing.assert_array_equal(loaded.twice(x)["y"], [[2.0, 3.0]])  # the endpoint as an attribute too
