"""Mistakes a user makes with `kbert finetune / predict / evaluate`, and with the same functions
from Python: each is refused in one line that says what is wrong and how to fix it.

- data in the wrong shape for the task (a classification TSV given to `--task tag`, scores
  given to `--task classify`, class names to `--task regress`);
- numbers out of range (`batch_size=0`, `max_seq_length=0`, `epochs=0`, ...), from the library
  as from the command line;
- an unfinished fine-tuning run (OUTPUT.partial/) used as a model, and a checkpoint that cannot
  be written: TensorFlow's `{{function_node ...}}` wrapping stays out of the message.
"""

import dataclasses
import json
import math
import os
import re

import pytest

from conftest import assert_user_error, run_kbert
from helpers import conll_sentences, sentiment_rows, write_conll, write_tsv
from kbert.finetuning.options import FinetuneOptions
from kbert.finetuning.readers import read_tagged_examples, read_text_examples
from kbert.runtime.errors import KbertError

TRAIN = ["--epochs", "1", "--batch-size", "16", "--max-seq-length", "16"]


def one_line(error: KbertError) -> str:
    message = str(error)
    assert "\n" not in message and "Traceback" not in message
    return message


def scores_rows(n):
    """STS-B-like rows: a sentence pair and a similarity score with a fraction (3.800)."""
    return [(t, "the city.", f"{(i % 26) / 5:.3f}") for i, (t, _) in enumerate(sentiment_rows(n, 0))]


# === data in the wrong shape for the task ===


def test_tag_refuses_a_classification_tsv(tmp_path, tiny_model_dir):
    tsv = write_tsv(tmp_path / "train.tsv", sentiment_rows(32, 0))
    with pytest.raises(KbertError) as raised:
        read_tagged_examples(tsv)
    assert "the first line is a header (text, label)" in one_line(raised.value)
    # From Python, the task is named as the argument; `kbert finetune` names its flag (below).
    assert "task='classify' or regress" in str(raised.value) and "task='tag' reads CoNLL" in str(raised.value)
    # Without a header: texts of several words in the first column are no CoNLL words either.
    headless = tmp_path / "headless.tsv"
    headless.write_text("".join(f"{t}\t{y}\n" for t, y in sentiment_rows(8, 1)))
    with pytest.raises(KbertError, match="its first column holds texts of several words"):
        read_tagged_examples(headless)
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"text": "gold glorious.", "label": "pos"}\n')
    with pytest.raises(KbertError, match="the first line is a JSON object"):
        read_tagged_examples(jsonl)
    # Real CoNLL, tab- and space-separated, still reads.
    conll = write_conll(tmp_path / "train.conll", conll_sentences(4, 0))
    assert len(read_tagged_examples(conll).words) == 4
    (tmp_path / "spaces.conll").write_text("-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n")
    assert read_tagged_examples(tmp_path / "spaces.conll").tags == [["B-ORG", "O"]]

    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "tag", "--train", tsv, "--output", tmp_path / "m", *TRAIN, check=False
    )
    assert_user_error(result, "train.tsv: the first line is a header", "--task tag reads CoNLL: one word and its tag")
    assert not (tmp_path / "m").exists()


def test_classify_refuses_scores_and_names_regress(tmp_path, tiny_model_dir):
    train = write_tsv(tmp_path / "train.tsv", scores_rows(32), header=("text", "text_b", "label"))
    result = run_kbert(
        "finetune",
        tiny_model_dir,
        "--task",
        "classify",
        "--train",
        train,
        "--output",
        tmp_path / "m",
        *TRAIN,
        check=False,
    )
    assert_user_error(
        result,
        "train.tsv: the labels are numbers with fractions (26 values from 0 to 5",
        "for a score per example use --task regress",
    )
    assert not (tmp_path / "m").exists()
    # Whole numbers are classes (1..5 stars), and so are names.
    stars = write_tsv(tmp_path / "stars.tsv", [(t, str(1 + i % 5)) for i, (t, _) in enumerate(sentiment_rows(32, 0))])
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", stars, "--output", tmp_path / "stars", *TRAIN
    )
    assert json.load(open(tmp_path / "stars" / "bert_config.json"))["labels"] == ["1", "2", "3", "4", "5"]


