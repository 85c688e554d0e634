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

import keras
import numpy as np

from kbert.config import BertConfig
from kbert.converters import loading
from kbert.converters.modernbert_hf import (
    convert_modernbert,
    describe_modernbert_hf,
    is_modernbert_config,
    save_modernbert_hf,
)
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
from kbert.finetuning.tasks import get_task, head_task_info
from kbert.formats.model_dir import (
    HEADS,
    VOCAB_FILE,
    fresh_heads_of,
    lower_case_for,
    stored_head_provenance,
)
from kbert.model.bert import BertClassifier, BertEncoder, BertPretrainer, Vocabulary, bert_classifier
from kbert.model.embedding_record import EMBEDDING_KEY, check_embedding
from kbert.modernbert.config import ModernBertConfig
from kbert.runtime.errors import KbertError, listing, option
from kbert.runtime.files import atomic_output_dir, count_lines, writes
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


# The key kbert adds to a config.json it writes with fresh heads in it (to-hf --include-fresh-heads),
# so that reading it back does not take their random weights for trained ones.
FRESH_HEADS_KEY = "kbert_fresh_heads"


def _recorded_fresh_heads(values, path) -> tuple:
    fresh = values.get(FRESH_HEADS_KEY, []) if isinstance(values, dict) else []
    if not isinstance(fresh, list) or not all(isinstance(h, str) for h in fresh) or set(fresh) - set(HEADS):
        raise KbertError(f"{path}: {FRESH_HEADS_KEY} must list heads among {', '.join(HEADS)}, got {fresh!r}"[:300])
    return tuple(h for h in HEADS if h in fresh)


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
    """A `BertPretrainer` holding the weights of a Hugging Face BERT (safetensors only); for a
    sentence-transformers CrossEncoder folder of one output, a reranker: a `BertClassifier` of one
    output whose task is rerank, with the CrossEncoder's activation and max_length.

    Args:
        src: str. A Hugging Face model directory (config.json, model.safetensors, vocab.txt or
            tokenizer.json), or its .safetensors file.
        do_lower_case: bool. Whether the vocabulary is uncased; read from tokenizer_config.json
            (or tokenizer.json) when None, else decided by the folder name (`lower_case_for`).

    Returns the model, declaring its vocabulary (`model.vocabulary`); `convert_hf_model` also
    returns what was loaded, skipped and freshly initialised.

    Example:
    >>> model = kbert.converters.load_hf_model("all-MiniLM-L6-v2/")  # doctest: +SKIP
    """
    return convert_hf_model(src, do_lower_case).model


