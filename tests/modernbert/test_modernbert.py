"""ModernBERT against transformers' own code: Hugging Face folders of random weights in several
configs (sliding window, global interval, pooling, biases), converted by `kbert convert from-hf`,
give transformers' outputs on TensorFlow here and on JAX and PyTorch in processes of their own;
they go back bit for bit; the tokenizer gives transformers' fast tokenizer's ids on hard text.

There is no ModernBERT download here, so each folder is made by transformers itself
(`save_pretrained`) with a byte-level BPE `tokenizer.json` trained by the tokenizers library on
the repo's sample text, with ModernBERT's special tokens and pair template.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import TESTS, run_kbert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SAMPLE = os.path.join(TESTS, "fixtures", "sample_text.txt")
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
HARD_TEXTS = [
    "",
    "Hello, world!",
    "  leading and   inner   whitespace runs\t\tand tabs\n",
    "emoji 🤗🚀 and accents: café, naïve, Ünïcödé",
    "中文文本，日本語のテキスト，한국어",
    "a " * 40,
    "The quick brown fox jumps over the lazy dog. " * 3,
]
# Each config: what it changes from the first.
CONFIGS = {
    "masked_lm": dict(architecture="ModernBertForMaskedLM", layers=3, every=2, window=8),
    "classifier_mean": dict(
        architecture="ModernBertForSequenceClassification",
        layers=4,
        every=3,
        window=6,
        classifier_pooling="mean",
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        classifier_bias=True,
        num_labels=3,
    ),
    "tagger": dict(architecture="ModernBertForTokenClassification", layers=2, every=1, window=4, num_labels=4),
}


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    with open(SAMPLE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(lines, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tokenizer


def make_hf_folder(folder, tokenizer, architecture, layers, every, window, num_labels=2, seed=0, **options):
    """A transformers ModernBERT of random weights (norms and biases too, away from 1 and 0), saved."""
    from transformers import ModernBertConfig, PreTrainedTokenizerFast

    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    config = ModernBertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=layers,
        num_attention_heads=4,
        local_attention=window,
        global_attn_every_n_layers=every,
        pad_token_id=tokenizer.token_to_id("[PAD]"),
        bos_token_id=cls,
        eos_token_id=sep,
        cls_token_id=cls,
        sep_token_id=sep,
        num_labels=num_labels,
        **options,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            parameter.copy_(base + 0.2 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{name: (HF folder, transformers model, kbert model directory)} for each config."""
    tokenizer = train_tokenizer()
    made = {}
    for i, (name, options) in enumerate(CONFIGS.items()):
        root = tmp_path_factory.mktemp(name)
        model = make_hf_folder(root / "hf", tokenizer, seed=i, **options)
        run_kbert("convert", "from-hf", root / "hf", root / "kbert")
        made[name] = (root / "hf", model, root / "kbert")
    return made


def batch_of(folder, texts):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(texts, padding=True, return_tensors="np")
    return {"input_ids": encoded["input_ids"].astype("int32"), "input_mask": encoded["attention_mask"].astype("int32")}


# Shorter and longer than every window above, odd lengths, and a short row padded beside long ones.
TEXTS = [
    "Hi.",
    "This text is longer than a sliding window of a few tokens, so the local layers see only part of it.",
    "A middling one, odd in length!",
]


