"""What `kbert export --precision int8` costs in accuracy, on real texts and a real task.

Exports twice, float32 and int8, and runs every export the way TF Serving does (a TF1 session on
the `serve` MetaGraph, fed and fetched by the `serving_default` signature's tensor names):

- ENCODER_DIR (a kbert encoder, e.g. all-MiniLM-L6-v2 converted by `kbert convert from-hf`):
  sentence embeddings of the texts of DATA_DIR/test.tsv, int8 against float32: the cosine of
  each text's mean-pooled `sequence_output` (how sentence-transformers pools MiniLM) and of its
  `pooled_output`; median, 1st percentile and minimum. A sentence-embedding model (converted
  from sentence-transformers) serves its `embedding`, compared the same way.
- CLASSIFIER_DIR (the same encoder fine-tuned by `kbert finetune --task classify`): accuracy on
  DATA_DIR/test.tsv of each export, and how many predictions differ.

With `--calibrated`, a third export of each, `--int8-ranges calibrated` on DATA_DIR/dev.tsv's
texts (not the test texts it is measured on), is compared with float32 the same way.

usage: .venv/bin/python scripts/int8_accuracy.py ENCODER_DIR CLASSIFIER_DIR DATA_DIR [--work DIR] [--calibrated]
DATA_DIR holds test.tsv (text, label), and dev.tsv for --calibrated, as `scripts/debian_sections.py` writes them.
Progress on stderr, one JSON object on stdout.
"""

import argparse
import csv
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np

from kbert.serving.export import export_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "reference"))
from serving_session import ServingSession  # a SavedModel in a TF1 session, as TF Serving loads it

BATCH = 32


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def serve(path, texts, fetch):
    """`fetch`'s outputs of the export at `path` for `texts`, in batches, as TF Serving runs it."""
    served = ServingSession(path)
    pairs = "text_b" in served.signatures["serving_default"].inputs
    parts = {k: [] for k in fetch}
    for start in range(0, len(texts), BATCH):
        batch = texts[start : start + BATCH]
        out = served.run({"text": batch, **({"text_b": [""] * len(batch)} if pairs else {})}, outputs=fetch)
        for k in fetch:
            parts[k].append(np.asarray(out[k]))
    served.close()
    return {k: np.concatenate(v) for k, v in parts.items()}


def cosines(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def summary(values):
    return {
        "median": round(float(np.median(values)), 5),
        "p1": round(float(np.percentile(values, 1)), 5),
        "min": round(float(values.min()), 5),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("encoder_dir")
    parser.add_argument("classifier_dir")
    parser.add_argument("data_dir")
    parser.add_argument("--work", help="where the exports go (default: a temporary directory)")
    parser.add_argument("--calibrated", action="store_true", help="also an int8 export on ranges measured on dev.tsv")
    args = parser.parse_args()
    int8_kinds = {"int8": {}}
    if args.calibrated:
        dev = os.path.join(args.data_dir, "dev.tsv")
        int8_kinds["int8-calibrated"] = {"int8_ranges": "calibrated", "calibration": dev}
    with open(os.path.join(args.data_dir, "test.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    texts, labels = [r["text"] for r in rows], [r["label"] for r in rows]
    work = args.work or tempfile.mkdtemp(prefix="kbert-int8-accuracy-")
    report = {"texts": len(texts), "data": os.path.abspath(args.data_dir)}

    exported = {}
    kinds = {"float32": {}, **{k: {"precision": "int8", **options} for k, options in int8_kinds.items()}}
    for kind, model_dir in (("encoder", args.encoder_dir), ("classifier", args.classifier_dir)):
        for name, options in kinds.items():
            log(f"exporting the {kind} ({name}) ...")
            exported[kind, name] = export_model(
                model_dir, os.path.join(work, f"{kind}-{name}"), version=1, overwrite=True, **options
            )

    log("sentence embeddings ...")
    probe = ServingSession(exported["encoder", "float32"])
    outputs = probe.signatures["serving_default"].outputs
    probe.close()
    if "embedding" in outputs:  # a sentence-embedding model: its own pooling, normalized
        runs = {p: serve(exported["encoder", p], texts, ["embedding"]) for p in kinds}
        sentence = {p: r["embedding"].astype(np.float64) for p, r in runs.items()}
    else:
        runs = {
            p: serve(exported["encoder", p], texts, ["sequence_output", "pooled_output", "input_mask"]) for p in kinds
        }
        mask = runs["float32"]["input_mask"][..., None].astype(np.float64)
        sentence = {p: (r["sequence_output"] * mask).sum(1) / mask.sum(1) for p, r in runs.items()}
    for name in int8_kinds:
        report[f"embeddings ({name})"] = {
            "sentence_embedding_cosine": summary(cosines(sentence[name], sentence["float32"]))
        }
        if "pooled_output" in runs[name]:
            pooled = cosines(runs[name]["pooled_output"], runs["float32"]["pooled_output"])
            report[f"embeddings ({name})"]["pooled_output_cosine"] = summary(pooled)
        log(f"  {name}: {report[f'embeddings ({name})']}")

    log("classification ...")
    predicted = {p: serve(exported["classifier", p], texts, ["label"])["label"] for p in kinds}
    predicted = {p: [v.decode() for v in values] for p, values in predicted.items()}
    accuracy = {p: float(np.mean([a == b for a, b in zip(values, labels)])) for p, values in predicted.items()}
    for name in int8_kinds:
        report[f"classification ({name})"] = {
            "float32_accuracy": round(accuracy["float32"], 4),
            "int8_accuracy": round(accuracy[name], 4),
            "int8_minus_float32_points": round(100 * (accuracy[name] - accuracy["float32"]), 2),
            "predictions_that_differ": int(sum(a != b for a, b in zip(predicted[name], predicted["float32"]))),
        }
        log(f"  {name}: {report[f'classification ({name})']}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
