"""`export_tfhub`: a kbert model -> TF Hub's BERT encoder and preprocessor SavedModels.

`OUT/encoder/` and `OUT/preprocessor/` follow TF Hub's "Text embeddings with Transformer
encoders" interface, as Model Garden's `export_tfhub.py` writes it, so code written for the
TF Hub BERTs (TensorFlow's "Classify text with BERT" tutorial, say) takes kbert models as is:

    preprocessor = hub.KerasLayer("OUT/preprocessor")
    encoder = hub.KerasLayer("OUT/encoder", trainable=True)
    pooled = encoder(preprocessor(text_input))["pooled_output"]

Encoder. Called on a dict of int32 `input_word_ids`, `input_mask`, `input_type_ids` [batch,
seq] (and `training=`, which turns dropout on), it returns `pooled_output` [batch, H],
`sequence_output` [batch, seq, H], `encoder_outputs` (every layer's output) and `default`
(= pooled_output). It carries `variables`, `trainable_variables` and `regularization_losses`
(TF Hub's Reusable SavedModel API, which `hub.KerasLayer(trainable=True)` reads), the
vocabulary (`vocab_file`, in assets/) and `do_lower_case`, as Model Garden's do, and
assets/bert_config.json. A pretraining model's encoder also has `mlm`: the same inputs plus
int32 `masked_lm_positions` [batch, P] give `mlm_logits` [batch, P, vocab] too. The
`serve` endpoint (for Keras 3's `TFSMLayer(path, call_endpoint="serve")`) and the
`serving_default` signature (TF Serving) give the same outputs, `encoder_outputs` as
`encoder_outputs_0`, `encoder_outputs_1`, ... kbert adds `nsp` (the
encoder's inputs -> `nsp_logits` [batch, 2]) for pretraining models, so that
`kbert convert from-tfhub` gets every weight back. A sentence-embedding model's encoder (its
bert_config.json records its pooling, `kbert.finetuning.embedding`) also returns `embedding` [batch, H]:
each text's vector, pooled over its real tokens and normalised as the record says, the vector
`kbert embed` gives; `default` stays `pooled_output`, as TF Hub's interface has it.

Preprocessor. Called on strings [batch] (also as `serve` and `serving_default`), it returns the encoder's three inputs at the
exported length (default 128). `tokenize`: strings -> int32 RaggedTensor [batch, words,
wordpieces]. `bert_pack_inputs`: a list of one or two tokenized segments (ragged rank 1 or 2)
and `seq_length=` -> the three inputs. The ids are the original tokenizer's (kbert's
GraphTokenizer, not tf.text's BertTokenizer), packed and truncated as run_classifier.py does.
"""

from __future__ import annotations

import json
import logging
import os

import keras
import tensorflow as tf

from kbert.backend import tensorflow_fused as fused
from kbert.backend.tensorflow_compat import auto_trackable
from kbert.config import sequence_length
from kbert.formats.model_dir import CONFIG_FILE
from kbert.formats.sources import open_model
from kbert.model.bert import BertEncoder, BertPretrainer, encoder_of
from kbert.model.embedding_record import embedding_of
from kbert.model.families import BERT, family_of
from kbert.model.layers import attention_adder
from kbert.model.pooling import l2_normalize, pool
from kbert.runtime.errors import KbertError, option
from kbert.runtime.files import atomic_output_dir, count_lines, writes
from kbert.text.graph_packer import pack_token_ids
from kbert.text.graph_tokenizer import GraphTokenizer
from kbert.text.tokenizer import load_vocab

log = logging.getLogger("kbert")

ENCODER_DIR, PREPROCESSOR_DIR = "encoder", "preprocessor"
# TF Hub's input names -> kbert's.
HUB_INPUTS = {"input_word_ids": "input_ids", "input_mask": "input_mask", "input_type_ids": "segment_ids"}