def test_regress_refuses_class_names_and_classify_refuses_conll(tmp_path):
    names = write_tsv(tmp_path / "names.tsv", sentiment_rows(8, 0))
    with pytest.raises(KbertError) as raised:
        read_text_examples(names, scores=True)
    assert re.search(
        r"no label is a number \(line 2: label '(pos|neg)' is not a number\); task='regress' needs "
        r"a number per row \(a score such as 3\.8\): for class names use task='classify'",
        one_line(raised.value),
    ), str(raised.value)
    conll = write_conll(tmp_path / "train.conll", conll_sentences(4, 0))
    with pytest.raises(KbertError, match=r"looks like CoNLL \(a word and its tag per line\), which task='tag' reads"):
        read_text_examples(conll)


@pytest.fixture(scope="module")
def tagger_dir(tmp_path_factory, tiny_model_dir):
    """An untrained tagger saved with the metadata kbert finetune records."""
    import kbert

    path = tmp_path_factory.mktemp("tagger") / "tagger"
    model = kbert.bert_tagger(kbert.load(tiny_model_dir), 3)
    model.task_info = {"task": "tag", "labels": ["B-LOC", "I-LOC", "O"], "max_seq_length": 16}
    kbert.save(model, path)
    return path


def test_predict_on_a_tagger_names_conll_for_a_classify_tsv(tmp_path, tagger_dir):
    tsv = write_tsv(tmp_path / "in.tsv", sentiment_rows(4, 0))
    assert_user_error(
        run_kbert("predict", tagger_dir, "--input", tsv, check=False),
        "in.tsv: the first line is a header (text, label)",
        "`kbert finetune --task tag` reads CoNLL",  # predict has no --task: the model's task is finetune's
    )
    # CoNLL whose tags the model never saw: prediction reads the words and ignores the tags
    # (evaluate needs them to be the model's).
    other = write_conll(tmp_path / "other.conll", [(["the", "city"], ["DET", "NOUN"])])
    rows = [json.loads(line) for line in run_kbert("predict", tagger_dir, "--input", other).stdout.splitlines()]
    assert [row["words"] for row in rows] == [["the", "city"]] and len(rows[0]["tags"]) == 2
    assert_user_error(
        run_kbert("evaluate", tagger_dir, "--input", other, check=False),
        "tags DET, NOUN were not in the training data",
        "evaluate with data tagged with",
    )


# === numbers out of range, from Python as from the command line ===


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("epochs", 0, "epochs must be at least 1, got 0"),
        ("batch_size", 0, "batch_size must be at least 1, got 0"),
        ("batch_size", -3, "batch_size must be at least 1, got -3"),
        ("batch_size", 2.5, "batch_size must be a whole number, got 2.5"),
        ("learning_rate", 0.0, "learning_rate must be more than 0, got 0.0"),
        ("learning_rate", -1e-5, "learning_rate must be more than 0"),
        ("learning_rate", math.nan, "learning_rate must be a finite number, got nan"),
        ("max_seq_length", 0, "max_seq_length must be at least 3, got 0"),
        ("max_seq_length", -5, "max_seq_length must be at least 3, got -5"),
        ("warmup_proportion", 1.0, "warmup_proportion must be in [0, 1), got 1.0"),
        ("warmup_proportion", -0.1, "warmup_proportion must be in [0, 1)"),
        ("seed", -1, "seed must be at least 0, got -1"),
        ("patience", -1, "patience must be at least 0, got -1"),
        ("save_every", 0, "save_every must be at least 1, got 0"),
        ("doc_stride", 0, "doc_stride must be at least 1, got 0"),
        ("max_query_length", 0, "max_query_length must be at least 1"),
        ("n_best_size", 0, "n_best_size must be at least 1"),
        ("max_answer_length", -1, "max_answer_length must be at least 1"),
        ("null_score_diff_threshold", math.inf, "null_score_diff_threshold must be a finite number"),
        ("strategy", "tpu", "strategy='tpu': fine-tuning runs on auto, cpu, gpu or mirrored"),
    ],
)
def test_options_check_every_number(field, value, fragment):
    from kbert.finetuning.options import resolve_options
    from kbert.runtime.errors import command_line_names

    with pytest.raises(KbertError) as raised:
        FinetuneOptions(**{field: value})
    assert one_line(raised.value).startswith(fragment)  # the argument, as a Python caller named it
    with pytest.raises(KbertError, match="^" + re.escape(fragment)):  # overrides, as library calls give them
        resolve_options(FinetuneOptions(), {field: value})
    # The same check while `kbert finetune` runs names its flag: `--batch-size must be ...`, `--strategy tpu: ...`.
    flag = "--" + field.replace("_", "-")
    if fragment.startswith(f"{field}="):
        said = fragment.replace(f"{field}={value!r}", f"{flag} {value}")
    else:
        said = flag + fragment[len(field) :]
    with command_line_names({flag}), pytest.raises(KbertError) as raised:
        FinetuneOptions(**{field: value})
    assert str(raised.value).startswith(said), str(raised.value)


