"""`Client`'s calls over REST: TF Serving's REST API (`tensorflow_model_server
--rest_api_port`, 8501 by default) with the standard library's urllib, no TensorFlow.

JSON has no bytes: string values that are not UTF-8 travel as `{"b64": ...}` both ways, and
outputs named `*_bytes` come back base64-encoded (TF Serving's rule).
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from kbert.runtime.errors import KbertError
from kbert.serving.client import NUMPY_DTYPES, Unavailable, decode_strings, one_line


class RestTransport:
    """The REST calls of one `Client`. Messages, retries and the model's address come from
    `client`."""

    def __init__(self, client):
        self.client = client

    # === TF Serving's APIs ===

    def predict(self, inputs: dict, signature_name: str, signature: dict | None) -> dict[str, np.ndarray]:
        body = self._request(
            "POST",
            ":predict",
            {"signature_name": signature_name, "inputs": {k: _json_value(v) for k, v in inputs.items()}},
        )
        if "outputs" not in body:
            raise KbertError(f"{self.client._where()}: the predict answer has no 'outputs'")
        outputs = (signature or {}).get("outputs", {})
        values = body["outputs"]
        if len(outputs) == 1:  # TF Serving returns a single output bare, without its name
            values = {next(iter(outputs)): values}
        elif not isinstance(values, dict):
            raise KbertError(f"{self.client._where()}: the predict answer's outputs are not named")
        return {name: _from_json(name, value, outputs.get(name, {})) for name, value in sorted(values.items())}

    def classify(self, examples: list[dict], signature_name: str) -> list[list[tuple[str, float]]]:
        body = self._request(
            "POST", ":classify", {"signature_name": signature_name, "examples": [_example(e) for e in examples]}
        )
        return [[(str(label), float(score)) for label, score in row] for row in _results(body)]

    def regress(self, examples: list[dict], signature_name: str) -> list[float]:
        body = self._request(
            "POST", ":regress", {"signature_name": signature_name, "examples": [_example(e) for e in examples]}
        )
        return [float(value) for value in _results(body)]

    def metadata(self) -> dict:
        """{signature name: {"method_name", "inputs", "outputs"}}, as `Client.metadata` gives it."""
        body = self._request("GET", "/metadata")
        try:
            raw = body["metadata"]["signature_def"]["signature_def"]
        except (KeyError, TypeError):
            raise KbertError(
                f"{self.client._where()}: the metadata response has no signature_def; is this TF Serving's REST API?"
            ) from None

        def info(tensor):
            shape = tensor.get("tensor_shape", {})
            dims = None if shape.get("unknown_rank") else [int(d.get("size", 0)) for d in shape.get("dim", [])]
            return {"dtype": tensor.get("dtype", "DT_INVALID"), "shape": dims}

        return {
            name: {
                "method_name": s.get("method_name", ""),
                "inputs": {k: info(v) for k, v in sorted(s.get("inputs", {}).items())},
                "outputs": {k: info(v) for k, v in sorted(s.get("outputs", {}).items())},
            }
            for name, s in raw.items()
        }

    def status(self) -> dict:
        """The model's status: GetModelStatus's response as JSON."""
        return self._request("GET", "")

    # === Requests ===

    def _url(self, suffix: str) -> str:
        client = self.client
        version = "" if client.version is None else f"/versions/{client.version}"
        return f"{client.address}/v1/models/{urllib.parse.quote(client.model_name, safe='')}{version}{suffix}"

    def _request(self, method: str, suffix: str, body: dict | None = None) -> dict:
        client = self.client
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(
            self._url(suffix), data=data, method=method, headers={"Content-Type": "application/json"}
        )

        def attempt(timeout):
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                message = one_line(str(_http_error_message(e)))
                if e.code == 503:  # TF Serving's UNAVAILABLE
                    raise Unavailable(
                        f"HTTP 503: {message}", lambda after: client._not_serving(f"HTTP 503: {message}", after)
                    ) from None
                raise KbertError(f"{client._where()}: HTTP {e.code}: {message}") from None
            except urllib.error.URLError as e:
                if isinstance(e.reason, (TimeoutError, socket.timeout)):
                    raise KbertError(self._timed_out(suffix)) from None
                if isinstance(e.reason, ConnectionError):  # refused or reset: down or restarting
                    raise self._unavailable(e.reason) from None
                raise KbertError(client._unreachable(str(e.reason))) from None
            except TimeoutError:
                raise KbertError(self._timed_out(suffix)) from None
            except (ConnectionError, http.client.IncompleteRead) as e:  # the server went away mid-answer
                raise self._unavailable(e) from None

        raw = client._retrying(attempt)
        try:
            return json.loads(raw)
        except ValueError:
            raise KbertError(
                f"{client._where()}: the answer to {method} {self._url(suffix)} is not JSON; "
                f"is this TF Serving's REST port?"
            ) from None

    def _unavailable(self, error: Exception) -> Unavailable:
        why = str(error) or type(error).__name__
        return Unavailable(why, lambda after: self.client._unreachable(why, after))

    def _timed_out(self, suffix: str) -> str:
        return (
            f"{self.client._where()}: no answer from {self._url(suffix)} within {self.client.timeout:g} s; "
            f"raise the timeout or check the server's load"
        )


# === JSON values ===


def _http_error_message(error: urllib.error.HTTPError):
    """TF Serving's {"error": ...}, or the start of whatever else the answer holds."""
    raw = error.read()
    try:
        return json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:300] or error.reason


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


def _from_json(name: str, value, info: dict) -> np.ndarray:
    """One REST output -> an array of the signature's dtype. JSON cannot hold an empty tensor's
    shape, so an empty output takes the signature's shape (0 for sizes it leaves open)."""
    dtype = NUMPY_DTYPES.get(info.get("dtype"), None)
    if dtype is object:

        def unpack(v):
            if isinstance(v, list):
                return [unpack(x) for x in v]
            return base64.b64decode(v["b64"]) if isinstance(v, dict) and "b64" in v else v

        array = decode_strings(name, np.array(unpack(value), dtype=object))
    else:
        array = np.asarray(value, dtype=dtype)
    signature_shape = info.get("shape")
    if array.size == 0 and signature_shape and len(signature_shape) > 1:
        array = array.reshape([0] + [max(d, 0) for d in signature_shape[1:]])
    return array


def _example(example: dict) -> dict:
    return {k: _json_value(v) for k, v in example.items()}


def _results(body: dict):
    # TF Serving's handler writes "results" (api_rest.md's prose says "result").
    results = body.get("results", body.get("result"))
    if results is None:
        raise KbertError(f"the classify/regress answer has no 'results': {str(body)[:200]}")
    return results
