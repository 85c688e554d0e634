"""A stand-in for tensorflow_model_server, used only by the tests.

The real server cannot be installed on the machines these tests run on, so this one plays its
part for `kbert.serving.Client` and `kbert predict --server`: it serves the newest all-digit
version under EXPORT_BASE (or --version), or each model of the models.config files given with
--model_config_file, on 127.0.0.1 only, over gRPC (PredictionService: Predict, Classify,
Regress, GetModelMetadata; ModelService: GetModelStatus) and over TF Serving's REST API.

It loads a SavedModel the way TF Serving does: a TF1 session on a fresh graph (`import
tensorflow_text` first, as TF Serving links those ops in), then runs a signature by feeding its
input tensors and fetching its output tensors by the names in the signature_def; it replays
`assets.extra/tf_serving_warmup_requests` first (a failing warmup fails the load, as in TF
Serving). What TF Serving checks, it checks, with TF Serving's status codes and messages
(tensorflow_serving/servables/tensorflow/predict_util.cc, classifier.cc, regressor.cc, util.cc,
tensorflow/cc/saved_model/util.cc, model_servers/http_rest_api_handler.cc, util/json_tensor.cc):

- a model name or version it does not serve: NOT_FOUND "Servable not found for request: ...";
- Predict: an unknown signature is FAILED_PRECONDITION ("Serving signature key ... not
  found."), over REST INVALID_ARGUMENT; missing or extra inputs INVALID_ARGUMENT; a tensor of
  the wrong dtype INVALID_ARGUMENT; a TF error while running (check_numerics, an id past the
  vocabulary) its own code (INVALID_ARGUMENT) and message;
- Classify/Regress: "No signature was found with the name: ..."; one input named `inputs`;
  `classes`/`scores` ([batch, C] string and float) or `outputs` ([batch] or [batch, 1] float);
  an empty request "Input is empty."; with --enable_signature_method_name_check (off by default,
  as in TF Serving) the method names tensorflow/serving/classify and /regress;
- REST: /v1/models/NAME[/versions/N|/labels/L][:predict|:classify|:regress|/metadata], columnar
  "inputs" -> "outputs" (one output bare, not in an object; names the signature lacks are
  ignored), row "instances" -> "predictions", {"b64": ...} strings, "examples" (+ "context") ->
  {"results": ...}, errors as {"error": ...} with TF Serving's HTTP codes (400 for
  INVALID_ARGUMENT and FAILED_PRECONDITION, 404 for NOT_FOUND); gRPC messages are cut at 1024
  characters, as TF Serving cuts them.

Not served: version labels, several versions of one model, batching, the Prometheus and
MultiInference endpoints, model reloading.

Run: `python tests/serving/standin_server.py EXPORT_BASE --model-name NAME --grpc-port 0 --rest-port 0`
(or `--model_config_file EXPORT_BASE/models.config`, repeatable); it prints one JSON line,
{"grpc_port", "rest_port", "models": {name: version}, "warmup_requests": {name: count}}, when
it serves, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import http.server
import json
import os
import re
import signal
import sys
import threading
import urllib.parse

import numpy as np

# tests/reference/serving_session.py: a SavedModel in a TF1 session, as TF Serving loads it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference"))

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"
# TF Serving's REST paths (model_servers/http_rest_api_util.cc).
PREDICTION_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)", re.IGNORECASE
)
STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?", re.IGNORECASE
)
# TF error codes are gRPC's; TF Serving answers REST with these HTTP codes (http_server.cc).
HTTP_STATUS = {
    0: 200,
    1: 499,
    2: 500,
    3: 400,
    4: 504,
    5: 404,
    6: 409,
    7: 403,
    8: 429,
    9: 400,
    10: 409,
    11: 400,
    12: 501,
    13: 500,
    14: 503,
    15: 500,
    16: 401,
}
OK, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNIMPLEMENTED, INTERNAL = 0, 3, 5, 9, 12, 13
GRPC_MESSAGE_LIMIT = 1024


class ServingError(Exception):
    """A request that fails with a TF status code (gRPC's numbering) and message."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class Model:
    """One loaded version: a TF1 session on the SavedModel's graph and its signature_defs."""

    def __init__(self, name: str, path: str, version: int, check_method_names: bool):
        import tensorflow as tf

        from serving_session import ServingSession  # tests/reference: TF Serving's session, tensorflow_text's ops

        self.tf = tf
        self.name, self.path, self.version = name, path, version
        self.check_method_names = check_method_names
        loaded = ServingSession(path)
        self.graph, self.session, self.signatures = loaded.graph, loaded.session, loaded.signatures

    # === The APIs (the request's model_spec already led here) ===

    def predict(self, request):
        from tensorflow_serving.apis import predict_pb2

        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in self.signatures:
            raise ServingError(FAILED_PRECONDITION, f'Serving signature key "{name}" not found.')
        signature = self.signatures[name]
        if self.check_method_names and signature.method_name not in (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
            raise ServingError(
                INTERNAL,
                f"Expected prediction signature method_name to be one of "
                f"{{{PREDICT_METHOD}, {CLASSIFY_METHOD}, {REGRESS_METHOD}}}. "
                f"Was: {signature.method_name}",
            )
        sent, expected = set(request.inputs), set(signature.inputs)
        if len(sent) != len(expected):
            raise ServingError(
                INVALID_ARGUMENT,
                (
                    f"input size does not match signature: {len(sent)}!={len(expected)} len({{{','.join(sorted(sent))}}}) "
                    f"!= len({{{','.join(sorted(expected))}}}). Sent extra: {{{','.join(sorted(sent - expected))}}}. "
                    f"Missing but required: {{{','.join(sorted(expected - sent))}}}."
                ),
            )
        feeds = {}
        for alias, info in sorted(signature.inputs.items()):
            if alias not in request.inputs:
                raise ServingError(
                    INVALID_ARGUMENT,
                    (
                        f"Signature input alias: {alias}(feed name: {info.name}) not found in request and no default "
                        f"value provided. Inputs expected to be in the request {{{','.join(sorted(sent))}}}, or "
                        f"default input alias set: "
                    ),
                )
            feeds[info.name] = self.tensor(alias, request.inputs[alias], info)
        aliases = list(request.output_filter) or sorted(signature.outputs)
        for alias in aliases:
            if alias not in signature.outputs:
                raise ServingError(
                    INVALID_ARGUMENT,
                    f"output tensor alias not found in signature: {alias} Outputs "
                    f"expected to be in the set {{{','.join(sorted(signature.outputs))}}}.",
                )
        values = self.run([signature.outputs[a].name for a in aliases], feeds)
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(self.response_spec(name))
        for alias, value in zip(aliases, values):
            response.outputs[alias].CopyFrom(as_proto_field(self.tf, value))
        return response

    def classify(self, request):
        from tensorflow_serving.apis import classification_pb2

        name, signature = self.api_signature(request.model_spec, CLASSIFY_METHOD, "classification")
        if len(signature.inputs) != 1:
            raise ServingError(INVALID_ARGUMENT, "Expected one input Tensor.")
        if len(signature.outputs) not in (1, 2):
            raise ServingError(INVALID_ARGUMENT, f"Expected one or two output Tensors, found {len(signature.outputs)}")
        if "inputs" not in signature.inputs:
            raise ServingError(INVALID_ARGUMENT, f"No classification inputs found in SignatureDef: {signature}")
        keys = [k for k in ("classes", "scores") if k in signature.outputs]
        if not keys:
            raise ServingError(
                INVALID_ARGUMENT,
                "Expected classification signature outputs to contain at least "
                f'one of "classes" or "scores". Signature was: {signature}',
            )
        examples = serialized_examples(request.input)
        values = dict(
            zip(keys, self.run([signature.outputs[k].name for k in keys], {signature.inputs["inputs"].name: examples}))
        )
        classes, scores = values.get("classes"), values.get("scores")
        for key, value, dtype in (("classes", classes, object), ("scores", scores, np.float32)):
            if value is None:
                continue
            if value.ndim != 2:
                raise ServingError(
                    INVALID_ARGUMENT, f"Expected Tensor shape: [batch_size num_classes] but got {list(value.shape)}"
                )
            if value.dtype != dtype:
                raise ServingError(
                    INVALID_ARGUMENT,
                    f"Expected {key} Tensor of {'DT_STRING' if dtype is object else 'DT_FLOAT'}. Got: {value.dtype}",
                )
            if value.shape[0] != len(examples):
                raise ServingError(
                    INVALID_ARGUMENT, f"Expected {key} output batch size of {len(examples)}. Got: {value.shape[0]}"
                )
        if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
            raise ServingError(
                INVALID_ARGUMENT,
                f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. {scores.shape[1]}",
            )
        response = classification_pb2.ClassificationResponse()
        response.model_spec.CopyFrom(self.response_spec(name))
        for i in range(len(examples)):
            row = response.result.classifications.add()
            for c in range((classes if classes is not None else scores).shape[1]):
                cls = row.classes.add()
                if classes is not None:
                    cls.label = classes[i, c].decode("utf-8")
                if scores is not None:
                    cls.score = float(scores[i, c])
        return response

    def regress(self, request):
        from tensorflow_serving.apis import regression_pb2

        name, signature = self.api_signature(request.model_spec, REGRESS_METHOD, "regression")
        if len(signature.inputs) != 1:
            raise ServingError(INVALID_ARGUMENT, "Expected one input Tensor.")
        if len(signature.outputs) != 1:
            raise ServingError(INVALID_ARGUMENT, "Expected one output Tensor.")
        if "inputs" not in signature.inputs:
            raise ServingError(INVALID_ARGUMENT, f"No regression inputs found in SignatureDef: {signature}")
        if "outputs" not in signature.outputs:
            raise ServingError(INVALID_ARGUMENT, f"No regression outputs found in SignatureDef: {signature}")
        examples = serialized_examples(request.input)
        (value,) = self.run([signature.outputs["outputs"].name], {signature.inputs["inputs"].name: examples})
        if not (value.ndim == 1 or (value.ndim == 2 and value.shape[1] == 1)):
            raise ServingError(
                INVALID_ARGUMENT,
                f"Expected output Tensor shape to be either [batch_size] or "
                f"[batch_size, 1] but got {list(value.shape)}",
            )
        if value.shape[0] != len(examples):
            raise ServingError(
                INVALID_ARGUMENT,
                f"Input batch size did not match output batch size: {len(examples)} vs. {value.shape[0]}",
            )
        if value.dtype != np.float32:
            raise ServingError(INVALID_ARGUMENT, f"Expected output Tensor of DT_FLOAT.  Got: {value.dtype}")
        response = regression_pb2.RegressionResponse()
        response.model_spec.CopyFrom(self.response_spec(name))
        for v in value.reshape(-1):
            response.result.regressions.add().value = float(v)
        return response

    def metadata(self, request):
        from tensorflow_serving.apis import get_model_metadata_pb2

        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for name, signature in self.signatures.items():
            signature_map.signature_def[name].CopyFrom(signature)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = self.name
        response.model_spec.version.value = self.version
        response.metadata["signature_def"].Pack(signature_map)
        return response

    # === Running the graph ===

    def api_signature(self, spec, method_name: str, what: str):
        name = spec.signature_name or DEFAULT_SIGNATURE
        if name not in self.signatures:
            raise ServingError(INVALID_ARGUMENT, f"No signature was found with the name: {name}")
        signature = self.signatures[name]
        if self.check_method_names and signature.method_name != method_name:
            raise ServingError(
                INVALID_ARGUMENT,
                f"Expected {what} signature method_name to be {method_name}. Was: {signature.method_name}",
            )
        return name, signature

    def tensor(self, alias: str, proto, info) -> np.ndarray:
        """A request's TensorProto as the session's feed; its dtype must be the signature's (a
        C++ session refuses another, where Python's would convert it)."""
        try:
            value = self.tf.make_ndarray(proto)
        except Exception:
            raise ServingError(INVALID_ARGUMENT, f"tensor parsing error: {alias}") from None
        if proto.dtype != info.dtype:
            want, got = (self.tf.as_dtype(d).name for d in (info.dtype, proto.dtype))
            raise ServingError(INVALID_ARGUMENT, f"Expects arg[{alias}] to be {want} but {got} is provided")
        return value

    def run(self, fetches: list[str], feeds: dict) -> list[np.ndarray]:
        try:
            return self.session.run(fetches, feeds)
        except self.tf.errors.OpError as e:
            # Python's session adds this line; the C++ session TF Serving runs does not.
            raise ServingError(e.error_code, re.sub(r"^Graph execution error:\s*", "", e.message)) from None
        except (ValueError, TypeError) as e:  # a feed the graph cannot take (shape)
            raise ServingError(INVALID_ARGUMENT, str(e)) from None

    def response_spec(self, signature_name: str):
        from tensorflow_serving.apis import model_pb2

        spec = model_pb2.ModelSpec(name=self.name, signature_name=signature_name)
        spec.version.value = self.version
        return spec

    def warm_up(self):
        """Replay the export's warmup requests, as TF Serving does at load."""
        from tensorflow_serving.apis import prediction_log_pb2

        path = os.path.join(self.path, "assets.extra", "tf_serving_warmup_requests")
        if not os.path.exists(path):
            return 0
        count = 0
        for record in self.tf.data.TFRecordDataset(path):
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            kind = log.WhichOneof("log_type")
            run = {"predict_log": self.predict, "classify_log": self.classify, "regress_log": self.regress}.get(kind)
            if run is None:
                raise ServingError(UNIMPLEMENTED, f"Unsupported log_type for warmup: {kind}")
            request = getattr(log, kind).request
            request.model_spec.name = self.name  # TF Serving sends warmup to the servable it loads
            request.model_spec.ClearField("version")
            run(request)
            count += 1
        return count


class Servables:
    """The loaded models by name: finds the one a request's ModelSpec names, as ServerCore does."""

    def __init__(self, models: dict):
        self.models = models

    def find(self, spec) -> Model:
        model = self.models.get(spec.name)
        if spec.HasField("version"):
            request = f"Specific({spec.name}, {spec.version.value})"
            found = model is not None and spec.version.value == model.version
        elif spec.version_label:
            request = f"Specific({spec.name}, label {spec.version_label})"
            found = False  # no labels are assigned here, as without a models.config that sets them
        else:
            request, found = f"Latest({spec.name})", model is not None
        if not found:
            raise ServingError(NOT_FOUND, f"Servable not found for request: {request}")
        return model

    def predict(self, request):
        return self.find(request.model_spec).predict(request)

    def classify(self, request):
        return self.find(request.model_spec).classify(request)

    def regress(self, request):
        return self.find(request.model_spec).regress(request)

    def metadata(self, request):
        if not request.HasField("model_spec"):
            raise ServingError(INVALID_ARGUMENT, "Missing ModelSpec")
        if not request.metadata_field:
            raise ServingError(INVALID_ARGUMENT, "GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                raise ServingError(INVALID_ARGUMENT, f"Metadata field {field} is not supported")
        return self.find(request.model_spec).metadata(request)

    def status(self, request):
        from tensorflow_serving.apis import get_model_status_pb2

        if not request.HasField("model_spec"):
            raise ServingError(INVALID_ARGUMENT, "Missing ModelSpec")
        spec = request.model_spec
        model = self.models.get(spec.name)
        if spec.HasField("version") and (model is None or spec.version.value != model.version):
            raise ServingError(NOT_FOUND, f"Could not find version {spec.version.value} of model {spec.name}")
        if model is None:
            raise ServingError(NOT_FOUND, f"Could not find any versions of model {spec.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        status = response.model_version_status.add()
        status.version = model.version
        status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        status.status.SetInParent()  # OK, with an empty message: TF Serving always sets it
        return response


def as_proto_field(tf, value: np.ndarray):
    """A TensorProto with typed repeated fields (float_val, string_val, ...), the form TF
    Serving's Predict answers in (Tensor::AsProtoField), not tensor_content."""
    from tensorflow.core.framework import tensor_pb2

    dtype = tf.as_dtype(value.dtype)
    proto = tensor_pb2.TensorProto(dtype=dtype.as_datatype_enum, tensor_shape=tf.TensorShape(value.shape).as_proto())
    field = {
        tf.float32: "float_val",
        tf.float64: "double_val",
        tf.int32: "int_val",
        tf.int16: "int_val",
        tf.int8: "int_val",
        tf.uint8: "int_val",
        tf.int64: "int64_val",
        tf.string: "string_val",
        tf.bool: "bool_val",
    }[dtype]
    getattr(proto, field).extend(value.reshape(-1).tolist())
    return proto


def serialized_examples(model_input) -> np.ndarray:
    """An Input proto's examples as serialized tf.Examples; with a context, its bytes go first, so
    parsing merges them (util.cc's InputToSerializedExampleTensor)."""
    kind = model_input.WhichOneof("kind")
    if kind == "example_list":
        examples = [e.SerializeToString() for e in model_input.example_list.examples]
    elif kind == "example_list_with_context":
        context = model_input.example_list_with_context.context.SerializeToString()
        examples = [context + e.SerializeToString() for e in model_input.example_list_with_context.examples]
    else:
        examples = []
    if not examples:
        raise ServingError(INVALID_ARGUMENT, "Input is empty.")
    return np.array(examples, dtype=object)


# === gRPC ===


def grpc_server(servables: Servables, port: int, workers: int):
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    codes = {c.value[0]: c for c in grpc.StatusCode}

    def handler(method):
        def call(request, context):
            try:
                return method(request)
            except ServingError as e:
                message = (
                    e.message
                    if len(e.message) <= GRPC_MESSAGE_LIMIT
                    else e.message[:GRPC_MESSAGE_LIMIT] + "...TRUNCATED"
                )
                context.abort(codes.get(e.code, grpc.StatusCode.UNKNOWN), message)

        return call

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        Predict = staticmethod(handler(servables.predict))
        Classify = staticmethod(handler(servables.classify))
        Regress = staticmethod(handler(servables.regress))
        GetModelMetadata = staticmethod(handler(servables.metadata))

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        GetModelStatus = staticmethod(handler(servables.status))

    limit = 2**31 - 1  # tensorflow_model_server's limit: INT_MAX
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=workers),
        options=[("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)],
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if not bound:
        raise SystemExit(f"standin_server: cannot listen on 127.0.0.1:{port} (gRPC)")
    server.start()
    return server, bound


# === REST ===


class RestApi:
    """TF Serving's REST handler: JSON -> the same request protos as gRPC -> JSON."""

    def __init__(self, servables: Servables):
        self.servables = servables

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str]:
        try:
            return 200, self.dispatch(method, path, body)
        except ServingError as e:
            return HTTP_STATUS.get(e.code, 500), json.dumps({"error": e.message}, indent=1)

    def dispatch(self, method: str, path: str, body: bytes) -> str:
        path = urllib.parse.urlsplit(path).path
        malformed = ServingError(INVALID_ARGUMENT, f"Malformed request: {method} {path}")
        pattern = PREDICTION_PATH if method == "POST" else STATUS_PATH if method == "GET" else None
        match = pattern and pattern.fullmatch(path)
        if not match:
            raise malformed
        name, version, label, verb = match.groups()
        name = urllib.parse.unquote(name or "")
        spec = self.spec(name, version, label)
        if method == "POST":
            return {"predict": self.predict, "classify": self.classify, "regress": self.regress}[verb.lower()](
                spec, body
            )
        if not name:
            raise ServingError(INVALID_ARGUMENT, "Missing model name in request.")
        if verb:
            return self.metadata(spec)
        from google.protobuf import json_format
        from tensorflow_serving.apis import get_model_status_pb2

        response = self.servables.status(get_model_status_pb2.GetModelStatusRequest(model_spec=spec))
        return json_format.MessageToJson(response, always_print_fields_with_no_presence=True, indent=1)

    @staticmethod
    def spec(name, version, label):
        from tensorflow_serving.apis import model_pb2

        spec = model_pb2.ModelSpec(name=name)
        if version:
            spec.version.value = int(version)
        if label:
            spec.version_label = urllib.parse.unquote(label)
        return spec

    def predict(self, spec, body: bytes) -> str:
        from tensorflow_serving.apis import predict_pb2

        doc = parse_json(body)
        request = predict_pb2.PredictRequest(model_spec=spec)
        request.model_spec.signature_name = signature_name(doc)
        # The input dtypes come from the signature, looked up before anything else (GetInfoMap).
        model = self.servables.find(spec)
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in model.signatures:
            raise ServingError(INVALID_ARGUMENT, f'Serving signature name: "{name}" not found in signature def')
        infos = model.signatures[name].inputs
        if not infos:
            raise ServingError(INVALID_ARGUMENT, f"Failed to get input map for signature: {name}")
        if "instances" in doc and "inputs" in doc:
            raise ServingError(
                INVALID_ARGUMENT,
                f"JSON Value: {short(doc)} Not formatted correctly expecting only "
                f"one of 'inputs' or 'instances' keys to exist ",
            )
        if "instances" in doc:
            row_format = True
            tensors = tensors_from_instances(doc, infos)
        elif "inputs" in doc:
            row_format = False
            tensors = tensors_from_inputs(doc["inputs"], infos)
        else:
            raise ServingError(INVALID_ARGUMENT, "Missing 'inputs' or 'instances' key")
        for alias, value in tensors.items():
            request.inputs[alias].CopyFrom(model.tf.make_tensor_proto(value, dtype=infos[alias].dtype))
        response = model.predict(request)
        outputs = {alias: model.tf.make_ndarray(proto) for alias, proto in sorted(response.outputs.items())}
        return json_from_outputs(outputs, row_format)

    def classify(self, spec, body: bytes) -> str:
        from tensorflow_serving.apis import classification_pb2

        request = classification_pb2.ClassificationRequest(model_spec=spec)
        fill_examples(parse_json(body), request)
        result = self.servables.classify(request).result
        if not result.classifications:
            raise ServingError(INVALID_ARGUMENT, "Cannot convert empty ClassificationResults to JSON")
        return json.dumps(
            {
                "results": [
                    [[c.label, float(np.float32(c.score))] for c in row.classes] for row in result.classifications
                ]
            },
            indent=1,
        )

    def regress(self, spec, body: bytes) -> str:
        from tensorflow_serving.apis import regression_pb2

        request = regression_pb2.RegressionRequest(model_spec=spec)
        fill_examples(parse_json(body), request)
        result = self.servables.regress(request).result
        if not result.regressions:
            raise ServingError(INVALID_ARGUMENT, "Cannot convert empty RegressionResults to JSON")
        return json.dumps({"results": [float(np.float32(r.value)) for r in result.regressions]}, indent=1)

    def metadata(self, spec) -> str:
        from google.protobuf import json_format
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest(model_spec=spec, metadata_field=["signature_def"])
        response = self.servables.metadata(request)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)

        def as_json(message):
            return json_format.MessageToDict(
                message, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
            )

        return json.dumps(
            {"model_spec": as_json(response.model_spec), "metadata": {"signature_def": as_json(signature_map)}},
            indent=1,
        )


def short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."


def parse_json(body: bytes) -> dict:
    if not body:
        raise ServingError(INVALID_ARGUMENT, "JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ServingError(INVALID_ARGUMENT, f"JSON Parse error: {e}") from None
    if not isinstance(doc, dict):
        raise ServingError(INVALID_ARGUMENT, f"JSON Value: {short(doc)} Is not object")
    return doc


def signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise ServingError(
            INVALID_ARGUMENT,
            f"JSON Value: {short(doc)} not formatted correctly. 'signature_name' key must be a string value.",
        )
    return name


def is_b64(value) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"] and isinstance(value["b64"], str)


def json_tensor(value, info) -> np.ndarray:
    """A JSON value as a tensor of the signature's dtype: nested lists, all leaves at one depth;
    a string may be {"b64": ...}."""
    from tensorflow.core.framework import types_pb2

    shape, probe = [], value
    while isinstance(probe, list):
        shape.append(len(probe))
        probe = probe[0] if probe else None
    leaves = []

    def walk(v, level):
        if isinstance(v, list):
            if level >= len(shape):
                raise ServingError(
                    INVALID_ARGUMENT, f"Encountered list at unexpected level: {level} expected < {len(shape)}"
                )
            if len(v) != shape[level]:
                raise ServingError(
                    INVALID_ARGUMENT,
                    f"Encountered list at unexpected size: {len(v)} at level: {level} expected size: {shape[level]}",
                )
            for x in v:
                walk(x, level + 1)
            return
        if level != len(shape):
            raise ServingError(
                INVALID_ARGUMENT,
                f"JSON Value: {short(v)} found at incorrect level: {level + 1} in "
                f"the JSON DOM. Expected at level: {len(shape)}",
            )
        leaves.append(json_leaf(v, info.dtype, types_pb2))

    walk(value, 0)
    import tensorflow as tf

    dtype = tf.as_dtype(info.dtype).as_numpy_dtype
    array = np.empty(len(leaves), dtype=dtype)
    array[:] = leaves
    return array.reshape(shape)


def json_leaf(v, dtype, types_pb2):
    name = types_pb2.DataType.Name(dtype)
    wrong = ServingError(
        INVALID_ARGUMENT, f"JSON Value: {short(v)} Type: {type(v).__name__} is not of expected type: {name[3:].lower()}"
    )
    if dtype == types_pb2.DT_STRING:
        if is_b64(v):
            try:
                return base64.b64decode(v["b64"], validate=True)
            except ValueError:
                raise ServingError(INVALID_ARGUMENT, "Unable to base64 decode") from None
        if isinstance(v, dict):
            raise ServingError(INVALID_ARGUMENT, f"JSON Value: {short(v)} not formatted correctly for base64 data")
        if not isinstance(v, str):
            raise wrong
        return v.encode("utf-8", "surrogatepass")
    if dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise wrong
        return float(v)
    if dtype == types_pb2.DT_BOOL:
        if not isinstance(v, bool):
            raise wrong
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise wrong
    info = np.iinfo(
        np.dtype({"DT_INT64": np.int64, "DT_UINT64": np.uint64, "DT_UINT32": np.uint32}.get(name, np.int32))
    )
    if not info.min <= v <= info.max:
        raise wrong
    return v


def tensors_from_inputs(value, infos) -> dict:
    """Columnar "inputs": a bare value for a one-input signature, else an object with every input
    (extra names are ignored, as TF Serving ignores them)."""
    if not isinstance(value, dict) or is_b64(value):
        if len(infos) > 1:
            raise ServingError(
                INVALID_ARGUMENT,
                "inputs is a plain value/list, but expecting an object as multiple "
                "input tensors required as per tensorinfo_map",
            )
        alias = next(iter(infos))
        return {alias: json_tensor(value, infos[alias])}
    tensors = {}
    for alias in sorted(infos):
        if alias not in value:
            raise ServingError(INVALID_ARGUMENT, f"Missing named input: {alias} in 'inputs' object.")
        tensors[alias] = json_tensor(value[alias], infos[alias])
    return tensors


def tensors_from_instances(doc, infos) -> dict:
    """Row "instances": a list of values (one-input signatures) or of objects, batched."""
    instances = doc["instances"]
    if not isinstance(instances, list):
        raise ServingError(INVALID_ARGUMENT, f"JSON Value: {short(doc)} Expecting 'instances' to be an list/array")
    if not instances:
        raise ServingError(INVALID_ARGUMENT, f"JSON Value: {short(doc)} No values in 'instances' array")
    objects = isinstance(instances[0], dict) and not is_b64(instances[0])
    if not objects and len(infos) > 1:
        raise ServingError(
            INVALID_ARGUMENT,
            "instances is a plain list, but expecting list of objects as multiple "
            "input tensors required as per tensorinfo_map",
        )
    rows = {alias: [] for alias in infos}
    for i, item in enumerate(instances):
        if objects != (isinstance(item, dict) and not is_b64(item)):
            raise ServingError(
                INVALID_ARGUMENT,
                f"Expecting {'object but got list' if objects else 'value/list but got object'}"
                f" at item {i} of input list",
            )
        if objects:
            unknown = sorted(set(item) - set(infos))
            if unknown:
                raise ServingError(
                    INVALID_ARGUMENT,
                    f"Failed to process element: {i} key: {unknown[0]} of 'instances' "
                    f"list. Error: JSON object: does not have named input: {unknown[0]}",
                )
            if set(item) != set(infos):
                raise ServingError(
                    INVALID_ARGUMENT,
                    f"Failed to process element: {i} of 'instances' list. JSON object: "
                    f"{short(item)} keys must be equal to: {','.join(sorted(infos))}",
                )
            for alias in infos:
                rows[alias].append(json_tensor(item[alias], infos[alias]))
        else:
            alias = next(iter(infos))
            rows[alias].append(json_tensor(item, infos[alias]))
    tensors = {}
    for alias, parts in rows.items():
        if len({p.shape for p in parts}) != 1:
            raise ServingError(
                INVALID_ARGUMENT,
                f"Expecting shape {list(parts[0].shape)} but got: "
                f"{[list(p.shape) for p in parts if p.shape != parts[0].shape][0]}",
            )
        tensors[alias] = np.stack(parts)
    return tensors


def json_value(alias: str, value: np.ndarray):
    """An output tensor as JSON: strings as text, or {"b64": ...} for outputs named *_bytes."""
    if value.dtype == object:
        as_bytes = alias.endswith("_bytes")

        def text(v):
            if isinstance(v, list):
                return [text(x) for x in v]
            return {"b64": base64.b64encode(v).decode("ascii")} if as_bytes else v.decode("utf-8", "replace")

        return text(value.tolist())
    if value.dtype in (np.float32, np.float64):
        return value.astype(np.float64).tolist()  # exact: every float32 is a float64
    return value.tolist()


def json_from_outputs(outputs: dict, row_format: bool) -> str:
    if not outputs:
        raise ServingError(INVALID_ARGUMENT, "Cannot convert empty tensor map to JSON")
    if not row_format:
        values = {alias: json_value(alias, v) for alias, v in outputs.items()}
        return json.dumps({"outputs": next(iter(values.values())) if len(values) == 1 else values}, indent=1)
    sizes = set()
    for alias, v in outputs.items():
        if v.ndim == 0:
            raise ServingError(INVALID_ARGUMENT, f"Tensor name: {alias} has no shape information ")
        sizes.add(v.shape[0])
    if len(sizes) > 1:
        raise ServingError(INVALID_ARGUMENT, f"Tensor name: {sorted(outputs)[-1]} has inconsistent batch size")
    rows = []
    for i in range(sizes.pop()):
        items = {alias: json_value(alias, v[i : i + 1])[0] for alias, v in outputs.items()}
        rows.append(next(iter(items.values())) if len(items) == 1 else items)
    return json.dumps({"predictions": rows}, indent=1)


def fill_examples(doc: dict, request):
    """Classify/Regress JSON: "examples" (and an optional "context") -> the request's Input."""
    from tensorflow.core.example import example_pb2

    request.model_spec.signature_name = signature_name(doc)
    if "context" in doc:
        make_example(doc["context"], request.input.example_list_with_context.context)
    examples = doc.get("examples")
    if examples is None:
        raise ServingError(
            INVALID_ARGUMENT,
            f"JSON Value: {short(doc)} When method is classify, key 'examples' is expected and was not found",
        )
    if not isinstance(examples, list):
        raise ServingError(INVALID_ARGUMENT, f"JSON Value: {short(doc)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise ServingError(INVALID_ARGUMENT, f"JSON Value: {short(doc)} 'examples' value is an empty array")
    target = (
        request.input.example_list_with_context.examples if "context" in doc else request.input.example_list.examples
    )
    for value in examples:
        example = example_pb2.Example()
        make_example(value, example)
        target.append(example)


def make_example(value, example):
    """A JSON object of feature -> value or list: strings and {"b64"} are bytes, whole numbers
    int64, others float (json_tensor.cc's MakeExampleFromJsonObject)."""
    if not isinstance(value, dict):
        raise ServingError(INVALID_ARGUMENT, f"Example must be JSON object but got JSON {type(value).__name__}")
    for name, content in value.items():
        feature = example.features.feature[name]
        for v in content if isinstance(content, list) else [content]:
            if isinstance(v, str) or is_b64(v):
                kind, item = (
                    "bytes_list",
                    base64.b64decode(v["b64"]) if is_b64(v) else v.encode("utf-8", "surrogatepass"),
                )
            elif isinstance(v, bool) or isinstance(v, int):
                kind, item = "int64_list", int(v)
            elif isinstance(v, float):
                kind, item = "float_list", v
            else:
                raise ServingError(
                    INVALID_ARGUMENT, f"Feature: {name} has element with unexpected JSON type: {type(v).__name__}"
                )
            current = feature.WhichOneof("kind")
            if current not in (None, kind):
                raise ServingError(
                    INVALID_ARGUMENT,
                    f"Unexpected element type in feature: {name} expecting type: {current.split('_')[0]}",
                )
            getattr(feature, kind).value.append(item)


def rest_server(api: RestApi, port: int):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, method):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, text = api.handle(method, self.path, body)
            data = text.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer("GET")

        def do_POST(self):
            self.answer("POST")

        def log_message(self, *args):  # quiet, as tests read stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


# === Command line ===


def newest_version(export_base: str) -> int:
    versions = [int(n) for n in os.listdir(export_base) if n.isdigit() and os.path.isdir(os.path.join(export_base, n))]
    if not versions:
        raise SystemExit(f"standin_server: no version directory (all digits) under {export_base}")
    return max(versions)


def read_model_config(path: str) -> list[tuple[str, str]]:
    """(name, base_path) of each `config { ... }` in a model_config_list text proto (the
    models.config kbert export writes); other fields are ignored."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"#[^\n]*", "", f.read())
    models = [
        (re.search(r'name:\s*"([^"]*)"', block), re.search(r'base_path:\s*"([^"]*)"', block))
        for block in re.findall(r"config\s*\{([^{}]*)\}", text)
    ]
    if not models or not all(name and base for name, base in models):
        raise SystemExit(
            f"standin_server: {path}: expected model_config_list {{ config {{ name: ... base_path: ... }} }}"
        )
    return [(name.group(1), base.group(1)) for name, base in models]


def main(argv=None):
    parser = argparse.ArgumentParser(description="A stand-in for tensorflow_model_server (tests only).")
    parser.add_argument("export_base", nargs="?", help="The model's base path: version directories 1/, 2/, ...")
    parser.add_argument("--model-name", help="Default: the base path's last name.")
    parser.add_argument("--version", type=int, help="Default: the newest version.")
    parser.add_argument(
        "--model_config_file",
        action="append",
        default=[],
        help="Serve the models of a models.config instead (newest version each); repeatable.",
    )
    parser.add_argument("--grpc-port", type=int, default=8500, help="0 picks a free port.")
    parser.add_argument("--rest-port", type=int, default=8501, help="0 picks a free port.")
    parser.add_argument("--workers", type=int, default=4, help="gRPC threads.")
    parser.add_argument(
        "--enable_signature_method_name_check",
        action="store_true",
        help="As tensorflow_model_server's flag: Classify/Regress check method names.",
    )
    args = parser.parse_args(argv)
    if bool(args.export_base) == bool(args.model_config_file):
        parser.error("give EXPORT_BASE or --model_config_file")

    if args.export_base:
        base = os.path.abspath(args.export_base)
        wanted = [(args.model_name or os.path.basename(base), base, args.version)]
    else:
        wanted = [(name, base, None) for path in args.model_config_file for name, base in read_model_config(path)]
    models, warmed = {}, {}
    for name, base, version in wanted:
        version = version if version is not None else newest_version(base)
        model = Model(name, os.path.join(base, str(version)), version, args.enable_signature_method_name_check)
        try:
            warmed[name] = model.warm_up()
        except ServingError as e:
            raise SystemExit(
                f"standin_server: {name}: a warmup request failed, so the model does not load: {e.message}"
            ) from None
        models[name] = model
    servables = Servables(models)
    grpc, grpc_port = grpc_server(servables, args.grpc_port, args.workers)
    rest, rest_port = rest_server(RestApi(servables), args.rest_port)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        json.dumps(
            {
                "grpc_port": grpc_port,
                "rest_port": rest_port,
                "models": {name: m.version for name, m in models.items()},
                "warmup_requests": warmed,
            }
        ),
        flush=True,
    )
    stop.wait()
    rest.shutdown()
    grpc.stop(grace=1).wait()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
