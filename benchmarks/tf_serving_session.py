"""A kbert export's serving_default as tensorflow_model_server runs it, for the benchmarks.

A TF1 session on the SavedModel's `serve` MetaGraph, fed and fetched by the `serving_default`
signature_def's tensor names, as TF Serving's SavedModelBundle does; the tokenizer's ops come
from tensorflow_text, which TF Serving's build links in.
"""

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer's ops)


def load(path: str, config=None):
    """(session, fetches {output key: tensor name}, the "text" input's tensor name) for the export at `path`.

    config: a `tf.compat.v1.ConfigProto` for the session (TF Serving's defaults if None).
    """
    graph = tf.Graph()
    with graph.as_default():
        session = tf.compat.v1.Session(graph=graph, config=config)
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
    signature = meta_graph.signature_def["serving_default"]
    return session, {key: t.name for key, t in signature.outputs.items()}, signature.inputs["text"].name


def session_call(path: str, config=None):
    """serving_default of the export at `path` as a function: (list of strings) -> {output key: array}."""
    session, fetches, feed = load(path, config)
    return lambda texts: session.run(fetches, {feed: texts})