def _hub_outputs(encoder: BertEncoder, inputs: dict, training: bool, embedding: dict | None = None) -> dict:
    """The encoder run layer by layer, so that every layer's output can be returned; the same
    layers and ops as `BertEncoder`'s functional graph. With an `embedding` record, also each
    text's sentence vector (`kbert.model.pooling`, as `kbert embed` computes it)."""
    ids, mask, types = (inputs[name] for name in HUB_INPUTS)
    hidden = encoder.embeddings(ids, types, training=training)
    adder = attention_adder(mask)
    layers = []
    for layer in encoder.transformer_layers:
        hidden = layer(hidden, adder, training=training)
        layers.append(hidden)
    pooled = encoder.pooler(hidden[:, 0, :])
    out = {"pooled_output": pooled, "sequence_output": hidden, "encoder_outputs": layers, "default": pooled}
    if embedding is not None:
        vectors = pool(hidden, mask, embedding["pooling"])
        out["embedding"] = l2_normalize(vectors) if embedding.get("normalize") else vectors
    return out


def _tf_variables(variables) -> list:
    # Keras 3 variables wrap a tf.Variable; SavedModels track the tf.Variable.
    return [v.value for v in variables]


def _callable(function):
    """A trackable object that is callable once saved, as TF Hub's sub-objects are."""
    holder = auto_trackable()
    holder.__call__ = function
    return holder


def _encoder_module(
    encoder: BertEncoder,
    pretrainer,
    vocab_file: str,
    do_lower_case: bool,
    config_file: str,
    with_nsp: bool = True,
    embedding: dict | None = None,
):
    specs = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in HUB_INPUTS}

    @tf.function
    def call(inputs, training=False):
        return _hub_outputs(encoder, inputs, training, embedding)

    root = auto_trackable()
    root.variables = _tf_variables(encoder.variables)
    root.trainable_variables = _tf_variables(encoder.trainable_variables)
    root.regularization_losses = []  # BERT has none; TF Hub's API asks for the list
    root.vocab_file = tf.saved_model.Asset(vocab_file)
    root.do_lower_case = tf.Variable(do_lower_case, trainable=False, name="do_lower_case")
    root.bert_config_file = tf.saved_model.Asset(config_file)
    for training in (False, True):  # hub.KerasLayer calls with training as a Python bool
        call.get_concrete_function(specs, training=training)
    root.__call__ = call

    @tf.function(input_signature=[specs])
    def serve(inputs):
        out = _hub_outputs(encoder, inputs, False, embedding)
        layers = out.pop("encoder_outputs")
        return {**out, **{f"encoder_outputs_{i}": layer for i, layer in enumerate(layers)}}

    root.serve = serve  # Keras 3's TFSMLayer endpoint (a dict in), as keras' own exports name it
    signatures = {"serving_default": serve.get_concrete_function()}
    if pretrainer is not None:
        mlm_specs = {**specs, "masked_lm_positions": tf.TensorSpec([None, None], tf.int32, name="masked_lm_positions")}

        @tf.function
        def mlm_call(inputs, training=False):
            out = _hub_outputs(encoder, inputs, training, embedding)
            return {
                **out,
                "mlm_logits": pretrainer.mlm_head(
                    out["sequence_output"], inputs["masked_lm_positions"], training=training
                ),
            }

        for training in (False, True):
            mlm_call.get_concrete_function(mlm_specs, training=training)
        mlm = _callable(mlm_call)
        # The encoder's variables and the masked-LM head's, not the next-sentence head's.
        mlm_variables = [v for v in pretrainer.variables if not v.path.startswith("nsp_head/")]
        mlm.variables = _tf_variables(mlm_variables)
        mlm.trainable_variables = _tf_variables(v for v in mlm_variables if v.trainable)
        mlm.regularization_losses = []
        root.mlm = mlm

    if pretrainer is not None and with_nsp:
        # Not part of TF Hub's interface (Model Garden's encoders have no next-sentence head):
        # kbert's addition, so that a pretraining model comes back whole from its export.
        @tf.function
        def nsp_call(inputs, training=False):
            out = _hub_outputs(encoder, inputs, training, embedding)
            return {**out, "nsp_logits": pretrainer.nsp_head(out["pooled_output"])}

        for training in (False, True):
            nsp_call.get_concrete_function(specs, training=training)
        nsp = _callable(nsp_call)
        nsp.variables = _tf_variables(v for v in pretrainer.variables if v.path.startswith("nsp_head/"))
        root.nsp = nsp
    return root, signatures


