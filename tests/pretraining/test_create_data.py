"""kbert create-data against google-research/bert's own create_pretraining_data.py, run here.

The original's functions run unmodified, in this process: its source (PyPI bert-tensorflow
1.0.4) is parsed and its functions and classes are executed without its module-level absl
flag definitions, which would clash with other original scripts' flags in one process and
which none of these functions reads. Its records are decoded with the original
run_pretraining.py's own `input_fn_builder` / `_decode_record`, taken the same way.
"""

import ast
import importlib.util
import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from bert import tokenization  # google-research/bert, PyPI bert-tensorflow 1.0.4

from conftest import FIXTURES, UNCASED_VOCAB, assert_user_error, run_kbert
from kbert import Tokenizer
from kbert.pretraining import create_data, python_random
from kbert.pretraining.create_data import create_pretraining_data
from kbert.pretraining.instances import InstanceBuilder, truncate_seq_pair
from kbert.pretraining.record_encoder import FEATURES
from kbert.pretraining.record_statistics import compute_statistics
from kbert.runtime.errors import KbertError, command_line_names

SAMPLE = os.path.join(FIXTURES, "sample_text.txt")


def original_module(name, keep=lambda node: True):
    """The original module `name`'s imports, functions and classes, as a module object."""
    path = os.path.join(importlib.util.find_spec("bert").submodule_search_locations[0], f"{name}.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    body = []
    for node in tree.body:
        is_def = isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Import)) or (
            isinstance(node, ast.ImportFrom) and node.module != "__future__"
        )
        # create_pretraining_data's one module-level value besides the flags.
        is_namedtuple = (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "MaskedLmInstance"
        )
        if (is_def or is_namedtuple) and keep(node):
            body.append(node)
    module = types.ModuleType(f"original_{name}")
    sys.modules[module.__name__] = module  # so that tf.data's autograph finds the source
    exec(compile(ast.Module(body, []), path, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def original():
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["pytest"])  # tokenization reads --preserve_unused_tokens
    module = original_module("create_pretraining_data")
    module.tokenizer = tokenization.FullTokenizer(UNCASED_VOCAB, do_lower_case=True)
    return module


@pytest.fixture(scope="module")
def original_input_fn():
    # run_pretraining's imports include modeling (tf.contrib); only these two functions are needed.
    module = original_module(
        "run_pretraining",
        keep=lambda node: isinstance(node, ast.FunctionDef) and node.name in ("input_fn_builder", "_decode_record"),
    )
    module.tf = tf.compat.v1
    return module.input_fn_builder


def write_original(
    original,
    corpus,
    outputs,
    dupe_factor,
    seed=12345,
    max_seq_length=128,
    max_predictions_per_seq=20,
    masked_lm_prob=0.15,
    short_seq_prob=0.1,
):
    """What create_pretraining_data.py's main() does with these flags."""
    rng = random.Random(seed)
    instances = original.create_training_instances(
        [str(corpus)],
        original.tokenizer,
        max_seq_length,
        dupe_factor,
        short_seq_prob,
        masked_lm_prob,
        max_predictions_per_seq,
        rng,
    )
    original.write_instance_to_example_files(
        instances, original.tokenizer, max_seq_length, max_predictions_per_seq, [str(p) for p in outputs]
    )


def read_examples(path):
    """Every record of a TFRecord file as {feature: list of values}."""
    out = []
    for record in tf.data.TFRecordDataset(str(path)):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        out.append({name: list(f.int64_list.value or f.float_list.value) for name, f in feature.items()})
    return out


def many_documents_corpus(path, lines_per_document=3):
    """sample_text.txt regrouped into more, shorter documents (random-next needs several)."""
    with open(SAMPLE, encoding="utf-8") as f:
        documents = [d.strip().splitlines() for d in f.read().split("\n\n") if d.strip()]
    pieces = [
        lines[i : i + lines_per_document] for lines in documents for i in range(0, len(lines), lines_per_document)
    ]
    path.write_text("\n\n".join("\n".join(p) for p in pieces) + "\n", encoding="utf-8")
    return path


# --- the random draws ---------------------------------------------------------------------------


def test_shuffle_and_randbelow_draw_exactly_like_random():
    for n in (0, 1, 2, 3, 7, 64, 125, 1000):
        ours, theirs = random.Random(n), random.Random(n)
        a, b = list(range(n)), list(range(n))
        for _ in range(20):
            theirs.shuffle(a)
            python_random.shuffle(b, ours)
            assert a == b
            assert theirs.randint(0, 30521) == python_random.randbelow(ours, 30522)
        assert theirs.random() == ours.random()  # the same state afterwards


def test_truncate_seq_pair_cuts_like_original(original):
    for seed in range(200):
        rng = random.Random(seed)
        a = list(range(rng.randint(1, 60)))
        b = list(range(100, 100 + rng.randint(1, 60)))
        limit = rng.randint(2, 70)
        ours, theirs = random.Random(seed), random.Random(seed)
        want_a, want_b = a[:], b[:]
        original.truncate_seq_pair(want_a, want_b, limit, theirs)
        assert truncate_seq_pair(a, b, limit, ours) == (want_a, want_b)
        assert ours.random() == theirs.random()


# --- against the original's records ------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        dict(shards=1),
        dict(shards=3, max_seq_length=64, max_predictions_per_seq=10, masked_lm_prob=0.2, short_seq_prob=0.3, seed=7),
        dict(shards=1, max_seq_length=256, max_predictions_per_seq=40, seed=5),
    ],
    ids=["defaults", "small-sharded", "long"],
)
def test_same_records_as_original_when_the_corpus_fits_one_chunk(original, tmp_path, flags):
    flags = dict(flags)
    shards = flags.pop("shards")
    theirs = [tmp_path / f"original-{i}.tfrecord" for i in range(shards)]
    write_original(original, SAMPLE, theirs, dupe_factor=5, **flags)
    result = create_pretraining_data(
        [SAMPLE], UNCASED_VOCAB, tmp_path / "kbert.tfrecord", dupe_factor=5, shards=shards, workers=1, **flags
    )
    assert result["chunks"] == 1
    assert len(result["output_files"]) == shards
    total = 0
    for ours_path, theirs_path in zip(result["output_files"], theirs):
        ours, want = read_examples(ours_path), read_examples(theirs_path)
        assert len(want) > 10
        assert ours == want  # every feature of every record, in the same order
        total += len(ours)
        if flags.get("max_seq_length", 128) > 128:  # positions past 127 take two bytes
            assert max(max(e["masked_lm_positions"]) for e in ours) >= 128
    assert total == result["instances"]