# long: the source's weights, names and casing feed both the model and its report, step after step
def convert_hf_model(src, do_lower_case=None) -> loading.Converted:
    """`load_hf_model`'s model (same arguments) and its report."""
    source = find_hf_model(src)
    values = _read_json(source.config_file, "config")
    if is_modernbert_config(values):  # a ModernBERT or an Ettin encoder: its family's converter
        activation = cross_encoder_activation(source.folder, values)
        converted = convert_modernbert(source, values)
        if activation:
            return _modernbert_reranker(converted, source.folder, activation)
        # A sentence-transformers folder's pooling, as for a BERT's (a byte-level BPE never lower-cases).
        embedding = sentence_transformers_embedding(source.folder, converted.model.config, False)
        if embedding:
            converted.model.config.extras[EMBEDDING_KEY] = embedding
        return loading.Converted(converted.model, {**converted.report, "embedding": embedding})
    config = config_from_hf(values, source.config_file)
    recorded_fresh = _recorded_fresh_heads(values, source.config_file)
    vocab_file, vocab_origin = _vocab_file(source.folder, config, source.config_file)
    keys = _open_weights(source)
    hf_to_tf1 = hf_to_tf1_names(config.num_hidden_layers)
    tf1_to_kbert = tf1_to_kbert_paths(config.num_hidden_layers)
    transposed = {hf: hf_name(tf1)[1] for hf, tf1 in hf_to_tf1.items()}
    weights = {c: (f, name) for c, (f, name) in keys.items() if c not in HF_TIED and c not in HF_BUFFERS}
    # A CrossEncoder's classifier is read onto the reranker after its encoder.
    activation = cross_encoder_activation(source.folder, values)
    head = {c: weights.pop(c) for c in map(hf_canonical, CLASSIFIER_WEIGHTS) if c in weights} if activation else {}

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
        do_lower_case = lower_case_for(source.folder) if unsaid else do_lower_case
    embedding = None if activation else sentence_transformers_embedding(source.folder, config, bool(do_lower_case))
    if embedding:
        config.extras[EMBEDDING_KEY] = embedding
    model, absent = loading.load_pretrainer(
        config,
        loading.Stored(
            where=source.folder,
            shapes={c: tuple(f.shapes[name]) for c, (f, name) in weights.items()},
            paths=kbert_paths,
            read=read,
            stored_shape=lambda path, shape: tuple(shape)[::-1] if transposed[hf_of[path]] else tuple(shape),
            optional={**loading.HEAD_PATHS, "pooler": loading.POOLER_PATH},
            thing="file",
            config_name=HF_CONFIG_FILE,
            config_file=source.config_file,
            unknown_hint=_unknown_hint,
            missing_hint=lambda names: "",
            spelled=lambda c: weights[c][1],
        ),
        Vocabulary(vocab_file, bool(do_lower_case)),
    )
    loaded = set(weights) | set(head)
    _check_tied(source, keys)
    # Heads kbert wrote out though fresh (to-hf --include-fresh-heads) stay fresh.
    for part in recorded_fresh:
        if part not in absent:
            log.info("%s records the %s as fresh (random weights written out by kbert)", HF_CONFIG_FILE, part)
    missing, absent = absent, [h for h in HEADS if h in absent or h in recorded_fresh]
    model.fresh_heads = tuple(absent)
    rerank = None
    if activation:
        if "pooler" in absent:
            raise KbertError(
                f"{source.folder}: a CrossEncoder without its pooler (bert.pooler.*), which its score reads; "
                f"convert the BertForSequenceClassification's complete files"
            )
        rerank = {"activation": activation, "max_seq_length": _cross_encoder_length(source.folder, config)}
        model = _as_reranker(model, head, values, rerank["activation"], rerank["max_seq_length"], source.folder)
        missing = absent = []  # the pretraining heads are no part of a reranker

    skipped = sorted(name for canonical, (_, name) in keys.items() if canonical in HF_BUFFERS)
    if skipped:
        log.info("skipped %s (buffers of indices, not weights)", listing(skipped))
    for part in missing:
        what = "pooler" if part == "pooler" else f"{part} head"
        log.info("the checkpoint has no %s (%s*): it is freshly initialised", what, HF_OPTIONAL[part])
    dtypes = sorted({f.dtypes[name] for hf, (f, name) in keys.items() if hf in loaded})
    if set(dtypes) - {"F32"}:
        log.info("converted %s weights to float32", "/".join(d for d in dtypes if d != "F32"))
    if unsaid:
        log.info(
            "do_lower_case=%s, from the folder name (no tokenizer_config.json or tokenizer.json says); pass %s to set it",
            do_lower_case,
            option("do_lower_case", flag="--lowercase/--no-lowercase", command="convert from-hf"),
        )
    if vocab_origin != VOCAB_FILE:  # the temporary vocab.txt lives as long as the model
        weakref.finalize(model, shutil.rmtree, os.path.dirname(vocab_file), True)
    return loading.Converted(
        model,
        {
            "source": source.weight_files[0] if len(source.weight_files) == 1 else source.folder,
            "loaded": len(loaded),
            "fresh_heads": absent,
            "skipped": skipped,
            "dtypes": dtypes,
            "vocab_from": vocab_origin,
            "embedding": embedding,
            "rerank": rerank,
        },
    )


# === Writing ===


# The transformers class of a kbert model, by the pretraining heads written (masked-LM, next-sentence).
HF_PRETRAINING_ARCHITECTURES = {
    (True, True): "BertForPreTraining",
    (True, False): "BertForMaskedLM",
    (False, True): "BertForNextSentencePrediction",
    (False, False): "BertModel",
}


