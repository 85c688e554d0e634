"""Serving latency: kbert's exported SavedModel against keras-hub and Hugging Face on the CPU.

A BERT-base-size model (L=12, H=768, A=12, I=3072, V=30522, random weights: the cost does not
depend on the values), 128 tokens per sequence, in one run, each contender in a fresh process:

- kbert: `kbert export` of an encoder, run two ways. "session": the way tensorflow_model_server
  runs a SavedModel (a TF1-style session that loads the `serve` MetaGraph and runs the
  signature_def's tensors, as TF Serving's SavedModelBundle does); "tf.saved_model.load": the
  TF2 Python API calling the signatures. Both through `serve_ids` (token ids in) and
  `serving_default` (raw text in, tokenized inside the graph; the text fills all 128 tokens).
- keras-hub: `BertBackbone` called in-process, timed two ways, `predict_on_batch` and the call
  wrapped in one `tf.function`; its best way counts. (Eager `__call__` was 3x slower than
  both in a first run, so it is not timed.)
- Hugging Face: transformers' `BertModel` on PyTorch CPU under `torch.inference_mode()`,
  ids in; and text in through its fast tokenizer (`BertTokenizerFast`).

Each is run in float32 and in bfloat16 (kbert: `kbert export --precision bfloat16`; keras-hub:
the "bfloat16" dtype policy; PyTorch: the model cast to torch.bfloat16); each contender's best
way counts, and kbert is compared with the fastest anchor at the same precision. TensorFlow runs
with its default threads; `--inter-op 0 1` also tries one inter-op thread (what
`tensorflow_model_server --tensorflow_inter_op_parallelism=1` sets), which was no faster for
either TensorFlow contender in a first run.

Latency is per request at batch 1 (p50 and p99 over `--requests` calls after warm-up);
throughput is sequences/s at batch 32. Every contender gets the same input ids.

usage: .venv/bin/python benchmarks/serving_bench.py [--requests 100] [--batches 6] [--quick]
Needs the bench extra and PyTorch for the Hugging Face row:
`pip install -e ".[bench]" torch==2.13.0 transformers` (the row is skipped without them).
Progress on stderr, one JSON object on stdout.
"""

# Only the standard library and numpy at the top: each child process imports this module, then
# only the libraries of the one it times (the PyTorch child never loads TensorFlow, and so on).
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

L, H, A, I, V, SEQ, BIG_BATCH = 12, 768, 12, 3072, 30522, 128, 32
HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = os.path.join(HERE, os.pardir, "tests", "fixtures", "vocab-uncased.txt")
# Real words, many more than 128 tokens: every contender's text input fills the sequence.
TEXT = ("The package provides a command-line tool and a library for reading, writing and "
        "converting archives; it supports compressed formats, streaming, and large files. ") * 8


def token_ids(batch, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, V, (batch, SEQ)).astype("int32")
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return ids, np.ones((batch, SEQ), "int32"), np.zeros((batch, SEQ), "int32")


def measure(call, batch_one, batch_big, requests, batches):
    """p50/p99 latency (ms) of call(batch_one), and sequences/s of call(batch_big)."""
    for _ in range(5):
        call(batch_one)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        call(batch_one)
        times.append((time.perf_counter() - start) * 1000)
    call(batch_big)
    start = time.perf_counter()
    for _ in range(batches):
        call(batch_big)
    rate = batches * BIG_BATCH / (time.perf_counter() - start)
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
            "batch32_seq_per_s": rate}


def threads(inter):
    import tensorflow as tf
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)


def child_kbert(requests, batches, precision, inter):
    threads(inter)
    import tensorflow as tf

    import kbert
    from kbert.serving.export import export_model
    config = kbert.BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
                              intermediate_size=I, max_position_embeddings=512, type_vocab_size=2)
    with tempfile.TemporaryDirectory() as work:
        model = kbert.bert_encoder(config)
        model.vocab_file, model.do_lower_case = VOCAB, True
        kbert.save(model, os.path.join(work, "model"))
        path = export_model(os.path.join(work, "model"), os.path.join(work, "export"), max_seq_length=SEQ,
                            precision=precision)
        names = ("input_ids", "input_mask", "segment_ids")
        one, big = dict(zip(names, token_ids(1))), dict(zip(names, token_ids(BIG_BATCH)))
        text, texts = {"text": [TEXT]}, {"text": [TEXT] * BIG_BATCH}
        result = {"session": {}, "tf.saved_model.load": {}}

        graph = tf.Graph()
        with graph.as_default():
            session = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
                inter_op_parallelism_threads=inter))
            meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)

        def session_call(name):
            signature = meta_graph.signature_def[name]
            fetches = {key: t.name for key, t in signature.outputs.items()}
            return lambda x: session.run(fetches, {signature.inputs[k].name: v for k, v in x.items()})

        assert int(session_call("serving_default")(text)["input_mask"].sum()) == SEQ
        result["session"]["ids"] = measure(session_call("serve_ids"), one, big, requests, batches)
        result["session"]["text"] = measure(session_call("serving_default"), text, texts, requests, batches)
        session.close()

        signatures = tf.saved_model.load(path).signatures

        def signature_call(name):
            return lambda x: {k: v.numpy() for k, v in signatures[name](
                **{key: tf.constant(value) for key, value in x.items()}).items()}

        result["tf.saved_model.load"]["ids"] = measure(signature_call("serve_ids"), one, big, requests, batches)
        result["tf.saved_model.load"]["text"] = measure(signature_call("serving_default"), text, texts,
                                                        requests, batches)
    return result


