"""Every command, every path and number option, every generic bad value: one line, exit 1.

The cases are derived from the typer app itself: each command's declared inputs and outputs
(kbert.cli.frame.command) and its number options' declared ranges. A command added without a
valid invocation below, a path parameter not declared to the frame, or a number option with
neither a range nor a reason to take any value, fails `test_the_sweep_covers_every_command`.

Each case asserts: exit status 1, one line on stderr that starts `kbert: error:` and names
no option its command lacks, no traceback, nothing on stdout, and not one file or directory
added or changed anywhere under
the test's tree. The frame checks run before TensorFlow does any work, so each case takes a
fraction of a second in-process. An unwritable output (a mode-555 folder, for a process without
root's override) is refused naming the folder, in a process where TensorFlow cannot be imported.
"""

import inspect
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, TINY, UNCASED_VOCAB, run_kbert
from kbert.cli.frame import option_name
from kbert.cli.main import app
from test_help import foreign_flags

# A valid invocation of each command over the tree `tree()` makes (T is its root). The sweep
# changes one parameter of it at a time.
VALID = {
    "create-data": "--input T/text.txt --vocab T/vocab.txt --output T/out/data.tfrecord",
    "vocab": "--input T/text.txt --output T/out/vocab.txt",
    "pretrain": "--model-dir T/out/run --data T/data.tfrecord --config T/model/bert_config.json --vocab T/model/vocab.txt",
    "fill-mask": "T/model the_[MASK]",
    "finetune": "T/model --task classify --train T/train.tsv --dev T/dev.tsv --output T/out/ft",
    "predict": "T/model --input T/train.tsv --output T/out/predictions.jsonl",
    "evaluate": "T/model --input T/train.tsv",
    "embed": "T/model --input T/text.txt --output T/out/embeddings.jsonl --pooling mean",
    "rerank": "T/reranker --input T/candidates.jsonl --output T/out/reranked.jsonl",
    "export": "T/model T/out/export",
    "extend": "T/model T/out/extended --max-position-embeddings 128 --words T/words.txt --corpus T/text.txt --max-new 2",
    "convert from-tf1": "T/model T/out/converted --config T/model/bert_config.json --vocab T/model/vocab.txt",
    "convert to-tf1": "T/model T/out/tf1",
    "convert from-hf": "T/hf T/out/from-hf",
    "convert to-hf": "T/model T/out/hf",
    "convert from-tfhub": "T/hub/encoder T/out/from-hub --preprocessor T/hub/preprocessor",
    "convert to-keras-hub": "T/model T/out/keras-hub",
    "convert from-keras-hub": "T/keras-hub T/out/from-keras-hub",
    "convert inspect": "T/model",
}

# Number options that take any value, and why. Every other number option declares its range.
ANY_NUMBER = {
    "null_score_diff_threshold": "squad v2's threshold is a difference of scores, negative or not",
}

# str options that hold paths (typer has no Path type for globs and gs:// URLs).
PATH_NAMES = {"input", "more_inputs", "output", "data", "eval_data", "corpus"}


def commands():
    """{"convert from-tf1": callback, ...} for every command of the app."""
    found = {info.name: info.callback for info in app.registered_commands}
    for group in app.registered_groups:
        for info in group.typer_instance.registered_commands:
            found[f"{group.name} {info.name}"] = info.callback
    return found


def _annotation_is(annotation, kinds) -> bool:
    args = typing.get_args(annotation)
    return annotation in kinds or any(_annotation_is(a, kinds) for a in args)


def test_the_sweep_covers_every_command():
    found = commands()
    assert set(found) == set(VALID), "give each command a valid invocation in VALID"
    for name, callback in found.items():
        assert hasattr(callback, "inputs"), f"{name} is not declared with kbert.cli.frame.command"
        declared = set(callback.inputs) | set(callback.outputs)
        for parameter in inspect.signature(callback, eval_str=True).parameters.values():
            if _annotation_is(parameter.annotation, (Path,)) or parameter.name in PATH_NAMES:
                assert parameter.name in declared, f"{name}: declare {parameter.name} as an input or output"
            if _annotation_is(parameter.annotation, (int, float)):
                info = parameter.default
                assert info.min is not None or info.max is not None or parameter.name in ANY_NUMBER, (
                    f"{name} --{parameter.name}: declare its range (typer.Option(min=...)) or list it in ANY_NUMBER"
                )


def _elf_head() -> bytes:
    """The first 17 kB of a real executable: mostly valid UTF-8, and not text."""
    with open(shutil.which("ls") or "/bin/ls", "rb") as f:
        return f.read(17_000)