def hf_tensors(model, left_out=()) -> tuple:
    """({HF name: float32 array}, architecture) for a kbert encoder, pretrainer or classifier:
    kernels transposed to torch's [out, in], the tied decoder written out as transformers names
    it, the heads in `left_out` (of "masked_lm", "next_sentence", "pooler") not written. The
    architecture is the transformers class that holds what is written: a pretrainer without its
    pretraining heads is a `BertModel`, a classifier a `BertForSequenceClassification`."""
    if type(model) not in (BertEncoder, BertPretrainer, BertClassifier):
        raise KbertError(
            f"cannot write a {type(model).__name__} as a Hugging Face model; to-hf writes kbert encoders, "
            f"pretrainers and classifiers (other task heads have no HF layout here)"
        )
    tf1_to_kbert = tf1_to_kbert_paths(model.config.num_hidden_layers)
    hf_paths = {hf_name(tf1)[0]: path for tf1, path in tf1_to_kbert.items()}
    transposed = {path: hf_name(tf1)[1] for tf1, path in tf1_to_kbert.items()}
    if type(model) is BertClassifier:
        # BertForSequenceClassification's classifier Linear: weight [num_labels, H], as output_weights is.
        hf_paths.update(
            {"classifier.weight": "classifier_head/output_weights", "classifier.bias": "classifier_head/output_bias"}
        )

    def to_stored(path, value):
        # convert_to_numpy, not np.asarray: a PyTorch weight carries grad, and refuses numpy().
        value = keras.ops.convert_to_numpy(value).astype("float32", copy=False)
        return value.T if transposed.get(path) else value

    tensors = loading.stored_weights(
        model,
        hf_paths,
        format_name="a Hugging Face model",
        to_stored=to_stored,
        left_out=left_out,
        unnamed_hint="encoders, pretrainers and classifiers",
    )
    if type(model) is BertClassifier:
        return tensors, "BertForSequenceClassification"
    architecture = HF_PRETRAINING_ARCHITECTURES[
        (
            any(name.startswith("cls.predictions.") for name in tensors),
            any(name.startswith("cls.seq_relationship.") for name in tensors),
        )
    ]
    if architecture == "BertModel":
        # BertModel's own files carry no "bert." prefix (it is BertForPreTraining's attribute).
        return {name[len("bert.") :]: value for name, value in tensors.items()}, architecture
    if "cls.predictions.bias" in tensors:
        for tied, target in HF_TIED.items():  # so that any loader, tying or not, finds them
            tensors[tied] = tensors[target]
    return tensors, architecture


def _task_config(model) -> dict:
    """A classifier's labels and loss as BertForSequenceClassification's config reads them."""
    if type(model) is not BertClassifier:
        return {}
    info = head_task_info(model)
    if _reranks(info):  # a CrossEncoder's: its activation where sentence-transformers reads it
        activation_fn = ST_ACTIVATION_OF[info.get("activation", "sigmoid")]
        return {
            "num_labels": 1,
            "classifier_dropout": model.dropout_rate,
            ST_CROSS_ENCODER_KEY: {"activation_fn": activation_fn},
        }
    if model.num_classes == 1:  # a regressor: its one logit is the prediction
        return {"num_labels": 1, "problem_type": "regression", "classifier_dropout": model.dropout_rate}
    labels = info["labels"]
    return {
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
        "problem_type": "single_label_classification",
        "classifier_dropout": model.dropout_rate,
    }


