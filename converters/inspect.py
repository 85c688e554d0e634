"""`describe(src)`: what a google-research checkpoint or a kbert model directory holds, without
building a model (a `.keras` file is loaded): config, parameter count, heads, optimizer slots, step.
Each head (masked_lm, next_sentence, pooler) is "trained", "fresh" (created by a converter: random
weights) or "absent".

It also checks what it reads, so that a damaged source is not reported as healthy: the data
files must hold every byte the index lists (a download cut short), and every weight's shape must
be the one bert_config.json implies (a config from another model). A problem is one line naming
the file or variable, what was expected and what was found.
"""

from __future__ import annotations

import json
import os
import re

import h5py
import numpy as np

import kbert.finetuning.tasks  # noqa: F401  (a .keras task model's record, checked and completed by its task)
from kbert.config import BertConfig
from kbert.converters.hf import describe_hf
from kbert.converters.names import HEADS, suspect_field, tf1_to_kbert_paths
from kbert.finetuning.run_state import interrupted_finetuning, interrupted_finetuning_message
from kbert.formats.model_dir import (
    CONFIG_FILE,
    VOCAB_FILE,
    WEIGHTS_FILE,
    head_provenance,
    load_keras_file,
    recorded_fresh_heads,
    stored_head_provenance,
)
from kbert.formats.sources import KINDS, open_model, read_with_tensorflow, refuse_run, source_kind
from kbert.model.embedding_record import EMBEDDING_KEY, check_embedding
from kbert.model.kinds import TASK_KEYS, model_kind
from kbert.modernbert import directory as modernbert_directory
from kbert.modernbert.config import ModernBertConfig
from kbert.pretraining.run_record import interrupted_pretraining, interrupted_pretraining_message
from kbert.runtime.errors import KbertError, plural
from kbert.runtime.files import count_lines

# Where each head's variables live in a google-research checkpoint.
TF1_HEADS = {**HEADS, "pooler": "bert/pooler/"}


def describe(src) -> dict:
    """A JSON-ready summary of SRC: any model source (`kbert.formats.sources.source_kind`), or the
    folder of an unfinished pretrain or finetune run.

    Example:
    >>> describe("tests/fixtures/tf1-tiny")["parameters"]
    99374
    """
    src = os.fspath(src)
    kind = source_kind(src)
    describer = _DESCRIBERS.get(kind)
    return describer(src) if describer else _describe_converted(src, kind)


def _describe_run(src) -> dict:
    """The folder of an unfinished pretrain or finetune run: where it stopped and how to finish it."""
    prefix = interrupted_pretraining(src)
    if prefix:
        return _describe_interrupted_run(src, prefix)
    state = interrupted_finetuning(src)
    if state:
        return _describe_unfinished_finetuning(src, state)
    refuse_run(src)


def tf1_shapes(config: BertConfig) -> dict:
    """{google-research name: shape} of every weight a model with this config has.

    >>> shapes = tf1_shapes(BertConfig.from_json_file("tests/fixtures/tf1-tiny/bert_config.json"))
    >>> shapes["bert/embeddings/word_embeddings"], shapes["bert/encoder/layer_1/output/dense/kernel"]
    ((300, 64), (128, 64))
    """
    h, inner = config.hidden_size, config.intermediate_size
    by_suffix = (  # the first matching rule gives the shape; modeling.py's layer sizes
        (r"word_embeddings$", (config.vocab_size, h)),
        (r"token_type_embeddings$", (config.type_vocab_size, h)),
        (r"position_embeddings$", (config.max_position_embeddings, h)),
        (r"intermediate/dense/kernel$", (h, inner)),
        (r"intermediate/dense/bias$", (inner,)),
        (r"layer_\d+/output/dense/kernel$", (inner, h)),
        (r"seq_relationship/output_weights$", (2, h)),
        (r"seq_relationship/output_bias$", (2,)),
        (r"predictions/output_bias$", (config.vocab_size,)),
        (r"kernel$", (h, h)),
        (r"", (h,)),  # biases, LayerNorm gamma and beta
    )
    return {
        name: next(shape for pattern, shape in by_suffix if re.search(pattern, name))
        for name in tf1_to_kbert_paths(config.num_hidden_layers)
    }