def tree(root: Path):
    """The files the valid invocations read, and the bad ones the sweep passes instead."""
    shutil.copytree(TINY, root / "model")
    shutil.copytree(os.path.join(FIXTURES, "hf-tiny"), root / "hf")
    shutil.copytree(os.path.join(FIXTURES, "model-garden-tfhub"), root / "hub")
    run_kbert("convert", "to-keras-hub", root / "model", root / "keras-hub")
    run_kbert("convert", "from-tf1", root / "model", root / "kbert")  # opens without a casing note
    shutil.copy(os.path.join(FIXTURES, "sample_text.txt"), root / "text.txt")
    shutil.copy(UNCASED_VOCAB, root / "vocab.txt")
    tokenizer_files(root)
    (root / "train.tsv").write_text("text\tlabel\ngold fresh.\tpos\ndead dust.\tneg\n")
    # Its own file, so that "--output is the dev file" is a case apart from "--output is the train file".
    shutil.copy(root / "train.tsv", root / "dev.tsv")
    (root / "pairs.tsv").write_text("text\ttext_b\tlabel\ngold.\tfresh.\tpos\ndead.\tdust.\tneg\n")
    (root / "query-pairs.tsv").write_text("query\tdocument\ngold.\tfresh.\ndead.\tdust.\n")  # finetune --task embed
    (root / "empty-query.tsv").write_text("query\tdocument\ngold.\tfresh.\n \tdust.\n")
    # A classify file without its header, given as pairs: its "documents" are two labels.
    (root / "labelled.tsv").write_text("".join(f"gold fresh {i}.\t{'pos' if i % 2 else 'neg'}\n" for i in range(12)))
    (root / "plain.txt").write_text("a file where a directory belongs\n")
    (root / "words.txt").write_text("philammon\n")  # a word of text.txt the tiny vocabulary splits
    (root / "known-word.txt").write_text("philammon\nthe\n")
    (root / "punctuated-word.txt").write_text("e-mail\n")
    (root / "spaced-word.txt").write_text("gold dust\n")
    (root / "blank-lines.txt").write_text("\n  \n\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "no-texts.jsonl").write_text('{"id": 1}\n{"id": 2}\n')  # JSON, but no text in it
    (root / "empty-dir").mkdir()
    (root / "binary.bin").write_bytes(_elf_head())
    (root / "broken.keras").write_bytes(_elf_head())  # a model input may be a .keras file: this is not one
    (root / "truncated.json").write_text(open(os.path.join(TINY, "bert_config.json")).read()[:60])
    (root / "notes").mkdir()  # a folder, but of no model
    (root / "notes" / "notes.txt").write_text("not a model\n")
    truncated_sources(root)
    cross_encoders(root)
    # A model directory whose bert_config.json names its fresh heads wrongly (a string, not a list).
    shutil.copytree(root / "kbert", root / "bad-fresh-heads")
    config = json.loads((root / "kbert" / "bert_config.json").read_text())
    (root / "bad-fresh-heads" / "bert_config.json").write_text(json.dumps(dict(config, fresh_heads="masked_lm")))
    # A sentence-embedding model: the record kbert convert from-hf writes for a sentence-transformers folder.
    shutil.copytree(root / "kbert", root / "embedding")
    embedding = {"pooling": "mean", "normalize": True, "max_seq_length": 32}
    (root / "embedding" / "bert_config.json").write_text(json.dumps(dict(config, embedding=embedding)))
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(root / "data.tfrecord")) as writer:
        for i in range(4):
            writer.write(tf.train.Example().SerializeToString() + bytes(40 * i))
    data = (root / "data.tfrecord").read_bytes()
    (root / "truncated.tfrecord").write_bytes(data[: len(data) - 7])
    # Real records whose ids come from the 30,522-word vocabulary: not the tiny model's.
    run_kbert("create-data", "--input", root / "text.txt", "--vocab", root / "vocab.txt", "--output",
              root / "uncased.tfrecord", "--dupe-factor", "1", "--workers", "1")  # fmt: skip
    stopped_runs(root)
    run_kbert("create-data", "--input", root / "text.txt", "--vocab", root / "model" / "vocab.txt", "--output",
              root / "tiny.tfrecord", "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "1",
              "--workers", "1")  # fmt: skip
    # A classifier, for the options a task's head does not read (predict --layers).
    import kbert

    kbert.save(
        kbert.bert_classifier(kbert.load(root / "kbert"), 2, task_info={"labels": ["neg", "pos"]}), root / "classifier"
    )
    # A reranker (a classifier of one output recording task rerank), and the files rerankers read.
    kbert.save(kbert.bert_classifier(kbert.load(root / "kbert"), 1, task_info={"task": "rerank"}), root / "reranker")
    rerank_files(root)
    (root / "read-only").mkdir()
    (root / "read-only").chmod(0o555)