@writes("out_dir")
def save_hf_model(
    model, out_dir, vocab_file=None, do_lower_case=None, overwrite: bool = False, *, include_fresh_heads=False
) -> dict:
    """Write `model` as a Hugging Face BERT directory, atomically; returns what was written.

    Writes config.json, model.safetensors (float32), vocab.txt and tokenizer_config.json, for the
    transformers class that holds what is written (the returned `architecture`):
    `BertForPreTraining` for a pretrainer, `BertModel` for an encoder,
    `BertForSequenceClassification` (with its labels as id2label/label2id) for a classifier;
    `from_pretrained` loads it with no missing or unexpected keys. Heads a converter created
    (`model.fresh_heads`: random weights) are left out unless `include_fresh_heads`: a pretrainer
    whose pretraining heads are both fresh is written as its encoder alone, a `BertModel`.

    Args:
        model: a kbert `BertEncoder`, `BertPretrainer` or `BertClassifier`.
        out_dir: str. Output directory (must not exist or be empty unless `overwrite`).
        vocab_file: str. Defaults to `model.vocab_file` (set by `kbert.load` and the converters).
        do_lower_case: bool. Defaults to `model.do_lower_case`, else True.
        include_fresh_heads: bool. Write fresh heads' random weights too (config.json then
            records them in `kbert_fresh_heads`, so that `from-hf` keeps them fresh).

    A sentence-embedding model (one whose config records an `embedding`, as `convert from-hf` of a
    sentence-transformers folder makes) also gets modules.json, 1_Pooling/, 2_Normalize/ (when it
    normalises), sentence_bert_config.json and config_sentence_transformers.json, so that
    `sentence_transformers.SentenceTransformer(out_dir)` gives kbert's vectors.

    A reranker (task rerank) is written as a sentence-transformers CrossEncoder folder: config.json
    records its activation (`sentence_transformers.activation_fn`) and tokenizer_config.json its
    max_seq_length (`model_max_length`), so that `sentence_transformers.CrossEncoder(out_dir)` scores
    pairs as kbert does.

    Returns {"architecture": str, "left_out": [heads], "parameters": int, "embedding": dict or None,
    "rerank": {"activation", "max_seq_length"} or None}.

    Example:
    >>> kbert.converters.save_hf_model(kbert.load("out/tiny"), "out/tiny-hf")  # doctest: +SKIP
    """
    if getattr(model, "family", None) == "modernbert":
        embedding = check_embedding(model.config, "the model's config")
        rerank = _rerank_record(model)
        hidden = model.config.hidden_size

        def write_more(folder):
            if embedding:
                write_sentence_transformers_files(folder, embedding, hidden)
            if rerank:
                _write_cross_encoder_record(folder, rerank)

        written = save_modernbert_hf(model, out_dir, overwrite=overwrite, write_more=write_more)
        return {**written, "embedding": embedding, "rerank": rerank}
    vocab_file, do_lower_case, config, left_out = loading.model_to_write(
        model, "save_hf_model", vocab_file, do_lower_case, include_fresh_heads
    )
    tensors, architecture = hf_tensors(model, left_out)
    # A sentence-embedding model is written as a sentence-transformers folder too.
    embedding = None if type(model) is BertClassifier else check_embedding(model.config, "the model's config")
    for head in left_out:
        log.info(
            "left out the %s (%s*): a converter created it, so its weights are random; pass %s to write it",
            "pooler" if head == "pooler" else f"{head} head",
            HF_OPTIONAL[head],
            option("include_fresh_heads", True),
        )
    written_fresh = [h for h in fresh_heads_of(model) if h not in left_out]
    # transformers' BertTokenizer reads vocab.txt as the original's load_vocab does: a repeated
    # token gets its last id, so that is the [PAD] id the config must name.
    pad_token_id = load_vocab(vocab_file).get("[PAD]", 0)
    hf_values = {
        **hf_config(config, architecture, pad_token_id),
        **_task_config(model),
        **({FRESH_HEADS_KEY: written_fresh} if written_fresh else {}),
    }
    # A reranker's max_seq_length is its CrossEncoder's max_length, which the tokenizer holds.
    rerank = _rerank_record(model)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(do_lower_case),
        "model_max_length": rerank["max_seq_length"] if rerank else config.max_position_embeddings,
    }
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        write_safetensors(os.path.join(tmp, WEIGHTS_FILE), tensors)
        _write_json(os.path.join(tmp, HF_CONFIG_FILE), hf_values)
        _write_json(os.path.join(tmp, TOKENIZER_CONFIG_FILE), tokenizer_config)
        shutil.copyfile(vocab_file, os.path.join(tmp, VOCAB_FILE))
        if embedding:
            write_sentence_transformers_files(tmp, embedding, config.hidden_size)
    tied = set(HF_TIED) & set(tensors)
    return {
        "architecture": architecture,
        "left_out": list(left_out),
        "parameters": int(sum(np.size(v) for name, v in tensors.items() if name not in tied)),
        "embedding": embedding,
        "rerank": rerank,
    }


def _reranks(info: dict) -> bool:
    """Whether a task record is a reranker's (a CrossEncoder's, in Hugging Face's layout)."""
    return bool(info.get("task")) and get_task(info["task"]).reranks


def _rerank_record(model) -> dict | None:
    """A reranker's {"activation", "max_seq_length"}, as a CrossEncoder folder records them; else None."""
    info = head_task_info(model) if getattr(model, "num_classes", None) == 1 else {}
    if not _reranks(info):
        return None
    length = min(
        info.get("max_seq_length") or model.config.max_position_embeddings, model.config.max_position_embeddings
    )
    return {"activation": info.get("activation", "sigmoid"), "max_seq_length": int(length)}


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(value, indent=2) + "\n")


# === inspect ===