def test_records_decode_with_original_input_fn(original_input_fn, tmp_path):
    out = tmp_path / "kbert.tfrecord"
    result = create_pretraining_data(
        [SAMPLE], UNCASED_VOCAB, out, dupe_factor=3, workers=1, max_seq_length=96, max_predictions_per_seq=14
    )
    n = result["instances"]
    examples = read_examples(out)
    assert len(examples) == n and set(examples[0]) == set(FEATURES)
    batch = next(iter(original_input_fn([str(out)], 96, 14, is_training=False)({"batch_size": n})))
    shapes = {name: tuple(t.shape) for name, t in batch.items()}
    assert shapes == {
        "input_ids": (n, 96),
        "input_mask": (n, 96),
        "segment_ids": (n, 96),
        "masked_lm_positions": (n, 14),
        "masked_lm_ids": (n, 14),
        "masked_lm_weights": (n, 14),
        "next_sentence_labels": (n, 1),
    }
    assert batch["masked_lm_weights"].dtype == tf.float32
    for name in FEATURES:
        np.testing.assert_array_equal(batch[name].numpy(), np.array([e[name] for e in examples]))
    # Padding as the original pads: zeros after the tokens and after the predictions.
    mask, weights = batch["input_mask"].numpy(), batch["masked_lm_weights"].numpy()
    lengths, predictions = mask.sum(1), (weights > 0).sum(1)
    for i in range(n):
        assert (mask[i, : lengths[i]] == 1).all() and (batch["input_ids"].numpy()[i, lengths[i] :] == 0).all()
        assert set(weights[i, : predictions[i]]) == {1.0} and (weights[i, predictions[i] :] == 0).all()
        assert (batch["masked_lm_positions"].numpy()[i, predictions[i] :] == 0).all()


