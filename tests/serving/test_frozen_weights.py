"""An export served with `TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1` (docs/serving.md) answers as without it.

The setting makes oneDNN keep what it made of the first call's right-hand operand of every matmul
fused with its bias add, for every later call: right for weights, wrong for a matmul whose
right-hand operand changes from request to request. Each side runs in a fresh process (TensorFlow reads the setting once),
with oneDNN's rewrites on (`TF_ENABLE_ONEDNN_OPTS=1`, their default on CPUs with AVX-512 VNNI or
AMX), on requests of several lengths and batch sizes, the shortest first. A control SavedModel,
a @ b + c with all three from the request, shows that the setting took effect in the child: its
second answer goes wrong there.
"""

import numpy as np
import pytest
import tensorflow as tf

from conftest import run_kbert
from helpers import run_in_fresh_process

TEXTS = ["ok", "a longer sentence about gold and silver prices", "short one", "x " * 60]
REQUESTS = [[TEXTS[0]], [TEXTS[1]], TEXTS, [TEXTS[3]], [TEXTS[2], TEXTS[0]]]

SERVE = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the graph tokenizer's ops)
from serving_session import session_call

spec = json.load(open(sys.argv[1]))
answers = {}
for name, path in spec["exports"].items():
    serve = session_call(path)
    answers[name] = [{k: np.asarray(v, np.float32).tolist() for k, v in serve(r).items()} for r in spec["requests"]]
# The control: a @ b + c with all three from the request, as a TF1 session runs a SavedModel.
session = tf.compat.v1.Session(graph=tf.Graph())
with session.graph.as_default():
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], spec["control"])
    signature = meta.signature_def["serving_default"]
    feeds = {k: v.name for k, v in signature.inputs.items()}
    fetch = signature.outputs["output_0"].name
answers["control"] = [
    session.run(fetch, {feeds["a"]: np.float32(a), feeds["b"]: np.float32(b), feeds["c"]: np.zeros(8, np.float32)}).tolist()
    for a, b in spec["pairs"]
]
print(json.dumps(answers))
"""


class _Product(tf.Module):
    @tf.function(
        input_signature=[
            tf.TensorSpec([None, 16], tf.float32),
            tf.TensorSpec([16, 8], tf.float32),
            tf.TensorSpec([8], tf.float32),
        ]
    )
    def __call__(self, a, b, c):
        return tf.nn.bias_add(tf.matmul(a, b), c)  # one fused oneDNN matmul


def _served(work, spec, **env) -> dict:
    return run_in_fresh_process(work, SERVE, spec, timeout=600, env={"TF_ENABLE_ONEDNN_OPTS": "1", **env})


@pytest.fixture(scope="module")
def answers(tiny_model_dir, tiny_encoder_export, tmp_path_factory):
    work = tmp_path_factory.mktemp("frozen-weights")
    run_kbert("export", tiny_model_dir, work / "bf16", "--precision", "bfloat16")
    module = _Product()
    tf.saved_model.save(module, str(work / "control"), signatures=module.__call__.get_concrete_function())
    rng = np.random.default_rng(0)
    pairs = [(rng.normal(size=(rows, 16)).tolist(), rng.normal(size=(16, 8)).tolist()) for rows in (3, 3, 5)]
    spec = {
        "exports": {
            "bfloat16 encoder": str(work / "bf16" / "1"),
            "float32 encoder": str(tiny_encoder_export[0] / "1"),
        },
        "requests": REQUESTS,
        "control": str(work / "control"),
        "pairs": pairs,
    }
    expected = [np.asarray(a) @ np.asarray(b) for a, b in pairs]
    return _served(work, spec), _served(work, spec, TF_ONEDNN_ASSUME_FROZEN_WEIGHTS="1"), expected


def test_the_setting_takes_effect_in_the_served_process(answers):
    plain, frozen, expected = answers
    np.testing.assert_allclose(plain["control"][1], expected[1], atol=1e-4)
    if np.allclose(frozen["control"][1], expected[1], atol=1e-4):
        # oneDNN keeps what it caches only when it reorders the weights into a blocked layout.
        pytest.skip("this CPU's oneDNN kept the control's weights in their own layout: nothing was cached")
    # With the setting the control's second product is made with the first call's b.
    assert np.abs(np.asarray(frozen["control"][1]) - expected[1]).max() > 0.1


@pytest.mark.parametrize("export", ["bfloat16 encoder", "float32 encoder"])
def test_every_answer_is_the_same_with_the_setting(answers, export):
    plain, frozen, _ = answers
    assert len(plain[export]) == len(REQUESTS)
    for request, (ours, theirs) in enumerate(zip(frozen[export], plain[export])):
        assert ours.keys() == theirs.keys()
        for key in ours:
            np.testing.assert_allclose(ours[key], theirs[key], atol=1e-5, err_msg=f"request {request}, {key}")
