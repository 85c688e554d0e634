"""Hugging Face BERT directories (config.json + model.safetensors) in and out of kbert, strictly.

Reading mirrors the TF1 converter: every weight must be found with its exact shape, unknown
keys are an error, a missing head is freshly initialised and said so. Names go through the
one table in converters/names.py. Only safetensors is read, by kbert's numpy reader
(converters/safetensors_file.py, no torch): a `pytorch_model.bin` is a pickle, and unpickling
can run any code, so it is refused and never opened. Writing gives what
`transformers.BertForPreTraining.from_pretrained` loads with no missing or unexpected keys.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import shutil
import tempfile
import weakref

import numpy as np

from kbert.config import BertConfig
from kbert.converters.loading import HEAD_PATHS, POOLER_PATH, Converted, Stored, load_pretrainer, stored_weights
from kbert.converters.names import (
    HF_BUFFERS,
    HF_OPTIONAL,
    HF_TIED,
    hf_canonical,
    hf_name,
    hf_to_tf1_names,
    tf1_to_kbert_paths,
)
from kbert.converters.safetensors_file import RESAVE, SafetensorsFile, write_safetensors
from kbert.errors import KbertError
from kbert.errors import listing as _listing
from kbert.files import atomic_output_dir, count_lines
from kbert.model.bert import BertEncoder, BertPretrainer, Vocabulary
from kbert.model_dir import VOCAB_FILE, check_vocab
from kbert.outputs import writes
from kbert.text.tokenizer import load_vocab

log = logging.getLogger("kbert")

HF_CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded model.safetensors
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
OTHER_FORMATS = ("tf_model.h5", "flax_model.msgpack")


# === Finding the model ===


@dataclasses.dataclass
class HfSource:
    """Where a Hugging Face BERT's parts are."""

    folder: str
    config_file: str
    weight_files: list


def find_hf_model(src) -> HfSource:
    """Resolve SRC: a Hugging Face model directory, or a .safetensors file (or a sharded
    model's model.safetensors.index.json) with config.json beside it. Pickles are refused."""
    src = os.fspath(src).rstrip("/") or "/"
    if os.path.isdir(src):
        folder, weights = src, _weights_in_dir(src)
    elif os.path.isfile(src):
        folder = os.path.dirname(src) or "."
        if src.endswith(".index.json"):
            weights = _shards(src)
        elif src.endswith(".safetensors"):
            weights = [src]
        elif src.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt")):
            raise KbertError(f"{src} is a PyTorch pickle, which kbert never loads (unpickling can run code); {RESAVE}")
        else:
            raise KbertError(
                f"{src}: not a model.safetensors; pass the Hugging Face model directory or its .safetensors file"
            )
    else:
        raise KbertError(
            f"{src}: no such Hugging Face model directory or file; pass the folder "
            f"holding config.json and model.safetensors"
        )
    config_file = os.path.join(folder, HF_CONFIG_FILE)
    if not os.path.isfile(config_file):
        hint = (
            "; this looks like a google-research checkpoint: use kbert convert from-tf1"
            if os.path.isfile(os.path.join(folder, "bert_config.json"))
            else "; put the model's config.json beside its weights"
        )
        raise KbertError(f"{config_file}: missing{hint}")
    return HfSource(folder, config_file, weights)


def _weights_in_dir(folder):
    if os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
        return [os.path.join(folder, WEIGHTS_FILE)]
    if os.path.isfile(os.path.join(folder, WEIGHTS_INDEX)):
        return _shards(os.path.join(folder, WEIGHTS_INDEX))
    for name in PICKLE_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            raise KbertError(
                f"{folder}: only {name} here, a PyTorch pickle, which kbert never loads "
                f"(unpickling can run code); {RESAVE}"
            )
    found = [name for name in OTHER_FORMATS if os.path.isfile(os.path.join(folder, name))]
    if found:
        raise KbertError(f"{folder}: only {found[0]} here; kbert reads model.safetensors: {RESAVE}")
    if glob.glob(os.path.join(folder, "bert_model.ckpt*.index")):
        raise KbertError(
            f"{folder}: a google-research checkpoint, not a Hugging Face model; use kbert convert from-tf1"
        )
    raise KbertError(
        f"{folder}: no {WEIGHTS_FILE} here; pass the Hugging Face model directory "
        f"that holds config.json and {WEIGHTS_FILE}"
    )