def test_statistics_match_original_when_chunked(original, tmp_path):
    corpus = many_documents_corpus(tmp_path / "many.txt")
    theirs = tmp_path / "original.tfrecord"
    write_original(original, corpus, [theirs], dupe_factor=60, seed=3)
    # Chunks of 4 documents: random-next segments come from 3 others, not from all of them.
    result = create_pretraining_data(
        [corpus], UNCASED_VOCAB, tmp_path / "kbert.tfrecord", dupe_factor=60, seed=3, workers=1, chunk_docs=4
    )
    assert result["chunks"] >= 3
    ours = compute_statistics(result["output_files"], UNCASED_VOCAB)
    want = compute_statistics([theirs], UNCASED_VOCAB)
    assert want["instances"] > 1000
    for key, value in ours.items():  # the tally made while writing is what the records hold
        assert result[key] == pytest.approx(value, rel=1e-9), key
    assert ours["instances"] == pytest.approx(want["instances"], rel=0.05)
    assert ours["mean_length"] == pytest.approx(want["mean_length"], rel=0.03)
    assert ours["masked_share"] == pytest.approx(want["masked_share"], abs=0.003)
    for key in ("mask_token_share", "kept_share", "random_share"):
        assert ours[key] == pytest.approx(want[key], abs=0.01), key
    assert ours["random_next_share"] == pytest.approx(want["random_next_share"], abs=0.04)
    assert (ours["mask_token_share"], ours["kept_share"], ours["random_share"]) == pytest.approx(
        (0.8, 0.1, 0.1), abs=0.015
    )


def test_output_does_not_depend_on_the_number_of_workers(tmp_path):
    corpus = many_documents_corpus(tmp_path / "many.txt")
    outputs = []
    for workers in (1, 2):
        result = create_pretraining_data(
            [corpus], UNCASED_VOCAB, tmp_path / f"w{workers}.tfrecord", dupe_factor=4, workers=workers, chunk_docs=3
        )
        assert result["chunks"] >= 4 and result["workers"] == workers
        outputs.append(Path(result["output_files"][0]).read_bytes())
    assert outputs[0] == outputs[1]
    again = create_pretraining_data(
        [corpus], UNCASED_VOCAB, tmp_path / "seed.tfrecord", dupe_factor=4, workers=1, chunk_docs=3, seed=1
    )
    assert Path(again["output_files"][0]).read_bytes() != outputs[0]  # the seed does


def test_whole_word_mask_masks_whole_words(tmp_path):
    vocab = InstanceBuilder(UNCASED_VOCAB, True, create_data.DataOptions()).tokenizer.inv_vocab
    result = create_pretraining_data(
        [SAMPLE], UNCASED_VOCAB, tmp_path / "wwm.tfrecord", dupe_factor=20, workers=1, whole_word_mask=True
    )
    masked_multi_piece_words = 0
    for example in read_examples(result["output_files"][0]):
        n = sum(example["input_mask"])
        k = int(sum(example["masked_lm_weights"]))
        positions = example["masked_lm_positions"][:k]
        assert 0 < k <= min(20, max(1, round(n * 0.15)))
        tokens = list(example["input_ids"][:n])
        for p, label in zip(positions, example["masked_lm_ids"][:k]):
            tokens[p] = label  # the text before masking
        # Words as the original groups them: a ## piece joins the last candidate before it.
        words = []
        for i in range(1, n - 1):
            if vocab[tokens[i]] in ("[CLS]", "[SEP]"):
                continue
            if words and vocab[tokens[i]].startswith("##"):
                words[-1].append(i)
            else:
                words.append([i])
        for word in words:
            hit = [i in positions for i in word]
            assert all(hit) or not any(hit), [vocab[tokens[i]] for i in word]
            masked_multi_piece_words += len(word) > 1 and all(hit)
    assert masked_multi_piece_words > 20
    assert result["masked_share"] == pytest.approx(0.15, abs=0.02)


# --- bad input -------------------------------------------------------------------------------


