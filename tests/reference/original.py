"""Run google-research/bert's own code (PyPI bert-tensorflow 1.0.4) through tf1shim.

As a script: `python original.py CHECKPOINT_DIR EXPECTED.npz` builds the original BertModel
and pretraining heads in graph mode, loads CHECKPOINT_DIR exactly as the original scripts
do (`modeling.get_assignment_map_from_checkpoint` + `tf.train.init_from_checkpoint`),
runs the inputs stored in EXPECTED.npz and prints one JSON object: how many variables the
checkpoint initialised, which it did not, and the max |difference| per output.
"""

import importlib.util
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))


def _source(name):
    spec = importlib.util.find_spec("bert")
    if spec is None:
        raise ImportError("the reference needs bert-tensorflow==1.0.4: pip install -e '.[test]'")
    path = os.path.join(spec.submodule_search_locations[0], f"{name}.py")
    with open(path, encoding="utf-8") as f:
        return path, f.read()


def load_original(name, **injected):
    """The original module `name` (modeling, optimization, run_pretraining), run on tf1shim."""
    sys.path.insert(0, HERE)
    path, src = _source(name)
    src = src.replace("import tensorflow.compat.v1 as tf", "import tf1shim as tf")
    src = src.replace("from tensorflow.contrib import layers as contrib_layers", "contrib_layers = tf.contrib.layers")
    for dep in injected:
        src = src.replace(f"from bert import {dep}", "")
    module = types.ModuleType(f"original_{name}")
    module.__dict__.update(injected)
    exec(compile(src, path, "exec"), module.__dict__)
    return module


def erf_gelu(tf):
    # The GELU of google-research/bert's first release, which the released checkpoints used.
    return lambda x: x * 0.5 * (1.0 + tf.math.erf(x / tf.sqrt(2.0)))


def main(checkpoint_dir, expected_path):
    import numpy as np

    modeling = load_original("modeling")
    optimization = load_original("optimization")
    run_pretraining = load_original("run_pretraining", modeling=modeling, optimization=optimization)
    tf = modeling.tf
    modeling.gelu = erf_gelu(tf)

    expected = np.load(expected_path)
    config = modeling.BertConfig.from_json_file(os.path.join(checkpoint_dir, "bert_config.json"))
    ckpt = tf.train.latest_checkpoint(checkpoint_dir) or os.path.join(checkpoint_dir, "bert_model.ckpt")
    feeds = {
        k: tf.constant(expected[k].astype("int32"))
        for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
    }
    model = modeling.BertModel(
        config=config,
        is_training=False,
        input_ids=feeds["input_ids"],
        input_mask=feeds["input_mask"],
        token_type_ids=feeds["segment_ids"],
        use_one_hot_embeddings=False,
    )
    positions = feeds["masked_lm_positions"]
    ids = tf.zeros_like(positions)
    weights = tf.ones_like(positions, dtype=tf.float32)
    _, _, mlm_log_probs = run_pretraining.get_masked_lm_output(
        config, model.get_sequence_output(), model.get_embedding_table(), positions, ids, weights
    )
    _, _, nsp_log_probs = run_pretraining.get_next_sentence_output(
        config, model.get_pooled_output(), tf.zeros([positions.shape[0]], tf.int32)
    )

    tvars = tf.trainable_variables()
    assignment_map, initialized = modeling.get_assignment_map_from_checkpoint(tvars, ckpt)
    tf.train.init_from_checkpoint(ckpt, assignment_map)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        got = sess.run(
            {
                "embedding_output": model.get_embedding_output(),
                "sequence_output": model.get_sequence_output(),
                "pooled_output": model.get_pooled_output(),
                "mlm_log_probs": tf.reshape(mlm_log_probs, expected["mlm_log_probs"].shape),
                "nsp_log_probs": nsp_log_probs,
            }
        )
    names = [v.name.split(":")[0] for v in tvars]
    print(
        json.dumps(
            {
                "trainable_variables": len(names),
                "initialized_from_checkpoint": sum(1 for n in names if n in initialized),
                "not_initialized": [n for n in names if n not in initialized],
                "max_abs_diff": {k: float(np.abs(v - expected[k]).max()) for k, v in got.items()},
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
