"""Time and peak memory of converting a BERT-base google-research checkpoint in and out of kbert.

Writes a random checkpoint in the original format (BERT-base: L=12 H=768 A=12 I=3072
V=30522, with the cls/ heads, ~110M parameters) to a temporary directory, then measures, each
in a fresh subprocess so that peak RSS belongs to one operation:
  read    the yardstick: tf.train.load_checkpoint + get_tensor of every variable,
          each dropped at once (so the same few pages are reused)
  read_keep  the same but keeping every tensor: the floor for any importer, which must end
          up holding all the weights in fresh memory (page faults cost ~0.7 s per 420 MiB here)
  import  kbert.converters.load_tf1_checkpoint, then kbert.save to a model directory
  export  kbert.load of that directory, then kbert.converters.save_tf1_checkpoint
Each child also reports its RSS right after importing TensorFlow + Keras (+ kbert): the
process baseline, which every peak includes. The targets are printed, not asserted:
import <= 2x read time, peak RSS <= 2.5x the checkpoint's size.

Run from the repository root:
    .venv/bin/python benchmarks/convert_bench.py [--quick] [--keep]
--quick uses L=2 H=128 A=2 I=512 (V=30522) and runs in seconds; its memory ratios are
dominated by the baseline. Progress goes to stderr, one JSON object to stdout.
"""

# The parent imports nothing heavy on purpose: on Linux a child's ru_maxrss starts from the
# RSS of the process it was forked from, so a large parent would inflate every child's peak.
# Each child function imports what it measures.
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "fixtures", "vocab-uncased.txt")
BASE = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072)
QUICK = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512)
TARGETS = {"import_over_read_seconds": 2.0, "peak_rss_over_checkpoint_size": 2.5}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def mib(n_bytes):
    return round(n_bytes / 2**20, 1)