def reference(model, batch) -> dict:
    with torch.no_grad():
        ids, mask = torch.tensor(batch["input_ids"]).long(), torch.tensor(batch["input_mask"])
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        base = model.model if hasattr(model, "model") else model
        sequence = base(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    result = {"sequence_output": sequence}
    if hasattr(out, "logits"):
        result["mlm_logits" if "MaskedLM" in type(model).__name__ else "logits"] = out.logits.numpy()
    return result


def assert_close(name, ours, theirs, mask):
    if ours.ndim >= 2 and ours.shape[:2] == mask.shape:  # per token: the real tokens only
        ours, theirs = ours[mask.astype(bool)], theirs[mask.astype(bool)]
    gap = float(np.max(np.abs(ours - theirs)))
    assert gap < 1e-4, f"{name}: {gap:.2e} from transformers"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_converted_models_give_transformers_outputs_on_tensorflow(folders, name):
    import kbert

    hf_folder, model, kbert_dir = folders[name]
    batch = batch_of(hf_folder, TEXTS)
    assert batch["input_mask"].min() == 0 and batch["input_ids"].shape[1] > 2 * CONFIGS[name]["window"]
    expected = reference(model, batch)
    ours = kbert.load(kbert_dir)(batch)
    for key, value in expected.items():
        if key == "sequence_output" and key not in ours:
            continue
        assert_close(f"{name} {key}", keras.ops.convert_to_numpy(ours[key]), value, batch["input_mask"])


BACKEND_SCRIPT = r"""
import json, sys
import numpy as np, keras, kbert
job = json.loads(sys.argv[1])
batch = {k: np.asarray(v, "int32") for k, v in job["batch"].items()}
out = kbert.load(job["model_dir"])(batch)
np.savez(job["out"], **{k: keras.ops.convert_to_numpy(v) for k, v in out.items()}, backend=keras.config.backend())
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_converted_models_give_transformers_outputs_on_jax_and_pytorch(folders, tmp_path, backend):
    for name, (hf_folder, model, kbert_dir) in folders.items():
        batch = batch_of(hf_folder, TEXTS)
        out = tmp_path / f"{name}.npz"
        job = {"model_dir": str(kbert_dir), "batch": {k: v.tolist() for k, v in batch.items()}, "out": str(out)}
        env = dict(os.environ, KERAS_BACKEND=backend)
        done = subprocess.run(
            [sys.executable, "-c", BACKEND_SCRIPT, json.dumps(job)], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        ours = np.load(out)
        assert str(ours["backend"]) == backend
        for key, value in reference(model, batch).items():
            if key in ours:
                assert_close(f"{backend} {name} {key}", ours[key], value, batch["input_mask"])


def test_mlm_logits_at_given_positions_are_those_of_every_position(folders):
    import kbert

    hf_folder, _, kbert_dir = folders["masked_lm"]
    model = kbert.load(kbert_dir)
    batch = batch_of(hf_folder, TEXTS)
    every = keras.ops.convert_to_numpy(model(batch)["mlm_logits"])
    positions = np.array([[0, 1], [5, 17], [2, 3]], dtype="int32")
    picked = keras.ops.convert_to_numpy(model({**batch, "masked_lm_positions": positions})["mlm_logits"])
    assert picked.shape == (3, 2, every.shape[-1])
    np.testing.assert_allclose(picked, np.take_along_axis(every, positions[..., None], axis=1), atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_to_hf_gives_back_every_tensor_bit_for_bit(folders, tmp_path, name):
    from safetensors.numpy import load_file

    hf_folder, _, kbert_dir = folders[name]
    result = json.loads(run_kbert("convert", "to-hf", kbert_dir, tmp_path / "back").stdout)
    assert result["architecture"] == CONFIGS[name]["architecture"]
    before, after = load_file(hf_folder / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(before) == sorted(after)
    for key in before:
        assert before[key].tobytes() == after[key].tobytes(), key
    cls = getattr(transformers, CONFIGS[name]["architecture"])
    _, info = cls.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert os.path.isfile(tmp_path / "back" / "tokenizer.json")


def test_inspect_names_the_family_of_the_folder_and_of_the_model_directory(folders):
    hf_folder, _, kbert_dir = folders["classifier_mean"]
    for path, kind in ((hf_folder, "Hugging Face model"), (kbert_dir, "kbert model directory (classifier)")):
        described = json.loads(run_kbert("convert", "inspect", path).stdout)
        assert (described["family"], described["kind"]) == ("modernbert", kind)
        assert described["config"]["classifier_pooling"] == "mean"


def test_the_tokenizer_gives_transformers_ids_on_hard_text(folders):
    from transformers import AutoTokenizer

    from kbert.modernbert.tokenizer import BpeTokenizer

    hf_folder, _, kbert_dir = folders["masked_lm"]
    theirs = AutoTokenizer.from_pretrained(hf_folder)
    ours = BpeTokenizer(kbert_dir / "tokenizer.json")
    assert ours.encode(HARD_TEXTS) == [theirs(text)["input_ids"] for text in HARD_TEXTS]
    pairs_b = list(reversed(HARD_TEXTS))
    for length in (None, 9, 24):
        cut = {"truncation": True, "max_length": length} if length else {}
        expected = [theirs(a, b, **cut)["input_ids"] for a, b in zip(HARD_TEXTS, pairs_b)]
        assert ours.encode(HARD_TEXTS, pairs_b, max_length=length) == expected, length
    packed = ours.pack(HARD_TEXTS[:3], max_length=8)
    padded = theirs(HARD_TEXTS[:3], truncation=True, max_length=8, padding=True)
    assert packed["input_ids"].tolist() == padded["input_ids"]
    assert packed["input_mask"].tolist() == padded["attention_mask"]


def test_strict_conversion_refuses_unknown_and_misshapen_weights_in_one_line(folders, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    hf_folder, _, _ = folders["masked_lm"]
    tensors = load_file(hf_folder / "model.safetensors")
    for case, change in {
        "unknown": lambda t: {**t, "model.extra.weight": np.zeros(3, "float32")},
        "misshapen": lambda t: {**t, "head.dense.weight": np.zeros((32, 31), "float32")},
        "missing": lambda t: {k: v for k, v in t.items() if k != "model.final_norm.weight"},
    }.items():
        folder = tmp_path / case
        shutil.copytree(hf_folder, folder)
        save_file(change(dict(tensors)), folder / "model.safetensors", metadata={"format": "pt"})
        done = run_kbert("convert", "from-hf", folder, tmp_path / f"{case}-out", check=False)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert {"unknown": "model.extra.weight", "misshapen": "head.dense.weight", "missing": "final_norm"}[
            case
        ] in done.stderr
        assert not (tmp_path / f"{case}-out").exists()


def test_fill_mask_gives_the_pipelines_predictions(folders):
    from transformers import pipeline

    hf_folder, _, kbert_dir = folders["masked_lm"]
    text = "The man went to the [MASK] and bought a [MASK] of milk."
    ours = json.loads(run_kbert("fill-mask", kbert_dir, text, "--top-k", "3").stdout)
    theirs = pipeline("fill-mask", model=str(hf_folder), top_k=3)(text)
    assert len(ours["masks"]) == 2
    for mask, expected in zip(ours["masks"], theirs):
        assert [p["id"] for p in mask["predictions"]] == [e["token"] for e in expected]
        for p, e in zip(mask["predictions"], expected):
            assert abs(p["probability"] - e["score"]) < 1e-5


def test_fill_mask_on_a_classifier_says_it_has_no_masked_lm_head(folders):
    _, _, kbert_dir = folders["classifier_mean"]
    done = run_kbert("fill-mask", kbert_dir, "a [MASK] here", check=False)
    assert done.returncode == 1 and "has no masked-LM head: it is a classifier" in done.stderr, done.stderr


def test_a_sentence_transformers_modernbert_embeds_as_encode_does_and_goes_back(folders, tmp_path):
    from sentence_transformers import SentenceTransformer, models

    hf_folder, _, _ = folders["masked_lm"]
    transformer = models.Transformer(str(hf_folder), max_seq_length=24)
    width = transformer.get_embedding_dimension()
    modules = [transformer, models.Pooling(width, "mean"), models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    converted = json.loads(run_kbert("convert", "from-hf", tmp_path / "st", tmp_path / "kbert").stdout)
    assert converted["embedding"] == {"pooling": "mean", "normalize": True, "max_seq_length": 24}
    texts = [*HARD_TEXTS, *TEXTS]
    (tmp_path / "texts.txt").write_text("\n".join(t.replace("\n", " ").strip() or "." for t in texts) + "\n")
    lines = (tmp_path / "texts.txt").read_text().splitlines()
    run_kbert("embed", tmp_path / "kbert", "--input", tmp_path / "texts.txt", "--output", tmp_path / "v.jsonl")
    ours = np.array([json.loads(line)["embedding"] for line in (tmp_path / "v.jsonl").read_text().splitlines()])
    np.testing.assert_allclose(ours, st.encode(lines, batch_size=4), atol=1e-5)
    run_kbert("convert", "to-hf", tmp_path / "kbert", tmp_path / "back")
    again = SentenceTransformer(str(tmp_path / "back"), device="cpu")
    np.testing.assert_allclose(again.encode(lines), st.encode(lines), atol=1e-6)


SENTIMENT = [
    ("a great and wonderful film", "pos"),
    ("i loved it, truly good", "pos"),
    ("excellent acting and a fine story", "pos"),
    ("a terrible and boring film", "neg"),
    ("i hated it, truly bad", "neg"),
    ("awful acting and a dull story", "neg"),
]


def test_a_finetuned_modernbert_predicts_evaluates_and_goes_to_transformers_alike(folders, tmp_path):
    hf_folder, _, _ = folders["masked_lm"]
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"{t}\t{label}\n" for t, label in SENTIMENT * 4))
    result = json.loads(
        run_kbert(
            "finetune", hf_folder, "--task", "classify", "--train", train, "--dev", train, "--output",
            tmp_path / "clf", "--epochs", "2", "--max-seq-length", "24", "--batch-size", "8",
            "--learning-rate", "1e-3",
        ).stdout
    )  # fmt: skip
    assert result["max_seq_length"] == 24 and 0 <= result["accuracy"] <= 1
    rows = [json.loads(line) for line in run_kbert("predict", tmp_path / "clf", "--input", train).stdout.splitlines()]
    scores = json.loads(run_kbert("evaluate", tmp_path / "clf", "--input", train).stdout)
    assert scores["examples"] == len(rows) == len(SENTIMENT) * 4
    run_kbert("convert", "to-hf", tmp_path / "clf", tmp_path / "hf")
    from transformers import AutoTokenizer, ModernBertForSequenceClassification

    model = ModernBertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = [t for t, _ in SENTIMENT]
    with torch.no_grad():
        expected = model(**tokenizer(texts, return_tensors="pt", padding=True)).logits.softmax(-1).numpy()
    labels = [model.config.id2label[i] for i in range(2)]
    ours = np.array([[row["probabilities"][label] for label in labels] for row in rows[: len(texts)]])
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_words_pack_as_transformers_packs_words_split_in_advance(folders):
    """A tagger's words: each tokenized on its own (transformers' `is_split_into_words`), cut to
    the length, each word's first token found (-1: cut off)."""
    from transformers import AutoTokenizer

    from kbert.modernbert.packing import BpePacker

    hf_folder, _, kbert_dir = folders["masked_lm"]
    theirs = AutoTokenizer.from_pretrained(hf_folder)
    sentences = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn", "🤗", "東京"], ["a"] * 40]
    packer = BpePacker(kbert_dir / "tokenizer.json", theirs.pad_token_id, 24)
    features, positions, truncated = packer.encode_words(sentences)
    for row, words in enumerate(sentences):
        expected = theirs(words, is_split_into_words=True, truncation=True, max_length=24)
        width = len(expected["input_ids"])
        assert features["input_ids"][row, :width].tolist() == expected["input_ids"]
        assert features["input_mask"][row].sum() == width
        word_ids = expected.word_ids()
        first = [word_ids.index(w) if w in word_ids else -1 for w in range(len(words))]
        assert positions.to_list()[row] == first
    whole = [len(theirs(words, is_split_into_words=True)["input_ids"]) for words in sentences]
    assert truncated.tolist() == [n > 24 for n in whole] and not all(truncated) and any(truncated)