def test_finetune_names_its_flags_where_python_names_arguments(tmp_path, tiny_model_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(8, 0))
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", train, "--output", tmp_path / "m",
        "--strategy", "tpu", check=False,
    )  # fmt: skip
    assert result.stderr.strip().splitlines()[-1] == (
        "kbert: error: --strategy tpu: fine-tuning runs on auto, cpu, gpu or mirrored"
    )
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", train, "--output", tmp_path / "m",
        "--long-text", "windows", "--max-seq-length", "3", check=False,
    )  # fmt: skip
    assert_user_error(result, "--long-text windows needs windows of at least 2 tokens; --max-seq-length 3 leaves 1")
    with pytest.raises(KbertError) as raised:
        FinetuneOptions(long_text="windows", max_seq_length=3)
    assert one_line(raised.value) == (
        "long_text='windows' needs windows of at least 2 tokens; max_seq_length=3 leaves 1 beside [CLS] and "
        "[SEP]: use max_seq_length=4 or more"
    )
    assert not (tmp_path / "m").exists()


def test_options_take_good_values_and_refuse_unknown_names():
    import numpy as np

    from kbert.finetuning.options import resolve_options

    assert FinetuneOptions(batch_size=np.int64(8), max_seq_length=None, patience=0).batch_size == 8
    with pytest.raises(KbertError, match="unknown option 'batchsize'; the options are FinetuneOptions' fields: epochs"):
        resolve_options(None, {"batchsize": 8})


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tiny_model_dir):
    """An untrained classifier saved with the metadata kbert finetune records, and a labelled TSV."""
    import kbert

    work = tmp_path_factory.mktemp("classifier")
    model = kbert.bert_classifier(kbert.load(tiny_model_dir), 2)
    model.task_info = {"task": "classify", "labels": ["neg", "pos"], "max_seq_length": 16}
    kbert.save(model, work / "classifier")
    return work / "classifier", write_tsv(work / "data.tsv", sentiment_rows(8, 0))


@pytest.mark.parametrize(
    "call, overrides, fragment",
    [
        ("predict", {"batch_size": 0}, "batch_size must be at least 1, got 0"),
        ("evaluate", {"batch_size": -3}, "batch_size must be at least 1, got -3"),
        ("predict", {"max_seq_length": 0}, "max_seq_length must be at least 3, got 0"),
        ("evaluate", {"max_seq_length": -1}, "max_seq_length must be at least 3, got -1"),
    ],
)
def test_predict_and_evaluate_check_numbers_at_the_call(classifier_dir, call, overrides, fragment):
    from kbert.finetuning import predict

    model, data = classifier_dir
    with pytest.raises(KbertError) as raised:
        getattr(predict, call)(str(model), str(data), **overrides)  # predict fails here, not at its first row
    assert one_line(raised.value).startswith(fragment)


