"""Every block of README.md runs as written, or is listed here with the reason it cannot
(`NOT_RUN`); so does every Python block of docs/conversion.md. Python blocks run each in a fresh
Python in a directory of its own; shell blocks run their `kbert` lines in order in a directory of
their own, with the few changes `SHELL_CHANGES` lists, each with its reason (a tiny model, a few
steps).

The blocks name what a reader has at hand (`bert_config.json`, `uncased_L-12_H-768_A-12/`,
`vocab.txt`, `bert-base`, `OUT`, a TF Serving at localhost): each block's directory holds small
real things under those names, made here from the fixtures, so the text of a block runs
unchanged. The only changes are the two that cannot be files: the Client block's addresses
(the stand-in TF Serving's free ports for localhost:8500/8501) and the data the model.fit block
leaves to its reader (`texts`, `labels`), set in front of it. A block runs as an interactive
session shows it: statements in order, and the value of each bare expression printed, which the
tests compare with what the README's comments say.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, TINY, UNCASED_VOCAB, run_kbert
from helpers import sentiment_rows, start_standin_server, write_tsv

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


# Each shell block of the README (and its synopsis of the convert commands), by a line only it has.
SHELL_MARKERS = {
    "two-commands": "make quickstart",
    "pretraining": "kbert create-data --input corpus.txt",
    "fine-tuning": "kbert finetune MODEL_DIR --task classify",
    "converting": "kbert convert inspect SRC",
    "serving": "kbert export out/clf exports/sentiment",
    "modernbert": "kbert convert from-hf ModernBERT-base out/modernbert",
}

# What of the README's blocks does not run here, and why.
NOT_RUN = {
    "make test": "it runs the whole suite, this test among it",
    "make quickstart": "scripts/quickstart.sh runs nine kbert processes, minutes of this machine, and writes "
    "quickstart-out/ in the checkout; run it by hand",
    "converting": "a synopsis of the convert commands' arguments (SRC, OUT_MODEL_DIR), not commands; each command "
    "runs in tests/converters/",
    "tensorflow_model_server": "the binary cannot be installed here: the stand-in (tests/serving/standin_server.py) "
    "serves the same models.config in its place",
}

# The changes a shell block's lines get here, (block, as written, as run) with the reason for each.
SHELL_CHANGES = [
    # A tiny model (bert_config.json is tf1-tiny's) trains 2 steps, not 100,000.
    ("pretraining", "--steps 100000 --batch-size 256", "--steps 2 --batch-size 4"),
    # The run above finished: --resume continues it only to more steps. (A stopped run's bit-for-bit
    # resume is tests/pretraining/'s.)
    (
        "pretraining",
        "kbert pretrain --model-dir out/bert --resume",
        "kbert pretrain --model-dir out/bert --resume --steps 3",
    ),
]


def all_blocks(page=PAGES[0]) -> list:
    """(language, text) of every fenced block of a page."""
    with open(page, encoding="utf-8") as f:
        return re.findall(r"^```(\w*)\n(.*?)^```", f.read(), flags=re.M | re.S)


def shell_block(name: str) -> str:
    (found,) = [text for language, text in all_blocks() if language != "python" and SHELL_MARKERS[name] in text]
    return found


def shell_commands(name: str) -> list:
    """The block's commands as argv lists: continued lines joined, comments dropped, the `[--flag]`
    of an optional flag run as given, and SHELL_CHANGES made."""
    text = shell_block(name).replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        for block, written, run in SHELL_CHANGES:
            line = line.replace(written, run) if block == name else line
        words = shlex.split(re.sub(r"\[(--[^\]]*)\]", r"\1", line), comments=True)
        if words:
            commands.append(words)
    return commands


def run_shell_block(name: str, cwd, monkeypatch, skip=()) -> dict:
    """Run the block's kbert commands in order in `cwd`; returns {the command's first words: its stdout}."""
    monkeypatch.chdir(cwd)
    printed = {}
    for words in shell_commands(name):
        if words[0] in skip:
            continue
        assert words[0] == "kbert", words  # every other command is listed in NOT_RUN
        printed[" ".join(words[:3])] = run_kbert(*words[1:]).stdout
    return printed


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
    """A new block in the README (or Python block in docs/conversion.md) needs its inputs made here, or
    its reason in NOT_RUN, so it fails this first."""
    names = [[name for name, marker in MARKERS.items() if marker in code] for code in python_blocks()]
    assert sorted(n for found in names for n in found) == sorted(MARKERS)
    assert all(len(found) == 1 for found in names), names
    others = [text for language, text in all_blocks() if language != "python"]
    names = [[name for name, marker in SHELL_MARKERS.items() if marker in text] for text in others]
    assert sorted(n for found in names for n in found) == sorted(SHELL_MARKERS)
    assert all(len(found) == 1 for found in names), names
    # A shell block's commands run here (kbert, and curl against the stand-in), or say why not.
    for name in set(SHELL_MARKERS) - set(NOT_RUN):
        for words in shell_commands(name):
            assert words[0] in ("kbert", "curl") or words[0] in NOT_RUN or " ".join(words) in NOT_RUN, (name, words)


def test_pretraining_block(tmp_path, monkeypatch):
    sample = os.path.join(FIXTURES, "sample_text.txt")
    shutil.copy(sample, tmp_path / "corpus.txt")
    # A domain's words, seen often enough (--min-count) for `extend --corpus` to choose them.
    (tmp_path / "debian.txt").write_text(open(sample).read() + "\n" + "the daemon restarts systemd units.\n" * 6)
    vocab, *rest = shell_commands("pretraining")
    monkeypatch.chdir(tmp_path)
    run_kbert(*vocab[1:])
    # As the text after the block says, a new model's vocab_size is its vocab.txt's line count; its
    # positions hold create-data's 128-token records.
    config = json.loads(open(os.path.join(TINY, "bert_config.json")).read())
    size = len((tmp_path / "vocab.txt").read_text().splitlines())
    (tmp_path / "bert_config.json").write_text(json.dumps(dict(config, vocab_size=size, max_position_embeddings=128)))
    printed = [json.loads(run_kbert(*words[1:]).stdout.splitlines()[-1]) for words in rest]
    made, trained, resumed, longer, more_words, filled = printed
    assert sorted(os.path.basename(f) for f in made["output_files"]) == [
        f"train.tfrecord-{i:05d}-of-00004" for i in range(4)
    ]
    assert trained["step"] == 2 and trained["mixed_precision"] == "mixed_bfloat16"
    assert resumed["step"] == 3 and resumed["resumed_from"] == 2
    assert longer["max_position_embeddings"] == {"from": 128, "to": 1024}
    assert "systemd" in more_words["new_words"]["words"]
    assert filled["masks"][0]["predictions"]


def test_modernbert_block(tmp_path, monkeypatch):
    """The ModernBERT block on a transformers ModernBertForMaskedLM of random weights (no download
    here), saved with a byte-level BPE tokenizer.json, in the block's ModernBERT-base folder."""
    from test_modernbert import CONFIGS, make_hf_folder, train_tokenizer

    make_hf_folder(tmp_path / "ModernBERT-base", train_tokenizer(), **CONFIGS["masked_lm"])
    for name, seed in (("train.tsv", 0), ("dev.tsv", 1)):
        write_tsv(tmp_path / name, sentiment_rows(32, seed))
    write_tsv(tmp_path / "new.tsv", [(text,) for text, _ in sentiment_rows(4, 3)], header=("text",))
    printed = run_shell_block("modernbert", tmp_path, monkeypatch)
    assert json.loads(printed["kbert convert from-hf"])["family"] == "modernbert"
    assert "accuracy" in json.loads(printed["kbert finetune out/modernbert"])
    rows = [json.loads(line) for line in printed["kbert predict out/modernbert-clf"].splitlines()]
    assert len(rows) == 4 and all(sorted(row["probabilities"]) == ["neg", "pos"] for row in rows)
    exported = json.loads(printed["kbert export out/modernbert-clf"])
    assert exported["serving_default_inputs"] == ["text"]


