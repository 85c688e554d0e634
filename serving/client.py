"""`Client`: call a model that TF Serving serves, over gRPC or REST. (`kbert predict --server`
is `kbert.finetuning.predict.predict_served`, which reads files as local `kbert predict` does.)

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
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from kbert.errors import KbertError

log = logging.getLogger("kbert")

# gRPC's stubs and TF Serving's protos are imported inside the methods that use them: they
# import TensorFlow (seconds), which a REST client never needs.
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
# TF Serving's DataType names -> numpy dtypes (object: Python str or bytes).
_NUMPY = {"DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_INT32": np.int32, "DT_INT64": np.int64,
          "DT_INT16": np.int16, "DT_INT8": np.int8, "DT_UINT8": np.uint8, "DT_BOOL": np.bool_,
          "DT_STRING": object}
_MAX_MESSAGE = 2 ** 31 - 1  # tensorflow_model_server accepts messages up to INT_MAX bytes too
FIRST_RETRY_WAIT, MAX_RETRY_WAIT = 0.1, 10.0  # seconds: the back-off doubles from the first to the cap
# What TensorFlow wraps an op's error in, which a server passes on: "{{function_node
# __inference_...}}" before it, "[[{{node ...}}]]" and "[Op:...]" after it.
_TF_WRAPPING = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[\[(?:\{\{[^}]*\}\})+\]\]|\s*\[Op:[^\]]*\]")
_WAIT_HINT = "allow more time (retries, timeout; kbert predict --retries, --timeout)"


class _Unavailable(Exception):
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
    kbert.errors.KbertError: server address 'localhost': give HOST:PORT (gRPC) or http://HOST:PORT (REST)
    """

    def __init__(self, address: str, model_name: str, *, version: int | None = None, timeout: float = 60.0,
                 retries: int = 10):
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
        self._channel = None
        self._stubs = {}
        self._signatures = None

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
        signature = self._signature(signature_name)
        if self.protocol == "grpc":
            return self._grpc_predict(inputs, signature_name, signature)
        return self._rest_predict(inputs, signature_name, signature)

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
                raise KbertError(f"{self._where()}: serving_default takes single texts (no text_b), but "
                                 f"second texts were given; send single texts, or serve a model fine-tuned "
                                 f"on sentence pairs")
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
        arrays = {name: np.asarray(value, dtype=np.int32) for name, value in
                  (("input_ids", input_ids), ("input_mask", input_mask), ("segment_ids", segment_ids))}
        shapes = {a.shape for a in arrays.values()}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise KbertError(f"input_ids, input_mask and segment_ids must be [batch, seq] arrays of one shape; "
                             f"got {', '.join(str(a.shape) for a in arrays.values())}")
        return self.predict(arrays, "serve_ids")

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
        if self.protocol == "grpc":
            from tensorflow_serving.apis import classification_pb2
            request = classification_pb2.ClassificationRequest(
                model_spec=self._model_spec(signature_name), input=_grpc_input(examples))
            result = self._grpc_call("PredictionService", "Classify", request).result
            return [[(c.label, float(c.score)) for c in row.classes] for row in result.classifications]
        body = self._rest("POST", ":classify", {"signature_name": signature_name,
                                                "examples": [_rest_example(e) for e in examples]})
        return [[(str(label), float(score)) for label, score in row] for row in _results(body)]

    def regress(self, texts, texts_b=None, signature_name: str = "regress") -> list[float]:
        """TF Serving's Regress API: one float per text (tf.Examples as for `classify`).

        Example:
        >>> Client("http://localhost:8501", "similarity").regress(["a cat"], ["a small cat"])  # doctest: +SKIP
        [4.21]
        """
        examples = _examples(texts, texts_b)
        if not examples:
            return []
        if self.protocol == "grpc":
            from tensorflow_serving.apis import regression_pb2
            request = regression_pb2.RegressionRequest(
                model_spec=self._model_spec(signature_name), input=_grpc_input(examples))
            result = self._grpc_call("PredictionService", "Regress", request).result
            return [float(r.value) for r in result.regressions]
        body = self._rest("POST", ":regress", {"signature_name": signature_name,
                                               "examples": [_rest_example(e) for e in examples]})
        return [float(value) for value in _results(body)]

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
        if self.protocol == "grpc":
            from tensorflow.core.framework import types_pb2
            from tensorflow_serving.apis import get_model_metadata_pb2

            request = get_model_metadata_pb2.GetModelMetadataRequest(
                model_spec=self._model_spec(), metadata_field=["signature_def"])
            response = self._grpc_call("PredictionService", "GetModelMetadata", request)
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            response.metadata["signature_def"].Unpack(signature_map)

            def info(tensor):
                shape = None if tensor.tensor_shape.unknown_rank else [d.size for d in tensor.tensor_shape.dim]
                return {"dtype": types_pb2.DataType.Name(tensor.dtype), "shape": shape}
            signatures = {name: {"method_name": s.method_name,
                                 "inputs": {k: info(v) for k, v in sorted(s.inputs.items())},
                                 "outputs": {k: info(v) for k, v in sorted(s.outputs.items())}}
                          for name, s in signature_map.signature_def.items()}
        else:
            body = self._rest("GET", "/metadata")
            try:
                raw = body["metadata"]["signature_def"]["signature_def"]
            except (KeyError, TypeError):
                raise KbertError(f"{self._where()}: the metadata response has no signature_def; is this TF "
                                 f"Serving's REST API?") from None

            def info(tensor):
                shape = tensor.get("tensor_shape", {})
                dims = None if shape.get("unknown_rank") else [int(d.get("size", 0)) for d in shape.get("dim", [])]
                return {"dtype": tensor.get("dtype", "DT_INVALID"), "shape": dims}
            signatures = {name: {"method_name": s.get("method_name", ""),
                                 "inputs": {k: info(v) for k, v in sorted(s.get("inputs", {}).items())},
                                 "outputs": {k: info(v) for k, v in sorted(s.get("outputs", {}).items())}}
                          for name, s in raw.items()}
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
        if self.protocol == "grpc":
            from google.protobuf import json_format
            from tensorflow_serving.apis import get_model_status_pb2
            request = get_model_status_pb2.GetModelStatusRequest(model_spec=self._model_spec())
            body = json_format.MessageToDict(self._grpc_call("ModelService", "GetModelStatus", request))
        else:
            body = self._rest("GET", "")
        # The REST answer is the response proto's JSON; fields at their default are left out.
        return [{"version": int(s.get("version", 0)), "state": s.get("state", "UNKNOWN"),
                 "error_code": s.get("status", {}).get("error_code", "OK"),
                 "error_message": s.get("status", {}).get("error_message", "")}
                for s in body.get("model_version_status", [])]

    # === gRPC ===

    def _model_spec(self, signature_name: str = ""):
        from tensorflow_serving.apis import model_pb2
        spec = model_pb2.ModelSpec(name=self.model_name, signature_name=signature_name)
        if self.version is not None:
            spec.version.value = self.version
        return spec

    def _stub(self, service: str):
        import grpc
        if service not in self._stubs:
            from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc
            if self._channel is None:
                self._channel = grpc.insecure_channel(self.target, options=[
                    ("grpc.max_send_message_length", _MAX_MESSAGE),
                    ("grpc.max_receive_message_length", _MAX_MESSAGE),
                    # A channel of its own, not one shared through gRPC's global pool: dropping
                    # it (below) must also drop its reconnect back-off.
                    ("grpc.use_local_subchannel_pool", 1)])
            module = prediction_service_pb2_grpc if service == "PredictionService" else model_service_pb2_grpc
            self._stubs[service] = getattr(module, f"{service}Stub")(self._channel)
        return self._stubs[service]

    def _drop_channel(self):
        """Forget the channel: after a failure it waits out gRPC's own reconnect back-off (up to
        2 minutes) before it tries the server again, where a new channel connects at once."""
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stubs = None, {}

    def _grpc_call(self, service: str, method: str, request):
        import grpc

        def attempt(timeout):
            try:
                return getattr(self._stub(service), method)(request, timeout=timeout)
            except grpc.RpcError as e:
                code, details = e.code(), _one_line(e.details() or "")
                if code == grpc.StatusCode.UNAVAILABLE:
                    self._drop_channel()
                    if "connect" in details.lower() or not details:
                        # "failed to connect to all addresses; ...: Connection refused": the last
                        # part says why, enough for the line of each wait.
                        raise _Unavailable(details.rsplit(": ", 1)[-1] or "no connection",
                                           lambda after: self._unreachable(details, after)) from None
                    raise _Unavailable(details, lambda after: self._not_serving(f"UNAVAILABLE: {details}", after)) \
                        from None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise KbertError(f"{self._where()}: no answer within {self.timeout:g} s (gRPC {method}); "
                                     f"raise the timeout or check the server's load") from None
                raise KbertError(f"{self._where()}: {code.name}: {details}") from None
        return self._retrying(attempt)

    def _grpc_predict(self, inputs, signature_name, signature):
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest(model_spec=self._model_spec(signature_name))
        for name, value in inputs.items():
            dtype = (signature or {}).get("inputs", {}).get(name, {}).get("dtype")
            try:
                if dtype == "DT_STRING":
                    proto = tf.make_tensor_proto(_as_bytes(value), dtype=tf.string)
                elif dtype in _NUMPY:
                    proto = tf.make_tensor_proto(np.asarray(value, dtype=_NUMPY[dtype]))
                else:  # not an input of the signature: the server names the mistake
                    proto = tf.make_tensor_proto(_as_bytes(value) if _is_text(value) else np.asarray(value))
            except (TypeError, ValueError) as e:
                raise KbertError(f"input {name!r}: cannot make a {dtype or 'tensor'} of it ({_one_line(str(e))})") \
                    from None
            request.inputs[name].CopyFrom(proto)
        response = self._grpc_call("PredictionService", "Predict", request)
        return {name: _decode(name, tf.make_ndarray(proto)) for name, proto in sorted(response.outputs.items())}

    # === REST ===

    def _url(self, suffix: str) -> str:
        version = "" if self.version is None else f"/versions/{self.version}"
        return f"{self.address}/v1/models/{urllib.parse.quote(self.model_name, safe='')}{version}{suffix}"

    def _rest(self, method: str, suffix: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self._url(suffix), data=data, method=method,
                                         headers={"Content-Type": "application/json"})

        def attempt(timeout):
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                message = _one_line(str(_http_error_message(e)))
                if e.code == 503:  # TF Serving's UNAVAILABLE
                    raise _Unavailable(f"HTTP 503: {message}",
                                       lambda after: self._not_serving(f"HTTP 503: {message}", after)) from None
                raise KbertError(f"{self._where()}: HTTP {e.code}: {message}") from None
            except urllib.error.URLError as e:
                if isinstance(e.reason, (TimeoutError, socket.timeout)):
                    raise KbertError(self._timed_out(suffix)) from None
                if isinstance(e.reason, ConnectionError):  # refused or reset: down or restarting
                    raise self._rest_unavailable(e.reason) from None
                raise KbertError(self._unreachable(str(e.reason))) from None
            except (TimeoutError, socket.timeout):
                raise KbertError(self._timed_out(suffix)) from None
            except (ConnectionError, http.client.IncompleteRead) as e:  # the server went away mid-answer
                raise self._rest_unavailable(e) from None
        raw = self._retrying(attempt)
        try:
            return json.loads(raw)
        except ValueError:
            raise KbertError(f"{self._where()}: the answer to {method} {self._url(suffix)} is not JSON; "
                             f"is this TF Serving's REST port?") from None

    def _rest_predict(self, inputs, signature_name, signature):
        body = self._rest("POST", ":predict", {"signature_name": signature_name,
                                               "inputs": {k: _json_value(v) for k, v in inputs.items()}})
        if "outputs" not in body:
            raise KbertError(f"{self._where()}: the predict answer has no 'outputs'")
        outputs = (signature or {}).get("outputs", {})
        values = body["outputs"]
        if len(outputs) == 1:  # TF Serving returns a single output bare, without its name
            values = {next(iter(outputs)): values}
        elif not isinstance(values, dict):
            raise KbertError(f"{self._where()}: the predict answer's outputs are not named")
        return {name: _from_json(name, value, outputs.get(name, {})) for name, value in sorted(values.items())}

    def _rest_unavailable(self, error: Exception) -> _Unavailable:
        why = str(error) or type(error).__name__
        return _Unavailable(why, lambda after: self._unreachable(why, after))

    # === Both ===

    def _retrying(self, attempt):
        """`attempt(seconds left)`'s result, tried again while it finds the server unavailable,
        with exponential back-off: at most `retries` times, and never past `timeout` seconds."""
        start = time.monotonic()
        deadline = start + self.timeout
        for retry in range(self.retries + 1):
            try:
                return attempt(max(deadline - time.monotonic(), 0.001))
            except _Unavailable as e:
                wait = retry_wait(retry, jitter=random.uniform(0.5, 1.0))
                if retry == self.retries or time.monotonic() + wait >= deadline:
                    after = (f" (after {retry} {'retry' if retry == 1 else 'retries'} in "
                             f"{time.monotonic() - start:.1f} s)") if retry else ""
                    raise KbertError(e.message(after)) from None
                log.warning("TF Serving at %s unavailable (%s); retrying in %.2g s (%d/%d)", self.target,
                            _short(e.reason), wait, retry + 1, self.retries)
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
        return (f"{self._where()}: {what}{after}; the server is up but not serving the model: wait until it "
                f"has loaded it (its log says), or {_WAIT_HINT}")

    def _unreachable(self, why: str, after: str = "") -> str:
        flag = "--port" if self.protocol == "grpc" else "--rest_api_port"
        longer = f", or {_WAIT_HINT}" if after else ""
        return (f"cannot reach TF Serving at {self.target} over {self._protocol_name} ({why}){after}; is the "
                f"server running at {self.target}? Start tensorflow_model_server with "
                f"{flag}={self.target.rpartition(':')[2]}, fix the address{longer}")

    def _timed_out(self, suffix: str) -> str:
        return (f"{self._where()}: no answer from {self._url(suffix)} within {self.timeout:g} s; raise the "
                f"timeout or check the server's load")