def _shards(index_file):
    folder = os.path.dirname(index_file) or "."
    try:
        with open(index_file, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KbertError(f"{index_file}: not a safetensors index (no weight_map); download it again") from None
    paths = [os.path.join(folder, name) for name in files]
    for path in paths:
        if not os.path.isfile(path):
            raise KbertError(f"{path}: missing, but {os.path.basename(index_file)} lists it; download every shard")
    return paths


def is_hf_model(src) -> bool:
    """Whether SRC looks like a Hugging Face model (directory or .safetensors), for `inspect`."""
    src = os.fspath(src)
    if os.path.isfile(src):
        return src.endswith((".safetensors", ".index.json"))
    return os.path.isfile(os.path.join(src, HF_CONFIG_FILE)) and any(
        os.path.isfile(os.path.join(src, name)) for name in (WEIGHTS_FILE, WEIGHTS_INDEX) + PICKLE_FILES + OTHER_FORMATS
    )


# === config.json <-> bert_config.json ===
# transformers' BertConfig defaults, for fields a config.json leaves out (as transformers does).
HF_DEFAULTS = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}
# transformers' hidden_act values that compute what kbert's same-named one does: "gelu" is the
# exact erf form in both; gelu_new and gelu_pytorch_tanh are the tanh approximation.
HF_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "tanh")
KBERT_TO_HF_ACT = {"gelu_tanh": "gelu_new"}  # kbert's other name for it; transformers lacks it
LAYER_NORM_EPS = 1e-12  # google-research/bert's, the only one kbert's LayerNorm uses


def config_from_hf(values: dict, path: str = HF_CONFIG_FILE) -> BertConfig:
    """kbert's `BertConfig` for a Hugging Face BERT config.json dict; refuses what kbert
    would compute differently (LayerNorm epsilon, position embeddings, activation).

    Example:
    >>> config_from_hf({"model_type": "bert", "vocab_size": 300, "hidden_size": 64,
    ...                 "num_attention_heads": 4, "hidden_act": "gelu_new"}).hidden_act
    'gelu_new'
    """
    if not isinstance(values, dict):
        raise KbertError(f"{path}: must be a JSON object, got {type(values).__name__}")
    model_type = values.get("model_type", "bert")
    if model_type != "bert":
        raise KbertError(f'{path}: model_type {model_type!r} is not BERT; kbert converts model_type "bert" only')
    if values.get("is_decoder") or values.get("add_cross_attention"):
        raise KbertError(f"{path}: a decoder BERT (is_decoder/add_cross_attention); kbert converts encoder BERTs only")
    eps = values.get("layer_norm_eps", LAYER_NORM_EPS)
    if eps != LAYER_NORM_EPS:
        raise KbertError(
            f"{path}: layer_norm_eps is {eps}, but kbert's LayerNorm uses "
            f"google-research/bert's 1e-12, so this model would compute other "
            f"outputs; convert a model trained with layer_norm_eps 1e-12"
        )
    position = values.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise KbertError(
            f"{path}: position_embedding_type is {position!r}; kbert has "
            f"google-research/bert's absolute position embeddings only"
        )
    act = values.get("hidden_act", "gelu")
    if act not in HF_ACTS:
        raise KbertError(f"{path}: hidden_act {act!r} is not supported; kbert converts {', '.join(HF_ACTS)}")
    try:
        return BertConfig.from_dict({k: values.get(k, default) for k, default in HF_DEFAULTS.items()})
    except (KbertError, TypeError) as e:
        raise KbertError(f"{path}: {e}") from None


def _read_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise KbertError(f"{path}: invalid JSON ({e}); fix the {what} or download it again") from None


def hf_config(config: BertConfig, architecture: str, pad_token_id: int) -> dict:
    """The config.json transformers reads for `config` (all BERT fields, explicit)."""
    fields = {name: getattr(config, name) for name in BertConfig.field_names()}
    fields["hidden_act"] = KBERT_TO_HF_ACT.get(config.hidden_act, config.hidden_act)
    return {
        "architectures": [architecture],
        "model_type": "bert",
        **fields,
        "layer_norm_eps": LAYER_NORM_EPS,
        "position_embedding_type": "absolute",
        "pad_token_id": pad_token_id,
        "torch_dtype": "float32",
    }


# === Vocabulary and casing ===


