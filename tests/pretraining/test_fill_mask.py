"""`kbert fill-mask` on the tiny checkpoint, whose vocabulary repeats tokens ("4", "a", "i")."""

import json
import os

from conftest import TINY, run_kbert


def test_top_k_over_the_whole_vocabulary_names_every_id(tiny_model_dir):
    result = run_kbert("fill-mask", tiny_model_dir, "the [MASK].", "--top-k", "300")
    (mask,) = json.loads(result.stdout)["masks"]
    predictions = mask["predictions"]
    with open(os.path.join(TINY, "vocab.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    # Every id once, each with its own line's token: the earlier copy of a repeated token too.
    assert sorted(p["id"] for p in predictions) == list(range(300))
    assert all(p["token"] == lines[p["id"]] for p in predictions)
    assert {lines.index(t) for t in ("4", "a", "i")} <= {p["id"] for p in predictions}
    probabilities = [p["probability"] for p in predictions]
    assert probabilities == sorted(probabilities, reverse=True) and abs(sum(probabilities) - 1) < 1e-3
