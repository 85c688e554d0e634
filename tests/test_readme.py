"""Every Python block of README.md and docs/conversion.md runs as written, each in a fresh Python in a
directory of its own.

The blocks name what a reader has at hand (`bert_config.json`, `uncased_L-12_H-768_A-12/`,
`vocab.txt`, `bert-base`, `OUT`, a TF Serving at localhost): each block's directory holds small
real things under those names, made here from the fixtures, so the text of a block runs
unchanged. The only changes are the two that cannot be files: the Client block's addresses
(the stand-in TF Serving's free ports for localhost:8500/8501) and the data the model.fit block
leaves to its reader (`texts`, `labels`), set in front of it. A block runs as an interactive
session shows it: statements in order, and the value of each bare expression printed, which the
tests compare with what the README's comments say.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import TINY, UNCASED_VOCAB, run_kbert
from helpers import start_standin_server

pytestmark = pytest.mark.slow  # a fresh Python per block, exports and a server: about 2 minutes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README, and the page that took its TF Hub and keras-hub examples.
PAGES = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "conversion.md")]

# Runs a block as an interactive session does: each statement in order, and the value of a bare
# expression printed (one line each, after "=> "). Tracebacks keep the block's line numbers.
SESSION = r"""
import ast, sys
path = sys.argv[1]
tree = ast.parse(open(path, encoding="utf-8").read(), path)
namespace = {"__name__": "__main__"}
for node in tree.body:
    if isinstance(node, ast.Expr):
        value = eval(compile(ast.Expression(node.value), path, "eval"), namespace)
        print("=> " + " ".join(repr(value).split()), flush=True)
    else:
        exec(compile(ast.Module([node], []), path, "exec"), namespace)
"""

# Each block, by a line only it has (tfhub-* and keras-hub are in docs/conversion.md). The model-fit
# block runs on each Keras backend in tests/model/test_backends.py.
MARKERS = {
    "python-api": 'kbert.BertConfig.from_json_file("bert_config.json")',
    "tfhub-tf-keras": 'hub.KerasLayer("OUT/preprocessor")',
    "tfhub-keras-3": 'keras.layers.TFSMLayer("OUT/encoder"',
    "keras-hub": 'keras_hub.models.BertBackbone.from_preset("OUT")',
    "model-fit": "kbert.bert_classifier(pretrained, num_classes=2,",
    "client": "from kbert.serving import Client",
}


def python_blocks() -> list:
    blocks = []
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            blocks += re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.M | re.S)
    return blocks


def block(name: str) -> str:
    (found,) = [b for b in python_blocks() if MARKERS[name] in b]
    return found


def run_block(code: str, cwd) -> list:
    """Run `code` in a fresh Python in `cwd`; returns the printed values of its bare expressions."""
    (cwd / "block.py").write_text(code, encoding="utf-8")
    (cwd / "session.py").write_text(SESSION, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "session.py", "block.py"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return [line[3:] for line in result.stdout.splitlines() if line.startswith("=> ")]


def small_real_vocab_bert(path, max_positions=128):
    """A one-layer BERT on the real 30,522-token uncased vocabulary (random weights), saved as a
    kbert model directory: where a block uses real token ids or 128 positions."""
    import kbert

    config = kbert.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
    )
    kbert.save(kbert.bert_pretrainer(config), path, vocab_file=UNCASED_VOCAB, do_lower_case=True)
    return path


def test_every_block_is_run_here():
    """A new Python block in the README or docs/conversion.md needs its inputs made here, so it fails this first."""
    names = [[name for name, marker in MARKERS.items() if marker in code] for code in python_blocks()]
    assert sorted(n for found in names for n in found) == sorted(MARKERS)
    assert all(len(found) == 1 for found in names), names


def test_python_api_block(tmp_path):
    shutil.copy(os.path.join(TINY, "bert_config.json"), tmp_path)
    shutil.copytree(TINY, tmp_path / "uncased_L-12_H-768_A-12")
    shutil.copy(UNCASED_VOCAB, tmp_path / "vocab.txt")
    values = run_block(block("python-api"), tmp_path)
    # kbert.save and save_tf1_checkpoint return their paths; the tokenizer's comment is right, and
    # the graph tokenizer gives the same ids.
    assert values == [
        "'bert-base'",
        "'bert-base-tf1'",
        "['hello', ',', 'world', '!']",
        "<tf.RaggedTensor [[7592, 1010, 2088, 999]]>",
    ]
    assert (tmp_path / "bert-base" / "model.weights.h5").is_file()
    assert (tmp_path / "bert-base-tf1" / "bert_model.ckpt.index").is_file()


@pytest.mark.parametrize("name", ["tfhub-tf-keras", "tfhub-keras-3"])
def test_tfhub_blocks(name, tmp_path, tiny_hub_export):
    base, _ = tiny_hub_export
    os.symlink(base / "hub", tmp_path / "OUT")
    assert run_block(block(name), tmp_path) == []  # assignments only: that they run is the test


def test_keras_hub_block(tmp_path, tiny_model_dir):
    run_kbert("convert", "to-keras-hub", tiny_model_dir, tmp_path / "OUT")
    values = run_block(block("keras-hub"), tmp_path)
    assert len(values) == 1 and values[0].startswith("array([[") and values[0].endswith("dtype=float32)")
    assert values[0].count("[") == 3  # [2 texts, 3 classes]


def test_client_block(tmp_path):
    import kbert
    from kbert.serving.export import export_model

    classifier = kbert.bert_classifier(kbert.load(small_real_vocab_bert(tmp_path / "bert")), 2)
    classifier.task_info = {"task": "classify", "labels": ["neg", "pos"], "max_seq_length": 16, "text_pairs": False}
    kbert.save(classifier, tmp_path / "classifier")
    export = export_model(tmp_path / "classifier", tmp_path / "exports" / "sentiment")
    process, ready = start_standin_server(
        [os.path.join(os.path.dirname(export), "models.config")], tmp_path / "server.log"
    )
    try:
        code = (
            block("client")
            .replace('"localhost:8500"', f'"127.0.0.1:{ready["grpc_port"]}"')
            .replace('"http://localhost:8501"', f'"http://127.0.0.1:{ready["rest_port"]}"')
        )
        values = run_block(code, tmp_path)
    finally:
        process.terminate()
        process.wait(timeout=30)
    default, classify, ids = values
    assert default.startswith("{'label': array(['") and "'probabilities': array([[" in default
    assert re.fullmatch(r"\[\[\('neg', [0-9.e-]+\), \('pos', [0-9.e-]+\)\]\]", classify), classify
    assert ids.startswith("{'label': array(['")