# === Turning values into requests and answers into arrays ===


def _one_line(message: str) -> str:
    """A server's message on one line, without the wrapping TensorFlow puts around an op's error.

    >>> _one_line("indices[0,2] = 9 is not in [0, 3)\\n\\t [[{{function_node __inference_f_12}}{{node GatherV2}}]]")
    'indices[0,2] = 9 is not in [0, 3)'
    """
    return " ".join(_TF_WRAPPING.sub("", message).split())


def _short(message: str, limit: int = 120) -> str:
    return message if len(message) <= limit else message[:limit] + "..."


def _http_error_message(error: urllib.error.HTTPError):
    """TF Serving's {"error": ...}, or the start of whatever else the answer holds."""
    raw = error.read()
    try:
        return json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:300] or error.reason


def _is_text(value) -> bool:
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "SUO"
    if isinstance(value, (list, tuple)):
        return any(_is_text(v) for v in value)
    return False


def _as_bytes(value):
    """Nested str/bytes -> nested bytes (str as UTF-8), kept as lists so no byte is lost."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    if isinstance(value, (list, tuple)):
        return [_as_bytes(v) for v in value]
    raise TypeError(f"expected text (str or bytes), got {type(value).__name__}")


def _json_value(value):
    """A request value as TF Serving's REST API reads it: bytes that are not UTF-8 as {"b64": ...}."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(name: str, array: np.ndarray) -> np.ndarray:
    """String tensors -> object arrays of str (bytes for `*_bytes` outputs)."""
    if array.dtype == object and not name.endswith("_bytes"):
        flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in array.ravel().tolist()]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(array.shape)
    return array


