"""Pretraining, as google-research/bert's `create_pretraining_data.py` and `run_pretraining.py`.

- `create_data`: `kbert create-data`, text -> TFRecords of masked-LM + next-sentence instances (the writer),
  with `instances` (the original's algorithm), `python_random` (CPython's draws), `record_encoder`
  (the records' features and Example bytes), `worker_pool` (the spawned workers) and `record_statistics`;
- `beam_pipeline`: the same records made by an Apache Beam pipeline, on any runner;
- `dataset`: those TFRecords -> a `tf.data` pipeline for training (the reader);
- `losses`: the masked-LM and next-sentence losses;
- `train`: `kbert pretrain`, the custom `strategy.run` training loop, with `options` (its flags) and
  `run_record` (pretrain_run.json: what `--resume` continues with and may change);
- `keras_loop`: the same run on JAX and PyTorch, by Keras' own `fit`, without TensorFlow;
- `fill_mask`: `kbert fill-mask`, the masked-LM head's top predictions.
"""