def test_fine_tuning_and_serving_blocks(tmp_path, monkeypatch, tiny_model_dir):
    """The fine-tuning block, then the serving block on the single-text classifier it made: its export
    takes `text` only, as the curl line sends."""
    os.symlink(tiny_model_dir, tmp_path / "MODEL_DIR")  # "any model kbert reads"
    for name, seed in (("train.tsv", 0), ("dev.tsv", 1), ("test.tsv", 2)):
        write_tsv(tmp_path / name, sentiment_rows(32, seed))
    write_tsv(tmp_path / "new.tsv", [(text,) for text, _ in sentiment_rows(4, 3)], header=("text",))
    printed = run_shell_block("fine-tuning", tmp_path, monkeypatch)
    assert "accuracy" in json.loads(printed["kbert finetune MODEL_DIR"])
    rows = [json.loads(line) for line in printed["kbert predict out/clf"].splitlines()]
    assert len(rows) == 4 and all(sorted(row["probabilities"]) == ["neg", "pos"] for row in rows)
    assert {"accuracy", "macro_f1", "mcc"} <= set(json.loads(printed["kbert evaluate out/clf"]))

    export, server, curl = shell_commands("serving")
    assert server[0] == "tensorflow_model_server"  # NOT_RUN: the stand-in serves the same models.config
    exported = json.loads(run_kbert(*export[1:]).stdout)
    assert exported["serving_default_inputs"] == ["text"]  # fine-tuned on single texts
    process, ready = start_standin_server([exported["model_config_file"]], tmp_path / "server.log")
    try:
        curl = [w.replace("localhost:8501", f"127.0.0.1:{ready['rest_port']}") for w in curl]
        answer = subprocess.run(curl, capture_output=True, text=True, timeout=60)
    finally:
        process.terminate()
        process.wait(timeout=30)
    outputs = json.loads(answer.stdout)["outputs"]
    assert outputs["label"][0] in ("neg", "pos") and len(outputs["probabilities"][0]) == 2, answer.stdout


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