def _config_problems(config: BertConfig, config_file: str, shapes: dict) -> list:
    """What in a checkpoint's weights contradicts its bert_config.json, one sentence each."""
    problems = []
    layers = {int(m.group(1)) for n in shapes for m in [re.match(r"bert/encoder/layer_(\d+)/", n)] if m}
    if layers and len(layers) != config.num_hidden_layers:
        problems.append(
            f"the checkpoint has {plural(len(layers), 'layer')} but {config_file} says "
            f"num_hidden_layers {config.num_hidden_layers}"
        )
    for name, expected in tf1_shapes(config).items():
        found = tuple(shapes.get(name, expected))
        if found != expected:
            problems.append(
                f"{name} has shape {list(found)} but {config_file} gives {list(expected)}; "
                f"check {suspect_field(name, expected, found)}"
            )
    return problems


def _raise_problems(where: str, problems: list, fix: str):
    if problems:
        more = f" (and {plural(len(problems) - 1, 'more problem')})" if len(problems) > 1 else ""
        raise KbertError(f"{where}: {problems[0]}{more}; {fix}")


def _config_summary(path):
    if not os.path.isfile(path):
        return None
    return BertConfig.from_json_file(path).to_dict()


def _describe_checkpoint(src) -> dict:
    with read_with_tensorflow(src, "tf1"):  # TensorFlow reads the checkpoint: one line where it is missing
        from kbert.converters.tf1 import data_problems, find_checkpoint, is_optimizer_state, open_reader
    try:
        source = find_checkpoint(src)
        config_file, vocab_file, prefix = source.config_file, source.vocab_file, source.prefix
    except KbertError as e:
        # A bare prefix without config/vocab can still be inspected.
        if os.path.isfile(os.fspath(src) + ".index"):
            prefix, config_file, vocab_file = os.fspath(src), None, None
        else:
            raise e
    reader = open_reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    _raise_problems(prefix, data_problems(prefix, shapes, dtypes), "download or copy the checkpoint again")
    weights = {n: s for n, s in shapes.items() if n.startswith(("bert/", "cls/")) and not is_optimizer_state(n)}
    if config_file:
        config = BertConfig.from_json_file(config_file)
        problems = _config_problems(config, config_file, weights)
        if vocab_file and os.path.isfile(vocab_file) and count_lines(vocab_file) != config.vocab_size:
            problems.append(
                f"{vocab_file} has {count_lines(vocab_file)} entries but {config_file} says "
                f"vocab_size {config.vocab_size}"
            )
        _raise_problems(prefix, problems, "use the bert_config.json and vocab.txt that came with the checkpoint")
    slots = sorted(n for n in shapes if is_optimizer_state(n) and n != "global_step")
    layers = {int(n.split("/")[2].split("_")[1]) for n in weights if n.startswith("bert/encoder/layer_")}
    return {
        "kind": "google-research checkpoint",
        "checkpoint": prefix,
        "config": _config_summary(config_file) if config_file else None,
        "vocab_entries": count_lines(vocab_file) if vocab_file and os.path.isfile(vocab_file) else None,
        "parameters": int(sum(np.prod(s) for s in weights.values())),
        "layers_in_checkpoint": len(layers),
        "heads": stored_head_provenance(
            {head: any(n.startswith(p) for n in weights) for head, p in TF1_HEADS.items()},
            recorded_fresh_heads(config, config_file) if config_file else (),
        ),
        "optimizer_slots": len(slots),
        "optimizer_slot_kinds": sorted({n.rsplit("/", 1)[1] for n in slots}),
        "global_step": int(reader.get_tensor("global_step")) if "global_step" in shapes else None,
        "dtypes": sorted({dtypes[n].name for n in weights}),
        "other_variables": sorted(n for n in shapes if n not in weights and not is_optimizer_state(n)),
    }


