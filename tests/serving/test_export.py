"""`kbert export` on the tiny checkpoint and on a tiny fine-tuned classifier.

The SavedModel is read back in a fresh Python that imports only tensorflow and
tensorflow_text (what TF Serving has: the graph; kbert and keras_hub cannot be imported there,
and nothing loads Keras beyond what `import tensorflow` itself loads), after the model
directory it came from is deleted, and its answers are compared with kbert's model run
in this process on the same text.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REFERENCE, assert_user_error, run_kbert
from helpers import run_in_fresh_process

LONG = " ".join(["gold"] * 5000)
# Real text, an empty string, a text far past max length, and invalid UTF-8 bytes (dropped,
# as the original's decode("utf-8", "ignore") drops them).
TEXTS = [b"gold glorious great.", b"dead dust the dread.", b"", LONG.encode(), b"gold\xff glorious\xfe great."]
TEXTS_B = [b"", b"", b"", b"", b"dead."]  # the last row is a sentence pair

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them

SERVE = r"""
import json, sys
sys.modules["kbert"] = sys.modules["keras_hub"] = None  # importing either would now fail
import numpy as np
import tensorflow as tf
# TensorFlow 2.21 imports keras itself; anything more must not come from reading the export.
after_tensorflow = set(sys.modules)
import tensorflow_text  # noqa: F401  (registers the tokenizer's ops, as TF Serving's build does)

spec = json.load(open(sys.argv[1]))
texts = [bytes.fromhex(t) for t in spec["texts"]]
texts_b = [bytes.fromhex(t) for t in spec["texts_b"]]


def plain(outputs):
    return {k: (np.char.decode(v.numpy().astype(bytes), "utf-8").tolist() if v.dtype == tf.string
                else v.numpy().tolist()) for k, v in outputs.items()}


def shapes(outputs):
    return {k: list(v.shape) for k, v in outputs.items()}


result = {}
for kind, path in spec["exports"].items():
    loaded = tf.saved_model.load(path)
    default = loaded.signatures["serving_default"]
    pairs = "text_b" in default.structured_input_signature[1]
    text = {"text": tf.constant(texts)}
    if pairs:
        text["text_b"] = tf.constant(texts_b)
    examples = []
    for i, t in enumerate(texts):
        feature = {"text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[t]))}
        if pairs and texts_b[i]:
            feature["text_b"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[texts_b[i]]))
        examples.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    empty = {k: tf.constant([], tf.string) for k in text}
    ids = {k: tf.constant(v, tf.int32) for k, v in spec["ids"][kind].items()}
    result[kind] = {
        "pairs": pairs,
        "serving_default": plain(default(**text)),
        "serve_ids": plain(loaded.signatures["serve_ids"](**ids)),
        "serve_examples": plain(loaded.signatures["serve_examples"](examples=tf.constant(examples))),
        "signatures": sorted(loaded.signatures),
        "empty_batch": shapes(default(**empty)),
    }
    if "classify" in loaded.signatures:
        result[kind]["classify"] = plain(loaded.signatures["classify"](inputs=tf.constant(examples)))
result["modules"] = sorted(m for m in set(sys.modules) - after_tensorflow
                          if m.split(".")[0] in ("kbert", "keras", "keras_hub", "tf_keras"))
