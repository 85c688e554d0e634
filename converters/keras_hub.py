"""keras-hub BERT presets in and out of kbert, written and read by keras-hub's own code.

A preset directory is what `save_to_preset` writes: `config.json` (the BertBackbone),
`model.weights.h5`, `tokenizer.json` + `assets/tokenizer/vocabulary.txt`, `metadata.json`, and
for a classifier `preprocessor.json`, `task.json` and `task.weights.h5`. kbert builds keras-hub's
objects, copies the weights by the names table's "keras_hub" column, and lets keras-hub save
them (writing); it lets keras-hub load the preset and copies the weights back (reading).

keras-hub's BertBackbone computes GELU with the tanh approximation, hard-coded. The released
google-research checkpoints were trained with the exact erf GELU (kbert's `gelu`), so such a
model cannot come out exact: `to-keras-hub` measures the difference on real text and reports it.
Reading is exact: the kbert model gets `hidden_act: gelu_tanh`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

import keras
import keras_hub
import numpy as np

from kbert.backend import make_preprocessor
from kbert.config import BertConfig
from kbert.converters.loading import Converted
from kbert.converters.named import named_arrays, pretrainer_from_named
from kbert.converters.names import KERAS_HUB_CLASSIFIER_HEAD
from kbert.formats.model_dir import check_vocab, fresh_heads_of, lower_case_for
from kbert.formats.sources import open_model
from kbert.model.bert import BertClassifier, BertEncoder, BertPretrainer, Vocabulary, encoder_of
from kbert.runtime.errors import KbertError, first_line, listing, option
from kbert.runtime.files import atomic_output_dir, check_free_space, weights_file_bytes, writes
from kbert.text.tokenizer import load_vocab, vocab_tokens

log = logging.getLogger("kbert")

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, TASK_FILE = "config.json", "model.weights.h5", "tokenizer.json", "task.json"
VOCABULARY_FILE = os.path.join("assets", "tokenizer", "vocabulary.txt")
# The activations kbert computes that map onto keras-hub's (tanh) GELU.
GELU_TANH = ("gelu_tanh", "gelu_new", "gelu_pytorch_tanh")
# keras-hub's text classifier preprocessor pads to 512 by default; never past the model's positions.
DEFAULT_SEQUENCE_LENGTH = 512
# Real text for measuring the erf/tanh GELU difference (Debian package descriptions and
# google-research/bert's sample text), so the number reported is the one users will see.
MEASURE_TEXTS = (
    "This package contains the shared library needed by programs that use the GNU C library.",
    "A fast, scalable, distributed revision control system with an extensive set of commands.",
    "Text::Wrap formats paragraphs; it is a drop-in replacement for the fmt utility.",
    "The man went to the store. He bought a gallon of milk.",
    "Penguins are flightless birds, mostly of the southern hemisphere; see also puffin.",
    "Unicode is handled properly: café, naïve, 東京, and ﬁ ligatures.",
)


def _unique_vocabulary(vocab_file: str, out_file: str) -> int:
    """Copy vocab.txt, renaming earlier copies of a repeated token; returns how many were renamed.

    keras-hub's tokenizer (tf.text's FastWordpieceTokenizer) refuses repeated tokens. The
    original's `load_vocab` maps a repeated token to its last id, so renaming the earlier
    ones keeps every token's id as the original tokenizer gives it.
    """
    tokens = vocab_tokens(vocab_file)
    last = load_vocab(vocab_file)
    renamed = [token if last[token] == i else f"[unused_repeat_{i}]" for i, token in enumerate(tokens)]
    with open(out_file, "w", encoding="utf-8") as f:
        f.write("\n".join(renamed) + "\n")
    return sum(a != b for a, b in zip(tokens, renamed))


def _backbone(config: BertConfig):
    return keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        dropout=config.hidden_dropout_prob,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size,
    )


def _set_weights(layer, arrays: dict, what: str):
    """Assign every weight of a keras-hub layer from `arrays` by path; all must be there and used."""
    paths = {w.path for w in layer.weights}
    if paths != set(arrays):
        raise RuntimeError(
            f"kbert bug: {what} weights do not match keras-hub's: missing "
            f"{listing(paths - set(arrays))}, extra {listing(set(arrays) - paths)}"
        )
    for weight in layer.weights:
        weight.assign(arrays[weight.path])


def _numpy(x):
    """A model output as numpy, on any backend (a PyTorch tensor that carries grad refuses np.asarray)."""
    return keras.ops.convert_to_numpy(x)


def _max_difference(encoder: BertEncoder, backbone, vocab_file: str, do_lower_case: bool) -> dict:
    """Max |kbert - keras-hub| of sequence_output and pooled_output on MEASURE_TEXTS (same ids)."""
    length = min(64, encoder.config.max_position_embeddings)
    packed, _ = make_preprocessor(vocab_file, do_lower_case, length).encode(list(MEASURE_TEXTS))
    ours = encoder(packed, training=False)
    theirs = backbone(
        {"token_ids": packed["input_ids"], "segment_ids": packed["segment_ids"], "padding_mask": packed["input_mask"]},
        training=False,
    )
    mask = np.asarray(packed["input_mask"], bool)  # padding positions are not compared
    return {
        "sequence_output": float(
            np.abs(_numpy(ours["sequence_output"]) - _numpy(theirs["sequence_output"]))[mask].max()
        ),
        "pooled_output": float(np.abs(_numpy(ours["pooled_output"]) - _numpy(theirs["pooled_output"])).max()),
    }


# keras-hub's BertMaskedLM computes its head's LayerNorm with this epsilon (MaskedLMHead's default),
# where google-research/bert's, and kbert's, is 1e-12.
KERAS_HUB_MLM_EPSILON = 1e-5


def _masked_lm(backbone, mlm_arrays: dict, preprocessor=None):
    """keras-hub's BertMaskedLM on `backbone`, its head holding `mlm_arrays` (keras-hub paths)."""
    task = keras_hub.models.BertMaskedLM(backbone, preprocessor=preprocessor)
    tied = {
        w.path: keras.ops.convert_to_numpy(w) for w in backbone.token_embedding.weights
    }  # the head's tied word embeddings
    _set_weights(task.masked_lm_head, {**mlm_arrays, **tied}, "masked-LM head")
    return task