def describe_hf(src) -> dict:
    """A JSON-ready summary of a Hugging Face BERT, read from headers only (no weights)."""
    source = find_hf_model(src)
    values = _read_json(source.config_file, "config")
    if is_modernbert_config(values):
        activation = cross_encoder_activation(source.folder, values)
        described = describe_modernbert_hf(source, values)
        if activation:
            config = ModernBertConfig.from_hf(values, source.config_file)
            described["rerank"] = {
                "activation": activation,
                "max_seq_length": _cross_encoder_length(source.folder, config),
            }
        return described
    keys = _open_weights(source)
    config = config_from_hf(values, source.config_file)
    weights = {c: v for c, v in keys.items() if c not in HF_BUFFERS and c not in HF_TIED}
    layers = {c.split(".")[3] for c in weights if c.startswith("bert.encoder.layer.")}
    folder = source.folder
    vocab = os.path.join(folder, VOCAB_FILE)
    lower = hf_lower_case(folder)[0]
    activation = cross_encoder_activation(folder, values)
    rerank = {"activation": activation, "max_seq_length": _cross_encoder_length(folder, config)} if activation else None
    embedding = None if rerank else sentence_transformers_embedding(folder, config, lower_case_for(folder, lower))
    return {
        "kind": "Hugging Face model",
        "source": source.folder,
        "weight_files": [os.path.basename(p) for p in source.weight_files],
        "config": config.to_dict(),
        "architectures": values.get("architectures") if isinstance(values, dict) else None,
        "vocab_entries": count_lines(vocab) if os.path.isfile(vocab) else None,
        "parameters": int(sum(np.prod(f.shapes[n]) for f, n in weights.values())),
        "layers_in_file": len(layers),
        "heads": stored_head_provenance(
            {part: any(c.startswith(prefix) for c in keys) for part, prefix in HF_OPTIONAL.items()},
            _recorded_fresh_heads(values, source.config_file),
        ),
        "dtypes": sorted({f.dtypes[n] for f, n in weights.values()}),
        "do_lower_case": lower,
        **({"embedding": embedding} if embedding else {}),
        **({"rerank": rerank} if rerank else {}),
    }


# === sentence-transformers ===
# A sentence-transformers model folder is a Hugging Face BERT plus modules.json, which lists
# what runs after it: a Pooling module (1_Pooling/config.json) and maybe a Normalize. kbert
# records those as the model's `embedding` (kbert.model.embedding_record.EMBEDDING_KEY) and writes them back.