def rerank_files(root: Path):
    """Candidate lists and reranker training files, good and bad."""
    rows = {
        "candidates": {"query": "gold.", "documents": ["fresh.", "dust."], "positive": ["fresh."]},
        "no-documents": {"query": "gold.", "documents": []},
        "no-positive": {"query": "gold.", "documents": ["fresh.", "dust."], "positive": []},
        "queries": {"query": "gold."},
    }
    for name, row in rows.items():
        (root / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    tables = {
        "rerank-groups": "query\tdocument\tnegative\ngold.\tfresh.\tdust.\n",
        "rerank-pairs": "query\tdocument\tlabel\ngold.\tfresh.\t1\ngold.\tdust.\t0\n",
        "label-out-of-range": "query\tdocument\tlabel\ngold.\tfresh.\t3\n",
        "label-and-negative": "query\tdocument\tlabel\tnegative\ngold.\tfresh.\t1\tdust.\n",
        "empty-negative": "query\tdocument\tnegative\ngold.\tfresh.\t \n",
        "teacher": "query\tdocument\tnegative\tteacher\ngold.\tfresh.\tdust.\t0.9 0.1 0.3\n",
    }
    for name, text in tables.items():
        (root / f"{name}.tsv").write_text(text)


def cross_encoders(root: Path):
    """T/ce-tanh: hf-tiny recording, as a sentence-transformers CrossEncoder does, an activation kbert
    cannot reproduce; T/ce-two: hf-tiny with the head of a CrossEncoder of two outputs."""
    from kbert.converters.safetensors_file import SafetensorsFile, write_safetensors

    config = json.loads((root / "hf" / "config.json").read_text())
    for name, values in (
        ("ce-tanh", {"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}),
        ("ce-two", {"architectures": ["BertForSequenceClassification"], "sentence_transformers": {}}),
    ):
        shutil.copytree(root / "hf", root / name)
        (root / name / "config.json").write_text(json.dumps({**config, **values}))
    weights = SafetensorsFile(root / "hf" / "model.safetensors")
    tensors = {name: weights.read(name) for name in weights.shapes if not name.startswith("cls.")}
    head = {
        "classifier.weight": np.zeros((2, config["hidden_size"]), "float32"),
        "classifier.bias": np.zeros(2, "float32"),
    }
    write_safetensors(str(root / "ce-two" / "model.safetensors"), {**tensors, **head})


def tokenizer_files(root: Path):
    """T/tokenizer.json (a ModernBERT's byte-level BPE), and tokenizer.json files create-data cannot use."""
    from helpers import bpe_tokenizer_file

    text = root / "text.txt"
    bpe_tokenizer_file(root / "tokenizer.json", text)
    bpe_tokenizer_file(root / "no-mask-tokenizer.json", text, ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))
    bpe_tokenizer_file(root / "no-template-tokenizer.json", text, template=None)


def stopped_runs(root: Path):
    """T/stopped-predictions.jsonl.partial and T/stopped-embeddings.jsonl.partial: a row each, of
    runs of T/kbert stopped after it, recorded as `kbert predict` and `kbert embed` record theirs.
    (In T itself: a refused command's lock, made and removed beside its output, leaves no trace on
    an entry the sweep compares.)"""
    from kbert.finetuning.output import model_identity, write_rows
    from kbert.runtime.errors import Interrupted

    def one_row_then_stop(start):
        yield {"label": "pos"}
        raise KeyboardInterrupt

    model = model_identity(root / "kbert")
    predicted = {"model": model, "layers": None, "max_seq_length": None, "format": "auto", "skip_bad_rows": False}
    embedded = {"model": model, "max_seq_length": None, "pooling": "mean", "normalize": None, "long_text": "truncate"}
    for name, source, made_by in [
        ("predictions", "train.tsv", predicted),
        ("embeddings", "text.txt", dict(embedded, doc_stride=None)),
    ]:
        with pytest.raises(Interrupted):
            write_rows(root / f"stopped-{name}.jsonl", one_row_then_stop, source=root / source, made_by=made_by)


# Each kind of model source (kbert.formats.sources.KINDS) with one of its weight files cut in half.
TRUNCATED_SOURCES = {
    "tf1": ("T/model", "bert_model.ckpt.data-00000-of-00001"),
    "hf": ("T/hf", "model.safetensors"),
    "kbert": ("T/kbert", "model.weights.h5"),
    "keras": ("T/tiny.keras", ""),
    "tfhub": ("T/hub/encoder", "variables/variables.data-00000-of-00001"),
    "keras_hub": ("T/keras-hub", "model.weights.h5"),
}


def truncated_sources(root: Path):
    """T/truncated/KIND: a copy of the tree's source of that kind, with a weight file cut in half."""
    import kbert

    kbert.load(root / "kbert").save(root / "tiny.keras")
    for kind, (source, weights) in TRUNCATED_SOURCES.items():
        source = root / source[2:]
        copy = root / "truncated" / (kind + (".keras" if kind == "keras" else ""))
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
        cut = copy / weights if weights else copy
        cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])


def truncated_path(kind: str) -> str:
    return f"T/truncated/{kind}" + (".keras" if kind == "keras" else "")


_FLAGS_WITHOUT_VALUE = {"--overwrite", "--resume", "--whole-word-mask"}
_DIRECTORIES = {
    "T/model",
    "T/hf",
    "T/hub/encoder",
    "T/hub/preprocessor",
    "T/keras-hub",
}  # the valid invocations' inputs that are directories


def parse(name, callback):
    """The valid invocation of `name` as (positional values, {flag: value})."""
    tokens, positional, options = VALID[name].split(), [], {}
    while tokens:
        token = tokens.pop(0)
        if token in _FLAGS_WITHOUT_VALUE:
            options[token] = None
        elif token.startswith("--"):
            options[token] = tokens.pop(0)
        else:
            positional.append(token.replace("_", " ") if "[MASK]" in token else token)
    return positional, options