def _vocab_file(folder, config: BertConfig, config_file: str):
    """(path to a vocab.txt, where it came from): the folder's vocab.txt, else one written from
    tokenizer.json's WordPiece vocabulary into a temporary directory."""
    path = os.path.join(folder, VOCAB_FILE)
    origin = VOCAB_FILE
    if not os.path.isfile(path):
        tokenizer_json = os.path.join(folder, TOKENIZER_FILE)
        if not os.path.isfile(tokenizer_json):
            raise KbertError(
                f"{folder}: no vocab.txt or tokenizer.json; put the model's vocabulary beside its config.json"
            )
        tokens = wordpiece_vocab(tokenizer_json)
        tmp = tempfile.mkdtemp(prefix="kbert-vocab-")
        path, origin = os.path.join(tmp, VOCAB_FILE), TOKENIZER_FILE
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(token + "\n" for token in tokens))
    n = count_lines(path)
    if n != config.vocab_size:
        raise KbertError(
            f"{os.path.join(folder, origin)} has {n} entries but {config_file} says "
            f"vocab_size {config.vocab_size}; use the vocabulary this model was "
            f"trained with"
        )
    return path, origin


def wordpiece_vocab(tokenizer_json: str) -> list:
    """The tokens of a tokenizer.json's WordPiece model (plus added tokens), in id order."""
    data = _read_json(tokenizer_json, "tokenizer file")
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, dict) else None
        raise KbertError(
            f"{tokenizer_json}: a {kind or 'non-WordPiece'} tokenizer, not BERT's "
            f"WordPiece; pass a model that ships vocab.txt"
        )
    by_id = {int(i): token for token, i in model.get("vocab", {}).items()}
    for added in data.get("added_tokens") or []:
        by_id.setdefault(int(added["id"]), added["content"])
    holes = sorted(set(range(max(by_id, default=-1) + 1)) - set(by_id))
    if holes:  # what a vocab.txt with repeated lines becomes: the repeats' ids have no token
        raise KbertError(
            f"{tokenizer_json}: no token has id {', '.join(map(str, holes[:5]))}, so "
            f"vocab.txt cannot be rebuilt from it; put the model's vocab.txt beside it"
        )
    tokens = [by_id[i] for i in range(len(by_id))]
    bad = [t for t in tokens if not t or t != t.strip() or "\n" in t]
    if bad:
        raise KbertError(f"{tokenizer_json}: token {bad[0]!r} has surrounding whitespace, which vocab.txt cannot hold")
    return tokens


def hf_lower_case(folder) -> tuple:
    """(do_lower_case, file that says so) from tokenizer_config.json, else tokenizer.json's
    BertNormalizer; (None, None) when neither says."""
    path = os.path.join(folder, TOKENIZER_CONFIG_FILE)
    if os.path.isfile(path):
        value = _read_json(path, "tokenizer config")
        if isinstance(value, dict) and isinstance(value.get("do_lower_case"), bool):
            return value["do_lower_case"], TOKENIZER_CONFIG_FILE
    path = os.path.join(folder, TOKENIZER_FILE)
    if os.path.isfile(path):
        data = _read_json(path, "tokenizer file")
        normalizer = data.get("normalizer") if isinstance(data, dict) else None
        if (
            isinstance(normalizer, dict)
            and normalizer.get("type") == "BertNormalizer"
            and isinstance(normalizer.get("lowercase"), bool)
        ):
            return normalizer["lowercase"], TOKENIZER_FILE
    return None, None


# === Reading ===


def _open_weights(source: HfSource) -> dict:
    """{canonical HF name: (file, the name in the file)} over every weight file."""
    keys = {}
    for path in source.weight_files:
        f = SafetensorsFile(path)
        for name in f.shapes:
            canonical = hf_canonical(name)
            if canonical in keys:
                raise KbertError(f"{path}: {name} and {keys[canonical][1]} are the same weight ({canonical}); keep one")
            keys[canonical] = (f, name)
    # transformers may keep the MLM bias only as the decoder's (they are one parameter).
    if "cls.predictions.decoder.bias" in keys and "cls.predictions.bias" not in keys:
        keys["cls.predictions.bias"] = keys["cls.predictions.decoder.bias"]
    return keys


def _unknown_hint(names) -> str:
    if any(n.startswith(("classifier.", "qa_outputs.")) for n in names):
        return (
            "; this is a fine-tuned task model: kbert converts the encoder and the "
            "pretraining heads (BertModel, BertForPreTraining, BertForMaskedLM)"
        )
    return "; is this a BERT model?"


def _check_tied(source, keys):
    """An HF file's copies of the tied MLM decoder must equal what kbert ties them to."""
    for tied, target in HF_TIED.items():
        if tied not in keys or target not in keys or keys[tied] == keys[target]:
            continue
        (f, name), (g, target_name) = keys[tied], keys[target]
        if f.shapes[name] != g.shapes[target_name] or not np.array_equal(f.read(name), g.read(target_name)):
            raise KbertError(
                f"{name} differs from {target_name}; kbert ties the MLM decoder to "
                f"them as google-research/bert does, so this untied model cannot be "
                f"converted exactly"
            )