def _describe_interrupted_run(src, prefix: str) -> dict:
    """A `kbert pretrain --model-dir` that stopped before writing model.weights.h5: its config,
    the checkpoint `--resume` continues from, and how to continue it."""
    from kbert.converters.tf1 import open_reader  # the TensorFlow engine's checkpoint: TensorFlow reads it

    reader = open_reader(prefix)
    # tf.train.Checkpoint(weights=[...], optimizer=...) as kbert.pretraining.tf_engine saves it.
    weights = {
        n: s
        for n, s in reader.get_variable_to_shape_map().items()
        if re.fullmatch(r"weights/\d+/\.ATTRIBUTES/VARIABLE_VALUE", n)
    }
    vocab = os.path.join(src, VOCAB_FILE)
    return {
        "kind": "kbert pretraining run that stopped before writing the model",
        "model_dir": src,
        "checkpoint": prefix,
        "step": int(prefix.rsplit("-", 1)[-1]),
        "config": BertConfig.from_json_file(os.path.join(src, CONFIG_FILE)).to_dict(),
        "vocab_entries": count_lines(vocab) if os.path.isfile(vocab) else None,
        "parameters": int(sum(np.prod(s) for s in weights.values())),
        "resume": interrupted_pretraining_message(src, prefix),
    }


def _describe_unfinished_finetuning(src, state: dict) -> dict:
    """A `kbert finetune` run's OUTPUT.partial/: what it trains, the step it reached, how to finish it."""
    run = state["fingerprint"]
    return {
        "kind": "kbert fine-tuning run that did not finish",
        "run_dir": src,
        "step": state.get("step"),
        "best_epoch": (state.get("tracker") or {}).get("best_epoch") or None,
        "run": {
            k: run.get(k)
            for k in (
                "model_dir",
                "task",
                "train",
                "dev",
                "epochs",
                "batch_size",
                "learning_rate",
                "seed",
                "max_seq_length",
                "train_examples",
            )
        },
        "resume": interrupted_finetuning_message(src, state),
    }


# Where a kbert model directory's weights file keeps the weights that fix its config's sizes
# (Keras names the groups after kbert's layers), and their google-research names for tf1_shapes.
H5_SIZED_WEIGHTS = (
    ("word_embeddings/vars/0", "bert/embeddings/word_embeddings"),
    ("token_type_embeddings/vars/0", "bert/embeddings/token_type_embeddings"),
    ("position_embeddings/vars/0", "bert/embeddings/position_embeddings"),
    ("transformer_layer/query/vars/0", "bert/encoder/layer_0/attention/self/query/kernel"),
    ("transformer_layer/intermediate/vars/0", "bert/encoder/layer_0/intermediate/dense/kernel"),
    ("transformer_layer/output_dense/vars/0", "bert/encoder/layer_0/output/dense/kernel"),
)


def _weights_file_shapes(weights_path: str) -> dict:
    """{dataset path: shape} of a Keras weights file; a truncated or unreadable one is a one-line error."""
    shapes = {}
    try:
        with h5py.File(weights_path, "r") as f:
            f.visititems(
                lambda name, obj: shapes.__setitem__(name, tuple(obj.shape)) if isinstance(obj, h5py.Dataset) else None
            )
    except OSError as e:
        cut = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(e))
        if cut:
            # The size on disk, not HDF5's own idea of the end of file, and the size the file records.
            raise KbertError(
                f"{weights_path}: holds {os.path.getsize(weights_path):,} bytes of the {int(cut.group(2)):,} it "
                f"should: truncated (a copy cut short); copy it again, or convert or train again"
            ) from None
        raise KbertError(f"{weights_path}: not a readable weights file ({e}); convert or train again") from None
    return shapes


def _model_dir_problems(config: BertConfig, shapes: dict) -> list:
    """What in a model directory's weights contradicts its bert_config.json, one sentence each."""
    expected_shapes = tf1_shapes(config)
    problems = []
    layers = {m.group(1) for name in shapes for m in [re.search(r"/(transformer_layer(?:_\d+)?)/", name)] if m}
    if layers and len(layers) != config.num_hidden_layers:
        problems.append(
            f"the weights hold {plural(len(layers), 'transformer layer')} but bert_config.json says "
            f"num_hidden_layers {config.num_hidden_layers}"
        )
    for suffix, tf1_name in H5_SIZED_WEIGHTS:
        found = next((shape for name, shape in shapes.items() if name.endswith("/" + suffix)), None)
        expected = expected_shapes[tf1_name]
        if found is not None and found != expected:
            problems.append(
                f"{tf1_name} has shape {list(found)} but bert_config.json gives {list(expected)}; "
                f"check {suspect_field(tf1_name, expected, found)}"
            )
    return problems


