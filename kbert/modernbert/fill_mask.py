"""fill-mask for a ModernBERT: the masked-LM head's top tokens at each `[MASK]`, as transformers'
fill-mask pipeline gives them (the tokenizer.json's mask token is found in the text as is)."""

from __future__ import annotations

import keras
import numpy as np

from kbert.modernbert.tokenizer import BpeTokenizer
from kbert.runtime.errors import KbertError


def fill_mask(model, text: str, top_k: int, mask: str) -> dict:
    """{"text", "tokens", "masks": [{"position", "predictions": [{"token", "id", "probability"}]}]}."""
    tokenizer = BpeTokenizer(model.tokenizer_file, model.config.pad_token_id)
    mask_id = tokenizer.token_to_id(mask)
    if mask_id is None:
        raise KbertError(f"{model.tokenizer_file} has no {mask} token, so this model cannot fill masks")
    ids = tokenizer.encode([text])[0]
    if len(ids) > model.config.max_position_embeddings:
        raise KbertError(
            f"the text is {len(ids)} tokens long, more than the model's "
            f"{model.config.max_position_embeddings} positions; shorten it"
        )
    positions = [i for i, token in enumerate(ids) if token == mask_id]
    batch = np.array([ids], dtype="int32")
    outputs = model(
        {"input_ids": batch, "input_mask": np.ones_like(batch), "masked_lm_positions": np.array([positions], "int32")},
        training=False,
    )
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(outputs["mlm_logits"], axis=-1))[0]
    masks = []
    for position, probs in zip(positions, probabilities):
        best = np.argsort(-probs)[:top_k]
        predictions = [
            {"token": tokenizer.decode([int(i)]), "id": int(i), "probability": round(float(probs[i]), 6)} for i in best
        ]
        masks.append({"position": int(position), "predictions": predictions})
    return {"text": text, "tokens": [tokenizer.decode([i]) for i in ids], "masks": masks}