def test_cli_survives_bad_bytes_empty_documents_and_a_10mb_line(tmp_path):
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(
        b"First document, caf\xc3\nwith bad bytes \xff here \xfe.\n\n\n\n"
        b"\x01\x02\x7f\n\x00\n\n"  # no tokens at all: an empty document
        + b"one endless sentence " * 500_000
        + b"\nEnd of the long one.\n\n"
        + Path(SAMPLE).read_bytes()
    )
    out = tmp_path / "out.tfrecord"
    result = run_kbert(
        "create-data",
        "--input",
        corpus,
        "--vocab",
        UNCASED_VOCAB,
        "--output",
        out,
        "--dupe-factor",
        "1",
        "--workers",
        "1",
    )
    summary = json.loads(result.stdout)
    assert summary["replaced_invalid_utf8"] == 3
    assert summary["skipped_empty_documents"] == 1
    assert summary["documents"] == 5  # the first, the long one, sample_text's three
    assert summary["output_files"] == [str(out)]
    examples = read_examples(out)
    assert len(examples) == summary["instances"] > 10
    assert all(sum(e["input_mask"]) <= 128 for e in examples)
    endless = token_id("endless")
    assert any(endless in e["input_ids"] or endless in e["masked_lm_ids"] for e in examples)
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def token_id(word):
    (token,) = Tokenizer(UNCASED_VOCAB).convert_tokens_to_ids([word])
    return token


def test_workers_do_not_load_tensorflow():
    """A spawned worker imports the kbert script (so kbert.cli.main) and this module, then builds
    its tokenizer: none of that may load TensorFlow, whose start-up each worker would pay again."""
    code = (
        "import sys, kbert.cli.main; from kbert.pretraining import create_data, worker_pool; "
        f"worker_pool._start_worker({UNCASED_VOCAB!r}, True, create_data.DataOptions()); "
        "print('tensorflow' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_cli_user_errors(tmp_path):
    out = tmp_path / "out.tfrecord"
    assert_user_error(
        run_kbert(
            "create-data", "--input", tmp_path / "missing.txt", "--vocab", UNCASED_VOCAB, "--output", out, check=False
        ),
        "missing.txt: no such text file",
    )
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n\n   \n\x01\n\n\xff\n")
    assert_user_error(
        run_kbert(
            "create-data", "--input", blank, "--vocab", UNCASED_VOCAB, "--output", out, "--workers", "1", check=False
        ),
        "blank.txt: no text to make instances from",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blank.txt"]  # no output, no temp file
    out.write_bytes(b"precious")
    assert_user_error(
        run_kbert("create-data", "--input", SAMPLE, "--vocab", UNCASED_VOCAB, "--output", out, check=False),
        "exists and is not empty",
        "--overwrite",
    )
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(
    "flags, message, flag",
    [
        (dict(max_seq_length=4), "max_seq_length must be at least 5 ", "--max-seq-length"),
        (dict(dupe_factor=0), "dupe_factor must be at least 1", "--dupe-factor"),
        (dict(masked_lm_prob=0.0), "masked_lm_prob must be in (0, 1]", "--masked-lm-prob"),
        (dict(shards=0), "shards must be at least 1", "--shards"),
        (dict(workers=0), "workers must be at least 1", "--workers"),
        (dict(seed=-1), "seed must be in [0, 2**64)", "--seed"),
    ],
)
def test_option_errors_name_the_argument_in_python_and_the_flag_on_the_command_line(tmp_path, flags, message, flag):
    # A Python caller passed max_seq_length=4: the message names that, not a flag it never typed.
    with pytest.raises(KbertError) as raised:
        create_pretraining_data([SAMPLE], UNCASED_VOCAB, tmp_path / "x.tfrecord", **flags)
    assert str(raised.value).startswith(message) and "--" not in str(raised.value), raised.value
    with command_line_names({flag}), pytest.raises(KbertError) as raised:
        create_pretraining_data([SAMPLE], UNCASED_VOCAB, tmp_path / "x.tfrecord", **flags)
    name = next(iter(flags))
    assert str(raised.value).startswith(flag + message[len(name) :]), raised.value


def test_vocab_without_special_tokens_is_refused(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(KbertError, match=r"vocab.txt has no \[MASK\]"):
        create_pretraining_data([SAMPLE], vocab, tmp_path / "x.tfrecord")
