"""kbert.serving.heads: what an export serves for each task, on a stand-in model whose logits are given."""

import math

import numpy as np
import pytest
import tensorflow as tf

from conftest import UNCASED_VOCAB
from kbert.finetuning.tasks import TASKS
from kbert.runtime.errors import KbertError
from kbert.serving.heads import SERVED_TASKS, require_served, serve_encoder, serving_head
from kbert.text.graph_packer import BertPreprocessor
from kbert.text.tokenizer import Tokenizer

LN2, LN3 = math.log(2), math.log(3)


class _Logits:
    def __init__(self, logits):
        self.logits = tf.constant(logits, dtype=tf.float32)
        self.num_classes = self.logits.shape[-1]

    def __call__(self, features, training):
        assert training is False
        return {"logits": self.logits}


def test_a_classifier_serves_probabilities_labels_and_the_classify_api():
    head = serving_head("classify", _Logits([[0.0, LN3], [LN3, 0.0]]), ["neg", "pos"])
    out = head.outputs({})
    np.testing.assert_allclose(out["probabilities"].numpy(), [[0.25, 0.75], [0.75, 0.25]], rtol=1e-6)
    assert out["label_id"].numpy().tolist() == [1, 0] and out["label"].numpy().tolist() == [b"pos", b"neg"]
    assert head.api == "classify"
    api = head.api_outputs({})
    assert api["classes"].numpy().tolist() == [[b"neg", b"pos"]] * 2
    np.testing.assert_allclose(api["scores"].numpy(), out["probabilities"].numpy())


def test_a_classifier_without_label_names_serves_class_numbers():
    out = serving_head("classify", _Logits([[0.0, 1.0, 0.0]]), None).outputs({})
    assert out["label"].numpy().tolist() == [b"1"]


def test_label_names_must_match_the_head():
    with pytest.raises(KbertError, match="bert_config.json lists 2 labels for a head of 3 classes"):
        serving_head("classify", _Logits([[0.0, 1.0, 0.0]]), ["neg", "pos"])


def test_a_regressor_serves_scores_and_refuses_nan():
    head = serving_head("regress", _Logits([[0.5], [-1.25]]), None)
    assert head.outputs({})["score"].numpy().tolist() == [0.5, -1.25]
    assert head.api == "regress" and head.api_outputs({})["outputs"].numpy().tolist() == [0.5, -1.25]
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-finite values in output score"):
        serving_head("regress", _Logits([[float("nan")]]), None).outputs({})


def test_a_tagger_serves_a_label_per_piece():
    logits = np.full((1, 3, 2), -1.0)
    logits[0, 0, 1] = logits[0, 1, 0] = logits[0, 2, 1] = 1.0
    head = serving_head("tag", _Logits(logits), ["B-LOC", "O"])
    out = head.outputs({"input_mask": tf.constant([[1, 1, 0]])})
    assert out["label"].numpy().tolist() == [[b"O", b"B-LOC", b"O"]]
    assert out["input_mask"].numpy().tolist() == [[1, 1, 0]]
    assert head.text_outputs is not None and head.api is None  # word_label comes from text


def test_a_tagger_reads_each_words_tag_at_its_first_piece_of_the_packed_text():
    # Hand-worked, sequence length 7 (5 pieces): "cass ##ius crossed phil ##am" and "##mon road"
    # cut off; "\x00" has no pieces and becomes [UNK]. Logits pick B-PER (0) or O (1) per position.
    picks = [[1, 0, 0, 1, 0, 0, 0], [1, 0, 1, 1, 1, 1, 1]]
    logits = np.where(np.array(picks)[..., None] == np.arange(2), 1.0, -1.0)
    seen = {}

    class Tagger(_Logits):
        def __call__(self, features, training):
            seen.update(features)
            return super().__call__(features, training)

    head = serving_head("tag", Tagger(logits), ["B-PER", "O"])
    out = head.text_outputs(
        {"text": tf.constant(["Cassius crossed Philammon road", "\x00  road"])},
        None,
        BertPreprocessor(UNCASED_VOCAB, sequence_length=7),
    )
    tokens = Tokenizer(UNCASED_VOCAB).convert_ids_to_tokens
    assert [tokens(row) for row in seen["input_ids"].numpy()] == [
        ["[CLS]", "cass", "##ius", "crossed", "phil", "##am", "[SEP]"],
        ["[CLS]", "[UNK]", "road", "[SEP]", "[PAD]", "[PAD]", "[PAD]"],
    ]
    # Words start at 1, 3, 4 (and "road" is cut: "O", the fallback); at 1 and 2.
    assert out["word_label"].numpy().astype(str).tolist() == [["B-PER", "O", "B-PER", "O"], ["B-PER", "O", "", ""]]


def test_a_multiple_choice_model_serves_probabilities_over_endings():
    head = serving_head("choice", _Logits([[0.0, LN2, 0.0]]), None)
    out = head.outputs({})
    np.testing.assert_allclose(out["probabilities"].numpy(), [[0.25, 0.5, 0.25]], rtol=1e-6)
    assert out["label_id"].numpy().tolist() == [1]
    assert head.text_inputs == {"text": 1, "endings": 2} and head.ids_rank == 3


def test_an_encoder_serves_its_outputs_and_takes_pairs_when_asked():
    pooled, sequence = [[0.5, -0.25]], [[[1.0, 2.0]]]

    def encoder(features, training):
        assert training is False
        return {"pooled_output": tf.constant(pooled), "sequence_output": tf.constant(sequence)}

    head = serve_encoder(encoder, text_pairs=False)
    out = head.outputs({"input_mask": tf.constant([[1]])})
    assert out["pooled_output"].numpy().tolist() == pooled and out["sequence_output"].numpy().tolist() == sequence
    assert out["input_mask"].numpy().tolist() == [[1]]
    assert head.text_inputs == {"text": 1} and serve_encoder(encoder, True).text_inputs == {"text": 1, "text_b": 1}


def test_every_task_but_squad_is_served():
    # An embed model is an encoder with an embedding record: it exports as one (heads.embedding_model).
    assert SERVED_TASKS == tuple(name for name in TASKS if name not in ("squad", "embed"))
    with pytest.raises(KbertError) as error:
        require_served("squad")
    assert str(error.value) == (
        "kbert export serves encoders, pretrained models and the classify, regress, tag, choice, rerank tasks; a squad "
        "model needs its question/context windows, which export does not build yet: serve its encoder or use "
        "kbert predict"
    )
    with pytest.raises(KbertError, match="unknown task='ner'"):
        serving_head("ner", _Logits([[0.0]]), None)