def load_hf_model(src, do_lower_case=None):
    """A `BertPretrainer` holding the weights of a Hugging Face BERT (safetensors only).

    Args:
        src: str. A Hugging Face model directory (config.json, model.safetensors, vocab.txt or
            tokenizer.json), or its .safetensors file.
        do_lower_case: bool. Whether the vocabulary is uncased; read from tokenizer_config.json
            (or tokenizer.json) when None, else True.

    Returns the model, declaring its vocabulary (`model.vocabulary`); `convert_hf_model` also
    returns what was loaded, skipped and freshly initialised.

    Example:
    >>> model = kbert.converters.load_hf_model("all-MiniLM-L6-v2/")  # doctest: +SKIP
    """
    return convert_hf_model(src, do_lower_case).model


def convert_hf_model(src, do_lower_case=None) -> Converted:
    """`load_hf_model`'s model (same arguments) and its report."""
    source = find_hf_model(src)
    config = config_from_hf(_read_json(source.config_file, "config"), source.config_file)
    vocab_file, vocab_origin = _vocab_file(source.folder, config, source.config_file)
    keys = _open_weights(source)
    hf_to_tf1 = hf_to_tf1_names(config.num_hidden_layers)
    tf1_to_kbert = tf1_to_kbert_paths(config.num_hidden_layers)
    transposed = {hf: hf_name(tf1)[1] for hf, tf1 in hf_to_tf1.items()}
    weights = {c: (f, name) for c, (f, name) in keys.items() if c not in HF_TIED and c not in HF_BUFFERS}

    def read(canonical, shape):
        # A kernel is transposed from torch's [out, in] to TF1's [in, out].
        f, name = weights[canonical]
        value = f.read(name)
        return np.ascontiguousarray(value.T) if transposed[canonical] else value

    kbert_paths = {hf: tf1_to_kbert[tf1] for hf, tf1 in hf_to_tf1.items()}
    hf_of = {path: hf for hf, path in kbert_paths.items()}
    unsaid = False
    if do_lower_case is None:
        do_lower_case, _ = hf_lower_case(source.folder)
        unsaid = do_lower_case is None
        do_lower_case = True if unsaid else do_lower_case
    model, absent = load_pretrainer(
        config,
        Stored(
            where=source.folder,
            shapes={c: tuple(f.shapes[name]) for c, (f, name) in weights.items()},
            paths=kbert_paths,
            read=read,
            stored_shape=lambda path, shape: tuple(shape)[::-1] if transposed[hf_of[path]] else tuple(shape),
            optional={**HEAD_PATHS, "pooler": POOLER_PATH},
            thing="file",
            config_name=HF_CONFIG_FILE,
            config_file=source.config_file,
            unknown_hint=_unknown_hint,
            missing_hint=lambda names: "",
            spelled=lambda c: weights[c][1],
        ),
        Vocabulary(vocab_file, bool(do_lower_case)),
    )
    loaded = set(weights)
    _check_tied(source, keys)

    skipped = sorted(name for canonical, (_, name) in keys.items() if canonical in HF_BUFFERS)
    if skipped:
        log.info("skipped %s (buffers of indices, not weights)", _listing(skipped))
    for part in absent:
        what = "pooler" if part == "pooler" else f"{part} head"
        log.info("the checkpoint has no %s (%s*): it is freshly initialised", what, HF_OPTIONAL[part])
    dtypes = sorted({f.dtypes[name] for hf, (f, name) in keys.items() if hf in loaded})
    if set(dtypes) - {"F32"}:
        log.info("converted %s weights to float32", "/".join(d for d in dtypes if d != "F32"))
    if unsaid:
        log.info(
            "do_lower_case=True: no tokenizer_config.json says otherwise; pass --lowercase/--no-lowercase to set it"
        )
    if vocab_origin != VOCAB_FILE:  # the temporary vocab.txt lives as long as the model
        weakref.finalize(model, shutil.rmtree, os.path.dirname(vocab_file), True)
    return Converted(
        model,
        {
            "source": source.weight_files[0] if len(source.weight_files) == 1 else source.folder,
            "loaded": len(loaded),
            "fresh_heads": absent,
            "skipped": skipped,
            "dtypes": dtypes,
            "vocab_from": vocab_origin,
        },
    )


# === Writing ===


