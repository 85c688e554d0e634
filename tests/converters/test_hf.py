"""`kbert convert from-hf / to-hf`: Hugging Face BERTs in and out, round trips, every error case.

The reference is tests/fixtures/hf-tiny: the original tf1-tiny checkpoint converted by
transformers' own TF1 converter and saved by transformers (see its README), so kbert's reading
is checked against the original code's outputs through a path kbert did not write.
"""

import json
import os
import pickle
import shutil
import struct

import numpy as np
import pytest
import tensorflow as tf

import kbert
from conftest import FIXTURES, TINY, assert_user_error, run_kbert
from helpers import EXPECTED, original_outputs
from kbert.converters.names import HF_TIED
from kbert.converters.safetensors_file import SafetensorsFile, write_safetensors

HF_TINY = os.path.join(FIXTURES, "hf-tiny")


def _tensors(path):
    f = SafetensorsFile(path)
    return {name: f.read(name) for name in f.shapes}


HF_ORIGINAL = _tensors(f"{HF_TINY}/model.safetensors")


def _tf1(prefix):
    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _hf_dir(tmp_path, tensors=None, name="hf", config=None, **files):
    """A copy of hf-tiny with other weights, config.json fields or files (None removes one)."""
    folder = tmp_path / name
    shutil.copytree(HF_TINY, folder)
    for p in folder.iterdir():
        p.chmod(0o644)
    if tensors is not None:
        write_safetensors(folder / "model.safetensors", tensors)
    if config:
        values = json.load(open(folder / "config.json"))
        (folder / "config.json").write_text(json.dumps(dict(values, **config)))
    for filename, content in files.items():
        path = folder / filename.replace("__", ".")
        if content is None:
            path.unlink()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return folder


def _weights(model):
    return {v.path: v.numpy() for v in model.weights}


@pytest.fixture(scope="module")
def hf_model_dir(tmp_path_factory):
    """hf-tiny converted once by the CLI."""
    out = tmp_path_factory.mktemp("from-hf") / "tiny"
    run_kbert("convert", "from-hf", HF_TINY, out)
    return out


# --- conversions and round trips ---


def test_from_hf_reproduces_the_original_code(hf_model_dir):
    out = original_outputs(kbert.load(hf_model_dir))
    for name, value in out.items():
        np.testing.assert_allclose(np.asarray(value), EXPECTED[name], atol=1e-5, rtol=0)


def test_from_hf_gives_the_weights_of_from_tf1(hf_model_dir, tiny_model_dir):
    a, b = _weights(kbert.load(hf_model_dir)), _weights(kbert.load(tiny_model_dir))
    assert sorted(a) == sorted(b)
    for path in a:
        assert np.array_equal(a[path], b[path]), path
    config = json.load(open(hf_model_dir / "bert_config.json"))
    assert config == json.load(open(tiny_model_dir / "bert_config.json"))


def test_from_hf_reports_json(tmp_path):
    result = run_kbert("convert", "from-hf", f"{HF_TINY}/model.safetensors", tmp_path / "out")
    report = json.loads(result.stdout)
    assert report["parameters"] == 99374 and report["weights_loaded"] == 46
    assert report["fresh_heads"] == [] and report["dtypes"] == ["F32"]
    assert report["vocab_from"] == "vocab.txt" and report["do_lower_case"] is True
    assert result.stderr == ""


def test_from_hf_then_to_hf_is_bit_for_bit(hf_model_dir, tmp_path):
    result = run_kbert("convert", "to-hf", hf_model_dir, tmp_path / "back")
    assert json.loads(result.stdout)["parameters"] == 99374
    back = _tensors(tmp_path / "back" / "model.safetensors")
    assert set(back) - set(HF_ORIGINAL) <= set(HF_TIED)
    for name, value in HF_ORIGINAL.items():
        assert back[name].shape == value.shape and np.array_equal(back[name], value), name
    assert np.array_equal(back["cls.predictions.decoder.weight"], HF_ORIGINAL["bert.embeddings.word_embeddings.weight"])
    assert np.array_equal(back["cls.predictions.decoder.bias"], HF_ORIGINAL["cls.predictions.bias"])
    assert open(tmp_path / "back" / "vocab.txt").read() == open(f"{TINY}/vocab.txt").read()
    config = json.load(open(tmp_path / "back" / "config.json"))
    original = json.load(open(f"{HF_TINY}/config.json"))
    for key, value in json.load(open(f"{TINY}/bert_config.json")).items():
        assert config[key] == original[key] == value, key
    assert config["architectures"] == ["BertForPreTraining"] and config["model_type"] == "bert"
    assert config["layer_norm_eps"] == 1e-12 and config["position_embedding_type"] == "absolute"
    assert json.load(open(tmp_path / "back" / "tokenizer_config.json"))["do_lower_case"] is True