def _preprocessor_module(vocab_file: str, do_lower_case: bool, length: int):
    tokenizer = GraphTokenizer(vocab_file, do_lower_case)
    vocab = load_vocab(vocab_file)
    special = {
        "vocab_size": count_lines(vocab_file),  # ids, as the encoder's vocab_size counts them
        "start_of_sequence_id": vocab["[CLS]"],
        "end_of_segment_id": vocab["[SEP]"],
        "padding_id": vocab.get("[PAD]", 0),
        "mask_id": vocab.get("[MASK]", vocab["[UNK]"]),
    }

    def hub_names(packed):
        return {hub: packed[ours] for hub, ours in HUB_INPUTS.items()}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
    def preprocess(sentences):
        return hub_names(
            pack_token_ids(
                tokenizer(sentences), None, length, special["start_of_sequence_id"], special["end_of_segment_id"]
            )
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
    def tokenize(sentences):
        return tokenizer.word_pieces(sentences)

    @tf.function(input_signature=[])
    def special_tokens():
        return {name: tf.constant(value, tf.int32) for name, value in special.items()}

    @tf.function(autograph=False)
    def bert_pack_inputs(inputs, seq_length=length):
        segments = [s.merge_dims(1, 2) if s.ragged_rank == 2 else s for s in inputs]
        if len(segments) not in (1, 2):
            raise ValueError(f"bert_pack_inputs takes 1 or 2 segments, got {len(segments)}")
        return hub_names(
            pack_token_ids(
                segments[0],
                segments[1] if len(segments) == 2 else None,
                tf.cast(seq_length, tf.int32),
                special["start_of_sequence_id"],
                special["end_of_segment_id"],
            )
        )

    for ragged_rank in (1, 2):  # as Model Garden's: 1 or 2 segments, words or tokens
        for count in (1, 2):
            bert_pack_inputs.get_concrete_function(
                [tf.RaggedTensorSpec([None] * (ragged_rank + 1), tf.int32) for _ in range(count)],
                seq_length=tf.TensorSpec([], tf.int32),
            )

    root = _callable(preprocess)
    root.serve = preprocess  # Keras 3's TFSMLayer endpoint
    root.vocab_table = tokenizer.table  # the lookup table the tokenizer's graph reads
    root.vocab_file = tf.saved_model.Asset(vocab_file)
    root.do_lower_case = tf.Variable(do_lower_case, trainable=False, name="do_lower_case")
    root.tokenize = _callable(tokenize)
    root.tokenize.get_special_tokens_dict = _callable(special_tokens)
    root.bert_pack_inputs = _callable(bert_pack_inputs)
    return root, {"serving_default": preprocess.get_concrete_function()}


def _left_out(model) -> list:
    """What of `model` a TF Hub export does not carry, one phrase each: a task head (TF Hub's
    encoders have none), and heads a converter created (random weights)."""
    said = []
    if not isinstance(model, (BertEncoder, BertPretrainer)):
        kind = type(model).__name__
        task = (getattr(model, "task_info", None) or {}).get("task")
        said.append(f"the {kind}'s task head{f' ({task})' if task else ''}: TF Hub encoders carry none")
    fresh = getattr(model, "fresh_heads", ())
    if isinstance(model, BertPretrainer):
        for head, what in (
            ("masked_lm", "the masked-LM head (mlm)"),
            ("next_sentence", "the next-sentence head (nsp)"),
        ):
            if head in fresh:
                said.append(f"{what}: a converter created it, so its weights are random")
        if "masked_lm" in fresh and "next_sentence" not in fresh:
            # The export carries nsp inside the mlm sub-object (kbert's own addition), so it goes too.
            said.append("the next-sentence head (nsp): the export carries it only beside the masked-LM head")
    return said


@writes("out", inputs=("model_dir",))
def export_tfhub(model_dir, out, max_seq_length: int | None = None, overwrite: bool = False) -> dict:
    """Export a kbert model as TF Hub's BERT encoder and preprocessor: `out/encoder`, `out/preprocessor`.

    A fine-tuned model exports its encoder (TF Hub's encoders carry no task head); a pretraining
    model's encoder gets the `mlm` sub-object; a sentence-embedding model's encoder the
    `embedding` output. `out` appears whole or not at all.

    Args:
        model_dir: str. A kbert model directory, or a google-research checkpoint directory.
        out: str. The directory to write.
        max_seq_length: int. The preprocessor's default length; default the length a
            sentence-embedding model records, else 128, never past the model's
            max_position_embeddings. `bert_pack_inputs(..., seq_length=N)` overrides it.
        overwrite: bool. Replace `out` if it exists and is not empty.

    Returns a JSON-ready summary.

    Example:
    >>> export_tfhub("out/tiny", "hub/tiny")  # doctest: +SKIP
    """
    model_dir = os.fspath(model_dir)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = open_model(model_dir)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if family_of(model) != BERT:
        raise KbertError(
            f"{model_dir}: TF Hub's BERT format holds a BERT encoder and its preprocessor; a {family_of(model)} "
            f"model exports for TF Serving instead (raw text in, its tokenizer in the graph)"
        )
    encoder = encoder_of(model)
    if encoder is None:
        raise KbertError(f"{model_dir}: a {type(model).__name__} has no BERT encoder to export")
    left_out = _left_out(model)
    for part in left_out:
        log.info("%s: the export leaves out %s", model_dir, part)
    # A head a converter created (random weights) is not exported, so that nothing reads it back as trained.
    fresh = getattr(model, "fresh_heads", ())
    pretrainer = model if isinstance(model, BertPretrainer) and "masked_lm" not in fresh else None
    embedding = embedding_of(model)  # a sentence-embedding model: its encoder also returns `embedding`
    recorded = (embedding or {}).get("max_seq_length")  # the tokens its texts keep, as in kbert embed
    length = sequence_length(max_seq_length, encoder.config.max_position_embeddings, recorded)
    if length < 3:
        raise KbertError(f"{option('max_seq_length', length)} must be at least 3 ([CLS] x [SEP])")

    with atomic_output_dir(out, overwrite=overwrite) as tmp:
        config_file = os.path.join(tmp, CONFIG_FILE)  # copied into the encoder's assets, then removed
        with open(config_file, "w", encoding="utf-8") as f:
            f.write(json.dumps(encoder.config.to_dict(), indent=2) + "\n")
        # Traced without the fused training kernels: plain ops, whose gradients every loader has.
        with fused.disabled():
            root, signatures = _encoder_module(
                encoder,
                pretrainer,
                model.vocab_file,
                model.do_lower_case,
                config_file,
                with_nsp="next_sentence" not in fresh,
                embedding=embedding,
            )
            tf.saved_model.save(root, os.path.join(tmp, ENCODER_DIR), signatures=signatures)
        os.remove(config_file)
        root, signatures = _preprocessor_module(model.vocab_file, model.do_lower_case, length)
        tf.saved_model.save(root, os.path.join(tmp, PREPROCESSOR_DIR), signatures=signatures)
    out = os.path.abspath(os.fspath(out))
    return {
        "encoder": os.path.join(out, ENCODER_DIR),
        "preprocessor": os.path.join(out, PREPROCESSOR_DIR),
        "mlm": pretrainer is not None,
        # The pooling and normalisation behind the encoder's `embedding` output; null: no such output.
        "embedding": embedding,
        "left_out": left_out,
        "seq_length": length,
        "do_lower_case": model.do_lower_case,
        "parameters": int(encoder.count_params()),
    }