def rss():
    """{current RSS, peak RSS (ru_maxrss, KiB on Linux), VmHWM as a cross-check} in MiB."""
    with open("/proc/self/status") as f:
        status = {k: v.split()[0] for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")}
    return {
        "rss_mib": round(int(status["VmRSS"]) / 1024, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "vm_hwm_mib": round(int(status["VmHWM"]) / 1024, 1),
    }


# --- children: each prints one JSON line as its last stdout line ---


def child_generate(ckpt_dir, dims):
    """Random checkpoint with the original names: built model for the shapes, SaveV2 to write."""
    import numpy as np
    import tensorflow as tf

    import kbert
    from kbert.converters.names import tf1_to_kbert_paths

    config = kbert.BertConfig(vocab_size=30522, type_vocab_size=2, max_position_embeddings=512, **dims)
    shapes = {v.path: tuple(v.shape) for v in kbert.bert_pretrainer(config).weights}
    names = tf1_to_kbert_paths(config.num_hidden_layers)
    rng = np.random.default_rng(0)
    tensors = [
        np.ones(shapes[p], np.float32)
        if n.endswith("LayerNorm/gamma")
        else rng.standard_normal(shapes[p], np.float32) * np.float32(0.02)
        for n, p in names.items()
    ]
    tf.raw_ops.SaveV2(
        prefix=os.path.join(ckpt_dir, "bert_model.ckpt"),
        tensor_names=list(names),
        shape_and_slices=[""] * len(names),
        tensors=tensors,
    )
    config.to_json_file(os.path.join(ckpt_dir, "bert_config.json"))
    shutil.copyfile(VOCAB, os.path.join(ckpt_dir, "vocab.txt"))
    return {"variables": len(names), "parameters": int(sum(t.size for t in tensors))}


def child_read(ckpt_dir):
    import keras  # noqa: F401  (same baseline as the kbert children)
    import tensorflow as tf

    baseline = rss()["rss_mib"]
    t0 = time.perf_counter()
    reader = tf.train.load_checkpoint(os.path.join(ckpt_dir, "bert_model.ckpt"))
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)  # read and drop: the cost any converter must pay
    return {"read_seconds": time.perf_counter() - t0, "baseline_rss_mib": baseline, **rss()}


def child_read_keep(ckpt_dir):
    import keras  # noqa: F401
    import tensorflow as tf

    baseline = rss()["rss_mib"]
    t0 = time.perf_counter()
    reader = tf.train.load_checkpoint(os.path.join(ckpt_dir, "bert_model.ckpt"))
    kept = [reader.get_tensor(name) for name in reader.get_variable_to_shape_map()]
    seconds = time.perf_counter() - t0
    del kept
    return {"read_seconds": seconds, "baseline_rss_mib": baseline, **rss()}


def child_import(ckpt_dir, model_dir):
    import keras  # noqa: F401
    import tensorflow as tf  # noqa: F401

    import kbert
    import kbert.converters
    import kbert.model.bert

    baseline = rss()["rss_mib"]
    t0 = time.perf_counter()
    model = kbert.converters.load_tf1_checkpoint(ckpt_dir)
    t1 = time.perf_counter()
    after_load = rss()["peak_rss_mib"]
    kbert.save(model, model_dir, vocab_file=model.vocab_file, do_lower_case=True)
    t2 = time.perf_counter()
    return {
        "import_seconds": t1 - t0,
        "save_seconds": t2 - t1,
        "baseline_rss_mib": baseline,
        "peak_rss_after_import_mib": after_load,
        **rss(),
    }


def child_export(model_dir, out_dir):
    import keras  # noqa: F401
    import tensorflow as tf  # noqa: F401

    import kbert
    import kbert.converters
    import kbert.model.bert

    baseline = rss()["rss_mib"]
    t0 = time.perf_counter()
    model = kbert.load(model_dir)
    t1 = time.perf_counter()
    kbert.converters.save_tf1_checkpoint(model, out_dir)
    t2 = time.perf_counter()
    return {"load_seconds": t1 - t0, "export_seconds": t2 - t1, "baseline_rss_mib": baseline, **rss()}


CHILDREN = {
    "generate": child_generate,
    "read": child_read,
    "read_keep": child_read_keep,
    "import": child_import,
    "export": child_export,
}


def spawn(op, *args):
    """Run one child in a fresh interpreter; return its JSON report."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", op, *args], env=env, stdout=subprocess.PIPE, text=True
    )
    if proc.returncode:
        sys.exit(f"child {op} failed with exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model (L=2, H=128), seconds")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    if args.child:
        op, *rest = args.child
        if op == "generate":
            rest = [rest[0], json.loads(rest[1])]  # ckpt_dir, dims
        print(json.dumps(CHILDREN[op](*rest)))
        return

    dims = QUICK if args.quick else BASE
    work = tempfile.mkdtemp(prefix="kbert-convert-bench-")
    ckpt, model_dir, out = (os.path.join(work, d) for d in ("tf1", "kbert-model", "tf1-out"))
    os.makedirs(ckpt)
    try:
        log(f"writing a random checkpoint {dims} to {ckpt}")
        t0 = time.perf_counter()
        generated = spawn("generate", ckpt, json.dumps(dims))
        log(f"  {generated['parameters']:,} parameters in {time.perf_counter() - t0:.1f} s")
        size = os.path.getsize(os.path.join(ckpt, "bert_model.ckpt.data-00000-of-00001"))
        log("read ...")
        read = spawn("read", ckpt)
        read_keep = spawn("read_keep", ckpt)
        log("import + save ...")
        imp = spawn("import", ckpt, model_dir)
        log("load + export ...")
        exp = spawn("export", model_dir, out)
        weights_size = os.path.getsize(os.path.join(model_dir, "model.weights.h5"))
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    ckpt_mib = mib(size)

    def summary(child, **seconds):
        peak = child["peak_rss_mib"]
        return {
            **{k: round(v, 3) for k, v in seconds.items()},
            "peak_rss_mib": peak,
            "vm_hwm_mib": child["vm_hwm_mib"],
            "baseline_rss_mib": child["baseline_rss_mib"],
            "peak_rss_minus_baseline_mib": round(peak - child["baseline_rss_mib"], 1),
            "peak_rss_over_checkpoint_size": round(peak / ckpt_mib, 2),
            "peak_rss_minus_baseline_over_checkpoint_size": round((peak - child["baseline_rss_mib"]) / ckpt_mib, 2),
        }

    report = {
        "config": dict(dims, vocab_size=30522, type_vocab_size=2, max_position_embeddings=512),
        "parameters": generated["parameters"],
        "variables": generated["variables"],
        "checkpoint_mib": ckpt_mib,
        "kbert_weights_h5_mib": mib(weights_size),
        "read": summary(read, read_seconds=read["read_seconds"]),
        "read_keep": summary(read_keep, read_seconds=read_keep["read_seconds"]),
        "import": summary(
            imp,
            import_seconds=imp["import_seconds"],
            save_seconds=imp["save_seconds"],
            convert_from_tf1_seconds=imp["import_seconds"] + imp["save_seconds"],
        ),
        "export": summary(
            exp,
            load_seconds=exp["load_seconds"],
            export_seconds=exp["export_seconds"],
            convert_to_tf1_seconds=exp["load_seconds"] + exp["export_seconds"],
        ),
        "import_over_read_seconds": round(imp["import_seconds"] / read["read_seconds"], 2),
        "import_over_read_keep_seconds": round(imp["import_seconds"] / read_keep["read_seconds"], 2),
        "targets": TARGETS,
    }
    report["import"]["peak_rss_after_import_mib"] = imp["peak_rss_after_import_mib"]
    log(
        f"import/read time {report['import_over_read_seconds']} (target <= 2), import/read_keep "
        f"{report['import_over_read_keep_seconds']}; peak RSS / checkpoint: "
        f"import {report['import']['peak_rss_over_checkpoint_size']}, export "
        f"{report['export']['peak_rss_over_checkpoint_size']} (target <= 2.5)"
    )
    if args.quick:
        log(
            "(--quick: the checkpoint is small, so model building and the ~0.5 GiB TF baseline "
            "dominate these ratios; only the full size tests the targets)"
        )
    record.emit(report, "convert-quick" if args.quick else "convert", args.output, indent=2)


if __name__ == "__main__":
    main()