ST_MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
ST_MODEL_CONFIG_FILE = "config_sentence_transformers.json"
ST_POOLING_DIR = "1_Pooling"
ST_NORMALIZE_DIR = "2_Normalize"
# sentence-transformers' pooling names -> kbert's (kbert.model.pooling.POOLING_MODES).
ST_POOLING = {"cls": "cls", "mean": "mean", "max": "max", "mean_sqrt_len_tokens": "mean_sqrt_len"}
# The boolean keys of 1_Pooling/config.json as sentence-transformers before 6 wrote it, by mode.
ST_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The modules kbert reproduces, by class name (modules.json's "type" is its import path, which
# sentence-transformers renamed in version 6: sentence_transformers.models.Pooling, then
# sentence_transformers.sentence_transformer.modules.pooling.Pooling).
ST_MODULES = ("Transformer", "Pooling", "Normalize")


def sentence_transformers_embedding(folder, config: BertConfig, do_lower_case: bool) -> dict | None:
    """The `embedding` record of a sentence-transformers folder (None when it has no
    modules.json): {"pooling", "normalize", "max_seq_length"}, read from modules.json,
    1_Pooling/config.json, sentence_bert_config.json and tokenizer_config.json. A module kbert
    cannot reproduce (a Dense layer, weighted-mean pooling, ...) is refused in one line."""
    path = os.path.join(folder, ST_MODULES_FILE)
    if not os.path.isfile(path):
        return None
    modules = _read_json(path, "sentence-transformers module list")
    if not isinstance(modules, list) or not all(
        isinstance(m, dict) and isinstance(m.get("type"), str) for m in modules
    ):
        raise KbertError(f'{path}: must be a list of modules, each with a "type"; download it again')
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    for module, kind in zip(modules, kinds, strict=True):
        if kind not in ST_MODULES:
            raise KbertError(
                f"{path}: module {module.get('name', '?')} is a {module['type']} ({module.get('path') or 'no folder'}), "
                f"which kbert cannot reproduce; kbert converts sentence-transformers models made of "
                f"Transformer, Pooling and Normalize only"
            )
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise KbertError(
            f"{path}: modules {' -> '.join(kinds)}; kbert converts Transformer -> Pooling (-> Normalize), in that order"
        )
    if (modules[0].get("path") or "") not in ("", "."):
        raise KbertError(
            f"{path}: the Transformer's files are in {modules[0]['path']}/, but kbert reads a sentence-transformers "
            f"folder whose BERT (config.json, model.safetensors) is beside modules.json; move them there"
        )
    pooling = _st_pooling(os.path.join(folder, modules[1].get("path") or ST_POOLING_DIR), config)
    st_config_path = os.path.join(folder, ST_CONFIG_FILE)
    st_config = _read_json(st_config_path, "sentence-transformers config") if os.path.isfile(st_config_path) else {}
    st_config = st_config if isinstance(st_config, dict) else {}
    if st_config.get("do_lower_case") and not do_lower_case:
        raise KbertError(
            f"{st_config_path}: do_lower_case lower-cases texts before a cased tokenizer (accents kept), "
            f"which kbert's tokenizer cannot do; kbert converts models whose tokenizer does the lower-casing"
        )
    return {
        "pooling": pooling,
        "normalize": kinds[2:] == ["Normalize"],
        "max_seq_length": _st_length(folder, st_config, config),
    }


def _st_pooling(pooling_folder, config: BertConfig) -> str:
    """kbert's name of the one pooling mode a 1_Pooling/config.json sets (either format)."""
    path = os.path.join(pooling_folder, HF_CONFIG_FILE)
    if not os.path.isfile(path):
        raise KbertError(f"{path}: missing, but modules.json lists a Pooling module there; download the model again")
    values = _read_json(path, "sentence-transformers pooling config")
    if not isinstance(values, dict):
        raise KbertError(f"{path}: must be a JSON object; download the model again")
    mode = values.get("pooling_mode")
    if mode is None:  # sentence-transformers before 6: one boolean per mode (none set: mean)
        modes = [name for key, name in ST_POOLING_KEYS.items() if values.get(key)]
        mode = modes[0] if len(modes) == 1 else tuple(modes) or "mean"
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else tuple(mode)
    if not isinstance(mode, str):
        raise KbertError(
            f"{path}: pools in several modes at once ({' + '.join(map(str, mode))}, concatenated), which kbert "
            f"cannot reproduce; kbert converts one of {', '.join(ST_POOLING)}"
        )
    if mode not in ST_POOLING:
        raise KbertError(
            f"{path}: pooling mode {mode!r}, which kbert cannot reproduce; kbert converts {', '.join(ST_POOLING)}"
        )
    width = values.get("embedding_dimension", values.get("word_embedding_dimension", config.hidden_size))
    if width != config.hidden_size:
        raise KbertError(
            f"{path}: pools vectors of {width} values, but config.json says hidden_size {config.hidden_size}"
        )
    return ST_POOLING[mode]


def _st_length(folder, st_config: dict, config: BertConfig) -> int:
    """The tokens per text sentence-transformers keeps: sentence_bert_config.json's max_seq_length,
    else (as version 6 writes it) the tokenizer's model_max_length, within max_position_embeddings."""
    length = st_config.get("max_seq_length")
    if length is None:
        path = os.path.join(folder, TOKENIZER_CONFIG_FILE)
        values = _read_json(path, "tokenizer config") if os.path.isfile(path) else {}
        length = values.get("model_max_length") if isinstance(values, dict) else None
    if isinstance(length, bool) or not isinstance(length, (int, float)) or length < 3:
        return config.max_position_embeddings
    return int(min(length, config.max_position_embeddings))


def write_sentence_transformers_files(folder, embedding: dict, hidden_size: int):
    """The files beside a Hugging Face BERT that make `sentence_transformers.SentenceTransformer(folder)`
    pool (and normalise) as `embedding` says, in the format every sentence-transformers version reads."""
    modes = {kbert_name: st_name for st_name, kbert_name in ST_POOLING.items()}
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": ST_POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
    ]
    if embedding.get("normalize"):
        modules.append(
            {"idx": 2, "name": "2", "path": ST_NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"}
        )
        os.makedirs(os.path.join(folder, ST_NORMALIZE_DIR))  # Normalize has no settings: its folder is empty
    os.makedirs(os.path.join(folder, ST_POOLING_DIR))
    pooling = {"word_embedding_dimension": hidden_size}
    pooling.update({key: modes[embedding["pooling"]] == mode for key, mode in ST_POOLING_KEYS.items()})
    _write_json(os.path.join(folder, ST_MODULES_FILE), modules)
    _write_json(os.path.join(folder, ST_POOLING_DIR, HF_CONFIG_FILE), pooling)
    # do_lower_case here would lower-case before the tokenizer; the tokenizer's own casing is in tokenizer_config.json.
    length = {"max_seq_length": embedding["max_seq_length"]} if embedding.get("max_seq_length") else {}
    _write_json(os.path.join(folder, ST_CONFIG_FILE), {**length, "do_lower_case": False})
    # No prompts, and cosine similarity: what sentence-transformers assumes of a model that names none.
    _write_json(
        os.path.join(folder, ST_MODEL_CONFIG_FILE),
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
    )


# === sentence-transformers' CrossEncoder ===
# A CrossEncoder folder is a BertForSequenceClassification of one output plus a record of the
# activation its scores go through: config_sentence_transformers.json's activation_fn (version 6,
# beside a modules.json of one Transformer), config.json's sentence_transformers.activation_fn
# (versions 4 and 5) or config.json's sbert_ce_default_activation_function (before 4); a record
# naming none means the sigmoid, CrossEncoder's default for one output. Its tokenizer's
# model_max_length is the CrossEncoder's max_length. kbert converts it to a reranker (task rerank).

ST_CROSS_ENCODER_KEY = "sentence_transformers"
ST_LEGACY_ACTIVATION_KEY = "sbert_ce_default_activation_function"
# The activations kbert reproduces, by the import path sentence-transformers records (either spelling).
ST_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
}
# BertForSequenceClassification's head, a Linear of weight [num_labels, H].
CLASSIFIER_WEIGHTS = ("classifier.weight", "classifier.bias")
ST_ACTIVATION_OF = {"sigmoid": "torch.nn.modules.activation.Sigmoid", "identity": "torch.nn.modules.linear.Identity"}