def arguments(callback):
    """The command's positional parameters, in order."""
    signature = inspect.signature(callback)
    return [p for p in signature.parameters if not option_name(signature, p).startswith("--")]


def given_value(name, callback, parameter):
    positional, options = parse(name, callback)
    flag = option_name(inspect.signature(callback), parameter)
    if flag.startswith("--"):
        return options.get(flag)
    index = arguments(callback).index(parameter)
    return positional[index] if index < len(positional) else None


def bad_values(name, callback):
    """(case id, parameter, bad value) for one command: the generic bad values of its kinds."""
    signature = inspect.signature(callback, eval_str=True)
    for parameter, declared in callback.inputs.items():
        if given_value(name, callback, parameter) is None:
            continue
        yield f"{parameter}-missing", parameter, "T/nowhere/missing"
        if declared.kind == "file":
            yield f"{parameter}-a-directory", parameter, "T/empty-dir"
            yield f"{parameter}-empty", parameter, "T/empty.txt"
            if declared.content in ("text", "json"):
                yield f"{parameter}-binary", parameter, "T/binary.bin"
            if declared.content == "json":
                yield f"{parameter}-truncated", parameter, "T/truncated.json"
            if declared.content == "records":
                yield f"{parameter}-truncated", parameter, "T/truncated.tfrecord"
                yield f"{parameter}-text", parameter, "T/text.txt"
        elif declared.kind in ("dir", "model"):
            yield f"{parameter}-a-file", parameter, "T/plain.txt"
            yield f"{parameter}-empty-dir", parameter, "T/empty-dir"
            if declared.kind == "model":
                yield f"{parameter}-broken-keras-file", parameter, "T/broken.keras"
                yield f"{parameter}-a-folder-of-no-model", parameter, "T/notes"
                accepted = declared.accepts or TRUNCATED_SOURCES
                if "kbert" in accepted:
                    yield f"{parameter}-bad-fresh-heads", parameter, "T/bad-fresh-heads"
                for kind in TRUNCATED_SOURCES:
                    if kind in accepted:
                        yield f"{parameter}-truncated-{kind}", parameter, truncated_path(kind)
                    elif kind != "keras":  # a model of another kind, for a converter of one kind
                        yield f"{parameter}-a-{kind}-source", parameter, TRUNCATED_SOURCES[kind][0]
    for parameter, declared in callback.outputs.items():
        if given_value(name, callback, parameter) is None:
            continue
        for source in callback.inputs:
            value = given_value(name, callback, source)
            if value is None:
                continue
            yield f"{parameter}-is-{source}", parameter, value
            if value in _DIRECTORIES:
                yield f"{parameter}-inside-{source}", parameter, f"{value}/inside"
        if declared.kind in ("file", "shards"):
            yield f"{parameter}-a-directory", parameter, "T/empty-dir"
        else:
            yield f"{parameter}-a-file", parameter, "T/plain.txt"
        yield f"{parameter}-unwritable", parameter, "T/read-only/out"
    for parameter in signature.parameters.values():
        info = parameter.default
        if not _annotation_is(parameter.annotation, (int, float)) or getattr(info, "min", None) is None:
            continue
        for number in (0, -1):
            if number < info.min or number == 0 and parameter.name in callback.above_zero:
                yield f"{parameter.name}={number}", parameter.name, str(number)


def with_value(name, callback, parameter, value):
    """The valid invocation of `name` with `parameter` set to `value`, as argv."""
    positional, options = parse(name, callback)
    flag = option_name(inspect.signature(callback), parameter)
    if flag.startswith("--"):
        options[flag] = value
    else:
        positional[arguments(callback).index(parameter)] = value
    flags = [item for flag, v in options.items() for item in ([flag] if v is None else [flag, v])]
    return name.split() + positional + flags