print(json.dumps(result))
"""


def kbert_reference(model_dir, texts, texts_b=None):
    """The loaded kbert model on the same text, one example at a time (a pair only when b is
    non-empty, as run_classifier.py packs), through BertPreprocessor."""
    import tensorflow as tf

    import kbert
    from kbert.text.graph_packer import BertPreprocessor

    model = kbert.load(model_dir)
    limit = model.config.max_position_embeddings
    pre = BertPreprocessor.for_model(model, min(model.task_info.get("max_seq_length", 128), limit))
    rows = []
    for i, text in enumerate(texts):
        b = texts_b[i] if texts_b else b""
        rows.append(pre((tf.constant([text]), tf.constant([b]))) if b else pre(tf.constant([text])))
    features = {k: np.concatenate([row[k].numpy() for row in rows]) for k in rows[0]}
    # A pretrained model serves its encoder's outputs; a classifier its head's logits.
    run = model.encoder if isinstance(model, kbert.BertPretrainer) else model
    outputs = run(features, training=False)
    return model, features, {k: np.asarray(v) for k, v in outputs.items()}


@pytest.fixture(scope="module")
def classifier_dir(tiny_classifier):
    """A tiny sentiment classifier fine-tuned on sentence pairs (so its signature takes `text_b`):
    the export must match whatever it learned."""
    return tiny_classifier


@pytest.fixture(scope="module")
def exports(tiny_encoder_export, tiny_classifier_export):
    """The encoder exported (version 1) and the classifier, exported from a copy of its directory
    that was deleted before anything read the export (conftest's shared exports)."""
    encoder_base, run = tiny_encoder_export
    classifier_base, _ = tiny_classifier_export
    return {
        "encoder_base": encoder_base,
        "run": run,
        "encoder": encoder_base / "1",
        "classifier": classifier_base / "1",
    }


@pytest.fixture(scope="module")
def references(exports, tiny_model_dir, classifier_dir):
    return {
        "encoder": kbert_reference(tiny_model_dir, TEXTS),
        "classifier": kbert_reference(classifier_dir, TEXTS, TEXTS_B),
    }


@pytest.fixture(scope="module")
def served(exports, references, tmp_path_factory):
    """Every signature of both exports, run in a fresh Python with only tensorflow(_text)."""
    work = tmp_path_factory.mktemp("served")
    spec = {
        "exports": {k: str(exports[k]) for k in ("encoder", "classifier")},
        "texts": [t.hex() for t in TEXTS],
        "texts_b": [t.hex() for t in TEXTS_B],
        "ids": {k: {name: v.tolist() for name, v in references[k][1].items()} for k in references},
    }
    return run_in_fresh_process(work, SERVE, spec)


def test_export_writes_the_tf_serving_layout(exports):
    # The next version of the same base: tests/serving/test_export_configs.py.
    base = exports["encoder_base"]
    assert sorted(os.listdir(base)) == ["1", "batching_parameters.txt", "models.config"]
    assert exports["run"]["version"] == 1 and exports["run"]["export"] == str(base / "1")
    for version in (exports["encoder"], exports["classifier"]):
        for name in ("saved_model.pb", "variables", "assets/vocab.txt", "assets.extra/tf_serving_warmup_requests"):
            assert os.path.exists(version / name), (version, name)
        assert not [n for n in os.listdir(version.parent) if n.startswith(".")]  # no temporary left
    vocab = (exports["classifier"] / "assets" / "vocab.txt").read_text().splitlines()
    assert len(vocab) == 300 and vocab[:1] == ["[PAD]"]
    config = (base / "models.config").read_text()
    assert 'name: "tiny_encoder"' in config and f'base_path: "{base}"' in config
    assert 'model_platform: "tensorflow"' in config
    batching = (base / "batching_parameters.txt").read_text()
    assert "max_batch_size { value: 32 }" in batching and "pad_variable_length_inputs: false" in batching
    assert f"num_batch_threads {{ value: {os.cpu_count()} }}" in batching


def _float_constants(saved_model_dir):
    """Shapes of the float constants of at least 8 values in a SavedModel's graph and functions."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((Path(saved_model_dir) / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    tensors = [
        n.attr["value"].tensor
        for n in nodes
        if n.op == "Const" and n.attr["dtype"].type in (types_pb2.DT_FLOAT, types_pb2.DT_BFLOAT16)
    ]
    shapes = [[d.size for d in t.tensor_shape.dim] for t in tensors]
    return [shape for shape in shapes if np.prod(shape) >= 8]


def _saved_variables(saved_model_dir):
    """Shapes of the values in a SavedModel's variables/ checkpoint."""
    import tensorflow as tf

    return [
        shape
        for name, shape in tf.train.list_variables(os.path.join(saved_model_dir, "variables", "variables"))
        if "OBJECT_GRAPH" not in name
    ]


def _export(model_dir, base, **options):
    from kbert.serving.export import export_model

    return Path(export_model(model_dir, base, version=1, **options))


@pytest.fixture(scope="module")
def constant_export(tmp_path_factory, tiny_model_dir):
    """`kbert export --constant-weights --precision bfloat16`, through the CLI."""
    base = tmp_path_factory.mktemp("constant") / "base"
    result = run_kbert("export", tiny_model_dir, base, "--constant-weights", "--precision", "bfloat16")
    assert json.loads(result.stdout)["constant_weights"] is True
    return base / "1"


@pytest.mark.parametrize("weights", ["variables", "constants"])
def test_the_export_holds_each_weight_once_and_q_k_v_as_one(weights, exports, constant_export, tiny_model_dir):
    """The saved values are the weights the signatures use, once each although four signatures
    use them: every layer's query, key and value as one concatenated kernel and bias (the one
    matmul the export runs) in place of the three, so as many numbers as the encoder has. They
    are variables, or with --constant-weights constants of the graph and no variables. Keras'
    ExportArchive once saved every variable twice (a BERT-base float32 export was 839 MiB)."""
    import kbert

    model = kbert.load(tiny_model_dir)
    H, layers = model.config.hidden_size, model.config.num_hidden_layers
    path = exports["encoder"] if weights == "variables" else constant_export
    saved, other = _saved_variables(path), _float_constants(path)
    if weights == "constants":
        saved, other = other, saved
    assert other == []
    assert sum(int(np.prod(shape)) for shape in saved) == sum(int(np.prod(w.shape)) for w in model.encoder.weights)
    assert saved.count([H, 3 * H]) == layers and saved.count([3 * H]) == layers


@pytest.mark.parametrize("weights", ["variables", "constants"])
def test_every_dense_layer_runs_as_one_matmul_kernel_and_layer_norm_as_few_ops(
    weights, exports, constant_export, tiny_model_dir
):
    """Run as TF Serving runs it (a session on the signature), every dense layer of the export is
    one matmul kernel: each layer's Q, K and V as one, the attention output, the two
    feed-forward layers, and the pooler. Where TensorFlow turns oneDNN on (CPUs with AVX-512 and
    up, or TF_ENABLE_ONEDNN_OPTS=1) each is oneDNN's matmul with its bias add (and GELU) fused,
    and with --constant-weights marked constant, so oneDNN keeps their reordered layout between
    calls. Every LayerNorm (the embeddings' and two per layer) is the few ops of
    `layer_norm_in_few_ops`, one Rsqrt each, and no batch norm is left."""
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port

    import kbert

    sys.path.insert(0, REFERENCE)
    from serving_session import ServingSession

    layers = kbert.load(tiny_model_dir).config.num_hidden_layers
    served = ServingSession(exports["encoder"] if weights == "variables" else constant_export)
    metadata = tf.compat.v1.RunMetadata()
    served.run({"text": TEXTS}, options=tf.compat.v1.RunOptions(output_partition_graphs=True), run_metadata=metadata)
    nodes = [n for g in metadata.partition_graphs for n in g.node]
    matmuls = [n for n in nodes if n.op.endswith("MatMul") and "Batch" not in n.op]
    # The constants export is bfloat16, which oneDNN runs only on CPUs with AVX-512 (TF leaves
    # bfloat16 matmuls to Eigen elsewhere).
    with open("/proc/cpuinfo") as f:
        avx512 = "avx512f" in f.read()
    if _pywrap_util_port.IsMklEnabled() and (weights == "variables" or avx512):
        assert [n.op for n in matmuls] == ["_MklNativeFusedMatMul"] * (4 * layers + 1)
        assert [n.attr["is_filter_const"].b for n in matmuls] == [weights == "constants"] * len(matmuls)
    else:  # Eigen's kernels: the bias fused, the erf GELU after it
        assert len(matmuls) == 4 * layers + 1 and {n.op for n in matmuls} <= {"_FusedMatMul", "MatMul"}
    assert [n.op for n in nodes if n.op == "Rsqrt"] == ["Rsqrt"] * (2 * layers + 1)
    assert [n.op for n in nodes if "BatchNorm" in n.op or "LayerNorm" in n.op] == []


def test_weights_too_large_for_constants_stay_variables(tiny_model_dir, constant_export, tmp_path, monkeypatch):
    """Past CONSTANT_WEIGHTS_MAX_BYTES (a GraphDef can't pass 2 GiB) --constant-weights keeps
    variables, once each, and the outputs are those of the export with constants."""
    import tensorflow as tf

    import kbert
    from kbert.serving import optimize

    monkeypatch.setattr(optimize, "CONSTANT_WEIGHTS_MAX_BYTES", 1000)
    path = _export(tiny_model_dir, tmp_path / "base", precision="bfloat16", constant_weights=True)
    model = kbert.load(tiny_model_dir)
    saved = _saved_variables(path)
    assert sum(int(np.prod(shape)) for shape in saved) == sum(int(np.prod(w.shape)) for w in model.encoder.weights)
    assert _float_constants(path) == []
    texts = tf.constant(["the dog runs.", "a much longer text about a cat that sleeps all day long"])
    with_variables = tf.saved_model.load(str(path)).signatures["serving_default"](text=texts)
    with_constants = tf.saved_model.load(str(constant_export)).signatures["serving_default"](text=texts)
    for key in with_constants:
        np.testing.assert_allclose(with_variables[key].numpy(), with_constants[key].numpy(), rtol=0, atol=1e-5)


def test_existing_version_is_a_one_line_error(exports, tiny_model_dir):
    result = run_kbert("export", tiny_model_dir, exports["encoder_base"], "--version", "1", check=False)
    assert_user_error(result, "already exists", "--overwrite", "(2)")


def test_fresh_process_needs_no_kbert_or_keras(served):
    assert served["modules"] == []
    assert served["encoder"]["signatures"] == ["serve_examples", "serve_ids", "serving_default"]
    assert served["classifier"]["signatures"] == ["classify", "serve_examples", "serve_ids", "serving_default"]
    assert served["encoder"]["pairs"] is False and served["classifier"]["pairs"] is True


def test_encoder_serving_default_matches_kbert(served, references):
    # The reference runs every text padded to the 64 positions; the export runs the batch cut to
    # its longest text (64 here: one text is truncated at 64). Equal on every real token.
    _, features, expected = references["encoder"]
    out = served["encoder"]["serving_default"]
    assert sorted(out) == ["input_mask", "pooled_output", "sequence_output"]
    np.testing.assert_array_equal(out["input_mask"], features["input_mask"])
    np.testing.assert_allclose(out["pooled_output"], expected["pooled_output"], atol=1e-5)
    sequence, real = np.asarray(out["sequence_output"]), features["input_mask"].astype(bool)
    assert sequence.shape == (len(TEXTS), 64, 64)
    np.testing.assert_allclose(sequence[real], expected["sequence_output"][real], atol=1e-5)


def test_a_batch_runs_on_its_longest_text_rounded_up_to_8(exports, tiny_model_dir):
    """Two texts of 6 and 13 tokens ([CLS] and [SEP] included) run at 16 positions, not 64:
    positions 6-15 of the shorter text are the model's outputs for padding (computed), 16-63 of
    both are zeros (not computed), and the real tokens and pooled outputs are the padded run's."""
    import tensorflow as tf

    import kbert
    from kbert.text.graph_packer import BertPreprocessor

    texts = tf.constant(["gold glorious great.", "gold glorious great. dead dust the dread. gold."])
    out = tf.saved_model.load(str(exports["encoder"])).signatures["serving_default"](text=texts)
    features = BertPreprocessor.for_model(tiny_model_dir, 64)(texts)
    assert features["input_mask"].numpy().sum(-1).tolist() == [6, 13]
    padded = kbert.load(tiny_model_dir).encoder(features, training=False)
    sequence = out["sequence_output"].numpy()
    assert sequence.shape == (2, 64, 64) and not sequence[:, 16:].any()
    assert np.abs(sequence[0, 6:16]).min() > 0
    # Past a text, the cut run's padding outputs differ from the padded run's (they attend to fewer
    # padding positions), which is why they are not part of what the signature promises.
    np.testing.assert_allclose(sequence[0, :6], padded["sequence_output"].numpy()[0, :6], atol=1e-5)
    np.testing.assert_allclose(sequence[1, :13], padded["sequence_output"].numpy()[1, :13], atol=1e-5)
    np.testing.assert_allclose(out["pooled_output"], padded["pooled_output"], atol=1e-5)


def test_a_large_batch_runs_in_groups_of_similar_length_in_the_request_order(exports, tiny_model_dir):
    """20 texts, 12 short (6 tokens) and 8 long (47), shuffled: sorted by length and run 8 at a
    time, the 8 shortest run at 8 positions (zeros past them) while the long ones run at 48; every
    row comes back where the request had it, equal to the padded run on its real tokens."""
    import tensorflow as tf

    import kbert
    from kbert.serving.optimize import GROUP_ROWS
    from kbert.text.graph_packer import BertPreprocessor

    assert GROUP_ROWS == 8
    short, long = "gold glorious great.", " ".join(["gold glorious great. dead dust the dread."] * 5)
    texts = [short] * 12 + [long] * 8
    order = np.random.default_rng(0).permutation(len(texts))
    texts = tf.constant([texts[i] for i in order])
    out = tf.saved_model.load(str(exports["encoder"])).signatures["serving_default"](text=texts)
    features = BertPreprocessor.for_model(tiny_model_dir, 64)(texts)
    lengths = features["input_mask"].numpy().sum(-1)
    assert sorted(set(lengths.tolist())) == [6, 47]
    padded = kbert.load(tiny_model_dir).encoder(features, training=False)
    sequence = out["sequence_output"].numpy()
    computed = (np.abs(sequence).sum(-1) > 0).sum(-1)  # positions run for each row
    # The first 8 short texts in the sorted order (a stable sort keeps the request's order).
    first_group = [i for i in range(len(order)) if lengths[i] == 6][:GROUP_ROWS]
    assert sorted(np.flatnonzero(computed == 8).tolist()) == first_group
    assert (computed[lengths == 47] == 48).all() and sorted(set(computed.tolist())) == [8, 48]
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(sequence[row, :length], padded["sequence_output"].numpy()[row, :length], atol=1e-5)
    np.testing.assert_allclose(out["pooled_output"], padded["pooled_output"], atol=1e-5)
    np.testing.assert_array_equal(out["input_mask"], features["input_mask"])


def test_classifier_serves_probabilities_and_labels(served, references):
    model, _, expected = references["classifier"]
    out = served["classifier"]["serving_default"]
    assert sorted(out) == ["label", "label_id", "probabilities"]
    logits = expected["logits"]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    np.testing.assert_allclose(out["probabilities"], probabilities, atol=1e-5)
    assert out["label_id"] == probabilities.argmax(-1).tolist()
    assert out["label"] == [model.task_info["labels"][i] for i in out["label_id"]]
    assert set(out["label"]) <= {"neg", "pos"}


@pytest.mark.parametrize("kind", ["encoder", "classifier"])
def test_serve_ids_equals_serving_default(served, kind):
    # The ids are BertPreprocessor's for TEXTS, so the answers are serving_default's (which other
    # tests compare with kbert's model).
    by_ids, by_text = served[kind]["serve_ids"], served[kind]["serving_default"]
    assert sorted(by_ids) == sorted(by_text)
    for name in by_text:
        if name in ("label", "label_id", "input_mask"):
            assert by_ids[name] == by_text[name], name
        else:
            np.testing.assert_allclose(by_ids[name], by_text[name], atol=1e-4)


@pytest.mark.parametrize("kind", ["encoder", "classifier"])
def test_serve_examples_equals_serving_default(served, kind):
    by_text, by_example = served[kind]["serving_default"], served[kind]["serve_examples"]
    assert sorted(by_text) == sorted(by_example)
    for name in by_text:
        if isinstance(by_text[name][0], str) or name in ("label_id", "input_mask"):
            assert by_example[name] == by_text[name], name
        else:
            np.testing.assert_allclose(by_example[name], by_text[name], atol=1e-5)


def test_classify_signature_gives_every_label_and_its_score(served, exports):
    by_text, classified = served["classifier"]["serving_default"], served["classifier"]["classify"]
    assert sorted(classified) == ["classes", "scores"]
    assert classified["classes"] == [["neg", "pos"]] * len(TEXTS)
    np.testing.assert_allclose(classified["scores"], by_text["probabilities"], atol=1e-6)
    assert exports["run"]["serving_default_inputs"] == ["text"]  # an encoder: single texts
    assert exports["run"]["signatures"] == {
        "serve_examples": "tensorflow/serving/predict",
        "serve_ids": "tensorflow/serving/predict",
        "serving_default": "tensorflow/serving/predict",
    }


def test_bad_requests_give_defined_outputs(served, references):
    encoder, classifier = served["encoder"], served["classifier"]
    mask = np.asarray(encoder["serving_default"]["input_mask"])
    assert mask[2].sum() == 2  # "" -> [CLS] [SEP]
    assert mask[3].sum() == 64  # 5,000 words truncated to the 64 positions
    _, features, _ = references["encoder"]
    # The invalid bytes are dropped: the same ids as the clean text.
    assert features["input_ids"][4].tolist() == features["input_ids"][0].tolist()
    np.testing.assert_allclose(
        encoder["serving_default"]["pooled_output"][4], encoder["serving_default"]["pooled_output"][0], atol=1e-6
    )
    assert np.isfinite(np.asarray(classifier["serving_default"]["probabilities"])).all()
    assert encoder["empty_batch"] == {"input_mask": [0, 64], "pooled_output": [0, 64], "sequence_output": [0, 64, 64]}
    assert classifier["empty_batch"] == {"label": [0], "label_id": [0], "probabilities": [0, 2]}


def test_warmup_requests_run_against_the_export(exports, classifier_dir):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    import kbert
    from kbert.text.graph_packer import BertPreprocessor

    path = str(exports["classifier"] / "assets.extra" / "tf_serving_warmup_requests")
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    assert len(logs) == 3
    signature = tf.saved_model.load(str(exports["classifier"])).signatures["serving_default"]
    model = kbert.load(str(classifier_dir))
    pack = BertPreprocessor.for_model(model)
    for log in logs:
        request = log.predict_log.request
        assert request.model_spec.name == "sentiment" and request.model_spec.signature_name == "serving_default"
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        assert sorted(inputs) == ["text", "text_b"]
        out = signature(**inputs)
        assert out["probabilities"].shape == (inputs["text"].shape[0], 2)
        # As the padded run (every text at max_seq_length): TF Serving's warmup runs this graph.
        features = pack((inputs["text"], inputs["text_b"]))
        np.testing.assert_allclose(
            out["probabilities"], tf.nn.softmax(model(features, training=False)["logits"]), atol=1e-5
        )


def test_saved_model_cli_lists_and_runs_the_signatures(exports):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    shown = subprocess.run(
        [cli, "show", "--dir", str(exports["classifier"]), "--all"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    for name in ("serving_default", "serve_ids", "serve_examples"):
        assert f"signature_def['{name}']" in shown.stdout
    assert "tensorflow/serving/predict" in shown.stdout
    # The Classify API's signature has its own method name, which TF Serving checks.
    assert (
        "signature_def['classify']:\n  The given SavedModel SignatureDef contains the following input(s):\n"
        "    inputs['inputs'] tensor_info:" in shown.stdout
    )
    assert "Method name is: tensorflow/serving/classify" in shown.stdout
    # `run` imports the graph, so the tf.text ops must be registered first: the plain script
    # cannot (TF Serving links them into tensorflow_model_server), so run its main after
    # importing tensorflow_text.
    with_text_ops = [
        sys.executable,
        "-c",
        "import sys, tensorflow_text; from tensorflow.python.tools."
        "saved_model_cli import main; sys.argv[0] = 'saved_model_cli'; sys.exit(main())",
    ]
    run = subprocess.run(
        [
            *with_text_ops,
            "run",
            "--dir",
            str(exports["classifier"]),
            "--tag_set",
            "serve",
            "--signature_def",
            "serve_ids",
            "--input_exprs",
            "input_ids=[[2,5,6,3]];input_mask=[[1,1,1,1]];segment_ids=[[0,0,0,0]]",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "probabilities" in run.stdout and "label_id" in run.stdout


def test_non_finite_outputs_fail_the_request(tiny_model_dir, tmp_path):
    # A regressor whose pooler weights are NaN: its score must fail the request, not be served.
    import tensorflow as tf

    import kbert
    from kbert.serving.export import export_model

    model = kbert.bert_classifier(kbert.load(tiny_model_dir), 1)
    model.task_info = {"task": "regress", "max_seq_length": 8}
    model.encoder.pooler.set_weights([np.full_like(w, np.nan) for w in model.encoder.pooler.get_weights()])
    kbert.save(model, tmp_path / "broken")
    path = export_model(tmp_path / "broken", tmp_path / "base")
    assert path == str(tmp_path / "base" / "1")
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["serving_default"]
    assert sorted(signature.structured_outputs) == ["score"]
    from kbert.serving.export import exported_signatures

    assert exported_signatures(path)["regress"] == "tensorflow/serving/regress"
    assert sorted(signature.structured_input_signature[1]) == ["text", "text_b"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-finite values in output score"):
        signature(text=tf.constant(["gold."]), text_b=tf.constant([""]))
    example = tf.train.Example(
        features=tf.train.Features(feature={"text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"gold."]))})
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-finite values in output score"):
        loaded.signatures["regress"](inputs=tf.constant([example.SerializeToString()]))


def test_tagger_serves_a_label_per_token(tiny_model_dir, tmp_path):
    import tensorflow as tf

    import kbert
    from kbert.serving.export import export_model
    from kbert.text.graph_packer import BertPreprocessor

    base = kbert.load(tiny_model_dir)
    model = kbert.bert_tagger(base, 3)
    model.task_info = {"task": "tag", "labels": ["B", "I", "O"], "max_seq_length": 8}
    kbert.save(model, tmp_path / "tagger")
    signature = tf.saved_model.load(export_model(tmp_path / "tagger", tmp_path / "base")).signatures
    texts = tf.constant(["gold glorious great.", "dead."])
    out = signature["serving_default"](text=texts)
    assert sorted(out) == ["input_mask", "label", "label_id", "word_label"]
    features = BertPreprocessor(base.vocab_file, True, 8)(texts)
    # The batch's longest text (6 tokens) rounds up to 8, all of max_seq_length: the padded run.
    expected = model(features, training=False)["logits"].numpy().argmax(-1)
    assert out["label_id"].numpy().tolist() == expected.tolist()
    assert out["label"].numpy().astype(str).tolist() == [["BIO"[i] for i in row] for row in expected]
    np.testing.assert_array_equal(out["input_mask"].numpy(), features["input_mask"].numpy())
    # One tag per whitespace word, read at its first WordPiece ("great." is "great" "."), "" past
    # a sentence's words; serve_ids, without words, gives the per-token outputs only.
    tags = [["BIO"[i] for i in row] for row in expected]
    assert out["word_label"].numpy().astype(str).tolist() == [
        [tags[0][1], tags[0][2], tags[0][3]],
        [tags[1][1], "", ""],
    ]
    assert sorted(signature["serve_ids"](**{k: tf.constant(v) for k, v in features.items()})) == [
        "input_mask",
        "label",
        "label_id",
    ]


def test_bfloat16_export_is_close_to_float32_and_half_the_size(tiny_model_dir, exports, tmp_path):
    import tensorflow as tf

    from kbert.serving.export import export_model

    texts = tf.constant(["gold glorious great.", "dead dust the dread.", ""])
    out = {}
    paths = {
        "float32": str(exports["encoder"]),
        "bfloat16": export_model(tiny_model_dir, tmp_path / "bfloat16", precision="bfloat16"),
    }
    for precision, path in paths.items():
        loaded = tf.saved_model.load(path)
        out[precision] = loaded.signatures["serving_default"](text=texts)
        size = sum(
            os.path.getsize(os.path.join(path, "variables", n)) for n in os.listdir(os.path.join(path, "variables"))
        )
        out[precision + "_size"] = size
    for name in ("pooled_output", "sequence_output"):
        assert out["bfloat16"][name].dtype == tf.float32  # served as float32 either way
        difference = np.abs(out["bfloat16"][name].numpy() - out["float32"][name].numpy()).max()
        assert 0 < difference < 0.1, (name, difference)
    np.testing.assert_array_equal(out["bfloat16"]["input_mask"], out["float32"]["input_mask"])
    # The weights are stored in bfloat16: about half the bytes.
    assert out["bfloat16_size"] < 0.6 * out["float32_size"], (out["bfloat16_size"], out["float32_size"])