def test_encoder_features_and_served_predict_check_numbers(tiny_model_dir, tmp_path):
    from kbert.finetuning.predict import features, predict
    from kbert.serving import Client
    from kbert.serving.predict import predict_served

    lines = tmp_path / "in.txt"
    lines.write_text("gold glorious.\n")
    with pytest.raises(KbertError, match="^batch_size must be at least 1, got 0"):
        predict(tiny_model_dir, lines, batch_size=0)
    import kbert

    with pytest.raises(KbertError, match="^max_seq_length must be at least 3, got 0"):
        features(kbert.load(tiny_model_dir), lines, 0)
    # Checked before the server is asked (nothing listens at port 1).
    with pytest.raises(KbertError, match="^batch_size must be at least 1, got 0"):
        predict_served(Client("127.0.0.1:1", "m", retries=0), lines, batch_size=0)
    with pytest.raises(KbertError, match="start -1: give the number of examples to skip"):
        predict_served(Client("127.0.0.1:1", "m", retries=0), lines, start=-1)


def test_finetune_checks_numbers_before_reading(tmp_path, tiny_model_dir):
    from kbert.finetuning.train import finetune

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(8, 0))
    for overrides, fragment in (
        ({"max_seq_length": 0}, "max_seq_length must be at least 3, got 0"),
        ({"max_seq_length": 4}, "max_seq_length must be at least 8 to fine-tune, got 4"),
        ({"epochs": 0}, "epochs must be at least 1, got 0"),
        ({"learning_rate": 0}, "learning_rate must be more than 0"),
    ):
        with pytest.raises(KbertError) as raised:
            finetune(tiny_model_dir, "classify", train, tmp_path / "m", **overrides)
        assert one_line(raised.value).startswith(fragment)
    assert not (tmp_path / "m").exists()


def test_finetune_resume_without_a_run_names_the_argument_or_the_flag(tmp_path, tiny_model_dir):
    from kbert.finetuning.train import finetune

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(8, 0))
    with pytest.raises(KbertError) as raised:
        finetune(tiny_model_dir, "classify", train, tmp_path / "m", resume=True, max_seq_length=16, progress=False)
    assert one_line(raised.value) == (
        f"resume=True: no unfinished run at {tmp_path / 'm'}.partial to continue; drop resume=True to start one"
    )
    result = run_kbert(
        "finetune", tiny_model_dir, "--task", "classify", "--train", train, "--output", tmp_path / "m", *TRAIN,
        "--resume", check=False,
    )  # fmt: skip
    assert result.stderr.strip().splitlines()[-1] == (
        f"kbert: error: --resume: no unfinished run at {tmp_path / 'm'}.partial to continue; drop --resume to start one"
    )
    assert not (tmp_path / "m").exists()


# === an unfinished run: its checkpoint write fails, then it is used as a model, then resumed ===


MORE_SETTINGS = ("--warmup-proportion", "0.2", "--long-text", "windows", "--mixed-precision-dtype", "bfloat16")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory, tiny_model_dir):
    """`kbert finetune` whose second checkpoint cannot be written: a file stands where TensorFlow
    makes the checkpoint's temporary directory, so its SaveV2 op fails as on a broken disk.
    2 steps an epoch, a checkpoint every step: step 1 is saved, step 2 (the epoch's end) fails."""
    from kbert.finetuning import train as train_module

    work = tmp_path_factory.mktemp("failed")
    train = write_tsv(work / "train.tsv", sentiment_rows(32, 0))
    out = work / "ft" / "x"
    real_start = train_module._RunCheckpoints.start

    def start(self, overwrite):
        step = real_start(self, overwrite)
        os.makedirs(os.path.join(self.run_dir, "checkpoints"))
        open(os.path.join(self.run_dir, "checkpoints", "ckpt-2_temp"), "w").close()
        return step

    train_module._RunCheckpoints.start = start
    try:
        result = run_kbert(
            "finetune",
            tiny_model_dir,
            "--task",
            "classify",
            "--train",
            train,
            "--output",
            out,
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--max-seq-length",
            "16",
            "--save-every",
            "1",
            # Settings the message's command must repeat: the resume refuses other values.
            *MORE_SETTINGS,
            check=False,
        )
    finally:
        train_module._RunCheckpoints.start = real_start
    return out, result