def _mlm_difference(pretrainer, task, vocab_file: str, do_lower_case: bool) -> float:
    """Max |kbert - keras-hub| of the masked-LM logits on MEASURE_TEXTS, at three real tokens each."""
    length = min(64, pretrainer.config.max_position_embeddings)
    packed, _ = make_preprocessor(vocab_file, do_lower_case, length).encode(list(MEASURE_TEXTS))
    positions = np.tile(np.array([[1, 2, 3]], dtype="int32"), (len(MEASURE_TEXTS), 1))
    ours = pretrainer({**packed, "masked_lm_positions": positions}, training=False)["mlm_logits"]
    theirs = task(
        {
            "token_ids": packed["input_ids"],
            "segment_ids": packed["segment_ids"],
            "padding_mask": packed["input_mask"],
            "mask_positions": positions,
        },
        training=False,
    )
    return float(np.abs(_numpy(ours) - _numpy(theirs)).max())


@writes("out_dir", inputs=("model_dir",))
def save_keras_hub_preset(model_dir, out_dir, overwrite: bool = False) -> dict:
    """Write a kbert model as a keras-hub BERT preset directory; returns a JSON-ready report.

    `keras_hub.models.BertBackbone.from_preset(out_dir)`, `BertTokenizer.from_preset` and
    `BertTextClassifier.from_preset(out_dir, num_classes=N)` load it. A fine-tuned kbert
    classifier also writes keras-hub's task files, so `BertTextClassifier.from_preset(out_dir)`
    gets the trained head; a pretraining model with a trained masked-LM head writes it as a
    `BertMaskedLM` task, which `BertMaskedLM.from_preset(out_dir)` and `from-keras-hub` read (a
    fresh one, random weights, is left out). keras-hub has no next-sentence head.

    Args:
        model_dir: str. A kbert model directory or a google-research checkpoint directory.
        out_dir: str. The preset directory to write (atomically).
        overwrite: bool. Replace `out_dir` if it exists and is not empty.

    Example:
    >>> report = save_keras_hub_preset("out/tiny", "presets/tiny")  # doctest: +SKIP
    """
    model = open_model(os.fspath(model_dir))
    if isinstance(model, (BertEncoder, BertPretrainer, BertClassifier)):
        encoder = encoder_of(model)
    else:
        raise KbertError(
            f"{model_dir}: keras-hub has no preset for a {type(model).__name__}; convert an encoder, a "
            f"pretraining model or a classifier (the encoder of any fine-tuned model: `kbert export "
            f"--format tfhub`)"
        )
    config = encoder.config
    if config.hidden_act not in ("gelu",) + GELU_TANH:
        raise KbertError(
            f"{model_dir}: hidden_act {config.hidden_act!r}; keras-hub's BertBackbone computes GELU "
            f"only, so this model cannot be written as a keras-hub preset"
        )
    backbone = _backbone(config)
    _set_weights(backbone, named_arrays(encoder, "keras_hub"), "encoder")
    difference = _max_difference(encoder, backbone, model.vocab_file, model.do_lower_case)
    fresh = fresh_heads_of(model)
    mlm_arrays = None
    if isinstance(model, BertPretrainer) and "masked_lm" not in fresh:
        mlm_arrays = {k: v for k, v in named_arrays(model, "keras_hub").items() if k.startswith("mlm_head/")}
        difference["mlm_logits"] = _mlm_difference(
            model, _masked_lm(backbone, mlm_arrays), model.vocab_file, model.do_lower_case
        )
    elif isinstance(model, BertPretrainer):
        log.info("left out the masked_lm head: a converter created it, so its weights are random")

    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp, tempfile.TemporaryDirectory() as scratch:
        renamed = _write_preset(tmp, scratch, model, config, backbone, mlm_arrays)
    return _preset_report(out_dir, model, config, backbone, mlm_arrays, difference, renamed)