def cross_encoder_activation(folder, values: dict) -> str | None:
    """kbert's name ("sigmoid" or "identity") of the activation a sentence-transformers CrossEncoder
    folder records, read where sentence-transformers reads it; None for a folder that is no
    CrossEncoder. An activation kbert cannot reproduce is refused in one line.

    Example:
    >>> cross_encoder_activation("tests/fixtures/hf-tiny", {ST_LEGACY_ACTIVATION_KEY: "torch.nn.modules.linear.Identity"})
    'identity'
    >>> cross_encoder_activation("tests/fixtures/hf-tiny", {"model_type": "bert"}) is None
    True
    """
    recorded = []  # (file, activation_fn or None), most binding first, as CrossEncoder reads them
    path = os.path.join(folder, ST_MODEL_CONFIG_FILE)
    model_config = _read_json(path, "sentence-transformers config") if os.path.isfile(path) else {}
    if isinstance(model_config, dict) and model_config.get("model_type") == "CrossEncoder":
        _check_cross_encoder_modules(folder)
        recorded.append((path, model_config.get("activation_fn")))
    config_file = os.path.join(folder, HF_CONFIG_FILE)
    st_record = values.get(ST_CROSS_ENCODER_KEY)
    if isinstance(st_record, dict):
        recorded.append((config_file, st_record.get("activation_fn")))
    elif values.get(ST_LEGACY_ACTIVATION_KEY) is not None:
        recorded.append((config_file, values[ST_LEGACY_ACTIVATION_KEY]))
    if not recorded:
        return None
    where, name = next(((w, n) for w, n in recorded if n is not None), (recorded[0][0], ST_ACTIVATION_OF["sigmoid"]))
    if name not in ST_ACTIVATIONS:
        raise KbertError(
            f"{where}: the CrossEncoder's scores go through {name!r}, which kbert cannot reproduce; kbert converts "
            f"CrossEncoders whose activation_fn is torch.nn.Sigmoid or torch.nn.Identity"
        )
    return ST_ACTIVATIONS[name]


