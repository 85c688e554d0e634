"""The model: google-research/bert's `modeling.py` as Keras 3 layers and functional models.

- `layers`: embeddings, transformer layer, masked-LM and output heads, in the original's weight shapes;
- `fused`: the XLA kernels training runs through on TensorFlow (exact GELU, dropout, LayerNorm, attention softmax);
- `bert`: the functional models (`BertEncoder`, `BertPretrainer` and the task heads).
"""