def _from_json(name: str, value, info: dict) -> np.ndarray:
    """One REST output -> an array of the signature's dtype. JSON cannot hold an empty tensor's
    shape, so an empty output takes the signature's shape (0 for sizes it leaves open)."""
    dtype = _NUMPY.get(info.get("dtype"), None)
    if dtype is object:
        def unpack(v):
            if isinstance(v, list):
                return [unpack(x) for x in v]
            return base64.b64decode(v["b64"]) if isinstance(v, dict) and "b64" in v else v
        array = _decode(name, np.array(unpack(value), dtype=object))
    else:
        array = np.asarray(value, dtype=dtype)
    signature_shape = info.get("shape")
    if array.size == 0 and signature_shape and len(signature_shape) > 1:
        array = array.reshape([0] + [max(d, 0) for d in signature_shape[1:]])
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
    examples = [{"text": _as_bytes(t)} for t in texts]
    if texts_b is not None:
        for example, b in zip(examples, _text_list(texts_b, "texts_b", len(texts))):
            example["text_b"] = _as_bytes(b)
    return examples


def _grpc_input(examples):
    from tensorflow.core.example import example_pb2, feature_pb2
    from tensorflow_serving.apis import input_pb2

    protos = [example_pb2.Example(features=feature_pb2.Features(feature={
        k: feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[v])) for k, v in e.items()}))
        for e in examples]
    return input_pb2.Input(example_list=input_pb2.ExampleList(examples=protos))


def _rest_example(example: dict) -> dict:
    return {k: _json_value(v) for k, v in example.items()}


def _results(body: dict):
    # TF Serving's handler writes "results" (api_rest.md's prose says "result").
    results = body.get("results", body.get("result"))
    if results is None:
        raise KbertError(f"the classify/regress answer has no 'results': {str(body)[:200]}")
    return results
