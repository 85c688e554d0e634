"""A SavedModel run as TF Serving runs it: a TF1 session on its `serve` MetaGraph.

TF Serving's SavedModelBundle loads an export into a tf.compat.v1 Session on a graph of its own,
and runs a signature by feeding the input tensors and fetching the output tensors its
signature_def names; the tokenizer's ops come from tensorflow_text, which TF Serving's build
links in. The tests, the benchmarks and scripts/ all run exports through this module. It imports
neither kbert nor Keras, so a test can show that an export needs neither.

    import sys; sys.path.insert(0, "tests/reference")
    from serving_session import ServingSession
    served = ServingSession("EXPORT_BASE/1")
    served.run({"text": ["hello world"]})      # {output key: numpy array}
"""

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer's ops, as TF Serving's build does)


class ServingSession:
    """The SavedModel at `path` in a TF1 session, as TF Serving loads it.

    config: a `tf.compat.v1.ConfigProto` for the session (None: TF Serving's default options).
    Attributes: graph, session, meta_graph and signatures ({name: signature_def}).
    """

    def __init__(self, path, config=None):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.session = tf.compat.v1.Session(graph=self.graph, config=config)
            self.meta_graph = tf.compat.v1.saved_model.loader.load(self.session, ["serve"], str(path))
        self.signatures = self.meta_graph.signature_def

    def tensor_names(self, signature: str = "serving_default"):
        """({input key: tensor name}, {output key: tensor name}) of `signature`, for Session.run."""
        found = self.signatures[signature]
        return {k: t.name for k, t in found.inputs.items()}, {k: t.name for k, t in found.outputs.items()}

    def run(self, inputs: dict, signature: str = "serving_default", outputs=None, **run_args) -> dict:
        """{output key: array} of `signature` fed {input key: value}; `outputs`: the keys to fetch
        (all by default). run_args go to Session.run (options, run_metadata)."""
        feeds, fetches = self.tensor_names(signature)
        wanted = {k: fetches[k] for k in (fetches if outputs is None else outputs)}
        return self.session.run(wanted, {feeds[k]: v for k, v in inputs.items()}, **run_args)

    def close(self):
        self.session.close()


def load(path, config=None):
    """(session, fetches {output key: tensor name}, the "text" input's tensor name) of serving_default
    of the export at `path`: what a timing loop calls Session.run with, nothing in between."""
    served = ServingSession(path, config)
    feeds, fetches = served.tensor_names()
    return served.session, fetches, feeds["text"]


def session_call(path, config=None):
    """serving_default of the export at `path` as a function: (list of strings) -> {output key: array}."""
    session, fetches, feed = load(path, config)
    return lambda texts: session.run(fetches, {feed: texts})
