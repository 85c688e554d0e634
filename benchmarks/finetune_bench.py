"""Fine-tuning throughput: kbert's classifier against keras-hub's BertTextClassifier, both with `model.fit`.

Same model size, batch, sequence length and data, in one run, each setting in a fresh process:
L=4, H=256, A=4, I=1024, V=30522, seq 128, batch 32, 2 classes. keras-hub is timed at each of
its settings (float32 / mixed_bfloat16, jit_compile on / off) and kbert's best is compared with
keras-hub's *best*. kbert runs what `kbert finetune` runs: `bert_classifier` + the original's
AdamW (warmup + linear decay, clip 1.0) under `model.fit`; keras-hub gets Keras' AdamW with
the same clip.

usage: .venv/bin/python benchmarks/finetune_bench.py [--steps 40] [--quick]
Progress on stderr, one JSON object on stdout.
"""

# Only the standard library and numpy at the top: each child process imports this module, then
# only the libraries of the one it times (kbert's child never loads keras-hub, and the other way round).
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import record

L, H, A, I, V, SEQ, BATCH, CLASSES = 4, 256, 4, 1024, 30522, 128, 32, 2


def examples(n, seed=0):
    """Random token ids with real padding (lengths 32..128) and two segments."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(32, SEQ + 1, n)
    ids = rng.integers(1000, V, (n, SEQ)).astype("int32")
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype("int32")
    segments = (np.arange(SEQ)[None, :] >= (lengths // 2)[:, None]).astype("int32") * mask
    return ids * mask, mask, segments, rng.integers(0, CLASSES, n).astype("int32")


def _fit_rate(model, data, steps):
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)  # trace / compile
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    return steps * BATCH / (time.perf_counter() - start)


def child_kbert(steps, mixed, jit):
    import keras
    import tensorflow as tf

    import kbert
    from kbert.finetuning.train import compile_for_task, make_finetune_optimizer

    if mixed:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    config = kbert.BertConfig(
        vocab_size=V,
        hidden_size=H,
        num_hidden_layers=L,
        num_attention_heads=A,
        intermediate_size=I,
        max_position_embeddings=512,
        type_vocab_size=2,
    )
    model = kbert.bert_classifier(config, CLASSES)
    compile_for_task(model, "classify", make_finetune_optimizer(2e-5, 10_000, 1_000))
    if jit:
        model.jit_compile = True
    ids, mask, segments, labels = examples(BATCH * 8)
    data = tf.data.Dataset.from_tensor_slices(
        ({"input_ids": ids, "input_mask": mask, "segment_ids": segments}, {"logits": labels})
    )
    return {"examples_per_second": _fit_rate(model, data.repeat().batch(BATCH).prefetch(2), steps)}


def child_keras_hub(steps, mixed, jit):
    import keras
    import keras_hub
    import tensorflow as tf

    if mixed:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=V, num_layers=L, num_heads=A, hidden_dim=H, intermediate_dim=I, max_sequence_length=512
    )
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=CLASSES, preprocessor=None)
    model.compile(
        optimizer=keras.optimizers.AdamW(2e-5, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit,
    )
    ids, mask, segments, labels = examples(BATCH * 8)
    data = tf.data.Dataset.from_tensor_slices(
        ({"token_ids": ids, "padding_mask": mask > 0, "segment_ids": segments}, labels)
    )
    return {"examples_per_second": _fit_rate(model, data.repeat().batch(BATCH).prefetch(2), steps)}


def spawn(kind, steps, mixed, jit):
    code = (
        f"import json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"import finetune_bench as b; print(json.dumps(b.child_{kind}({steps}, {mixed}, {jit})))"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="10 steps, float32 and bfloat16 only")
    parser.add_argument("--output", help=record.OUTPUT_HELP)
    args = parser.parse_args()
    steps = 10 if args.quick else args.steps
    settings = (
        [(False, False), (True, False)] if args.quick else [(False, False), (True, False), (False, True), (True, True)]
    )
    results = {"keras_hub": {}, "kbert": {}}
    for kind in ("keras_hub", "kbert"):
        for mixed, jit in settings:
            name = f"{'mixed_bfloat16' if mixed else 'float32'}{'+xla' if jit else ''}"
            print(f"{kind} {name} ...", file=sys.stderr, flush=True)
            results[kind][name] = spawn(kind, steps, mixed, jit)
            print(f"  {results[kind][name]}", file=sys.stderr, flush=True)
    best = {k: max((v.get("examples_per_second", 0), n) for n, v in r.items()) for k, r in results.items()}
    report = {
        "config": dict(layers=L, hidden=H, heads=A, intermediate=I, vocab=V, seq=SEQ, batch=BATCH, classes=CLASSES),
        "steps_timed": steps,
        "results": results,
        "best": {k: {"setting": n, "examples_per_second": round(s, 2)} for k, (s, n) in best.items()},
        "speedup_vs_keras_hub_best": round(best["kbert"][0] / best["keras_hub"][0], 2),
    }
    record.emit(report, "finetune-quick" if args.quick else "finetune", args.output, indent=2)


if __name__ == "__main__":
    main()