# Bad invocations a command's declarations cannot derive, each a whole argv: (command, case, argv).
_FINETUNE = "finetune T/kbert --task classify --train T/train.tsv --output T/out/ft"
_PRETRAIN_INIT = "pretrain --model-dir T/out/run --data T/data.tfrecord --init"
_EMBED = "embed T/kbert --input T/text.txt --pooling mean"
_FINETUNE_EMBED = "finetune T/kbert --task embed --output T/out/ft"
_PREDICT_STOPPED = "predict T/kbert --input T/train.tsv --output T/stopped-predictions.jsonl"
_EMBED_STOPPED = "embed T/kbert --input T/text.txt --pooling mean --output T/stopped-embeddings.jsonl"
_MLM_DATA = "create-data --input T/text.txt --output T/out/data.tfrecord --vocab"
_PRETRAIN_NEW = (  # a run that would train: real records of the tiny vocabulary, one step
    "pretrain --model-dir T/out/run --data T/tiny.tfrecord --init T/kbert --max-seq-length 32 "
    "--max-predictions-per-seq 5 --steps 1 --batch-size 2"
)
_INT8 = "export T/kbert T/out/export --precision int8"
_FINETUNE_RERANK = "finetune T/kbert --task rerank --output T/out/ft"
_RERANK = "rerank T/reranker --input"
WHOLE_CASES = [
    # create-data with a tokenizer.json: what does not apply to byte-level BPE, and files it cannot use.
    ("create-data", "whole-word-mask-with-a-tokenizer-json", f"{_MLM_DATA} T/tokenizer.json --whole-word-mask"),
    ("create-data", "lowercase-with-a-tokenizer-json", f"{_MLM_DATA} T/tokenizer.json --lowercase"),
    ("create-data", "no-lowercase-with-a-tokenizer-json", f"{_MLM_DATA} T/tokenizer.json --no-lowercase"),
    ("create-data", "tokenizer-json-without-a-mask-token", f"{_MLM_DATA} T/no-mask-tokenizer.json"),
    ("create-data", "tokenizer-json-without-a-template", f"{_MLM_DATA} T/no-template-tokenizer.json"),
    ("create-data", "tokenizer-json-unreadable", f"{_MLM_DATA} T/truncated.json"),
    (
        "create-data",
        "tokenizer-json-without-a-mask-token-on-beam",
        f"{_MLM_DATA} T/no-mask-tokenizer.json --runner DirectRunner",
    ),
    # --init is not in pretrain's valid invocation (it starts from --config): its model sources here.
    ("pretrain", "init-missing", f"{_PRETRAIN_INIT} T/nowhere/missing"),
    ("pretrain", "init-empty-dir", f"{_PRETRAIN_INIT} T/empty-dir"),
    ("pretrain", "init-a-folder-of-no-model", f"{_PRETRAIN_INIT} T/notes"),
    *[("pretrain", f"init-truncated-{kind}", f"{_PRETRAIN_INIT} {truncated_path(kind)}") for kind in TRUNCATED_SOURCES],
    ("pretrain", "init-with-config-and-vocab", f"{VALID['pretrain']} --init T/kbert"),
    ("pretrain", "init-with-vocab", f"{_PRETRAIN_INIT} T/kbert --vocab T/model/vocab.txt"),
    (
        "pretrain",
        "data-of-another-vocabulary",
        "pretrain --model-dir T/out/run --data T/uncased.tfrecord --config T/model/bert_config.json --vocab T/model/vocab.txt",
    ),
    # An output directory that exists and cannot be written, written in place (not a new folder in it).
    (
        "pretrain",
        "model_dir-in-place-unwritable",
        "pretrain --model-dir T/read-only --init T/kbert --data T/data.tfrecord",
    ),
    ("export", "export_base-in-place-unwritable", "export T/kbert T/read-only"),
    ("export", "embedding-text-pairs", "export T/embedding T/out/export --text-pairs"),
    ("extend", "no-growth-option", "extend T/model T/out/extended"),
    ("extend", "positions-the-model's", "extend T/model T/out/extended --max-position-embeddings 64"),
    ("extend", "positions-below-the-model's", "extend T/model T/out/extended --max-position-embeddings 32"),
    ("extend", "positions-past-the-most", "extend T/model T/out/extended --max-position-embeddings 1000000000"),
    ("extend", "word-in-the-vocabulary", "extend T/kbert T/out/extended --words T/known-word.txt"),
    ("extend", "word-with-punctuation", "extend T/kbert T/out/extended --words T/punctuated-word.txt"),
    ("extend", "word-with-a-space", "extend T/kbert T/out/extended --words T/spaced-word.txt"),
    ("extend", "words-file-of-blank-lines", "extend T/kbert T/out/extended --words T/blank-lines.txt"),
    ("extend", "corpus-without-max-new", "extend T/kbert T/out/extended --corpus T/text.txt"),
    ("extend", "max-new-without-corpus", "extend T/kbert T/out/extended --max-new 3"),
    (
        "extend",
        "corpus-with-no-word-that-often",
        "extend T/kbert T/out/extended --corpus T/text.txt --max-new 3 --min-count 1000",
    ),
    ("extend", "dry-run-without-words", "extend T/kbert T/out/extended --dry-run --max-position-embeddings 128"),
    # --long-text windows: a stride the window (64 - 2 tokens by default, here) cannot take, tasks and pairs it does not read.
    ("finetune", "doc-stride-the-window's", f"{_FINETUNE} --long-text windows --doc-stride 62"),
    ("finetune", "doc-stride-past-the-window", f"{_FINETUNE} --long-text windows --max-seq-length 16 --doc-stride 20"),
    ("finetune", "long-text-unknown", f"{_FINETUNE} --long-text chunks"),
    ("finetune", "mixed-precision-dtype-unknown", f"{_FINETUNE} --mixed-precision-dtype fp16"),
    ("finetune", "windows-for-squad", f"{_FINETUNE.replace('classify', 'squad')} --long-text windows"),
    ("finetune", "windows-for-choice", f"{_FINETUNE.replace('classify', 'choice')} --long-text windows"),
    ("finetune", "windows-with-pairs", f"{_FINETUNE.replace('train.tsv', 'pairs.tsv')} --long-text windows"),
    # kbert embed: a model with no sentence-embedding pooling recorded, and what the command cannot take.
    ("embed", "no-pooling-recorded", "embed T/kbert --input T/text.txt"),
    ("embed", "pooling-unknown", "embed T/kbert --input T/text.txt --pooling sum"),
    ("embed", "format-unknown", "embed T/kbert --input T/text.txt --pooling mean --format csv"),
    ("embed", "npy-without-output", "embed T/kbert --input T/text.txt --pooling mean --format npy"),
    ("embed", "npy-resumed", f"{_EMBED} --output T/out/v.npy --format npy --resume"),
    ("embed", "text-pairs", "embed T/kbert --input T/pairs.tsv --pooling mean"),
    ("embed", "doc-stride-without-windows", f"{_EMBED} --doc-stride 4"),
    ("embed", "doc-stride-the-window's", f"{_EMBED} --long-text windows --doc-stride 62"),
    # finetune --task embed: a pairs file of one column, an empty query, a model with no pooling recorded.
    ("finetune", "embed-one-column", f"{_FINETUNE_EMBED} --pooling mean --train T/text.txt"),
    ("finetune", "embed-empty-query", f"{_FINETUNE_EMBED} --pooling mean --train T/empty-query.tsv"),
    ("finetune", "embed-no-pooling-recorded", f"{_FINETUNE_EMBED} --train T/query-pairs.tsv"),
    ("finetune", "embed-a-classify-file", f"{_FINETUNE_EMBED} --pooling mean --train T/train.tsv"),
    ("finetune", "embed-labels-as-documents", f"{_FINETUNE_EMBED} --pooling mean --train T/labelled.tsv"),
    ("evaluate", "embed-a-classify-file", "evaluate T/kbert --task embed --pooling mean --input T/train.tsv"),
    ("evaluate", "embed-labels-as-documents", "evaluate T/kbert --task embed --pooling mean --input T/labelled.tsv"),
    ("finetune", "embed-pooling-unknown", f"{_FINETUNE_EMBED} --pooling sum --train T/query-pairs.tsv"),
    ("finetune", "pooling-without-embed", f"{_FINETUNE} --pooling mean"),
    ("evaluate", "embed-no-pooling-recorded", "evaluate T/kbert --task embed --input T/query-pairs.tsv"),
    ("evaluate", "task-without-its-head", "evaluate T/kbert --task classify --input T/train.tsv"),
    # --resume of rows another model, or other options, made.
    ("predict", "resume-another-model", f"{_PREDICT_STOPPED.replace('T/kbert', 'T/model')} --resume"),
    ("predict", "resume-another-max-seq-length", f"{_PREDICT_STOPPED} --resume --max-seq-length 16"),
    ("predict", "resume-with-layers", f"{_PREDICT_STOPPED} --resume --layers -1"),
    ("embed", "resume-another-model", f"{_EMBED_STOPPED.replace('T/kbert', 'T/embedding')} --resume"),
    ("embed", "resume-another-pooling", f"{_EMBED_STOPPED} --resume --pooling cls --no-normalize"),
    # A new model whose config does not fit its vocabulary; a glob the shell expanded (unquoted).
    (
        "pretrain",
        "vocab-of-another-size",
        "pretrain --model-dir T/out/run --data T/data.tfrecord --config T/model/bert_config.json --vocab T/vocab.txt",
    ),
    (
        "pretrain",
        "data-glob-unquoted",
        "pretrain --model-dir T/out/run --data T/data.tfrecord T/truncated.tfrecord --init T/kbert",
    ),
    # Options that do not apply to what runs: each would go unread, so each is refused.
    ("pretrain", "mixed-precision-dtype-unknown", f"{_PRETRAIN_NEW} --mixed-precision-dtype half"),
    ("pretrain", "tpu-without-strategy-tpu", f"{_PRETRAIN_NEW} --tpu my-tpu"),
    ("pretrain", "eval-every-without-eval-data", f"{_PRETRAIN_NEW} --eval-every 5"),
    *[
        ("finetune", f"{flag[2:]}-without-squad", f"{_FINETUNE} {flag} {value}")
        for flag, value in (
            ("--max-query-length", "32"),
            ("--n-best-size", "5"),
            ("--max-answer-length", "10"),
            ("--null-score-diff-threshold", "1.5"),
        )
    ],
    ("finetune", "doc-stride-without-windows", f"{_FINETUNE} --doc-stride 8"),
    ("finetune", "normalize-without-embed", f"{_FINETUNE} --normalize"),
    ("predict", "layers-of-a-classifier", "predict T/classifier --input T/train.tsv --layers -1"),
    ("export", "max-windows-of-a-truncating-model", "export T/kbert T/out/export --max-windows 4"),
    # Calibration texts for the drift of an int8 export: files that hold none, or too few; options without them.
    *[
        ("export", f"calibration-{case}", f"{_INT8} --calibration {path}")
        for case, path in (
            ("missing", "T/nowhere/missing"),
            ("a-directory", "T/empty-dir"),
            ("empty", "T/empty.txt"),
            ("blank-lines", "T/blank-lines.txt"),
            ("binary", "T/binary.bin"),
            ("a-tfrecord", "T/uncased.tfrecord"),
            ("json-of-no-texts", "T/no-texts.jsonl"),
            ("pairs-for-a-one-text-model", "T/pairs.tsv"),
        )
    ],
    ("export", "calibration-fewer-texts-than-asked", f"{_INT8} --calibration T/text.txt --calibration-texts 1000"),
    ("export", "calibration-of-a-float32-export", "export T/kbert T/out/export --calibration T/text.txt"),
    ("export", "calibration-for-tfhub", "export T/kbert T/out/hub --format tfhub --calibration T/text.txt"),
    ("export", "max-drift-without-calibration", f"{_INT8} --max-drift 0.1"),
    ("export", "calibration-texts-without-calibration", f"{_INT8} --calibration-texts 10"),
    ("export", "max-drift-negative", f"{_INT8} --calibration T/text.txt --max-drift -0.5"),
    # Calibrated int8 ranges: measured on texts, so they need the file; only int8 has them.
    ("export", "int8-ranges-without-calibration", f"{_INT8} --int8-ranges calibrated"),
    ("export", "int8-ranges-unknown", f"{_INT8} --calibration T/text.txt --int8-ranges per-tensor"),
    (
        "export",
        "int8-ranges-of-a-float32-export",
        "export T/kbert T/out/export --int8-ranges calibrated --calibration T/text.txt",
    ),
    ("export", "int8-ranges-for-tfhub", "export T/kbert T/out/hub --format tfhub --int8-ranges calibrated"),
    ("export", "int8-ranges-calibrated-on-no-texts", f"{_INT8} --int8-ranges calibrated --calibration T/empty.txt"),
    # Batches of like lengths: only where a batch is cut to its longest text.
    ("finetune", "group-by-length-for-classify", f"{_FINETUNE} --group-by-length"),
    # Rerankers: training files of the wrong shape, losses their file cannot feed, lists with nothing to rank.
    ("finetune", "rerank-label-out-of-range", f"{_FINETUNE_RERANK} --train T/label-out-of-range.tsv"),
    ("finetune", "rerank-label-and-negatives", f"{_FINETUNE_RERANK} --train T/label-and-negative.tsv"),
    ("finetune", "rerank-empty-negative", f"{_FINETUNE_RERANK} --train T/empty-negative.tsv"),
    ("finetune", "rerank-no-header", f"{_FINETUNE_RERANK} --train T/labelled.tsv"),
    ("finetune", "rerank-candidate-lists", f"{_FINETUNE_RERANK} --train T/candidates.jsonl"),
    ("finetune", "rerank-loss-unknown", f"{_FINETUNE_RERANK} --train T/rerank-groups.tsv --loss hinge"),
    ("finetune", "rerank-listwise-on-pairs", f"{_FINETUNE_RERANK} --train T/rerank-pairs.tsv --loss listwise"),
    (
        "finetune",
        "rerank-margin-mse-without-teacher",
        f"{_FINETUNE_RERANK} --train T/rerank-groups.tsv --loss margin-mse",
    ),
    (
        "finetune",
        "rerank-teacher-without-margin-mse",
        f"{_FINETUNE_RERANK} --train T/teacher.tsv --teacher-scores teacher",
    ),
    (
        "finetune",
        "rerank-teacher-column-missing",
        f"{_FINETUNE_RERANK} --train T/rerank-groups.tsv --loss margin-mse --teacher-scores teacher",
    ),
    ("finetune", "loss-without-rerank", f"{_FINETUNE} --loss bce"),
    ("rerank", "no-documents", f"{_RERANK} T/no-documents.jsonl"),
    ("rerank", "a-training-file", f"{_RERANK} T/rerank-groups.tsv"),
    ("rerank", "not-a-reranker", "rerank T/classifier --input T/candidates.jsonl"),
    ("rerank", "resume-without-output", f"{_RERANK} T/candidates.jsonl --resume"),
    ("evaluate", "rerank-no-positive", "evaluate T/reranker --input T/no-positive.jsonl"),
    # The first stage: an embedding model's options without it, or a model that is not one.
    ("finetune", "negatives-without-mining", f"{_FINETUNE_RERANK} --train T/query-pairs.tsv --negatives 2"),
    (
        "finetune",
        "mine-negatives-with-a-classifier",
        f"{_FINETUNE_RERANK} --train T/query-pairs.tsv --mine-negatives T/classifier",
    ),
    (
        "finetune",
        "mine-negatives-of-labelled-pairs",
        f"{_FINETUNE_RERANK} --train T/rerank-pairs.tsv --mine-negatives T/embedding",
    ),
    (
        "finetune",
        "mine-negatives-for-margin-mse",
        f"{_FINETUNE_RERANK} --train T/query-pairs.tsv --mine-negatives T/embedding --loss margin-mse "
        "--teacher-scores teacher",
    ),
    ("rerank", "candidates-from-without-corpus", f"{_RERANK} T/queries.jsonl --candidates-from T/embedding"),
    ("rerank", "corpus-without-candidates-from", f"{_RERANK} T/queries.jsonl --corpus T/text.txt"),
    ("rerank", "k-without-candidates-from", f"{_RERANK} T/candidates.jsonl --k 5"),
    ("rerank", "candidates-from-missing", f"{_RERANK} T/queries.jsonl --candidates-from T/nowhere --corpus T/text.txt"),
    ("finetune", "mine-negatives-missing", f"{_FINETUNE_RERANK} --train T/query-pairs.tsv --mine-negatives T/nowhere"),
    (
        "rerank",
        "candidates-from-a-classifier",
        f"{_RERANK} T/queries.jsonl --candidates-from T/classifier --corpus T/text.txt",
    ),
    # sentence-transformers CrossEncoders kbert cannot reproduce: an activation it lacks, two outputs.
    ("convert from-hf", "cross-encoder-activation-unknown", "convert from-hf T/ce-tanh T/out/from-hf"),
    ("convert inspect", "cross-encoder-activation-unknown", "convert inspect T/ce-tanh"),
    ("convert from-hf", "cross-encoder-of-two-outputs", "convert from-hf T/ce-two T/out/from-hf"),
]