def test_tf1_to_hf_to_tf1_is_bit_for_bit(tiny_model_dir, tmp_path):
    """from-tf1 -> to-hf gives what transformers' own TF1 converter gives; -> from-hf -> to-tf1
    gives the original checkpoint back, and the model still computes the original outputs."""
    run_kbert("convert", "to-hf", tiny_model_dir, tmp_path / "hf")
    written = _tensors(tmp_path / "hf" / "model.safetensors")
    for name, value in HF_ORIGINAL.items():
        assert np.array_equal(written[name], value), name
    run_kbert("convert", "from-hf", tmp_path / "hf", tmp_path / "kbert")
    a, b = _weights(kbert.load(tmp_path / "kbert")), _weights(kbert.load(tiny_model_dir))
    assert all(np.array_equal(a[p], b[p]) for p in b)
    run_kbert("convert", "to-tf1", tmp_path / "kbert", tmp_path / "tf1")
    original, back = _tf1(f"{TINY}/bert_model.ckpt"), _tf1(tmp_path / "tf1" / "bert_model.ckpt")
    assert sorted(back) == sorted(original)
    assert all(np.array_equal(back[n], original[n]) for n in original)
    for name, value in original_outputs(kbert.load(tmp_path / "kbert")).items():
        np.testing.assert_allclose(np.asarray(value), EXPECTED[name], atol=1e-5, rtol=0)


def test_encoder_to_hf_is_a_bert_model_file(tmp_path, tiny_model_dir):
    model = kbert.load(tiny_model_dir)
    kbert.save(model.encoder, tmp_path / "encoder", vocab_file=model.vocab_file)
    run_kbert("convert", "to-hf", tmp_path / "encoder", tmp_path / "hf")
    written = _tensors(tmp_path / "hf" / "model.safetensors")
    encoder = {n[len("bert.") :]: v for n, v in HF_ORIGINAL.items() if n.startswith("bert.")}
    assert sorted(written) == sorted(encoder)  # BertModel's names: no "bert." prefix, no heads
    assert all(np.array_equal(written[n], v) for n, v in encoder.items())
    assert json.load(open(tmp_path / "hf" / "config.json"))["architectures"] == ["BertModel"]
    kbert.save(kbert.bert_tagger(model, 3), tmp_path / "tagger", vocab_file=model.vocab_file)
    assert_user_error(
        run_kbert("convert", "to-hf", tmp_path / "tagger", tmp_path / "c", check=False),
        "cannot write a BertTagger",
        "encoders, pretrainers and classifiers",
    )


def test_encoder_file_without_prefix_and_legacy_layer_norm_names(tmp_path, tiny_model_dir):
    # A BertModel file (no "bert." prefix, no heads) as early pytorch-pretrained-bert named it.
    tensors = {
        n[len("bert.") :].replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for n, v in HF_ORIGINAL.items()
        if n.startswith("bert.")
    }
    tensors["embeddings.position_ids"] = np.arange(64, dtype="float32")[None]
    folder = _hf_dir(tmp_path, tensors)
    result = run_kbert("convert", "from-hf", folder, tmp_path / "out")
    assert json.loads(result.stdout)["fresh_heads"] == ["masked_lm", "next_sentence"]
    assert "no masked_lm head (cls.predictions.*)" in result.stderr and "freshly initialised" in result.stderr
    assert "skipped embeddings.position_ids" in result.stderr
    a, b = _weights(kbert.load(tmp_path / "out")), _weights(kbert.load(tiny_model_dir))
    assert all(np.array_equal(a[p], b[p]) for p in b if not p.startswith(("mlm_head", "nsp_head")))


