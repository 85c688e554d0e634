"""`kbert.model_dir`: the one opener of model sources and the one place casing is decided.

A google-research checkpoint records no casing; its folder name does (cased_L-12_H-768_A-12).
Each command that takes a checkpoint directly (finetune, predict, export) must tokenize a
`cased_...` folder without lower-casing, and a fine-tuned model must record that.
"""

import json
import shutil

import numpy as np
import pytest

from conftest import TINY, run_kbert
from helpers import sentiment_rows, write_tsv

from kbert.model_dir import describe_source, lower_case_for, open_model

pytestmark = pytest.mark.slow  # `make test-fast` leaves these out; `make test` runs them


@pytest.fixture(scope="module")
def cased_dir(tmp_path_factory):
    """The original tiny checkpoint in a folder named as Google names its cased releases."""
    folder = tmp_path_factory.mktemp("released") / "cased_L-2_H-32_A-4"
    shutil.copytree(TINY, folder)
    return folder


def test_casing_is_decided_by_the_folder_or_the_record(cased_dir, tiny_model_dir):
    assert describe_source(cased_dir).do_lower_case is False
    assert describe_source(cased_dir / "bert_model.ckpt").do_lower_case is False
    assert describe_source(TINY).do_lower_case is True  # "tf1-tiny" says neither: uncased
    assert describe_source(tiny_model_dir).do_lower_case is True  # recorded by convert
    assert lower_case_for(cased_dir, recorded=True) is True
    model = open_model(cased_dir)
    assert model.do_lower_case is False and type(model).__name__ == "BertPretrainer"


def test_finetune_predict_and_export_keep_a_cased_checkpoint_cased(cased_dir, tmp_path):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(32, 0))
    run_kbert("finetune", cased_dir, "--task", "classify", "--train", train, "--output", tmp_path / "model",
              "--epochs", "1", "--batch-size", "16", "--max-seq-length", "16")
    assert json.load(open(tmp_path / "model" / "bert_config.json"))["do_lower_case"] is False

    # predict on the checkpoint itself: features, tokenized without lower-casing ("GOLD" is not
    # in the lower-case vocabulary; "gold" is).
    (tmp_path / "in.txt").write_text("GOLD gold\n")
    for source, expected in ((cased_dir, ["[CLS]", "[UNK]", "gold", "[SEP]"]),
                             (TINY, ["[CLS]", "gold", "gold", "[SEP]"])):
        line = json.loads(run_kbert("predict", source, "--input", tmp_path / "in.txt", "--layers", "-1").stdout)
        assert [f["token"] for f in line["features"]] == expected, source

    # export of the checkpoint itself: "GOLD" and "gold" are different inputs to a cased model.
    path = json.loads(run_kbert("export", cased_dir, tmp_path / "exports").stdout)["export"]
    serve = tf.saved_model.load(path).signatures["serving_default"]
    pooled = serve(text=tf.constant(["GOLD glorious.", "gold glorious."]))["pooled_output"].numpy()
    assert np.abs(pooled[0] - pooled[1]).max() > 1e-4