CASES = [
    (name, case, parameter, value)
    for name, callback in commands().items()
    if hasattr(callback, "inputs")
    for case, parameter, value in bad_values(name, callback)
] + [(name, case, None, argv) for name, case, argv in WHOLE_CASES]


# Set by the sweep's runs off TensorFlow (below): the tree a TensorFlow process made for them.
GIVEN_TREE = "KBERT_SWEEP_TREE"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    if os.environ.get(GIVEN_TREE):
        yield Path(os.environ[GIVEN_TREE])
        return
    path = tmp_path_factory.mktemp("sweep")
    tree(path)
    yield path
    (path / "read-only").chmod(0o755)


def snapshot(root: Path) -> dict:
    found = {}
    for folder, directories, files in os.walk(root):
        for entry in directories + files:
            full = os.path.join(folder, entry)
            status = os.lstat(full)
            found[full] = (status.st_size, status.st_mtime_ns, status.st_mode)
    return found


# The kbert command as its console script runs it, in a process where importing TensorFlow fails.
WITHOUT_TENSORFLOW = [
    sys.executable,
    "-c",
    "import sys; sys.modules['tensorflow'] = None; sys.argv[0] = 'kbert'; from kbert.cli.main import main; main()",
]


@pytest.mark.parametrize("name,case,parameter,value", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_bad_value_gets_one_line_and_leaves_nothing(root, name, case, parameter, value):
    argv = value.split() if parameter is None else with_value(name, commands()[name], parameter, value)
    args = [a.replace("T/", f"{root}/") for a in argv]
    before = snapshot(root)
    if case.endswith("-unwritable"):
        # As root, a mode-555 directory does not stop a writer: drop the capability that lets it.
        # TensorFlow cannot be imported there: the output is refused before any of the work.
        result = subprocess.run(
            ["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override", *WITHOUT_TENSORFLOW, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        unwritable = os.path.realpath(root / "read-only")
        assert f"kbert: error: cannot write to {unwritable} (permission denied" in result.stderr, result.stderr
    else:
        result = run_kbert(*args, check=False)
    assert result.returncode == 1, (args, result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kbert: error: "), (args, result.stderr)
    assert not foreign_flags(lines[0], name), f"{name} has no such option: {lines[0]}"
    assert "Traceback" not in result.stderr and "unexpected error" not in result.stderr
    assert result.stdout == ""
    assert snapshot(root) == before, (args, set(snapshot(root)) ^ set(before))


def test_predict_server_without_tensorflow_gets_one_line_and_leaves_nothing(root):
    """predict --server speaks TF Serving's protos, TensorFlow's: on JAX without it, one line says so."""
    before = snapshot(root)
    args = ["predict", "--server", "localhost:1", "--model", "m", "--input", str(root / "text.txt")]
    result = subprocess.run(
        [*WITHOUT_TENSORFLOW, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, KERAS_BACKEND="jax"),
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("kbert: error: kbert predict --server needs TensorFlow, and tensorflow is not installed")
    assert result.stdout == "" and snapshot(root) == before


@pytest.mark.skipif(bool(os.environ.get(GIVEN_TREE)), reason="this is the run off TensorFlow")
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_sweep_holds_on_jax_and_pytorch_without_tensorflow(root, backend, tmp_path):
    """Every case above again, in a Python where TensorFlow cannot be imported and Keras runs on
    JAX or PyTorch: a command that needs TensorFlow says so, the others refuse the bad value, each
    in one line, leaving nothing behind. (The tree is this process's: making it takes TensorFlow.)"""
    from helpers import without_tensorflow_env

    env = dict(without_tensorflow_env(tmp_path, backend), **{GIVEN_TREE: str(root)})
    pytest_args = ["-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-rf", __file__, "-k", "test_bad_value_gets"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=os.path.dirname(__file__),
        env=env,
    )
    failed = "\n".join(line for line in result.stdout.splitlines() if line.startswith("FAILED"))
    assert result.returncode == 0, failed or result.stdout[-4000:] + result.stderr[-2000:]
    assert f"{len(CASES)} passed" in result.stdout, result.stdout[-2000:]