def _check_cross_encoder_modules(folder):
    """A version-6 CrossEncoder folder's modules.json must list its Transformer alone, beside it."""
    path = os.path.join(folder, ST_MODULES_FILE)
    modules = _read_json(path, "sentence-transformers module list") if os.path.isfile(path) else []
    kinds = [m.get("type", "?").rsplit(".", 1)[-1] if isinstance(m, dict) else "?" for m in modules or ()]
    if kinds not in ([], ["Transformer"]) or (modules and (modules[0].get("path") or "") not in ("", ".")):
        raise KbertError(
            f"{path}: a CrossEncoder of modules {' -> '.join(kinds)}; kbert converts CrossEncoders whose one "
            f"module is the Transformer beside modules.json (a BertForSequenceClassification of one output)"
        )


def _cross_encoder_length(folder, config: BertConfig) -> int:
    """The tokens a CrossEncoder keeps per pair: its max_length, within max_position_embeddings."""
    path = os.path.join(folder, ST_CONFIG_FILE)
    st_config = _read_json(path, "sentence-transformers config") if os.path.isfile(path) else {}
    return _st_length(folder, st_config if isinstance(st_config, dict) else {}, config)


def _as_reranker(pretrainer, head: dict, values: dict, activation: str, max_seq_length: int, where: str):
    """The kbert reranker of a CrossEncoder: a classifier of one output on `pretrainer`'s encoder,
    its head read from `head` ({canonical HF name: (file, name in it)})."""
    weight_name, bias_name = map(hf_canonical, CLASSIFIER_WEIGHTS)
    if weight_name not in head or bias_name not in head:
        raise KbertError(
            f"{where}: a CrossEncoder without classifier.weight and classifier.bias; a CrossEncoder's score "
            f"is BertForSequenceClassification's, so its files must hold both"
        )
    (f, name), (g, stored_bias) = head[weight_name], head[bias_name]
    weight, bias = f.read(name), g.read(stored_bias)
    hidden = pretrainer.config.hidden_size
    if weight.shape[0] != 1:
        raise KbertError(
            f"{where}: a CrossEncoder of {weight.shape[0]} outputs; kbert converts CrossEncoders of one output "
            f"(rerankers, num_labels 1)"
        )
    if tuple(weight.shape) != (1, hidden) or tuple(bias.shape) != (1,):
        raise KbertError(
            f"{where}: classifier.weight is {list(weight.shape)} and classifier.bias {list(bias.shape)}, but "
            f"config.json's hidden_size {hidden} makes them [1, {hidden}] and [1]; the config is not these weights'"
        )
    dropout = values.get("classifier_dropout")  # BertForSequenceClassification's: hidden_dropout_prob when null
    reranker = bert_classifier(
        pretrainer,
        1,
        dropout=float(pretrainer.config.hidden_dropout_prob if dropout is None else dropout),
        task_info={"task": "rerank", "max_seq_length": max_seq_length, "activation": activation},
    )
    reranker.head.output_weights.assign(weight.astype("float32"))
    reranker.head.output_bias.assign(bias.astype("float32"))
    reranker.fresh_heads = ()
    return reranker


def _modernbert_reranker(converted, folder, activation: str):
    """A ModernBERT CrossEncoder's converted classifier, recording its task as a reranker's."""
    model = converted.model
    if getattr(model, "num_classes", None) != 1:
        raise KbertError(
            f"{folder}: a CrossEncoder of {getattr(model, 'num_classes', 'no')} outputs; kbert converts CrossEncoders "
            f"of one output (rerankers, num_labels 1)"
        )
    rerank = {"activation": activation, "max_seq_length": _cross_encoder_length(folder, model.config)}
    model.task_info = {"task": "rerank", **rerank}
    return loading.Converted(model, {**converted.report, "embedding": None, "rerank": rerank})


def _write_cross_encoder_record(folder, rerank: dict):
    """Record a reranker's activation and max_seq_length in the Hugging Face folder `folder` where
    sentence-transformers' CrossEncoder reads them (config.json, tokenizer_config.json)."""
    path = os.path.join(folder, HF_CONFIG_FILE)
    values = _read_json(path, "config")
    values[ST_CROSS_ENCODER_KEY] = {"activation_fn": ST_ACTIVATION_OF[rerank["activation"]]}
    _write_json(path, values)
    path = os.path.join(folder, TOKENIZER_CONFIG_FILE)
    tokenizer_config = _read_json(path, "tokenizer config") if os.path.isfile(path) else {}
    _write_json(path, {**tokenizer_config, "model_max_length": rerank["max_seq_length"]})
