"""Compare a kbert model directory's outputs with an expected.npz computed by google-research/bert.

usage: python scripts/check_fixture.py MODEL_DIR EXPECTED.npz
Prints one JSON object: the max absolute difference per output, and "ok" (all <= 1e-5).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from kbert.cli.common import import_tensorflow_quietly

import_tensorflow_quietly()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kbert  # noqa: E402


def main(model_dir, expected_path):
    expected = np.load(expected_path)
    model = kbert.load(model_dir)
    inputs = {k: expected[k].astype("int32") for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
    encoder_inputs = {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}
    out = model(inputs, training=False)
    log_softmax = lambda x: np.asarray(keras.ops.log_softmax(x, axis=-1))  # noqa: E731
    got = {
        # After the embeddings' LayerNorm: the original's get_embedding_output.
        "embedding_output": np.asarray(
            keras.Model(model.encoder.input, model.encoder.embeddings.output)(encoder_inputs)
        ),
        "sequence_output": np.asarray(out["sequence_output"]),
        "pooled_output": np.asarray(out["pooled_output"]),
        "mlm_log_probs": log_softmax(out["mlm_logits"]),
        "nsp_log_probs": log_softmax(out["nsp_logits"]),
    }
    diffs = {k: float(np.abs(v - expected[k]).max()) for k, v in got.items()}
    print(json.dumps({"max_abs_diff": diffs, "ok": max(diffs.values()) <= 1e-5}))
    return max(diffs.values()) <= 1e-5


if __name__ == "__main__":
    sys.exit(0 if main(*sys.argv[1:3]) else 1)