def child_keras_hub(requests, batches, precision, inter):
    threads(inter)
    import keras
    import keras_hub
    import tensorflow as tf
    keras.mixed_precision.set_global_policy(precision)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=V, num_layers=L, num_heads=A, hidden_dim=H,
                                             intermediate_dim=I, max_sequence_length=512)

    def inputs(batch):
        ids, mask, segments = token_ids(batch)
        return {"token_ids": tf.constant(ids), "padding_mask": tf.constant(mask > 0),
                "segment_ids": tf.constant(segments)}

    one, big = inputs(1), inputs(BIG_BATCH)
    compiled = tf.function(lambda x: backbone(x, training=False))
    ways = {"predict_on_batch": lambda x: backbone.predict_on_batch(x),
            "tf.function": lambda x: compiled(x)["sequence_output"].numpy()}
    return {"ids": {way: measure(call, one, big, requests, batches) for way, call in ways.items()}}


def child_hf(requests, batches, precision, inter):
    import torch
    import transformers
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=I))
    model.eval()
    if precision == "bfloat16":
        model = model.to(torch.bfloat16)
    tokenizer = transformers.BertTokenizerFast(VOCAB, do_lower_case=True)

    def inputs(batch):
        ids, mask, segments = token_ids(batch)
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "attention_mask": torch.tensor(mask),
                "token_type_ids": torch.tensor(segments, dtype=torch.long)}

    def run_ids(x):
        with torch.inference_mode():
            return model(**x).last_hidden_state.float().numpy()

    def run_text(texts):
        with torch.inference_mode():
            x = tokenizer(texts, max_length=SEQ, truncation=True, padding="max_length", return_tensors="pt")
            return model(**x).last_hidden_state.float().numpy()

    return {"torch_threads": torch.get_num_threads(),
            "ids": measure(run_ids, inputs(1), inputs(BIG_BATCH), requests, batches),
            "text": measure(run_text, [TEXT], [TEXT] * BIG_BATCH, requests, batches)}


def spawn(kind, requests, batches, precision, inter):
    code = (f"import json, sys; sys.path.insert(0, {HERE!r}); import serving_bench as b; "
            f"print(json.dumps(b.child_{kind}({requests}, {batches}, {precision!r}, {inter})))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    label = f"{kind} {precision} inter-op {inter or 'default'}"
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        print(f"{label}: failed: {tail[0]}", file=sys.stderr)
        return {"error": tail[0]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if kind == "kbert":  # {way: {mode: numbers}} -> {mode: {way: numbers}}, as keras-hub's
        result = {mode: {way: result[way][mode] for way in result} for mode in ("ids", "text")}
    print(f"{label}: {json.dumps(result)} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return result


def best(runs, mode):
    """The run (over settings and ways) with the lowest batch-1 p50 for `mode` ("ids"/"text")."""
    found = []
    for setting, result in runs.items():
        entry = result.get(mode)
        if not entry:
            continue
        ways = {"": entry} if "p50_ms" in entry else entry
        found += [dict(m, setting=f"{setting} {way}".strip()) for way, m in ways.items()]
    return min(found, key=lambda m: m["p50_ms"]) if found else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="timed batch-1 requests per contender")
    parser.add_argument("--batches", type=int, default=6, help="timed batch-32 calls per contender")
    parser.add_argument("--quick", action="store_true", help="20 requests, 2 batches: a smoke run")
    parser.add_argument("--only", nargs="*", default=["kbert", "keras_hub", "hf"])
    parser.add_argument("--precisions", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--inter-op", nargs="*", type=int, default=[0],
                        help="TensorFlow inter-op thread counts to try (0: TensorFlow's default)")
    args = parser.parse_args()
    requests, batches = (20, 2) if args.quick else (args.requests, args.batches)
    results = {}
    for precision in args.precisions:
        for kind in args.only:
            for inter in ((0,) if kind == "hf" else args.inter_op):
                results.setdefault(precision, {}).setdefault(kind, {})[f"inter-op {inter or 'default'}"] = \
                    spawn(kind, requests, batches, precision, inter)

    report = {"model": {"layers": L, "hidden": H, "heads": A, "intermediate": I, "vocab": V, "seq": SEQ},
              "cpus": os.cpu_count(), "results": results, "summary": {}}
    for precision, runs in results.items():
        rows = {kind: best(r, "ids") for kind, r in runs.items() if best(r, "ids")}
        summary = {kind: {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
                   for kind, row in rows.items()}
        anchors = {k: v for k, v in rows.items() if k != "kbert"}
        if "kbert" in rows and anchors:
            fastest = min(anchors, key=lambda k: anchors[k]["p50_ms"])
            summary["fastest_anchor_batch1"] = fastest
            summary["p50_speedup_vs_fastest"] = round(anchors[fastest]["p50_ms"] / rows["kbert"]["p50_ms"], 3)
            summary["p99_speedup_vs_fastest"] = round(anchors[fastest]["p99_ms"] / rows["kbert"]["p99_ms"], 3)
            summary["batch32_speedup_vs_best"] = round(rows["kbert"]["batch32_seq_per_s"] / max(
                a["batch32_seq_per_s"] for a in anchors.values()), 3)
        report["summary"][precision] = summary
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