def hf_tensors(model) -> tuple:
    """({HF name: float32 array}, architecture) for a kbert encoder or pretrainer: kernels
    transposed to torch's [out, in], the tied decoder written out as transformers names it."""
    if type(model) not in (BertEncoder, BertPretrainer):
        raise KbertError(
            f"cannot write a {type(model).__name__} as a Hugging Face model; to-hf "
            f"writes kbert encoders and pretrainers (task heads have no HF layout here)"
        )
    tf1_to_kbert = tf1_to_kbert_paths(model.config.num_hidden_layers)
    hf_paths = {hf_name(tf1)[0]: path for tf1, path in tf1_to_kbert.items()}
    transposed = {path: hf_name(tf1)[1] for tf1, path in tf1_to_kbert.items()}

    def to_stored(path, value):
        value = np.asarray(value, dtype="float32")
        return value.T if transposed[path] else value

    tensors = stored_weights(model, hf_paths, format_name="a Hugging Face model", to_stored=to_stored)
    if type(model) is BertEncoder:
        # BertModel's own files carry no "bert." prefix (it is BertForPreTraining's attribute).
        return {name[len("bert.") :]: value for name, value in tensors.items()}, "BertModel"
    for tied, target in HF_TIED.items():  # so that any loader, tying or not, finds them
        tensors[tied] = tensors[target]
    return tensors, "BertForPreTraining"


@writes("out_dir")
def save_hf_model(model, out_dir, vocab_file=None, do_lower_case=None, overwrite: bool = False):
    """Write `model` as a Hugging Face BERT directory, atomically.

    Writes config.json, model.safetensors (float32), vocab.txt and tokenizer_config.json;
    `transformers.BertForPreTraining.from_pretrained(out_dir)` (BertModel for an encoder)
    loads it with no missing or unexpected keys.

    Args:
        model: a kbert `BertEncoder` or `BertPretrainer`.
        out_dir: str. Output directory (must not exist or be empty unless `overwrite`).
        vocab_file: str. Defaults to `model.vocab_file` (set by `kbert.load` and the converters).
        do_lower_case: bool. Defaults to `model.do_lower_case`, else True.

    Example:
    >>> kbert.converters.save_hf_model(kbert.load("out/tiny"), "out/tiny-hf")  # doctest: +SKIP
    """
    vocab_file = vocab_file or getattr(model, "vocab_file", None)
    if not vocab_file:
        raise KbertError("save_hf_model needs the vocabulary: pass vocab_file=PATH/vocab.txt")
    if do_lower_case is None:
        do_lower_case = getattr(model, "do_lower_case", True)
    config = BertConfig.from_dict({k: v for k, v in model.config.to_dict().items() if k in BertConfig.field_names()})
    check_vocab(vocab_file, config)
    tensors, architecture = hf_tensors(model)
    # transformers' BertTokenizer reads vocab.txt as the original's load_vocab does: a repeated
    # token gets its last id, so that is the [PAD] id the config must name.
    pad_token_id = load_vocab(vocab_file).get("[PAD]", 0)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(do_lower_case),
        "model_max_length": config.max_position_embeddings,
    }
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        write_safetensors(os.path.join(tmp, WEIGHTS_FILE), tensors)
        _write_json(os.path.join(tmp, HF_CONFIG_FILE), hf_config(config, architecture, pad_token_id))
        _write_json(os.path.join(tmp, TOKENIZER_CONFIG_FILE), tokenizer_config)
        shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB_FILE))
    return out_dir


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(value, indent=2) + "\n")


# === inspect ===


def describe_hf(src) -> dict:
    """A JSON-ready summary of a Hugging Face BERT, read from headers only (no weights)."""
    source = find_hf_model(src)
    values = _read_json(source.config_file, "config")
    keys = _open_weights(source)
    weights = {c: v for c, v in keys.items() if c not in HF_BUFFERS and c not in HF_TIED}
    layers = {c.split(".")[3] for c in weights if c.startswith("bert.encoder.layer.")}
    folder = source.folder
    vocab = os.path.join(folder, VOCAB_FILE)
    return {
        "kind": "Hugging Face model",
        "source": source.folder,
        "weight_files": [os.path.basename(p) for p in source.weight_files],
        "config": config_from_hf(values, source.config_file).to_dict(),
        "architectures": values.get("architectures") if isinstance(values, dict) else None,
        "vocab_entries": count_lines(vocab) if os.path.isfile(vocab) else None,
        "parameters": int(sum(np.prod(f.shapes[n]) for f, n in weights.values())),
        "layers_in_file": len(layers),
        "heads": {part: any(c.startswith(prefix) for c in keys) for part, prefix in HF_OPTIONAL.items()},
        "dtypes": sorted({f.dtypes[n] for f, n in weights.values()}),
        "do_lower_case": hf_lower_case(folder)[0],
    }
