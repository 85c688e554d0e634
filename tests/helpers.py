"""What several test files share: the toy data sets the tiny checkpoint can learn, the
original code's outputs on the tiny checkpoint, the stand-in TF Serving server, and the
save/load round trip every model class must pass (as keras-hub's `run_serialization_test`)."""

import json
import os
import subprocess
import sys
import time

import h5py
import keras
import numpy as np

from conftest import REFERENCE, TESTS, TINY

# === Toy data over the tiny checkpoint's 300-word vocabulary ===

POSITIVE = ["gold", "glorious", "glittering", "great", "fortunate", "fresh", "grand", "young"]
NEGATIVE = ["dead", "dread", "empty", "dust", "fallen", "debris", "desert", "dim"]
FILLER = [
    "the",
    "of",
    "and",
    "a",
    "to",
    "at",
    "his",
    "in",
    "that",
    "he",
    "was",
    "city",
    "camp",
    "fire",
    "highway",
    "stream",
    "cabin",
    "morning",
    "rain",
    "they",
    "through",
    "street",
]


def sentiment_texts(n, seed):
    """Short sentences of cue words of one class plus a little filler; label 1 = positive cues."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(0, 2))
        words = list(rng.choice(POSITIVE if label else NEGATIVE, size=int(rng.integers(2, 5))))
        for _ in range(int(rng.integers(0, 3))):
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(FILLER)))
        texts.append(" ".join(words) + ".")
        labels.append(label)
    return texts, np.array(labels, dtype="int32")


def write_tsv(path, rows, header=("text", "label")):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(str(v) for v in row) + "\n")
    return path


def sentiment_rows(n, seed):
    texts, labels = sentiment_texts(n, seed)
    return [(t, "pos" if y else "neg") for t, y in zip(texts, labels)]


def conll_sentences(n, seed):
    """Tag place words LOC (two-word places B-LOC I-LOC) and people PER; the rest O.

    Each word has one tag wherever it stands: the tiny checkpoint has random weights, and a
    few hundred sentences do not teach it context; span assembly and WordPiece alignment are
    what this checks."""
    rng = np.random.default_rng(seed)
    places, people = ["city", "camp", "desert", "highway", "cabin"], ["cassius", "guide", "fellow"]
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(int(rng.integers(3, 7))):
            r = rng.random()
            if r < 0.2:  # two-word places: "great street", "great stream"
                words += ["great", str(rng.choice(["street", "stream"]))]
                tags += ["B-LOC", "I-LOC"]
            elif r < 0.4:
                words.append(str(rng.choice(places)))
                tags.append("B-LOC")
            elif r < 0.55:
                words.append(str(rng.choice(people)))
                tags.append("B-PER")
            else:
                words.append(str(rng.choice(FILLER[:10])))
                tags.append("O")
        out.append((words, tags))
    return out


def write_conll(path, sentences):
    with open(path, "w") as f:
        for words, tags in sentences:
            f.writelines(f"{w}\t{t}\n" for w, t in zip(words, tags))
            f.write("\n")
    return path


SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"


def swag_rows(n, seed):
    """SWAG-shaped questions over the tiny vocabulary: the right ending is the one with the
    positive cue words, the three others have negative ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        context = " ".join(rng.choice(FILLER[:12], size=4)) + "."
        right = int(rng.integers(0, 4))
        endings = [" ".join(rng.choice(POSITIVE if k == right else NEGATIVE, size=2)) + "." for k in range(4)]
        rows.append((f"v{i}", context, "the", endings, right))
    return rows


def write_swag(path, rows, labels=True):
    with open(path, "w") as f:
        f.write(SWAG_HEADER + "\n" if labels else SWAG_HEADER.rsplit(",", 1)[0] + "\n")
        for i, (video, context, start, endings, label) in enumerate(rows):
            fields = [str(i), video, "0", f"{context} {start}", context, start, "gold", *endings]
            f.write(",".join(fields + ([str(label)] if labels else [])) + "\n")
    return path


# === The original code's outputs on the tiny checkpoint (fixtures/tf1-tiny/expected.npz) ===

EXPECTED = np.load(os.path.join(TINY, "expected.npz"))
ENCODER_KEYS = ("input_ids", "input_mask", "segment_ids")


def original_outputs(model, inputs=None):
    """The outputs expected.npz holds, computed by `model` on the same inputs (or on `inputs`:
    the encoder's three and masked_lm_positions, as expected.npz holds them)."""
    if inputs is None:
        inputs = {k: EXPECTED[k].astype("int32") for k in ENCODER_KEYS + ("masked_lm_positions",)}
    out = model(inputs, training=False)
    return {
        "embedding_output": embedding_model(model.encoder)({k: inputs[k] for k in ENCODER_KEYS}),
        "sequence_output": out["sequence_output"],
        "pooled_output": out["pooled_output"],
        "mlm_log_probs": keras.ops.log_softmax(out["mlm_logits"], axis=-1),
        "nsp_log_probs": keras.ops.log_softmax(out["nsp_logits"], axis=-1),
    }


