"""kbert model directories: `bert_config.json` + `vocab.txt` + `model.weights.h5`.

`bert_config.json` keeps the original keys, plus kbert's own: `kbert_model` (which model
class the weights belong to) and `do_lower_case`. `kbert.load` rebuilds the model from the
config and loads the weights, so the directory stays readable by anything that reads
google-research/bert's config.
"""

from __future__ import annotations

import os
import shutil

from kbert.config import BertConfig
from kbert.errors import KbertError
from kbert.files import atomic_output_dir, count_lines, require_path

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
WEIGHTS_FILE = "model.weights.h5"
# What fine-tuning records in bert_config.json besides the original keys.
TASK_KEYS = ("task", "labels", "max_seq_length", "text_pairs", "doc_stride", "max_query_length")


def check_vocab(vocab_file: str, config: BertConfig):
    """A vocab.txt must have exactly `vocab_size` lines, or ids would point at the wrong rows."""
    require_path(vocab_file, "vocab file", "pass the vocab.txt that came with the checkpoint")
    n = count_lines(vocab_file)
    if n != config.vocab_size:
        raise KbertError(f"{vocab_file} has {n} entries but bert_config.json says vocab_size "
                         f"{config.vocab_size}; use the vocab.txt this model was trained with")


def _model_classes():
    from kbert.model import bert
    return {"pretrainer": bert.BertPretrainer, "encoder": bert.BertEncoder,
            "classifier": bert.BertClassifier, "tagger": bert.BertTagger,
            "span_predictor": bert.BertSpanPredictor}


def model_kind(model) -> str:
    for kind, cls in _model_classes().items():
        if type(model) is cls:
            return kind
    raise KbertError(f"cannot save a {type(model).__name__}: kbert model directories hold kbert models "
                     f"(bert_encoder, bert_pretrainer, bert_classifier, bert_tagger, bert_span_predictor)")


def _describe(model, config: BertConfig, do_lower_case: bool):
    """Record in the config what rebuilds `model`: its class, head size, casing and task metadata."""
    for key in TASK_KEYS + ("num_classes",):  # a head's metadata must not outlive the head
        config.extras.pop(key, None)
    config.extras.update(kbert_model=model_kind(model), do_lower_case=bool(do_lower_case))
    if hasattr(model, "num_classes"):
        config.extras["num_classes"] = model.num_classes
    # Fine-tuning sets these (task, labels, max_seq_length) so predict/evaluate/export need no flags.
    config.extras.update(getattr(model, "task_info", None) or {})


def save(model, model_dir, vocab_file: str | None = None, do_lower_case: bool | None = None,
         overwrite: bool = False):
    """Write `model` as a kbert model directory, atomically.

    Args:
        model: a kbert model (`bert_encoder`, `bert_pretrainer`).
        model_dir: str. The directory to write; must not exist or be empty unless `overwrite`.
        vocab_file: str. The vocab.txt to copy in; defaults to `model.vocab_file`, which
            `kbert.load` and the converters set.
        do_lower_case: bool. Recorded so tokenizers built from the directory lower-case or
            not; defaults to `model.do_lower_case`, else True.
        overwrite: bool. Replace a non-empty `model_dir`.

    Example:
    >>> kbert.save(kbert.converters.load_tf1_checkpoint("tests/fixtures/tf1-tiny"), "out/tiny")  # doctest: +SKIP
    """
    vocab_file = vocab_file or getattr(model, "vocab_file", None)
    if not vocab_file:
        raise KbertError("kbert.save needs the vocabulary: pass vocab_file=PATH/vocab.txt")
    if do_lower_case is None:
        do_lower_case = getattr(model, "do_lower_case", True)
    config = BertConfig.from_dict(model.config.to_dict())
    check_vocab(vocab_file, config)
    _describe(model, config, do_lower_case)
    with atomic_output_dir(model_dir, overwrite=overwrite) as tmp:
        config.to_json_file(os.path.join(tmp, CONFIG_FILE))
        shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB_FILE))
        model.save_weights(os.path.join(tmp, WEIGHTS_FILE))
    return model_dir


def is_model_dir(path) -> bool:
    return os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def load_config(model_dir) -> BertConfig:
    require_path(model_dir, "model directory", "pass a directory written by kbert (convert, pretrain, finetune)")
    return BertConfig.from_json_file(os.path.join(model_dir, CONFIG_FILE))


def load(model_dir):
    """The model saved in a kbert model directory, with its weights.

    The model carries `vocab_file` and `do_lower_case` attributes for building its tokenizer.

    Example:
    >>> model = kbert.load("out/tiny")  # doctest: +SKIP
    """
    import tensorflow as tf

    from kbert.model.layers import weights_from
    model_dir = os.fspath(model_dir)
    config = load_config(model_dir)
    weights = os.path.join(model_dir, WEIGHTS_FILE)
    require_path(weights, "weights file", "the model directory is incomplete; convert or train it again")
    kind = config.extras.get("kbert_model", "pretrainer")
    builders = _model_classes()
    if kind not in builders:
        raise KbertError(f"{model_dir}: unknown kbert_model {kind!r} in bert_config.json; "
                         f"expected one of {', '.join(builders)}")
    head = {"num_classes": int(config.extras.get("num_classes", 2))} if kind in (
        "classifier", "tagger", "span_predictor") else {}
    # Zero-filled weights, overwritten by load_weights next: drawing BERT-base's 110M random
    # initial values would take longer than reading the file.
    with weights_from(lambda path, shape: tf.zeros(shape)):
        model = builders[kind](config, **head)
    try:
        model.load_weights(weights)
    except (ValueError, OSError) as e:
        raise KbertError(f"{weights}: cannot load ({str(e).splitlines()[0]}); the file is damaged or "
                         f"does not match bert_config.json") from None
    model.vocab_file = os.path.join(model_dir, VOCAB_FILE)
    model.do_lower_case = bool(config.extras.get("do_lower_case", True))
    model.task_info = {k: config.extras[k] for k in TASK_KEYS if k in config.extras}
    return model


def write_model_files(model, model_dir, vocab_file: str, do_lower_case: bool, weights: bool = True):
    """Write (or replace) the model-directory files inside an existing directory, each one
    atomically: used by training, whose directory also holds checkpoints and logs."""
    config = BertConfig.from_dict(model.config.to_dict())
    _describe(model, config, do_lower_case)
    os.makedirs(model_dir, exist_ok=True)

    def replace(name, write):
        tmp = os.path.join(model_dir, f".{name}.tmp")
        write(tmp)
        os.replace(tmp, os.path.join(model_dir, name))

    replace(CONFIG_FILE, config.to_json_file)
    if os.path.abspath(vocab_file) != os.path.abspath(os.path.join(model_dir, VOCAB_FILE)):
        replace(VOCAB_FILE, lambda tmp: shutil.copyfile(vocab_file, tmp))
    if weights:
        # Keras insists on the .weights.h5 suffix, so the temporary name keeps it.
        tmp = os.path.join(model_dir, ".tmp-" + WEIGHTS_FILE)
        model.save_weights(tmp)
        os.replace(tmp, os.path.join(model_dir, WEIGHTS_FILE))
