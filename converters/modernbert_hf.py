"""Hugging Face ModernBERT folders (Ettin's encoders too) in and out of kbert, strictly.

As with BERT: only safetensors is read (kbert's numpy reader, no torch), every weight must be
found with its exact shape, and a name kbert does not know is an error. Each transformers class
becomes the kbert model of the same parts:

| transformers                          | kbert                  |
|---------------------------------------|------------------------|
| `ModernBertModel`                     | `ModernBertEncoder`    |
| `ModernBertForMaskedLM`               | `ModernBertMaskedLM`   |
| `ModernBertForSequenceClassification` | `ModernBertClassifier` |
| `ModernBertForTokenClassification`    | `ModernBertTagger`     |

Writing gives the folder `from_pretrained` loads with no missing or unexpected keys, and the
same tensors bit for bit. The tokenizer's files travel alongside.
"""

from __future__ import annotations

import json
import logging
import os

import keras
import numpy as np

from kbert.converters.loading import Converted
from kbert.converters.safetensors_file import SafetensorsFile, write_safetensors
from kbert.modernbert.config import ModernBertConfig
from kbert.modernbert.models import (
    ModernBertClassifier,
    ModernBertEncoder,
    ModernBertMaskedLM,
    ModernBertTagger,
)
from kbert.modernbert.tokenizer import copy_tokenizer_files, tokenizer_files_in
from kbert.runtime.errors import KbertError, listing
from kbert.runtime.files import atomic_output_dir, writes

log = logging.getLogger("kbert")

HF_CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURES = {
    "ModernBertModel": ModernBertEncoder,
    "ModernBertForMaskedLM": ModernBertMaskedLM,
    "ModernBertForSequenceClassification": ModernBertClassifier,
    "ModernBertForTokenClassification": ModernBertTagger,
}
ARCHITECTURE_OF = {cls: name for name, cls in ARCHITECTURES.items()}
TIED_DECODER = "decoder.weight"  # the MLM decoder's table: the token embeddings, one parameter


def is_modernbert_config(values: dict) -> bool:
    return values.get("model_type") == "modernbert"


def _norm(prefix: str, layer, with_bias: bool) -> dict:
    names = {f"{prefix}.weight": (layer.gamma, False)}
    if with_bias:
        names[f"{prefix}.bias"] = (layer.beta, False)
    return names


def _dense(prefix: str, layer) -> dict:
    # torch's Linear keeps [out, in]; Keras' Dense [in, out].
    names = {f"{prefix}.weight": (layer.kernel, True)}
    if layer.use_bias:
        names[f"{prefix}.bias"] = (layer.bias, False)
    return names


def hf_names(model) -> dict:
    """{transformers' name: (the kbert variable, whether it is stored transposed)} for every weight."""
    encoder = model if isinstance(model, ModernBertEncoder) else model.encoder
    config = encoder.config
    prefix = "" if isinstance(model, ModernBertEncoder) else "model."
    names = {f"{prefix}embeddings.tok_embeddings.weight": (encoder.tok_embeddings.embeddings, False)}
    names.update(_norm(f"{prefix}embeddings.norm", encoder.embeddings_norm, config.norm_bias))
    for i, layer in enumerate(encoder.encoder_layers):
        at = f"{prefix}layers.{i}"
        if layer.attn_norm is not None:
            names.update(_norm(f"{at}.attn_norm", layer.attn_norm, config.norm_bias))
        names.update(_dense(f"{at}.attn.Wqkv", layer.attn.Wqkv))
        names.update(_dense(f"{at}.attn.Wo", layer.attn.Wo))
        names.update(_norm(f"{at}.mlp_norm", layer.mlp_norm, config.norm_bias))
        names.update(_dense(f"{at}.mlp.Wi", layer.Wi))
        names.update(_dense(f"{at}.mlp.Wo", layer.Wo))
    names.update(_norm(f"{prefix}final_norm", encoder.final_norm, config.norm_bias))
    if not isinstance(model, ModernBertEncoder):
        names.update(_dense("head.dense", model.head.dense))
        names.update(_norm("head.norm", model.head.norm, config.norm_bias))
    if isinstance(model, ModernBertMaskedLM) and config.decoder_bias:
        names["decoder.bias"] = (model.decoder.bias, False)
    if isinstance(model, (ModernBertClassifier, ModernBertTagger)):
        names.update(_dense("classifier", model.classifier))
    return names


# === Reading ===


def _architecture(values: dict, keys, where: str) -> str:
    named = [a for a in values.get("architectures") or () if a in ARCHITECTURES]
    if named:
        return named[0]
    if any(k.startswith("classifier.") for k in keys):
        raise KbertError(
            f"{where}: a classifier's weights, but architectures names no ModernBertFor*Classification; "
            f"add the class to config.json's architectures"
        )
    return "ModernBertForMaskedLM" if "decoder.bias" in keys or "head.dense.weight" in keys else "ModernBertModel"


def _open(folder: str, weight_files) -> dict:
    keys = {}
    for path in weight_files:
        f = SafetensorsFile(path)
        for name in f.shapes:
            keys[name] = f
    return keys