def test_a_modernbert_tagger_finetunes_and_tags_each_word(folders, tmp_path):
    hf_folder, _, _ = folders["masked_lm"]
    train = tmp_path / "train.conll"
    train.write_text("EU\tB-ORG\nrejects\tO\nGerman\tB-MISC\n\nPeter\tB-PER\nwins\tO\n\n" * 4)
    run_kbert(
        "finetune", hf_folder, "--task", "tag", "--train", train, "--output", tmp_path / "tagger",
        "--epochs", "1", "--max-seq-length", "16", "--batch-size", "4",
    )  # fmt: skip
    rows = [
        json.loads(line) for line in run_kbert("predict", tmp_path / "tagger", "--input", train).stdout.splitlines()
    ]
    assert len(rows) == 8 and rows[0]["words"] == ["EU", "rejects", "German"] and len(rows[0]["tags"]) == 3
    assert {tag for row in rows for tag in row["tags"]} <= {"B-ORG", "O", "B-MISC", "B-PER"}


def test_features_of_a_modernbert_are_refused_in_one_line_pointing_to_embed(folders, tmp_path):
    _, _, kbert_dir = folders["masked_lm"]
    (tmp_path / "in.txt").write_text("one text\n")
    done = run_kbert("predict", kbert_dir, "--input", tmp_path / "in.txt", check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "no pooled output" in done.stderr and "kbert embed" in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["convert", "to-tf1", "{model}", "{out}"],
        ["convert", "to-keras-hub", "{model}", "{out}"],
        ["extend", "{model}", "{out}", "--max-position-embeddings", "1024"],
    ],
)
def test_commands_that_take_bert_only_say_so_of_a_modernbert_in_one_line(folders, tmp_path, command):
    _, _, kbert_dir = folders["masked_lm"]
    args = [part.format(model=kbert_dir, out=tmp_path / "out") for part in command]
    done = run_kbert(*args, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "a ModernBERT, and this command takes BERT models only so far" in done.stderr
    assert not (tmp_path / "out").exists()


TRAIN_STEP = r"""
import sys, numpy as np, keras, kbert
model = kbert.load(sys.argv[1])
ids = np.array([[1, 50, 60, 70, 2, 3, 3], [1, 80, 90, 2, 3, 3, 3]], "int32")
model.compile(optimizer=keras.optimizers.SGD(0.5),
              loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
loss = model.train_on_batch({"input_ids": ids, "input_mask": (ids != 3).astype("int32")}, {"logits": np.array([0, 2])})
np.savez(sys.argv[2], loss=np.asarray(loss), *[keras.ops.convert_to_numpy(w) for w in model.weights])
"""


def test_a_training_step_is_the_same_on_every_backend(folders, tmp_path):
    """One SGD step of the classifier (`mean` pooling, every bias) moves every weight alike on
    TensorFlow, JAX and PyTorch: the gradients agree, through the windowed and chunked attention
    and the real-token gathers."""
    _, _, kbert_dir = folders["classifier_mean"]
    after = {}
    for backend in ("tensorflow", "jax", "torch"):
        out = tmp_path / f"{backend}.npz"
        env = dict(os.environ, KERAS_BACKEND=backend)
        done = subprocess.run(
            [sys.executable, "-c", TRAIN_STEP, kbert_dir, out], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        after[backend] = np.load(out)
    names = [k for k in after["tensorflow"].files if k.startswith("arr_")]
    before = kbert_weights(kbert_dir)
    assert max(float(np.abs(after["tensorflow"][k] - w).max()) for k, w in zip(names, before)) > 1e-3  # it moved
    for backend in ("jax", "torch"):
        assert abs(float(after[backend]["loss"]) - float(after["tensorflow"]["loss"])) < 1e-5
        for name in names:
            np.testing.assert_allclose(after[backend][name], after["tensorflow"][name], atol=1e-5, err_msg=backend)


def kbert_weights(model_dir):
    import kbert

    return [keras.ops.convert_to_numpy(w) for w in kbert.load(model_dir).weights]