def test_masked_lm_file_without_pooler_and_with_tied_copies(tmp_path):
    # BertForMaskedLM: no pooler, no NSP head; the decoder saved as copies of its tied weights.
    tensors = {n: v for n, v in HF_ORIGINAL.items() if not n.startswith(("bert.pooler", "cls.seq_"))}
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.bias"] = tensors.pop("cls.predictions.bias")
    result = run_kbert("convert", "from-hf", _hf_dir(tmp_path, tensors), tmp_path / "out")
    assert json.loads(result.stdout)["fresh_heads"] == ["next_sentence", "pooler"]
    assert "no pooler (bert.pooler.*)" in result.stderr
    bias = [v for v in kbert.load(tmp_path / "out").weights if v.path == "mlm_head/output_bias"][0]
    assert np.array_equal(bias.numpy(), HF_ORIGINAL["cls.predictions.bias"])


def _tokenizer_json(tokens):
    """hf-tiny's tokenizer.json with a WordPiece vocabulary of `tokens`."""
    data = json.load(open(f"{HF_TINY}/tokenizer.json"))
    data["model"]["vocab"] = {token: i for i, token in enumerate(tokens)}
    return json.dumps(data)


def test_vocab_from_tokenizer_json_and_casing_from_tokenizer_config(tmp_path):
    # tf1-tiny's vocab.txt repeats three tokens, which a tokenizer.json cannot hold: rename them.
    lines = open(f"{TINY}/vocab.txt").read().splitlines()
    tokens = [t if t not in lines[:i] else f"[repeat{i}]" for i, t in enumerate(lines)]
    folder = _hf_dir(
        tmp_path,
        vocab__txt=None,
        tokenizer__json=_tokenizer_json(tokens),
        tokenizer_config__json=json.dumps({"do_lower_case": False}),
    )
    result = run_kbert("convert", "from-hf", folder, tmp_path / "out")
    report = json.loads(result.stdout)
    assert report["vocab_from"] == "tokenizer.json" and report["do_lower_case"] is False
    assert open(tmp_path / "out" / "vocab.txt").read().splitlines() == tokens
    assert json.load(open(tmp_path / "out" / "bert_config.json"))["do_lower_case"] is False
    result = run_kbert("convert", "from-hf", folder, tmp_path / "flag", "--lowercase")
    assert json.loads(result.stdout)["do_lower_case"] is True


def test_half_precision_files_are_read_as_float32(tmp_path):
    values = np.array([[1.5, -2.25, 3e-3], [65504.0, 0.0, -1e-4]], "float32")
    bf16 = (values.view("<u4") >> 16).astype("<u2")  # truncation: exact for these values' tops
    header = {
        "h": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]},
        "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [12, 24]},
    }
    raw = json.dumps(header).encode()
    path = tmp_path / "half.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + values.astype("<f2").tobytes() + bf16.tobytes())
    f = SafetensorsFile(path)
    assert f.read("h").dtype == np.float32
    np.testing.assert_array_equal(f.read("h"), values.astype("float16").astype("float32"))
    np.testing.assert_array_equal(f.read("b"), (bf16.astype("<u4") << 16).view("<f4"))
    assert f.read("b")[0, 0] == 1.5


def test_inspect_hf_directory():
    info = json.loads(run_kbert("convert", "inspect", HF_TINY).stdout)
    assert info["kind"] == "Hugging Face model" and info["parameters"] == 99374
    assert info["layers_in_file"] == 2 and info["dtypes"] == ["F32"]
    assert info["heads"] == {"masked_lm": "trained", "next_sentence": "trained", "pooler": "trained"}


# --- errors: one line, what is wrong and how to fix it ---


