"""Fine-tuning: one small head per task on a pretrained BERT, trained with `model.fit`.

- `tasks`: one file per task (reader, head, losses, metrics, prediction JSON, what its model
  records, what its export serves), on `tasks.base.Task`;
- `readers`: the file formats (CSV/TSV/JSONL, GLUE layouts, CoNLL, SWAG) -> examples, with
  `formats` (which format a file is, and whether it has the shape its task reads);
- `encoding`: examples -> model inputs, packed by the backend's packer (`kbert.backend.make_preprocessor`:
  `kbert.text.graph_packer.BertPreprocessor`, the packing exports run, or the same in Python on JAX and
  PyTorch) as run_classifier.py packs them, tags on first pieces;
- `squad`: `run_squad.py`'s reading, windows and scoring; `squad_decoding`: its answers;
- `windows`: documents longer than the window (`--long-text windows`): whose each window is,
  each word's window, and one answer per document;
- `metrics`: each task's scores;
- `train`: `kbert finetune`;
- `predict`: `kbert predict`, `kbert evaluate` and feature extraction; `rows`: the one batch loop
  of local and served prediction and of `kbert embed`.
"""
