"""The pretraining losses: run_pretraining.py's masked LM + next sentence (`pretraining_losses`),
the masked LM alone (`masked_lm_losses`, a ModernBERT's), and softmax cross-entropy for a large
vocabulary.

They are `keras.ops`, the same on TensorFlow, JAX and PyTorch. TensorFlow's engine trains with a
faster form of the cross-entropy (`kbert.pretraining.tf_losses`), which it passes to them.
"""

from __future__ import annotations

from keras import ops


def pretraining_losses(outputs, labels, cross_entropy=None):
    """The original's losses and accuracies from the pretrainer's outputs.

    masked-LM: Σ w·(-log p(label)) / (Σ w + 1e-5) over all masked positions (padding has w=0);
    next-sentence: the mean of -log p(label). Accuracies are weighted the same way.

    Args:
        outputs: dict. The pretrainer's `mlm_logits` [batch, P, vocab] and `nsp_logits` [batch, 2].
        labels: dict. `masked_lm_ids` int [batch, P], `masked_lm_weights` float32 [batch, P] and
            `next_sentence_labels` int [batch], as the pretraining records hold them.
        cross_entropy: callable. (loss, hit) per row from (labels [N], logits [N, vocab]);
            default `cross_entropy_and_hits`.

    Returns: dict of float32 scalars `loss` (MLM + NSP), `mlm_loss`, `nsp_loss`, `mlm_accuracy`, `nsp_accuracy`.

    Example:
    >>> import numpy as np
    >>> out = {"mlm_logits": np.array([[[2.0, 0.0], [0.0, 2.0]]], "float32"),
    ...        "nsp_logits": np.array([[0.0, 0.0]], "float32")}
    >>> labels = {"masked_lm_ids": np.array([[0, 0]]), "masked_lm_weights": np.array([[1.0, 0.0]], "float32"),
    ...           "next_sentence_labels": np.array([0])}
    >>> {k: round(float(v), 4) for k, v in pretraining_losses(out, labels).items()}
    {'loss': 0.8201, 'mlm_loss': 0.1269, 'nsp_loss': 0.6931, 'mlm_accuracy': 1.0, 'nsp_accuracy': 1.0}
    """
    masked_lm = masked_lm_losses(outputs, labels, cross_entropy)
    nsp_logits = ops.cast(outputs["nsp_logits"], "float32")
    nsp_labels = ops.cast(ops.reshape(labels["next_sentence_labels"], [-1]), "int32")
    nsp_loss = ops.mean(ops.sparse_categorical_crossentropy(nsp_labels, nsp_logits, from_logits=True))
    nsp_hits = ops.cast(ops.equal(ops.cast(ops.argmax(nsp_logits, -1), "int32"), nsp_labels), "float32")
    return {
        "loss": masked_lm["mlm_loss"] + nsp_loss,
        "mlm_loss": masked_lm["mlm_loss"],
        "nsp_loss": nsp_loss,
        "mlm_accuracy": masked_lm["mlm_accuracy"],
        "nsp_accuracy": ops.mean(nsp_hits),
    }


def masked_lm_losses(outputs, labels, cross_entropy=None):
    """The masked-LM loss alone (a ModernBERT's objective: no next-sentence task), weighted as
    the original weights it: Σ w·(-log p(label)) / (Σ w + 1e-5); the accuracy the same way.

    Args:
        outputs: dict. `mlm_logits` [batch, P, vocab].
        labels: dict. `masked_lm_ids` int [batch, P] and `masked_lm_weights` float32 [batch, P].
        cross_entropy: callable, as `pretraining_losses` takes it.

    Returns: dict of float32 scalars `loss` (the masked-LM loss), `mlm_loss` and `mlm_accuracy`.

    Example:
    >>> import numpy as np
    >>> out = {"mlm_logits": np.array([[[2.0, 0.0], [0.0, 2.0]]], "float32")}
    >>> labels = {"masked_lm_ids": np.array([[0, 0]]), "masked_lm_weights": np.array([[1.0, 1.0]], "float32")}
    >>> {k: round(float(v), 4) for k, v in masked_lm_losses(out, labels).items()}
    {'loss': 1.1269, 'mlm_loss': 1.1269, 'mlm_accuracy': 0.5}
    """
    ids = ops.cast(labels["masked_lm_ids"], "int32")
    weights = ops.cast(labels["masked_lm_weights"], "float32")
    mlm_logits = ops.cast(outputs["mlm_logits"], "float32")
    vocab = ops.shape(mlm_logits)[-1]
    # A hit: the label's logit is the largest (an argmax that differs only on exact ties, from
    # the row maximum the loss computes anyway).
    per_position, mlm_hits = (cross_entropy or cross_entropy_and_hits)(
        ops.reshape(ids, [-1]), ops.reshape(mlm_logits, [-1, vocab])
    )
    per_position = ops.reshape(per_position, ops.shape(ids))
    mlm_hits = ops.reshape(ops.cast(mlm_hits, "float32"), ops.shape(ids))
    mlm_loss = ops.sum(weights * per_position) / (ops.sum(weights) + 1e-5)
    return {
        "loss": mlm_loss,
        "mlm_loss": mlm_loss,
        "mlm_accuracy": ops.sum(weights * mlm_hits) / (ops.sum(weights) + 1e-5),
    }


def sparse_softmax_cross_entropy(labels, logits):
    """-log softmax(logits)[label] per row; labels int [N], logits float32 [N, classes].

    Example:
    >>> import numpy as np
    >>> logits = np.array([[2.0, 1.0, 0.1], [0.0, 0.0, 5.0]], "float32")
    >>> ours = ops.convert_to_numpy(sparse_softmax_cross_entropy(np.array([0, 2]), logits))
    >>> theirs = np.log(np.exp(logits).sum(-1)) - logits[[0, 1], [0, 2]]
    >>> bool(np.allclose(ours, theirs, atol=1e-6))
    True
    """
    return cross_entropy_and_hits(labels, logits)[0]


def cross_entropy_and_hits(labels, logits):
    """(loss, hit) per row: the cross-entropy above, and whether the label's logit is the row's
    largest (accuracy's test, from the maximum the loss computes anyway).

    A hit differs from `argmax == label` only on an exact tie for the largest logit.

    Example:
    >>> import numpy as np
    >>> loss, hit = cross_entropy_and_hits(np.array([0, 0]), np.array([[2.0, 1.0], [0.0, 3.0]], "float32"))
    >>> ops.convert_to_numpy(hit).tolist()
    [True, False]
    """
    labels, logits = ops.cast(labels, "int32"), ops.convert_to_tensor(logits)
    picked = ops.take_along_axis(logits, ops.expand_dims(labels, -1), axis=-1)[:, 0]
    top = ops.max(logits, axis=-1)
    # -log softmax(x)[label] = log Σ exp(x - top) + top - x[label]: shifted by the row maximum, exp cannot overflow.
    loss = ops.log(ops.sum(ops.exp(logits - ops.expand_dims(ops.stop_gradient(top), -1)), axis=-1))
    return loss + ops.stop_gradient(top) - picked, picked >= top