class _Canary:
    """Unpickling this creates a file: proof that kbert never unpickles."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_pickle_is_refused_and_never_opened(tmp_path):
    canary = tmp_path / "unpickled"
    payload = pickle.dumps({"bert.embeddings.word_embeddings.weight": _Canary(str(canary))})
    folder = _hf_dir(tmp_path, model__safetensors=None, pytorch_model__bin=payload)
    for src in (folder, folder / "pytorch_model.bin"):
        result = run_kbert("convert", "from-hf", src, tmp_path / "out", check=False)
        assert_user_error(result, "PyTorch pickle", "never loads", "safe_serialization=True")
    # A pickle renamed to model.safetensors is recognised by its first bytes.
    (folder / "model.safetensors").write_bytes(payload)
    assert_user_error(run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False), "PyTorch pickle")
    assert not canary.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "field, value, fragments",
    [
        ("model_type", "roberta", ["model_type 'roberta' is not BERT"]),
        ("layer_norm_eps", 1e-5, ["layer_norm_eps is 1e-05", "1e-12"]),
        ("position_embedding_type", "relative_key", ["position_embedding_type is 'relative_key'", "absolute"]),
        ("hidden_act", "silu", ["hidden_act 'silu' is not supported", "gelu_new"]),
    ],
)
def test_config_kbert_cannot_compute_is_refused(tmp_path, field, value, fragments):
    folder = _hf_dir(tmp_path, config={field: value})
    assert_user_error(run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False), "config.json", *fragments)


@pytest.mark.parametrize(
    "field, value, weight, shapes",
    [
        (
            "intermediate_size",
            256,
            "bert.encoder.layer.0.intermediate.dense.weight",
            "[128, 64] but config.json gives [256, 64]",
        ),
        (
            "max_position_embeddings",
            128,
            "bert.embeddings.position_embeddings.weight",
            "[64, 64] but config.json gives [128, 64]",
        ),
        ("type_vocab_size", 3, "bert.embeddings.token_type_embeddings.weight", "[2, 64] but config.json gives [3, 64]"),
    ],
)
def test_shape_mismatch_names_weight_shapes_and_field(tmp_path, field, value, weight, shapes):
    folder = _hf_dir(tmp_path, config={field: value})
    assert_user_error(
        run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False),
        weight,
        f"the file has shape {shapes}",
        f"check {field}",
    )


def test_missing_config_json(tmp_path):
    folder = _hf_dir(tmp_path, config__json=None)
    assert_user_error(run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False), "config.json: missing")
    assert_user_error(
        run_kbert("convert", "from-hf", TINY, tmp_path / "out", check=False), "google-research checkpoint", "from-tf1"
    )


def test_unknown_and_missing_weights_are_listed(tmp_path):
    tensors = dict(
        HF_ORIGINAL, **{"classifier.weight": np.zeros((3, 64), "float32"), "classifier.bias": np.zeros(3, "float32")}
    )
    assert_user_error(
        run_kbert("convert", "from-hf", _hf_dir(tmp_path, tensors), tmp_path / "out", check=False),
        "2 unknown weights",
        "classifier.bias, classifier.weight",
        "fine-tuned task model",
    )
    # Weights missing from a layer the file has are missing, not a sign of another layer count.
    tensors = {n: v for n, v in HF_ORIGINAL.items() if "layer.1.output" not in n}
    result = run_kbert("convert", "from-hf", _hf_dir(tmp_path, tensors, "b"), tmp_path / "out", check=False)
    assert_user_error(result, "4 weights missing", "bert.encoder.layer.1.output.dense.weight")
    assert "num_hidden_layers" not in result.stderr
    folder = _hf_dir(tmp_path, name="c", config={"num_hidden_layers": 1})
    assert_user_error(
        run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False),
        "unknown weights",
        "bert.encoder.layer.1.",
        "num_hidden_layers",
    )
    assert not (tmp_path / "out").exists()


def test_untied_decoder_is_refused(tmp_path):
    tensors = dict(
        HF_ORIGINAL, **{"cls.predictions.decoder.weight": HF_ORIGINAL["bert.embeddings.word_embeddings.weight"] + 1}
    )
    assert_user_error(
        run_kbert("convert", "from-hf", _hf_dir(tmp_path, tensors), tmp_path / "out", check=False),
        "cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight",
    )


def test_tokenizer_json_with_holes_needs_vocab_txt(tmp_path):
    # What transformers saved for tf1-tiny's vocabulary: its repeated tokens' ids are holes.
    folder = _hf_dir(tmp_path, vocab__txt=None)
    assert_user_error(
        run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False),
        "tokenizer.json: no token has id 16, 20, 28",
        "vocab.txt",
    )


def test_damaged_files(tmp_path):
    data = open(f"{HF_TINY}/model.safetensors", "rb").read()
    folder = _hf_dir(tmp_path, model__safetensors=data[: len(data) // 2])
    assert_user_error(run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False), "truncated")
    folder = _hf_dir(tmp_path, name="garbage", model__safetensors=b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert_user_error(
        run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False),
        "not a safetensors file",
        "header is not JSON",
    )
    folder = _hf_dir(tmp_path, name="vocab", vocab__txt="[PAD]\n[UNK]\n")
    assert_user_error(
        run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False),
        "vocab.txt has 2 entries",
        "vocab_size 300",
    )
    assert not (tmp_path / "out").exists()


def test_missing_paths_and_output_dir(tmp_path, hf_model_dir):
    assert_user_error(
        run_kbert("convert", "from-hf", tmp_path / "nope", tmp_path / "out", check=False),
        "no such file or folder; pass a Hugging Face model",
    )
    assert_user_error(
        run_kbert("convert", "to-hf", tmp_path / "nope", tmp_path / "out", check=False), "no such model directory"
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    assert_user_error(run_kbert("convert", "to-hf", hf_model_dir, out, check=False), "--overwrite")
    assert_user_error(run_kbert("convert", "from-hf", HF_TINY, out, check=False), "--overwrite")
    assert (out / "keep.txt").read_text() == "user data"
    run_kbert("convert", "to-hf", hf_model_dir, out, "--overwrite")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]


# --- transformers itself loads what to-hf writes (torch and transformers: the test extra's) ---


def test_transformers_loads_to_hf_output(tiny_model_dir, tmp_path):
    import torch  # the test extra's: the consumers of to-hf's output
    import transformers

    run_kbert("convert", "to-hf", tiny_model_dir, tmp_path / "hf")
    model, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    model.eval()
    inputs = {k: torch.tensor(EXPECTED[k].astype("int64")) for k in ("input_ids", "input_mask", "segment_ids")}
    with torch.no_grad():
        out = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["input_mask"],
            token_type_ids=inputs["segment_ids"],
            output_hidden_states=True,
        )
    positions = torch.tensor(EXPECTED["masked_lm_positions"].astype("int64"))
    mlm = torch.gather(out.prediction_logits, 1, positions[..., None].expand(-1, -1, out.prediction_logits.shape[-1]))
    got = {
        "embedding_output": out.hidden_states[0],
        "sequence_output": out.hidden_states[-1],
        "mlm_log_probs": torch.log_softmax(mlm, -1),
        "nsp_log_probs": torch.log_softmax(out.seq_relationship_logits, -1),
    }
    for name, value in got.items():
        np.testing.assert_allclose(value.numpy(), EXPECTED[name], atol=1e-4, rtol=0, err_msg=name)
    pooled = transformers.BertModel.from_pretrained(tmp_path / "hf")(
        input_ids=inputs["input_ids"], attention_mask=inputs["input_mask"], token_type_ids=inputs["segment_ids"]
    ).pooler_output
    np.testing.assert_allclose(pooled.detach().numpy(), EXPECTED["pooled_output"], atol=1e-4, rtol=0)
    encoder = kbert.load(tiny_model_dir).encoder
    kbert.save(encoder, tmp_path / "encoder", vocab_file=f"{TINY}/vocab.txt")
    run_kbert("convert", "to-hf", tmp_path / "encoder", tmp_path / "encoder-hf")
    bert, info = transformers.BertModel.from_pretrained(tmp_path / "encoder-hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        out = bert.eval()(
            input_ids=inputs["input_ids"], attention_mask=inputs["input_mask"], token_type_ids=inputs["segment_ids"]
        )
    np.testing.assert_allclose(out.last_hidden_state.numpy(), EXPECTED["sequence_output"], atol=1e-4, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = open(os.path.join(FIXTURES, "sample_text.txt")).read().splitlines()[0]
    assert tokenizer.tokenize(text) == kbert.Tokenizer(f"{TINY}/vocab.txt", do_lower_case=True).tokenize(text)