def original_code_report(checkpoint_dir, case) -> dict:
    """google-research/bert's own code (tests/reference/original.py, in a process of its own: its
    TF1 shim switches TensorFlow to graph mode) on the checkpoint in `checkpoint_dir`, fed the
    inputs of the .npz `case` and compared with the outputs it holds: the script's JSON report
    ("trainable_variables", "initialized_from_checkpoint", "not_initialized", "max_abs_diff")."""
    result = subprocess.run(
        [sys.executable, os.path.join(TESTS, "reference", "original.py"), str(checkpoint_dir), str(case)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# === The original's packing: run_classifier.convert_single_example, run by the original code ===

_CONVERT_SINGLE_EXAMPLE = r"""
import collections, json, sys
sys.path.insert(0, sys.argv[1])
from absl import flags
from original import load_original
tokenization = load_original("tokenization")
modeling = load_original("modeling")
optimization = load_original("optimization")
run_classifier = load_original("run_classifier", modeling=modeling, optimization=optimization,
                               tokenization=tokenization)
flags.FLAGS(["original"])
run_classifier.tf.logging.set_verbosity(run_classifier.tf.logging.ERROR)


def load_vocab(vocab_file):
    # github.com/google-research/bert's load_vocab, verbatim: PyPI 1.0.4's keeps the first copy of a
    # repeated token and renumbers the rest (see tests/text/test_tokenizer.py's github_load_vocab).
    vocab = collections.OrderedDict()
    index = 0
    with tokenization.tf.gfile.GFile(vocab_file, "r") as reader:
        while True:
            token = tokenization.convert_to_unicode(reader.readline())
            if not token:
                break
            token = token.strip()
            vocab[token] = index
            index += 1
    return vocab


tokenization.load_vocab = load_vocab
job = json.load(open(sys.argv[2], encoding="utf-8"))
tokenizer = tokenization.FullTokenizer(job["vocab"], do_lower_case=job["lower"])
features = []
for i, (a, b, length) in enumerate(job["cases"]):
    example = run_classifier.InputExample(guid=str(i), text_a=a, text_b=b, label="0")
    f = run_classifier.convert_single_example(i, example, ["0"], length, tokenizer)
    features.append([f.input_ids, f.input_mask, f.segment_ids])
print(json.dumps(features))
"""


def original_packing(cases, vocab_file, tmp_dir, do_lower_case=True) -> list:
    """[input_ids, input_mask, segment_ids] of each (text_a, text_b or None, max_seq_length) case,
    as google-research/bert's run_classifier.convert_single_example builds them (in a subprocess:
    its TF1 shim switches TensorFlow to graph mode), the vocabulary read as GitHub's load_vocab
    reads it (tf1-tiny's repeats tokens)."""
    job = os.path.join(tmp_dir, "packing.json")
    with open(job, "w", encoding="utf-8") as f:
        json.dump({"vocab": vocab_file, "lower": do_lower_case, "cases": list(cases)}, f)
    result = subprocess.run(
        [sys.executable, "-c", _CONVERT_SINGLE_EXAMPLE, os.path.join(TESTS, "reference"), job],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# === The stand-in TF Serving (the real tensorflow_model_server cannot be installed here) ===

STANDIN_SERVER = os.path.join(TESTS, "serving", "standin_server.py")


def start_standin_server(model_config_files, log_path, grpc_port=0, rest_port=0):
    """The stand-in serving the models of these models.config files with TF Serving's strictest
    signature checks, on these ports (0: free ones); returns (process, its ready line as a dict)."""
    log = open(log_path, "a")
    args = [a for path in model_config_files for a in ("--model_config_file", str(path))]
    process = subprocess.Popen(
        [
            sys.executable,
            STANDIN_SERVER,
            "--grpc-port",
            str(grpc_port),
            "--rest-port",
            str(rest_port),
            "--enable_signature_method_name_check",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    line = process.stdout.readline()
    log.close()
    if not line:
        process.wait(timeout=30)
        raise AssertionError("the stand-in server did not start:\n" + open(log_path).read()[-3000:])
    return process, json.loads(line)


# === Save/load round trips ===


TINY_VOCAB = os.path.join(TINY, "vocab.txt")


def assert_round_trips(model, inputs, tmp_path, vocab_file=TINY_VOCAB):
    """`model` survives every way kbert and Keras save it, with outputs equal bit for bit:
    get_config/from_config (same config), `model.save` + `keras.saving.load_model`, and
    `kbert.save` + `kbert.load` (same class, same outputs)."""
    import kbert

    clone = type(model).from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    expected = {k: np.asarray(v) for k, v in model(inputs, training=False).items()}
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert type(restored) is type(model)
    for name, value in restored(inputs, training=False).items():
        np.testing.assert_array_equal(np.asarray(value), expected[name], err_msg=f".keras: {name}")
    kbert.save(model, tmp_path / "model_dir", vocab_file=vocab_file)
    loaded = kbert.load(tmp_path / "model_dir")
    assert type(loaded) is type(model)
    for name, value in loaded(inputs, training=False).items():
        np.testing.assert_array_equal(np.asarray(value), expected[name], err_msg=f"model dir: {name}")


def saved_weights(model_dir):
    """{name: array} of every array in MODEL_DIR/model.weights.h5."""
    with h5py.File(os.path.join(model_dir, "model.weights.h5")) as f:
        arrays = {}
        f.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return arrays


def largest_difference(a: dict, b: dict) -> float:
    """The largest |a - b| over arrays of the same names (a BERT has 40 or more)."""
    assert a.keys() == b.keys() and len(a) >= 40
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


def embedding_model(encoder) -> keras.Model:
    """A model from the encoder's inputs to `embedding_output` (after embeddings + LayerNorm),
    the original's `get_embedding_output`, which the parity tests compare."""
    return keras.Model(encoder.input, encoder.embeddings.output)


def run_in_fresh_process(work, script: str, spec, timeout: int = 300, env: dict | None = None):
    """Run `script` (Python source) in a fresh interpreter on `work`/spec.json (`spec` as JSON),
    as the export tests run SavedModels the way TF Serving does (tests/reference is on its path, for
    serving_session), with `env` added to its environment; returns its last stdout line as JSON."""
    (work / "spec.json").write_text(json.dumps(spec))
    (work / "serve.py").write_text(script)
    result = subprocess.run(
        [sys.executable, str(work / "serve.py"), str(work / "spec.json")],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="3",
            PYTHONPATH=os.pathsep.join(filter(None, [REFERENCE, os.environ.get("PYTHONPATH")])),
            **(env or {}),
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# === A Python without TensorFlow, as on a GPU machine that has only JAX or PyTorch ===

# The modules a missing TensorFlow takes with it; `None` in sys.modules makes each import raise ImportError.
TENSORFLOW_MODULES = ("tensorflow", "tensorflow_text", "tf_keras", "tensorflow_hub")


def without_tensorflow_env(folder, backend: str) -> dict:
    """The environment of a Python in which TensorFlow is not installed, on Keras' `backend`:
    a sitecustomize.py in `folder` (put first on PYTHONPATH) blocks TENSORFLOW_MODULES."""
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in TENSORFLOW_MODULES)
    (folder / "sitecustomize.py").write_text("import sys\n" + blocked)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")


# === Byte-level BPE tokenizer.json files, as a ModernBERT (or RoBERTa) ships them ===


def bpe_tokenizer_file(path, corpus, specials=("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"), template=(1, 2)):
    """A byte-level BPE tokenizer.json trained by the tokenizers library on `corpus` (a text file),
    saved to `path`; `template`: the indices in `specials` of the tokens around one text, as
    ModernBERT's [CLS] ... [SEP] (None: no post-processor, so no special tokens are added)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    with open(corpus, encoding="utf-8") as f:
        lines = f.read().splitlines()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(lines, trainer)
    if template is not None:
        first, last = specials[template[0]], specials[template[1]]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{first}:0 $A:0 {last}:0",
            pair=f"{first}:0 $A:0 {last}:0 $B:1 {last}:1",
            special_tokens=[(first, tokenizer.token_to_id(first)), (last, tokenizer.token_to_id(last))],
        )
    tokenizer.save(str(path))
    return path


# === Runs stopped mid-file (predict, rerank: --output then --resume) ===


def complete_lines(path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def stop_mid_run(process, partial, number, rows, total, limit=300):
    """Send `number` once `partial` has `rows` complete lines, while the run is still going."""
    deadline = time.monotonic() + limit
    while complete_lines(partial) < rows:
        assert process.poll() is None, f"predict ended first: {process.returncode} {process.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"no {rows} rows in {partial} within {limit} s"
        time.sleep(0.005)
    process.send_signal(number)
    stdout, stderr = process.communicate(timeout=120)
    written = complete_lines(partial)
    assert rows <= written < total, f"the signal landed after the run ended ({written} of {total} rows)"
    return written, stdout, stderr