def convert_modernbert(source, values: dict) -> Converted:
    """The kbert model a Hugging Face ModernBERT folder holds (`source`: converters.hf's `HfSource`)
    and what the conversion did."""
    config = ModernBertConfig.from_hf(values, source.config_file)
    keys = _open(source.folder, source.weight_files)
    architecture = _architecture(values, keys, source.config_file)
    cls = ARCHITECTURES[architecture]
    tokenizer_file, tokenizer_folder = tokenizer_files_in(source.folder)
    head = {}
    if cls in (ModernBertClassifier, ModernBertTagger):
        labels = _labels(values, source.config_file)
        head = {"num_classes": len(labels), "task_info": {"labels": labels}}
    model = cls(config, tokenizer_file=tokenizer_file, **head)
    names = hf_names(model)
    if architecture == "ModernBertModel" and not any(name in keys for name in names):
        # A ModernBertModel inside a task folder's files keeps the "model." prefix: read it as such.
        names = {f"model.{name}": value for name, value in names.items()}
    unknown = sorted(set(keys) - set(names) - {TIED_DECODER})
    if unknown:
        raise KbertError(
            f"{source.folder}: {listing(unknown)} in the weights match no {architecture} weight; is config.json's "
            f"architectures right?"
        )
    missing = sorted(set(names) - set(keys))
    if missing:
        raise KbertError(f"{source.folder}: {listing(missing)} missing from the weights of this {architecture}")
    for name, (variable, transposed) in names.items():
        value = keys[name].read(name)
        value = np.ascontiguousarray(value.T) if transposed else value
        if tuple(value.shape) != tuple(variable.shape):
            raise KbertError(
                f"{source.folder}: {name} is {list(keys[name].shapes[name])}, but config.json makes it "
                f"{list(variable.shape)[::-1] if transposed else list(variable.shape)}; the config is not these weights'"
            )
        variable.assign(value)
    if TIED_DECODER in keys:
        table = keras.ops.convert_to_numpy(model_encoder(model).tok_embeddings.embeddings)
        if not np.array_equal(keys[TIED_DECODER].read(TIED_DECODER), table):
            raise KbertError(
                f"{source.folder}: decoder.weight differs from the token embeddings; kbert ties them as "
                f"transformers does, so this untied model cannot be converted exactly"
            )
    model.tokenizer_folder = tokenizer_folder
    dtypes = sorted({f.dtypes[name] for name, f in keys.items()})
    if set(dtypes) - {"F32"}:
        log.info("converted %s weights to float32", "/".join(d for d in dtypes if d != "F32"))
    return Converted(
        model,
        {
            "source": source.weight_files[0] if len(source.weight_files) == 1 else source.folder,
            "family": "modernbert",
            "architecture": architecture,
            "loaded": len(names),
            "fresh_heads": [],
            "dtypes": dtypes,
        },
    )


def model_encoder(model):
    return model if isinstance(model, ModernBertEncoder) else model.encoder


def _labels(values: dict, where: str) -> list:
    id2label = values.get("id2label") or {}
    count = int(values.get("num_labels", len(id2label) or 2))
    if id2label and sorted(int(i) for i in id2label) != list(range(len(id2label))):
        raise KbertError(f"{where}: id2label's ids must be 0 to {len(id2label) - 1}")
    return [str(id2label.get(str(i), id2label.get(i, i))) for i in range(len(id2label) or count)]


def describe_modernbert_hf(source, values: dict) -> dict:
    """A JSON-ready summary of a Hugging Face ModernBERT folder, read from headers only."""
    config = ModernBertConfig.from_hf(values, source.config_file)
    keys = _open(source.folder, source.weight_files)
    return {
        "kind": "Hugging Face model",
        "family": "modernbert",
        "source": source.folder,
        "weight_files": [os.path.basename(p) for p in source.weight_files],
        "architecture": _architecture(values, keys, source.config_file),
        "config": config.to_hf(),
        "parameters": int(sum(np.prod(f.shapes[n]) for n, f in keys.items() if n != TIED_DECODER)),
        "dtypes": sorted({f.dtypes[n] for n, f in keys.items()}),
    }


# === Writing ===


def hf_tensors(model) -> tuple:
    """({transformers' name: float32 array}, architecture) of a kbert ModernBERT model."""
    architecture = ARCHITECTURE_OF.get(type(model))
    if architecture is None:
        raise KbertError(f"cannot write a {type(model).__name__} as a Hugging Face ModernBERT")
    tensors = {}
    for name, (variable, transposed) in hf_names(model).items():
        value = keras.ops.convert_to_numpy(variable).astype("float32", copy=False)
        tensors[name] = value.T if transposed else value
    # decoder.weight is left out, as transformers' save_pretrained leaves it: it is the token embeddings.
    return tensors, architecture


@writes("out_dir")
def save_modernbert_hf(model, out_dir, overwrite: bool = False, write_more=None) -> dict:
    """Write a kbert ModernBERT as the Hugging Face folder of its transformers class, atomically:
    config.json, model.safetensors and the tokenizer's files; `write_more(folder)` adds files
    (a sentence-transformers folder's) before the folder takes its name."""
    tensors, architecture = hf_tensors(model)
    values = model.config.to_hf()
    for key in ("kbert_model", "kbert_family", "task", "labels", "embedding"):
        values.pop(key, None)
    values["architectures"] = [architecture]
    if isinstance(model, (ModernBertClassifier, ModernBertTagger)):
        labels = model.task_info.get("labels") or [str(i) for i in range(model.num_classes)]
        values["id2label"] = {str(i): label for i, label in enumerate(labels)}
        values["label2id"] = {label: i for i, label in enumerate(labels)}
        values["num_labels"] = len(labels)
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        write_safetensors(os.path.join(tmp, WEIGHTS_FILE), tensors)
        with open(os.path.join(tmp, HF_CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(json.dumps(values, indent=2) + "\n")
        copy_tokenizer_files(model, tmp)
        if write_more is not None:
            write_more(tmp)
    return {
        "architecture": architecture,
        "parameters": int(sum(np.size(v) for v in tensors.values())),
        "left_out": [],
    }