def _write_preset(tmp: str, scratch: str, model, config, backbone, mlm_arrays) -> list:
    """The preset's files in `tmp`: the backbone, the tokenizer and preprocessor, and a classifier's
    task or a trained masked-LM head's; returns the repeated tokens renamed in its vocabulary."""
    vocab = os.path.join(scratch, "vocab.txt")
    renamed = _unique_vocabulary(model.vocab_file, vocab)
    # An uncased BERT strips accents as it lower-cases (the original's _run_strip_accents).
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=vocab, lowercase=model.do_lower_case, strip_accents=model.do_lower_case
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=min(DEFAULT_SEQUENCE_LENGTH, config.max_position_embeddings)
    )
    if isinstance(model, BertClassifier):
        task = keras_hub.models.BertTextClassifier(
            backbone, model.num_classes, preprocessor=preprocessor, dropout=model.dropout_rate
        )
        head = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
        _set_weights(
            task.output_dense,
            {
                theirs: head[ours].T if transposed else head[ours]
                for ours, theirs, transposed in KERAS_HUB_CLASSIFIER_HEAD
            },
            "classifier",
        )
        # h5py crashes on a disk that fills as it writes: see kbert.runtime.files.save_weights.
        check_free_space(tmp, weights_file_bytes(task), "the preset's weights")
        task.save_to_preset(tmp)  # backbone, preprocessor (with the tokenizer), task
    elif mlm_arrays is not None:
        task = _masked_lm(backbone, mlm_arrays)
        check_free_space(tmp, weights_file_bytes(task), "the preset's weights")
        task.save_to_preset(tmp)  # backbone, task with the head
        # The classifier's preprocessor, as for a backbone alone, so that BertTextClassifier.from_preset
        # keeps working; BertMaskedLM.from_preset(out_dir, preprocessor=None) reads the head.
        preprocessor.save_to_preset(tmp)  # the tokenizer too, and the sequence length
    else:
        check_free_space(tmp, weights_file_bytes(backbone), "the preset's weights")
        backbone.save_to_preset(tmp)
        preprocessor.save_to_preset(tmp)  # the tokenizer too, and the sequence length
    return renamed


def _preset_report(out_dir, model, config, backbone, mlm_arrays, difference: dict, renamed) -> dict:
    """`save_keras_hub_preset`'s report: what was written, how far keras-hub's outputs are from kbert's, and why."""
    exact = config.hidden_act in GELU_TANH
    return {
        "preset": os.path.abspath(os.fspath(out_dir)),
        "parameters": int(backbone.count_params()),
        "task": "BertTextClassifier"
        if isinstance(model, BertClassifier)
        else "BertMaskedLM"
        if mlm_arrays is not None
        else None,
        "hidden_act": config.hidden_act,
        "max_abs_difference": difference,
        "note": (
            "keras-hub computes the same GELU (tanh): the outputs agree to float32 rounding"
            if exact
            else "keras-hub's BertBackbone computes GELU with tanh; this model was trained with the exact erf "
            "GELU, so keras-hub's outputs differ from kbert's by max_abs_difference on real text"
        )
        + (
            f"; keras-hub's masked-LM head computes its LayerNorm with epsilon {KERAS_HUB_MLM_EPSILON} (kbert "
            f"1e-12) and the erf GELU, so its logits differ from kbert's by max_abs_difference.mlm_logits"
            if mlm_arrays is not None
            else ""
        ),
        "left_out": (["next_sentence"] if isinstance(model, BertPretrainer) else [])
        + (["masked_lm"] if isinstance(model, BertPretrainer) and mlm_arrays is None else []),
        "renamed_repeated_tokens": renamed,
        "do_lower_case": model.do_lower_case,
    }


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise KbertError(f"{path}: unreadable {what} ({first_line(e)}); save the preset again") from None


def load_keras_hub_preset(src, do_lower_case: bool | None = None):
    """A `BertPretrainer` holding a keras-hub BertBackbone preset's weights, exactly.

    The next-sentence head, which keras-hub does not have, is fresh; so is the masked-LM head
    unless the preset is a `BertMaskedLM` task (what `to-keras-hub` writes for a pretraining
    model), whose head is read.

    Args:
        src: str. A local keras-hub preset directory (`save_to_preset`'s output).
        do_lower_case: bool. Default: the preset tokenizer's `lowercase`, else decided by the
            folder name (`lower_case_for`).

    Returns the model, declaring its vocabulary; `convert_keras_hub_preset` also returns its report.

    Example:
    >>> model = load_keras_hub_preset("presets/bert_tiny_en_uncased")  # doctest: +SKIP
    """
    return convert_keras_hub_preset(src, do_lower_case).model


