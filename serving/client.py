"""`Client`: call a model that TF Serving serves, over gRPC or REST. (`kbert predict --server`
is `kbert.serving.predict.predict_served`, which reads files as local `kbert predict` does.)

The address picks the protocol: `"HOST:PORT"` or `"grpc://HOST:PORT"` talks gRPC with
tensorflow-serving-api's stubs (`tensorflow_model_server --port`, 8500 by default);
`"http://HOST:PORT"` talks TF Serving's REST API (`--rest_api_port`, 8501) with the standard
library's urllib. Both give the same answers:

- numeric outputs are numpy arrays of the signature's dtype (float32 for DT_FLOAT);
- string outputs are numpy object arrays of Python `str` (decoded as UTF-8); outputs whose name
  ends in `_bytes` stay `bytes` (REST sends those base64-encoded, TF Serving's rule);
- inputs are cast to the signature's dtypes (read once from the model's metadata), so plain
  Python lists work with gRPC too; texts may be `str` or `bytes`, and bytes that are not valid
  UTF-8 travel as `{"b64": ...}` over REST.

A server error raises `KbertError` with one line naming the address, the model and the
server's own message; a server that cannot be reached says so.

A server that is down or restarting does not end a batch job: a call that finds it unavailable
(gRPC UNAVAILABLE, a refused or reset connection, HTTP 503) is retried after 0.1 s, 0.2 s,
0.4 s, ... (doubling up to 10 s, each wait cut by a random 0-50% so many clients do not come
back at once), at most `retries` times and never past `timeout` seconds from the call's start;
each wait logs one line. Every other error (INVALID_ARGUMENT, NOT_FOUND, HTTP 400 or 404, ...)
fails at once: asking again would get the same answer.

The gRPC protos import TensorFlow (several seconds, once); the REST client does not need it.

This module holds `Client` and what both protocols share (the checks of the inputs, retries,
error messages, decoding); the calls themselves are `kbert.serving.grpc_client` and
`kbert.serving.rest_client`.
"""

from __future__ import annotations

import logging
import random
import re
import time

import numpy as np

from kbert.runtime.errors import KbertError

log = logging.getLogger("kbert")

# TF Serving's DataType names -> numpy dtypes (object: Python str or bytes).
NUMPY_DTYPES = {
    "DT_FLOAT": np.float32,
    "DT_DOUBLE": np.float64,
    "DT_INT32": np.int32,
    "DT_INT64": np.int64,
    "DT_INT16": np.int16,
    "DT_INT8": np.int8,
    "DT_UINT8": np.uint8,
    "DT_BOOL": np.bool_,
    "DT_STRING": object,
}
FIRST_RETRY_WAIT, MAX_RETRY_WAIT = 0.1, 10.0  # seconds: the back-off doubles from the first to the cap
# What TensorFlow wraps an op's error in, which a server passes on: "{{function_node
# __inference_...}}" before it, "[[{{node ...}}]]" and "[Op:...]" after it.
_TF_WRAPPING = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[\[(?:\{\{[^}]*\}\})+\]\]|\s*\[Op:[^\]]*\]")
_WAIT_HINT = "allow more time (retries, timeout; kbert predict --retries, --timeout)"


class Unavailable(Exception):
    """One attempt found the server unavailable (down, restarting, overloaded): worth another try.

    `reason` is short, for the log line of each wait; `message(after)` is the one-line error if
    the call gives up, with `after` ("after 3 retries in 2.1 s") saying how hard it tried."""

    def __init__(self, reason: str, message):
        super().__init__(reason)
        self.reason, self.message = reason, message


def retry_wait(retry: int, jitter: float = 1.0) -> float:
    """Seconds to wait before retry number `retry` + 1: 0.1 s doubling up to 10 s, times `jitter`
    (the client draws it from 0.5..1, so clients cut off together do not come back together).

    >>> [retry_wait(n) for n in range(9)]
    [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    >>> retry_wait(3, jitter=0.5)
    0.4
    """
    return round(min(MAX_RETRY_WAIT, FIRST_RETRY_WAIT * 2 ** min(retry, 30)) * jitter, 3)