def _describe_model_dir(src) -> dict:
    if modernbert_directory.is_modernbert_dir(src):
        return _describe_modernbert_dir(src)
    config = BertConfig.from_json_file(os.path.join(src, CONFIG_FILE))
    weights_path = os.path.join(src, WEIGHTS_FILE)
    shapes = _weights_file_shapes(weights_path)
    vocab = os.path.join(src, VOCAB_FILE)
    problems = _model_dir_problems(config, shapes)
    if os.path.isfile(vocab) and count_lines(vocab) != config.vocab_size:
        problems.append(
            f"{vocab} has {count_lines(vocab)} entries but bert_config.json says vocab_size {config.vocab_size}"
        )
    _raise_problems(
        src, problems, "a model directory's three files must come from the same model: convert or train it again"
    )
    # Tied weights are stored once, so every dataset counts.
    total = sum(int(np.prod(shape)) for shape in shapes.values())
    kind = config.extras.get("kbert_model", "pretrainer")
    return {
        "kind": f"kbert model directory ({kind})",
        "model_dir": src,
        "config": config.to_dict(),
        "vocab_entries": count_lines(vocab) if os.path.isfile(vocab) else None,
        "parameters": total,
        # trained, fresh (created by a converter, random until trained) or absent
        "heads": head_provenance(kind, recorded_fresh_heads(config, os.path.join(src, CONFIG_FILE))),
        "do_lower_case": config.extras.get("do_lower_case"),
        # What predict, evaluate and export read (kbert finetune and kbert.save record it).
        **{k: config.extras[k] for k in TASK_KEYS if k in config.extras},
        # How kbert embed pools (and normalises) its vectors: a sentence-embedding model's.
        **_embedding_entry(config, os.path.join(src, CONFIG_FILE)),
    }


def _describe_modernbert_dir(src) -> dict:
    """A ModernBERT's model directory: its family, kind and config, read without building the model."""
    config_file = os.path.join(src, modernbert_directory.CONFIG_FILE)
    with open(config_file, encoding="utf-8") as f:
        values = json.load(f)
    kind = values.get("kbert_model", "encoder")
    shapes = _weights_file_shapes(os.path.join(src, modernbert_directory.WEIGHTS_FILE))
    return {
        "kind": f"kbert model directory ({kind})",
        "family": values.get(modernbert_directory.FAMILY_KEY),
        "model_dir": src,
        "config": ModernBertConfig.from_hf(values, config_file).to_hf(),
        "parameters": sum(int(np.prod(shape)) for shape in shapes.values()),
        **{k: values[k] for k in TASK_KEYS if k in values},
    }


def _embedding_entry(config: BertConfig, where) -> dict:
    embedding = check_embedding(config, where)
    return {EMBEDDING_KEY: embedding} if embedding else {}


def _describe_keras_file(src) -> dict:
    """A `.keras` file (`model.save`), loaded: its model, config and where each head came from."""
    model = load_keras_file(src)
    kind = model_kind(model)
    return {
        "kind": f"Keras file ({kind})",
        "model": src,
        "config": {k: v for k, v in model.config.to_dict().items() if k in BertConfig.field_names()},
        "vocab_entries": count_lines(model.vocab_file) if model.vocab_file else None,
        "parameters": int(model.count_params()),
        "heads": head_provenance(kind, model.fresh_heads),
        "do_lower_case": model.do_lower_case,
        **dict(getattr(model, "task_info", None) or {}),
        **_embedding_entry(model.config, src),
    }


def _describe_converted(src: str, kind: str) -> dict:
    """A TF Hub encoder or a keras-hub preset, converted in memory: the model kbert reads from it,
    with the heads the source lacks reported fresh."""
    model = open_model(src)
    return {
        "kind": KINDS[kind].split(" ", 1)[1],  # without its article: "TF Hub encoder SavedModel"
        "model": src,
        "config": {k: v for k, v in model.config.to_dict().items() if k in BertConfig.field_names()},
        "vocab_entries": count_lines(model.vocab_file),
        "parameters": int(model.count_params()),
        "heads": head_provenance(model_kind(model), model.fresh_heads),
        "do_lower_case": model.do_lower_case,
    }


# How each kind of source is described; the kinds not here (TF Hub, keras-hub) are converted in memory.
_DESCRIBERS = {
    "kbert": _describe_model_dir,
    "keras": _describe_keras_file,
    "tf1": _describe_checkpoint,
    "hf": describe_hf,
    "run": _describe_run,
}
