"""Pretraining, as google-research/bert's `create_pretraining_data.py` and `run_pretraining.py`.

- `create_data`: `kbert create-data`, text -> TFRecords of masked-LM + next-sentence instances (the writer);
- `dataset`: those TFRecords -> a `tf.data` pipeline for training (the reader);
- `losses`: the masked-LM and next-sentence losses;
- `train`: `kbert pretrain`, the custom `strategy.run` training loop;
- `fill_mask`: `kbert fill-mask`, the masked-LM head's top predictions.
"""
