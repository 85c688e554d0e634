"""`Client`'s calls over gRPC: TF Serving's PredictionService and ModelService through
tensorflow-serving-api's stubs (`tensorflow_model_server --port`, 8500 by default).

gRPC's stubs and TF Serving's protos are imported inside the methods that use them: they
import TensorFlow (seconds), which a REST client never needs.
"""

from __future__ import annotations

import numpy as np

from kbert.runtime.errors import KbertError
from kbert.serving.client import NUMPY_DTYPES, Unavailable, as_bytes, decode_strings, is_text, one_line

_MAX_MESSAGE = 2**31 - 1  # tensorflow_model_server accepts messages up to INT_MAX bytes too


class GrpcTransport:
    """The gRPC calls of one `Client`, on a channel of their own (dropped when the server is
    unavailable, see `_drop_channel`). Messages, retries and the model's address come from
    `client`."""

    def __init__(self, client):
        self.client = client
        self._channel = None
        self._stubs = {}

    # === TF Serving's APIs ===

    def predict(self, inputs: dict, signature_name: str, signature: dict | None) -> dict[str, np.ndarray]:
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest(model_spec=self._model_spec(signature_name))
        for name, value in inputs.items():
            dtype = (signature or {}).get("inputs", {}).get(name, {}).get("dtype")
            try:
                if dtype == "DT_STRING":
                    proto = tf.make_tensor_proto(as_bytes(value), dtype=tf.string)
                elif dtype in NUMPY_DTYPES:
                    proto = tf.make_tensor_proto(np.asarray(value, dtype=NUMPY_DTYPES[dtype]))
                else:  # not an input of the signature: the server names the mistake
                    proto = tf.make_tensor_proto(as_bytes(value) if is_text(value) else np.asarray(value))
            except (TypeError, ValueError) as e:
                raise KbertError(
                    f"input {name!r}: cannot make a {dtype or 'tensor'} of it ({one_line(str(e))})"
                ) from None
            request.inputs[name].CopyFrom(proto)
        response = self._call("PredictionService", "Predict", request)
        return {name: decode_strings(name, tf.make_ndarray(proto)) for name, proto in sorted(response.outputs.items())}

    def classify(self, examples: list[dict], signature_name: str) -> list[list[tuple[str, float]]]:
        from tensorflow_serving.apis import classification_pb2

        request = classification_pb2.ClassificationRequest(
            model_spec=self._model_spec(signature_name), input=_input(examples)
        )
        result = self._call("PredictionService", "Classify", request).result
        return [[(c.label, float(c.score)) for c in row.classes] for row in result.classifications]

    def regress(self, examples: list[dict], signature_name: str) -> list[float]:
        from tensorflow_serving.apis import regression_pb2

        request = regression_pb2.RegressionRequest(model_spec=self._model_spec(signature_name), input=_input(examples))
        result = self._call("PredictionService", "Regress", request).result
        return [float(r.value) for r in result.regressions]

    def metadata(self) -> dict:
        """{signature name: {"method_name", "inputs", "outputs"}}, as `Client.metadata` gives it."""
        from tensorflow.core.framework import types_pb2
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=self._model_spec(), metadata_field=["signature_def"]
        )
        response = self._call("PredictionService", "GetModelMetadata", request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)

        def info(tensor):
            shape = None if tensor.tensor_shape.unknown_rank else [d.size for d in tensor.tensor_shape.dim]
            return {"dtype": types_pb2.DataType.Name(tensor.dtype), "shape": shape}

        return {
            name: {
                "method_name": s.method_name,
                "inputs": {k: info(v) for k, v in sorted(s.inputs.items())},
                "outputs": {k: info(v) for k, v in sorted(s.outputs.items())},
            }
            for name, s in signature_map.signature_def.items()
        }

    def status(self) -> dict:
        """GetModelStatus's response as JSON, the same as the REST API's answer."""
        from google.protobuf import json_format
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest(model_spec=self._model_spec())
        return json_format.MessageToDict(self._call("ModelService", "GetModelStatus", request))

    # === Channel and calls ===

    def _model_spec(self, signature_name: str = ""):
        from tensorflow_serving.apis import model_pb2

        spec = model_pb2.ModelSpec(name=self.client.model_name, signature_name=signature_name)
        if self.client.version is not None:
            spec.version.value = self.client.version
        return spec

    def _stub(self, service: str):
        import grpc

        if service not in self._stubs:
            from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    self.client.target,
                    options=[
                        ("grpc.max_send_message_length", _MAX_MESSAGE),
                        ("grpc.max_receive_message_length", _MAX_MESSAGE),
                        # A channel of its own, not one shared through gRPC's global pool: dropping
                        # it (below) must also drop its reconnect back-off.
                        ("grpc.use_local_subchannel_pool", 1),
                    ],
                )
            module = prediction_service_pb2_grpc if service == "PredictionService" else model_service_pb2_grpc
            self._stubs[service] = getattr(module, f"{service}Stub")(self._channel)
        return self._stubs[service]

    def _drop_channel(self):
        """Forget the channel: after a failure it waits out gRPC's own reconnect back-off (up to
        2 minutes) before it tries the server again, where a new channel connects at once."""
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stubs = None, {}

    def _call(self, service: str, method: str, request):
        import grpc

        client = self.client

        def attempt(timeout):
            try:
                return getattr(self._stub(service), method)(request, timeout=timeout)
            except grpc.RpcError as e:
                code, details = e.code(), one_line(e.details() or "")
                if code == grpc.StatusCode.UNAVAILABLE:
                    self._drop_channel()
                    if "connect" in details.lower() or not details:
                        # "failed to connect to all addresses; ...: Connection refused": the last
                        # part says why, enough for the line of each wait.
                        raise Unavailable(
                            details.rsplit(": ", 1)[-1] or "no connection",
                            lambda after: client._unreachable(details, after),
                        ) from None
                    raise Unavailable(
                        details, lambda after: client._not_serving(f"UNAVAILABLE: {details}", after)
                    ) from None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise KbertError(
                        f"{client._where()}: no answer within {client.timeout:g} s (gRPC {method}); "
                        f"raise the timeout or check the server's load"
                    ) from None
                raise KbertError(f"{client._where()}: {code.name}: {details}") from None

        return client._retrying(attempt)


def _input(examples):
    """TF Serving's Input proto for the Classify and Regress APIs: one tf.Example per {feature: bytes}."""
    from tensorflow.core.example import example_pb2, feature_pb2
    from tensorflow_serving.apis import input_pb2

    protos = [
        example_pb2.Example(
            features=feature_pb2.Features(
                feature={k: feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[v])) for k, v in e.items()}
            )
        )
        for e in examples
    ]
    return input_pb2.Input(example_list=input_pb2.ExampleList(examples=protos))
