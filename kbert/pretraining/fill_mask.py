"""`fill_mask(model_dir, text)`: the masked-LM head's top tokens for each [MASK] in a text."""

from __future__ import annotations

import shlex

import keras
import numpy as np

from kbert.formats.model_dir import model_kind
from kbert.formats.sources import open_model
from kbert.model.bert import BertPretrainer
from kbert.model.families import fill_masks
from kbert.runtime.errors import KbertError, option
from kbert.text.tokenizer import Tokenizer

MASK = "[MASK]"


def encode_with_masks(tokenizer, text: str, max_length: int):
    """[CLS] tokens [SEP] with each literal "[MASK]" kept as the mask token (the original
    tokenizer would split it into "[", "mask", "]")."""
    tokens = ["[CLS]"]
    for i, piece in enumerate(text.split(MASK)):
        if i:
            tokens.append(MASK)
        tokens.extend(tokenizer.tokenize(piece))
    tokens.append("[SEP]")
    if len(tokens) > max_length:
        raise KbertError(
            f"the text is {len(tokens)} tokens long, more than the model's {max_length} positions; shorten it"
        )
    return tokens


_KINDS = {
    "encoder": "an encoder (no pretraining heads)",
    "classifier": "a classifier",
    "tagger": "a tagger",
    "span_predictor": "a SQuAD span predictor",
    "multiple_choice": "a multiple-choice model",
}


def what_it_is(model) -> str:
    """What a model without the MLM head is, for messages: its kind and task.

    >>> import kbert
    >>> config = kbert.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    ...                           num_attention_heads=4, intermediate_size=64)
    >>> model = kbert.bert_classifier(config, 2)
    >>> model.task_info = {"task": "classify", "labels": ["neg", "pos"]}
    >>> what_it_is(model)
    'a classifier (task classify, labels neg, pos)'
    """
    kind = model_kind(model)
    text = _KINDS.get(kind, f"a {kind}")
    info = getattr(model, "task_info", None) or {}
    if info.get("task"):
        labels = info.get("labels")
        shown = f", labels {', '.join(map(str, labels[:5]))}{', ...' if len(labels) > 5 else ''}" if labels else ""
        text += f" (task {info['task']}{shown})"
    return text


def fill_mask(model_dir, text: str, top_k: int = 5, model=None) -> dict:
    """Top-k predictions for every [MASK] in `text`.

    Example:
    >>> fill_mask("out/bert", "the [MASK] is blue.")["masks"][0]["predictions"][0]["token"]  # doctest: +SKIP
    'sky'
    """
    if MASK not in text:
        raise KbertError(
            f"the text has no {MASK}; write one where a token should be predicted, e.g. "
            f'"the capital of france is {MASK}."'
        )
    if top_k < 1:
        raise KbertError(f"{option('top_k')} must be at least 1, got {top_k}")
    model = model or open_model(model_dir)
    filled = fill_masks(model, text, top_k, MASK)  # a family that reads text its own way
    if filled is not None:
        return filled
    if not isinstance(model, BertPretrainer):
        raise KbertError(
            f"{model_dir} has no masked-LM head: it is {what_it_is(model)}; fill-mask needs a "
            f"pretrained or converted model directory (the one it was fine-tuned from, for a head)"
        )
    if "masked_lm" in getattr(model, "fresh_heads", ()):
        raise KbertError(
            f"{model_dir}: its masked-LM head was created by a converter (the source had none), so its "
            f"weights are random and so would be the predictions; pretrain it first, e.g. `kbert pretrain "
            f"--init {shlex.quote(str(model_dir))} --model-dir OUT --data 'DATA*.tfrecord'`, or convert a "
            f"checkpoint that has the head"
        )
    tokenizer = Tokenizer(model.vocab_file, model.do_lower_case)
    tokens = encode_with_masks(tokenizer, text, model.config.max_position_embeddings)
    ids = np.array([tokenizer.convert_tokens_to_ids(tokens)], dtype="int32")
    positions = np.array([[i for i, t in enumerate(tokens) if t == MASK]], dtype="int32")
    outputs = model(
        {
            "input_ids": ids,
            "input_mask": np.ones_like(ids),
            "segment_ids": np.zeros_like(ids),
            "masked_lm_positions": positions,
        },
        training=False,
    )
    # convert_to_numpy, not np.asarray: a PyTorch tensor that carries grad refuses numpy().
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(outputs["mlm_logits"], axis=-1))[0]
    masks = []
    for position, probs in zip(positions[0], probabilities):
        best = np.argsort(-probs)[:top_k]
        # Every id has a token, an earlier copy of a repeated token too (tokenizer.vocab_tokens).
        tokens_of_best = tokenizer.convert_ids_to_tokens(best)
        masks.append(
            {
                "position": int(position),
                "predictions": [
                    {"token": token, "id": int(i), "probability": round(float(probs[i]), 6)}
                    for token, i in zip(tokens_of_best, best)
                ],
            }
        )
    return {"text": text, "tokens": tokens, "masks": masks}
