"""Shows the wait at the end of keras-hub's `model.fit` that skewed earlier pretraining ratios.

Trains keras-hub's BertMaskedLM (the pretraining benchmark's config, mixed_bfloat16) on one
fixed batch repeated, so no input pipeline is involved, and calls `fit` several times. For
each call it prints when the last step ended and when `fit` returned. Measured on this 2-core
VM: calls 1 and 3 of 60 steps returned 29.0 and 32.8 s after their last step (82.0 and 81.9 s
in all: the 23.4 seq/s earlier benchmark runs kept reporting), call 2 at once (53.9 s). The
cause is not known; timing whole `fit` calls therefore understates the anchor, and
benchmarks/pretrain_bench.py times it step by step instead.

usage: .venv/bin/python benchmarks/fit_stall_probe.py [--steps 60] [--calls 3]
One JSON object per call on stdout.
"""

import argparse
import json
import os
import tempfile
import time

import keras
import keras_hub
import pretrain_bench as bench  # beside this script, so on sys.path when it runs
import tensorflow as tf

from kbert.pretraining.tf_dataset import pretraining_dataset


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 2 or args.calls < 1:
        parser.error("--steps must be at least 2 (a rate needs two step ends) and --calls at least 1")

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    records = os.path.join(tempfile.mkdtemp(), "random.tfrecord")
    bench.write_records(records, n=bench.BATCH)
    features, labels = next(iter(pretraining_dataset([records], bench.BATCH, bench.SEQ, bench.PRED)))
    inputs = {
        "token_ids": features["input_ids"],
        "padding_mask": features["input_mask"] > 0,
        "segment_ids": features["segment_ids"],
        "mask_positions": features["masked_lm_positions"],
    }
    data = tf.data.Dataset.from_tensors((inputs, labels["masked_lm_ids"], labels["masked_lm_weights"])).repeat()

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=bench.V,
        num_layers=bench.L,
        num_heads=bench.A,
        hidden_dim=bench.H,
        intermediate_dim=bench.I,
        max_sequence_length=512,
    )
    model = keras_hub.models.BertMaskedLM(backbone)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["sparse_categorical_accuracy"],
        jit_compile=False,
    )
    model.fit(data, steps_per_epoch=10, epochs=1, verbose=0)  # trace

    step_ends = []

    class StepEnds(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # wait for the step to finish
            step_ends.append(time.perf_counter())

    for call in range(args.calls):
        step_ends.clear()
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[StepEnds()])
        returned = time.perf_counter()
        print(
            json.dumps(
                {
                    "call": call + 1,
                    "steps": args.steps,
                    "fit_seconds": round(returned - start, 2),
                    "after_last_step_seconds": round(returned - step_ends[-1], 2),
                    "steady_sequences_per_second": round(
                        (len(step_ends) - 1) * bench.BATCH / (step_ends[-1] - step_ends[0]), 2
                    ),
                    "whole_call_sequences_per_second": round(args.steps * bench.BATCH / (returned - start), 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
