"""The signatures of a written SavedModel, read and edited in its `saved_model.pb`, and whether
it holds variables.

TF2's SavedModel writer gives every signature the method name `tensorflow/serving/predict`
and takes no other, so an export's `classify` or `regress` signature gets its method name
set here, after the writer is done.
"""

from __future__ import annotations

import os

from tensorflow.core.protobuf import saved_model_pb2

from kbert.backend.tensorflow_compat import write_saved_model_fingerprint


def set_method_name(saved_model_dir: str, signature: str, method_name: str):
    """Give one signature of a written SavedModel another method name, and renew its fingerprint.

    TF2's saving writes every signature as `tensorflow/serving/predict`; TF Serving's Classify
    and Regress APIs refuse those, so the name is set in `saved_model.pb` itself.
    """
    path = os.path.join(saved_model_dir, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        saved_model.ParseFromString(f.read())
    for meta_graph in saved_model.meta_graphs:
        meta_graph.signature_def[signature].method_name = method_name
    with open(path, "wb") as f:
        f.write(saved_model.SerializeToString())
    # fingerprint.pb hashes saved_model.pb (its signatures included); write the new one.
    write_saved_model_fingerprint(saved_model_dir)


def exported_signatures(path: str) -> dict:
    """{signature name: method name} of the SavedModel at `path`, read from saved_model.pb."""
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return {
        name: signature.method_name
        for name, signature in sorted(saved_model.meta_graphs[0].signature_def.items())
        if not name.startswith("__")
    }


def signature_inputs(path: str, name: str = "serving_default") -> list:
    """The input names a signature of the SavedModel at `path` takes (`text`, `text_b`, ...),
    read from saved_model.pb: what a client sends."""
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return sorted(saved_model.meta_graphs[0].signature_def[name].inputs)


def holds_no_variables(path: str) -> bool:
    """Whether a written SavedModel keeps its weights as graph constants (a model too large for
    them keeps variables)."""
    import tensorflow as tf

    return not [
        n for n, _ in tf.train.list_variables(os.path.join(path, "variables", "variables")) if "OBJECT_GRAPH" not in n
    ]
