"""Pretraining, as google-research/bert's `create_pretraining_data.py` and `run_pretraining.py`.

- `create_data`: `kbert create-data`, text -> TFRecords of masked-LM + next-sentence instances (the writer),
  with `instances` (the original's algorithm), `python_random` (CPython's draws), `record_encoder`
  (the records' features and Example bytes), `worker_pool` (the spawned workers) and `record_statistics`;
- `beam_pipeline`: the same records made by an Apache Beam pipeline, on any runner;
- `record_checks`: the record files a run is given, found and checked before it trains;
- `losses`: the masked-LM and next-sentence losses;
- `train`: `kbert pretrain`, the one training loop, with `options` (its flags), `run_setup` (what a
  run settles before it trains) and `run_record` (pretrain_run.json: what `--resume` continues with
  and may change); an engine runs what differs between backends:
  - `tf_engine`: a custom `strategy.run` loop on TensorFlow, reading `tf_dataset` (the records as a
    `tf.data` pipeline) and training with `tf_losses` (a faster cross-entropy);
  - `keras_engine`: Keras' own `fit` on JAX and PyTorch, without TensorFlow;
- `fill_mask`: `kbert fill-mask`, the masked-LM head's top predictions.
"""