def test_a_failed_checkpoint_write_says_why_without_tensorflow_wrapping(failed_run):
    out, result = failed_run
    assert_user_error(
        result,
        "writing the checkpoint for step 2 failed (",
        "ckpt-2_temp",
        "Not a directory",
        "the previous checkpoint (step 1) is intact: fix the cause, then --resume",
        alone=False,
    )
    assert "function_node" not in result.stderr and "[Op:" not in result.stderr, result.stderr
    assert json.load(open(f"{out}.partial/state.json"))["step"] == 1 and not out.exists()


def test_an_unfinished_run_is_named_and_its_command_finishes_it(failed_run, tmp_path, tiny_model_dir):
    import kbert

    out, _ = failed_run
    partial = f"{out}.partial"
    said = f"{partial}: an unfinished kbert finetune run (stopped at step 1 of 4), not a model; finish it with `kbert finetune"
    for args in (
        ("export", partial, tmp_path / "exports"),
        ("predict", partial, "--input", tmp_path / "x.tsv"),
        ("fill-mask", partial, "the [MASK]."),
    ):
        if args[0] == "predict":
            write_tsv(tmp_path / "x.tsv", [("gold.",)], header=("text",))
        assert_user_error(run_kbert(*args, check=False), said, "--resume`, then use " + str(out))
    assert not (tmp_path / "exports").exists()
    with pytest.raises(KbertError, match=re.escape(said)):
        kbert.load(partial)
    report = json.loads(run_kbert("convert", "inspect", partial).stdout)
    assert report["kind"] == "kbert fine-tuning run that did not finish" and report["step"] == 1
    assert report["run"]["task"] == "classify" and report["resume"].startswith(said)

    # The command the message gives is the one that finishes the run.
    command = re.search(r"`kbert (finetune .*--resume)`", report["resume"]).group(1).split()
    assert command[1:3] == [str(tiny_model_dir), "--task"] and "--epochs" in command and "--max-seq-length" in command
    said = " ".join(command)
    assert all(f"{flag} {value}" in said for flag, value in zip(MORE_SETTINGS[::2], MORE_SETTINGS[1::2])), said
    assert "--doc-stride 7" in said  # what windows of 16 tokens resolved to
    at = command.index("--mixed-precision-dtype")
    for other, recorded in ((["--mixed-precision-dtype", "float16"], "'float16'"), ([], "False")):
        refused = run_kbert(*command[:at], *other, *command[at + 2 :], check=False)
        assert_user_error(
            refused, f"was started with mixed_precision 'bfloat16', not {recorded}; resume with the same", alone=False
        )
    os.remove(os.path.join(partial, "checkpoints", "ckpt-2_temp"))
    finished = json.loads(run_kbert(*command).stdout)
    assert finished["resumed_from_step"] == 1 and finished["epoch"] >= 1
    assert kbert.load(out).task_info["labels"] == ["neg", "pos"] and not os.path.exists(partial)


def test_mixed_precision_auto_resumes_in_the_type_the_run_recorded(tmp_path):
    from kbert.finetuning.train import _settled_mixed_precision

    run_dir = tmp_path / "x.partial"
    run_dir.mkdir()
    (run_dir / "state.json").write_text(json.dumps({"step": 3, "fingerprint": {"mixed_precision": "float16"}}))
    auto = FinetuneOptions(mixed_precision=True)
    settled = [
        _settled_mixed_precision(opts, str(run_dir))
        for opts in (dataclasses.replace(auto, resume=True), auto, FinetuneOptions(mixed_precision_dtype="float16"))
    ]
    # A resume keeps the recorded float16; a new run on this CPU computes in bfloat16; a named type turns it on.
    assert [(o.mixed_precision, o.mixed_precision_dtype) for o in settled] == [
        (True, "float16"),
        (True, "bfloat16"),
        (True, "float16"),
    ]
    assert _settled_mixed_precision(FinetuneOptions(resume=True), str(run_dir)).mixed_precision is False
