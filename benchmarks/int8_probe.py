"""Does TensorFlow's own int8 make a kbert export faster? (Measured: it does not.)

Quantizes a `kbert export` version directory with
`tf.quantization.experimental.quantize_saved_model` (dynamic-range int8, the `serving_default`
signature), then times both SavedModels the way tensorflow_model_server runs them (a TF1
session on the signature_def's tensors), alternating, in this one process, which imports only
TensorFlow and TF Text: what TF Serving has.

usage: .venv/bin/python benchmarks/int8_probe.py EXPORT_VERSION_DIR [--words 85] [--requests 30]
(for example a BERT-base export that benchmarks/serving_bench.py left in its --work directory)
Progress on stderr, one JSON object on stdout.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import record
import tensorflow as tf
from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2 as quant

# tests/reference/serving_session.py: an export in a TF1 session, as TF Serving runs it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "reference"))
from serving_session import session_call


def quantize(src: str, dst: str) -> float:
    """Dynamic-range int8 of `src`'s serving_default into `dst`; returns the seconds it took."""
    options = quant.QuantizationOptions(
        quantization_method=quant.QuantizationMethod(preset_method=quant.QuantizationMethod.METHOD_DYNAMIC_RANGE_INT8),
        tags={"serve"},
        signature_keys=["serving_default"],
        op_set=quant.OpSet.TF,
    )
    start = time.perf_counter()
    tf.quantization.experimental.quantize_saved_model(
        src, dst, quantization_options=options, overwrite_output_directory=True
    )
    return time.perf_counter() - start


def size_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="a kbert export's version directory (EXPORT_BASE/N)")
    parser.add_argument("--words", type=int, default=85, help="words in the request's one text")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per model and round")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    text = [" ".join(["package"] * args.words)]
    with tempfile.TemporaryDirectory() as work:
        int8_path = os.path.join(work, "int8")
        seconds = quantize(args.export, int8_path)
        print(f"quantized in {seconds:.0f} s", file=sys.stderr)
        calls = {"float32": session_call(args.export), "int8": session_call(int8_path)}
        reference = calls["float32"](text)["pooled_output"]
        difference = float(np.abs(calls["int8"](text)["pooled_output"] - reference).max())
        times = {name: [] for name in calls}
        for _ in range(3):  # alternating rounds: this VM's speed drifts over minutes
            for name, call in calls.items():
                for _ in range(5):
                    call(text)
                for _ in range(args.requests):
                    start = time.perf_counter()
                    call(text)
                    times[name].append((time.perf_counter() - start) * 1000)
        p50 = {name: float(np.median(t)) for name, t in times.items()}
        record.emit(
            {
                "tokens": int(calls["float32"](text)["input_mask"].sum()),
                "quantize_s": seconds,
                "p50_ms": p50,
                "int8_speedup": p50["float32"] / p50["int8"],
                "pooled_output_max_difference": difference,
                "size_mb": {"float32": size_mb(args.export), "int8": size_mb(int8_path)},
            },
            "int8-probe",
            args.output,
            indent=None,
        )


if __name__ == "__main__":
    main()