def convert_keras_hub_preset(src, do_lower_case: bool | None = None) -> Converted:
    """`load_keras_hub_preset`'s model (same arguments) and its report."""
    src = os.fspath(src)
    if not os.path.isdir(src):
        raise KbertError(
            f"{src}: no such directory; pass a keras-hub preset directory (config.json, "
            f"model.weights.h5, tokenizer.json)"
        )
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, VOCABULARY_FILE):
        if not os.path.isfile(os.path.join(src, name)):
            raise KbertError(
                f"{src}: {name} is missing; a BERT preset as keras-hub's save_to_preset writes it has "
                f"{CONFIG_FILE}, {WEIGHTS_FILE}, {TOKENIZER_FILE} and {VOCABULARY_FILE}"
            )
    saved = _read_json(os.path.join(src, CONFIG_FILE), "preset config")
    kind = saved.get("class_name") if isinstance(saved, dict) else None
    if kind != "BertBackbone":
        raise KbertError(f"{src}: a {kind or 'non-Keras'} preset; kbert converts BERT presets (BertBackbone)")
    task_file = os.path.join(src, TASK_FILE)
    task_kind = _read_json(task_file, "task config").get("class_name") if os.path.isfile(task_file) else None
    masked_lm = None
    try:
        if task_kind == "BertMaskedLM":  # the backbone and its masked-LM head
            masked_lm = keras_hub.models.BertMaskedLM.from_preset(src, preprocessor=None)
            backbone = masked_lm.backbone
        else:
            backbone = keras_hub.models.BertBackbone.from_preset(src)
    except Exception as e:  # keras-hub raises ValueError, OSError, h5py errors, ...
        raise KbertError(f"{src}: keras-hub cannot load this preset ({first_line(e)})") from None
    values = saved["config"]
    config = BertConfig(
        vocab_size=values["vocabulary_size"],
        hidden_size=values["hidden_dim"],
        num_hidden_layers=values["num_layers"],
        num_attention_heads=values["num_heads"],
        intermediate_size=values["intermediate_dim"],
        hidden_act="gelu_tanh",
        hidden_dropout_prob=values.get("dropout", 0.1),
        attention_probs_dropout_prob=values.get("dropout", 0.1),
        max_position_embeddings=values["max_sequence_length"],
        type_vocab_size=values.get("num_segments", 2),
    )
    vocab_file = os.path.join(src, VOCABULARY_FILE)
    check_vocab(vocab_file, config)
    arrays = {w.path: keras.ops.convert_to_numpy(w.value) for w in backbone.weights}
    if masked_lm is not None:
        arrays.update(
            {
                w.path: keras.ops.convert_to_numpy(w.value)
                for w in masked_lm.masked_lm_head.weights
                if w.path.startswith("mlm_head/")
            }
        )
    if do_lower_case is None:
        tokenizer = _read_json(os.path.join(src, TOKENIZER_FILE), "tokenizer config")
        do_lower_case = tokenizer.get("config", {}).get("lowercase")
        if not isinstance(do_lower_case, bool):
            do_lower_case = lower_case_for(src)
            log.info(
                "do_lower_case=%s, from the folder name; pass %s to set it",
                do_lower_case,
                option("do_lower_case", flag="--lowercase/--no-lowercase", command="convert from-keras-hub"),
            )
    model, fresh_heads = pretrainer_from_named(
        config, arrays, "keras_hub", src, Vocabulary(vocab_file, bool(do_lower_case))
    )
    report = {"source": src, "loaded": len(arrays), "fresh_heads": fresh_heads, "hidden_act": "gelu_tanh"}
    if masked_lm is not None:
        # Its weights are the trained ones, read exactly; keras-hub computes the head a little
        # differently (LayerNorm epsilon, GELU form), so the difference is measured and said.
        report["mlm_max_abs_difference"] = _mlm_difference(model, masked_lm, vocab_file, bool(do_lower_case))
        log.info(
            "read the masked-LM head of the BertMaskedLM task; keras-hub computes it with LayerNorm epsilon %s and "
            "the erf GELU, kbert with 1e-12 and hidden_act gelu_tanh: their logits differ by up to %.2g on real text",
            KERAS_HUB_MLM_EPSILON,
            report["mlm_max_abs_difference"],
        )
    elif task_kind:
        log.info("%s holds a %s task; its head is not converted (kbert converts the backbone)", src, task_kind)
    return Converted(model, report)