class Client:
    """A model served by TF Serving (or anything that speaks its gRPC or REST API).

    Args:
        address: str. `"HOST:PORT"` or `"grpc://HOST:PORT"` for gRPC, `"http://HOST:PORT"`
            (or https) for REST.
        model_name: str. The model's name on the server (`--model_name`, or its name in
            models.config).
        version: int. A version to call; default: the newest one the server has loaded.
        timeout: float. Seconds one call may take in all, its retries and their waits included.
        retries: int. How many times a call that finds the server unavailable is tried again
            (with exponential back-off) before it fails; 0 fails at once.

    Example:
    >>> client = Client("localhost:8500", "sentiment")
    >>> client
    Client('grpc://localhost:8500', 'sentiment')
    >>> Client("http://localhost:8501", "sentiment", version=2)
    Client('http://localhost:8501', 'sentiment', version=2)
    >>> Client("localhost:8500", "sentiment", timeout=600, retries=30)  # ride out a long restart
    Client('grpc://localhost:8500', 'sentiment', timeout=600, retries=30)
    >>> client.predict_text(["great movie"])["label"]  # doctest: +SKIP
    array(['pos'], dtype=object)
    >>> client.classify(["great movie", "dull"])  # doctest: +SKIP
    [[('neg', 0.03), ('pos', 0.97)], [('neg', 0.88), ('pos', 0.12)]]
    >>> Client("localhost", "sentiment")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: server address 'localhost': give HOST:PORT (gRPC) or http://HOST:PORT (REST)
    """

    def __init__(
        self, address: str, model_name: str, *, version: int | None = None, timeout: float = 60.0, retries: int = 10
    ):
        address = str(address).strip().rstrip("/")
        scheme, sep, rest = address.partition("://")
        if not sep:
            scheme, rest = "grpc", address
        scheme = scheme.lower()
        host, _, port = rest.rpartition(":")
        if scheme not in ("grpc", "http", "https") or not host or not port.isdigit() or "/" in rest:
            raise KbertError(f"server address {address!r}: give HOST:PORT (gRPC) or http://HOST:PORT (REST)")
        if not model_name or "/" in model_name:
            raise KbertError(f"model name {model_name!r}: give the name the server serves the model under")
        if version is not None and int(version) < 0:
            raise KbertError(f"version {version}: TF Serving versions are non-negative integers")
        if not timeout > 0:
            raise KbertError(f"timeout {timeout}: give the seconds a call may take, more than 0")
        if int(retries) < 0:
            raise KbertError(f"retries {retries}: give how many times to retry, 0 or more")
        self.address = f"{scheme}://{rest}"
        self.target = rest  # HOST:PORT, as the messages name the server
        self.protocol = "grpc" if scheme == "grpc" else "rest"
        self._protocol_name = "gRPC" if self.protocol == "grpc" else "REST"
        self.model_name = model_name
        self.version = None if version is None else int(version)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self._signatures = None
        # The calls themselves, over the protocol the address names. Imported here, as each
        # transport's module imports what this one holds for both.
        if self.protocol == "grpc":
            from kbert.serving.grpc_client import GrpcTransport

            self._transport = GrpcTransport(self)
        else:
            from kbert.serving.rest_client import RestTransport

            self._transport = RestTransport(self)

    def __repr__(self):
        version = "" if self.version is None else f", version={self.version}"
        timeout = "" if self.timeout == 60.0 else f", timeout={self.timeout:g}"
        retries = "" if self.retries == 10 else f", retries={self.retries}"
        return f"Client({self.address!r}, {self.model_name!r}{version}{timeout}{retries})"

    # === Predict API ===

    def predict(self, inputs: dict, signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        """Run one signature through TF Serving's Predict API.

        Args:
            inputs: dict of str to array-like. One value per input of the signature, with the
                batch first; str or bytes for string inputs.
            signature_name: str. The signature to run.

        Returns:
            dict of str to np.ndarray: every output of the signature. Strings come back as
            object arrays of str (of bytes for outputs named `*_bytes`).

        Example:
        >>> client = Client("localhost:8500", "sentiment")
        >>> out = client.predict({"text": ["great movie"], "text_b": [""]})  # doctest: +SKIP
        >>> out["probabilities"].dtype, out["probabilities"].shape  # doctest: +SKIP
        (dtype('float32'), (1, 2))
        """
        if not isinstance(inputs, dict) or not inputs:
            raise KbertError("predict takes a dict of input name -> values, e.g. {'text': ['a text']}")
        return self._transport.predict(inputs, signature_name, self._signature(signature_name))

    def predict_text(self, texts, texts_b=None) -> dict[str, np.ndarray]:
        """`serving_default` on raw texts (tokenized inside the served graph).

        Args:
            texts: list of str or bytes. One text per example.
            texts_b: list of str or bytes. Second texts of sentence pairs. Left out for a model
                whose signature takes `text_b`, every example gets "" (a single text, as
                run_classifier.py packs it); given to one that does not, an error unless all
                are "".

        Returns:
            dict of str to np.ndarray: the export's outputs (`label`, `probabilities`, ...).

        Example:
        >>> Client("http://localhost:8501", "sentiment").predict_text(["great movie"])  # doctest: +SKIP
        {'label': array(['pos'], dtype=object), 'label_id': array([1], dtype=int32), 'probabilities': ...}
        """
        texts = _text_list(texts, "texts")
        inputs = {"text": texts}
        signature = self._signature("serving_default")
        takes_b = signature is None or "text_b" in signature["inputs"]  # None: the server will say
        if texts_b is not None:
            texts_b = _text_list(texts_b, "texts_b", len(texts))
            if not takes_b and any(texts_b):
                # TF Serving's REST API would drop text_b without a word; gRPC would refuse it.
                raise KbertError(
                    f"{self._where()}: serving_default takes single texts (no text_b), but "
                    f"second texts were given; send single texts, or serve a model fine-tuned "
                    f"on sentence pairs"
                )
            if takes_b:
                inputs["text_b"] = texts_b
        elif takes_b:
            inputs["text_b"] = [""] * len(texts)
        return self.predict(inputs, "serving_default")

    def predict_ids(self, input_ids, input_mask, segment_ids) -> dict[str, np.ndarray]:
        """`serve_ids` on already tokenized inputs: int [batch, seq] arrays, google-research's ids.

        Example:
        >>> out = Client("localhost:8500", "sentiment").predict_ids(  # doctest: +SKIP
        ...     [[2, 5, 6, 3]], [[1, 1, 1, 1]], [[0, 0, 0, 0]])
        """
        arrays = {
            name: np.asarray(value, dtype=np.int32)
            for name, value in (("input_ids", input_ids), ("input_mask", input_mask), ("segment_ids", segment_ids))
        }
        shapes = {a.shape for a in arrays.values()}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise KbertError(
                f"input_ids, input_mask and segment_ids must be [batch, seq] arrays of one shape; "
                f"got {', '.join(str(a.shape) for a in arrays.values())}"
            )
        return self.predict(arrays, "serve_ids")

    def rerank(self, query, documents) -> dict:
        """A served reranker's scores of a query's documents, and their order: what `kbert rerank`
        answers, `{"scores": [...], "ranking": [...]}` (document indexes, best first).

        Example:
        >>> Client("localhost:8500", "reranker").rerank("how to make tea", ["Call the vet.", "Put the kettle on."])  # doctest: +SKIP
        {'scores': [0.004, 0.981], 'ranking': [1, 0]}
        """
        documents = _text_list(documents, "documents")
        if not documents:
            return {"scores": [], "ranking": []}
        scores = self.predict_text([query] * len(documents), documents)["score"]
        order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
        return {"scores": [round(float(s), 6) for s in scores], "ranking": order.tolist()}

    # === Classify and Regress APIs ===

    def classify(self, texts, texts_b=None, signature_name: str = "classify") -> list[list[tuple[str, float]]]:
        """TF Serving's Classify API: tf.Examples with bytes features `text` (and `text_b`).

        Args:
            texts: list of str or bytes.
            texts_b: list of str or bytes, or None. Second texts of sentence pairs.
            signature_name: str. A signature of method `tensorflow/serving/classify`.

        Returns:
            list (one per text) of list of (label, score) in the model's class order. No texts
            give [] without a call (TF Serving refuses an empty request: "Input is empty.").

        Example:
        >>> Client("localhost:8500", "sentiment").classify(["great movie"])  # doctest: +SKIP
        [[('neg', 0.031), ('pos', 0.969)]]
        """
        examples = _examples(texts, texts_b)
        if not examples:
            return []
        return self._transport.classify(examples, signature_name)

    def regress(self, texts, texts_b=None, signature_name: str = "regress") -> list[float]:
        """TF Serving's Regress API: one float per text (tf.Examples as for `classify`).

        Example:
        >>> Client("http://localhost:8501", "similarity").regress(["a cat"], ["a small cat"])  # doctest: +SKIP
        [4.21]
        """
        examples = _examples(texts, texts_b)
        if not examples:
            return []
        return self._transport.regress(examples, signature_name)

    # === Model metadata and status ===

    def metadata(self) -> dict:
        """The served model's signatures, as TF Serving's GetModelMetadata lists them.

        Returns:
            dict: signature name -> {"method_name": str, "inputs": {name: {"dtype", "shape"}},
            "outputs": {...}}; dtype is TF Serving's name ("DT_STRING", "DT_FLOAT", ...), shape
            a list with -1 for unknown sizes (None for an unknown rank). TF Serving lists every
            signature of the SavedModel, `__saved_model_init_op` included.

        Example:
        >>> Client("localhost:8500", "sentiment").metadata()["classify"]["method_name"]  # doctest: +SKIP
        'tensorflow/serving/classify'
        """
        signatures = self._transport.metadata()
        self._signatures = dict(sorted(signatures.items()))
        return self._signatures

    def status(self) -> list[dict]:
        """The state of each loaded version (TF Serving's GetModelStatus).

        Returns:
            list of dict: {"version": int, "state": "AVAILABLE" (or START, LOADING, UNLOADING,
            END), "error_code": "OK" or a TF error code name, "error_message": str}.

        Example:
        >>> Client("localhost:8500", "sentiment").status()  # doctest: +SKIP
        [{'version': 1, 'state': 'AVAILABLE', 'error_code': 'OK', 'error_message': ''}]
        """
        body = self._transport.status()
        # The REST answer is the response proto's JSON (gRPC's is made the same); fields at
        # their default are left out.
        return [
            {
                "version": int(s.get("version", 0)),
                "state": s.get("state", "UNKNOWN"),
                "error_code": s.get("status", {}).get("error_code", "OK"),
                "error_message": s.get("status", {}).get("error_message", ""),
            }
            for s in body.get("model_version_status", [])
        ]

    # === Retries and messages, for both transports ===

    def _retrying(self, attempt):
        """`attempt(seconds left)`'s result, tried again while it finds the server unavailable,
        with exponential back-off: at most `retries` times, and never past `timeout` seconds."""
        start = time.monotonic()
        deadline = start + self.timeout
        for retry in range(self.retries + 1):
            try:
                return attempt(max(deadline - time.monotonic(), 0.001))
            except Unavailable as e:
                wait = retry_wait(retry, jitter=random.uniform(0.5, 1.0))
                if retry == self.retries or time.monotonic() + wait >= deadline:
                    after = (
                        (f" (after {retry} {'retry' if retry == 1 else 'retries'} in {time.monotonic() - start:.1f} s)")
                        if retry
                        else ""
                    )
                    raise KbertError(e.message(after)) from None
                log.warning(
                    "TF Serving at %s unavailable (%s); retrying in %.2g s (%d/%d)",
                    self.target,
                    _short(e.reason),
                    wait,
                    retry + 1,
                    self.retries,
                )
                time.sleep(wait)

    def _signature(self, name: str) -> dict | None:
        """The signature's metadata (fetched once per client), or None when the model has none by
        that name: the request then goes as it is and the server's error says what is wrong."""
        if self._signatures is None:
            self.metadata()
        return self._signatures.get(name)

    def _where(self) -> str:
        version = "" if self.version is None else f" version {self.version}"
        return f"TF Serving at {self.target} (model {self.model_name}{version}, {self._protocol_name})"

    def _not_serving(self, what: str, after: str) -> str:
        """The server answers but cannot serve the model (loading, overloaded), however long we waited."""
        return (
            f"{self._where()}: {what}{after}; the server is up but not serving the model: wait until it "
            f"has loaded it (its log says), or {_WAIT_HINT}"
        )

    def _unreachable(self, why: str, after: str = "") -> str:
        flag = "--port" if self.protocol == "grpc" else "--rest_api_port"
        longer = f", or {_WAIT_HINT}" if after else ""
        return (
            f"cannot reach TF Serving at {self.target} over {self._protocol_name} ({why}){after}; is the "
            f"server running at {self.target}? Start tensorflow_model_server with "
            f"{flag}={self.target.rpartition(':')[2]}, fix the address{longer}"
        )


# === Values, for both transports: texts checked and made bytes, string outputs decoded ===


def one_line(message: str) -> str:
    """A server's message on one line, without the wrapping TensorFlow puts around an op's error.

    >>> one_line("indices[0,2] = 9 is not in [0, 3)\\n\\t [[{{function_node __inference_f_12}}{{node GatherV2}}]]")
    'indices[0,2] = 9 is not in [0, 3)'
    """
    return " ".join(_TF_WRAPPING.sub("", message).split())


def _short(message: str, limit: int = 120) -> str:
    return message if len(message) <= limit else message[:limit] + "..."


def is_text(value) -> bool:
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "SUO"
    if isinstance(value, (list, tuple)):
        return any(is_text(v) for v in value)
    return False


def as_bytes(value):
    """Nested str/bytes -> nested bytes (str as UTF-8), kept as lists so no byte is lost."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    if isinstance(value, (list, tuple)):
        return [as_bytes(v) for v in value]
    raise TypeError(f"expected text (str or bytes), got {type(value).__name__}")


def decode_strings(name: str, array: np.ndarray) -> np.ndarray:
    """String tensors -> object arrays of str (bytes for `*_bytes` outputs)."""
    if array.dtype == object and not name.endswith("_bytes"):
        flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in array.ravel().tolist()]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(array.shape)
    return array


def _text_list(texts, what: str, n: int | None = None) -> list:
    if isinstance(texts, (str, bytes)):
        raise KbertError(f"{what}: pass a list of texts (a batch), e.g. [{texts!r}]")
    texts = list(texts)
    if n is not None and len(texts) != n:
        raise KbertError(f"{what} has {len(texts)} texts for {n} in texts; give one text_b per text")
    for t in texts:
        if not isinstance(t, (str, bytes)):
            raise KbertError(f"{what}: every text must be str or bytes, not {type(t).__name__}")
    return texts


def _examples(texts, texts_b) -> list[dict]:
    """One {feature: bytes} per text: `text` and, with pairs, `text_b`."""
    texts = _text_list(texts, "texts")
    examples = [{"text": as_bytes(t)} for t in texts]
    if texts_b is not None:
        for example, b in zip(examples, _text_list(texts_b, "texts_b", len(texts))):
            example["text_b"] = as_bytes(b)
    return examples
