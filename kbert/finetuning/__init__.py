"""Fine-tuning: one small head per task on a pretrained BERT, trained with `model.fit`.

- `tasks`: one record per task (reader, head, loss, metric, prediction JSON, serving outputs);
- `readers`: the file formats (CSV/TSV/JSONL, GLUE layouts, CoNLL, SWAG) -> model inputs;
- `squad`: `run_squad.py`'s windows and answer decoding;
- `metrics`: each task's scores;
- `train`: `kbert finetune`;
- `predict`: `kbert predict`, `kbert evaluate` and feature extraction, shared with `kbert predict --server`.
"""
