"""The pretraining records' reader: files that are not records fail before training, in one line."""

import os

from conftest import TINY, assert_user_error, run_kbert


def test_a_binary_file_as_data_is_one_whole_line(tmp_path):
    data = tmp_path / "some_random_bytes.bin"
    data.write_bytes(os.urandom(20000))
    result = run_kbert("pretrain", "--model-dir", tmp_path / "bert", "--data", data, "--config",
                       os.path.join(TINY, "bert_config.json"), "--vocab", os.path.join(TINY, "vocab.txt"),
                       "--max-seq-length", "64", "--steps", "2", check=False)
    assert_user_error(result, f"kbert: error: {data}: not a readable TFRecord file (TensorFlow says: corrupted "
                              f"record at 0 (Is this even a TFRecord file?)); --data takes the records kbert "
                              f"create-data (or create_pretraining_data.py) makes from text: make them first")
    assert "function_node" not in result.stderr
    assert not (tmp_path / "bert" / "checkpoints").exists()
