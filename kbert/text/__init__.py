"""Text to ids: the original tokenizer in Python and in the graph, and vocabularies.

- `tokenizer`: `Tokenizer`, the same tokens as google-research/bert's `FullTokenizer`;
- `unicode_classes`: the character classes both tokenizers share;
- `packing`: `pack_texts` and `PythonPreprocessor`, texts -> the encoder's three inputs as numpy arrays, in
  Python (any backend), and `Packer`, the methods it and `BertPreprocessor` share (a file's lists in, numpy out);
- `graph_tokenizer`: `GraphTokenizer`, the same ids as TensorFlow ops (for SavedModels and tf.data);
- `graph_packer`: `BertPreprocessor`, strings (or words to tag) -> the encoder's three inputs, in the
  graph: the one packing fine-tuning data and exports share;
- `windows`: `sliding_windows`, run_squad.py's overlapping windows over long documents and the window
  that owns each token, in numpy or in the graph (`graph_window_ops`: the TensorFlow ops it runs on tensors);
- `vocab_builder`: `kbert vocab`, a WordPiece vocabulary from text (`tf_text_vocab`: TF Text's learner).
"""
