"""An export's drift from float32, measured as a client sees it: both exports served on the same texts.

`kbert export --precision int8 --calibration FILE` (or bfloat16) also writes the float32 export
of the same model, with the same options, to a temporary directory, loads both SavedModels and
calls their `serving_default` on the same raw texts of FILE (`read_calibration`), in batches of
BATCH. What is compared depends on what the export serves (`head_kind`, from its outputs):

- an embedding model (`embedding`) or an encoder (`pooled_output`, and each real token's
  `sequence_output`): the cosine of each vector to float32's; drift = 1 - the smallest cosine;
- a classifier (`probabilities`, `label_id`): how often `label_id` agrees with float32's, and
  the largest and mean absolute error of the probabilities; drift = 1 - agreement;
- a regressor (`score`): the largest and mean absolute error of the score; drift = the largest;
- a tagger (per-token `label_id`): how often each real token's `label_id` agrees with
  float32's; drift = 1 - agreement.

Every drift is 0 for outputs equal to float32's and grows as they part; `check_drift` refuses
one past a limit (`kbert export --max-drift`).
"""

from __future__ import annotations

import numpy as np

from kbert.finetuning.readers import read_feature_texts
from kbert.runtime.errors import KbertError, option

# How many texts of the calibration file are used when the caller does not say.
CALIBRATION_TEXTS = 200
# Texts per request: a batch a client typically sends (the export groups each by length).
BATCH = 32
# What each kind's drift is, in words: for the report and for messages.
DRIFT_IS = {
    "embedding": "1 - the smallest cosine to float32's vectors",
    "encoder": "1 - the smallest cosine to float32's vectors (pooled_output and each real token's sequence_output)",
    "classifier": "1 - the share of texts whose label_id agrees with float32's",
    "regressor": "the largest absolute error of score against float32's",
    "tagger": "1 - the share of real tokens whose label_id agrees with float32's",
}


def read_calibration(path, count: int | None = None) -> tuple[list, list | None]:
    """(texts, texts_b or None): the first `count` texts of a calibration file (default: up to
    CALIBRATION_TEXTS), read as `kbert embed` reads its input: one text per line (`text ||| text_b`
    for pairs), or a CSV, TSV or JSON Lines table with a `text` column (and `text_b`).

    A file with fewer texts than `count`, with no texts, or with rows that hold none, is refused.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "texts.txt")
    >>> _ = open(path, "w").write("A first text.\\nA second one.\\n")
    >>> read_calibration(path)
    (['A first text.', 'A second one.'], None)
    >>> read_calibration(path, 3)
    Traceback (most recent call last):
    kbert.runtime.errors.KbertError: ... holds 2 texts, fewer than calibration_texts=3: ...
    """
    # Bad rows are skipped here and refused below: the reader's own message names an option
    # that `kbert export` does not have.
    examples = read_feature_texts(path, skip_bad_rows=True)
    if examples.skipped_rows:
        lines = examples.skipped_rows
        raise KbertError(
            f"{path}: rows at line {', '.join(map(str, lines[:5]))}{' and more' if len(lines) > 5 else ''} hold no "
            "text; fix them (one text per line, or a CSV, TSV or JSON Lines table with a text column)"
        )
    texts, texts_b = examples.texts, examples.texts_b
    if count is not None and len(texts) < count:
        raise KbertError(
            f"{path} holds {len(texts)} texts, fewer than {option('calibration_texts', count)}: pass "
            f"{option('calibration_texts', len(texts))} or fewer, or a file with more texts"
        )
    count = count or CALIBRATION_TEXTS
    return texts[:count], None if texts_b is None else texts_b[:count]


def head_kind(outputs) -> str:
    """What an export serves, from its `serving_default` output names: "embedding", "encoder",
    "classifier", "regressor" or "tagger" (the keys of DRIFT_IS).

    >>> head_kind(["probabilities", "label_id", "label"]), head_kind(["score"])
    ('classifier', 'regressor')
    """
    outputs = set(outputs)
    for name, kind in (
        ("embedding", "embedding"),
        ("pooled_output", "encoder"),
        ("probabilities", "classifier"),
        ("score", "regressor"),
        ("label_id", "tagger"),
    ):
        if name in outputs:
            return kind
    raise KbertError(
        f"an export with outputs {', '.join(sorted(outputs))} has no drift measure; leave out {option('calibration')}"
    )


def serve(path: str, texts: list, texts_b: list | None = None) -> list[dict]:
    """The numeric outputs of the SavedModel at `path`'s `serving_default`, one dict per batch
    of BATCH texts (what a client gets back, as numpy arrays).

    A model that takes `text_b` gets "" where the texts have none, as a client sending single
    texts does; one that takes `text` alone refuses pairs.
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(path)
    function = loaded.signatures["serving_default"]
    inputs = set(function.structured_input_signature[1])
    if texts_b is not None and "text_b" not in inputs:
        raise KbertError(
            f"the calibration texts are pairs (text_b), and this export takes one text per row; "
            f"pass a file of single texts to {option('calibration')}"
        )
    batches = []
    for start in range(0, len(texts), BATCH):
        request = {"text": tf.constant(texts[start : start + BATCH])}
        if "text_b" in inputs:
            second = texts_b[start : start + BATCH] if texts_b is not None else [""] * len(request["text"])
            request["text_b"] = tf.constant(second)
        out = function(**request)
        batches.append({k: v.numpy() for k, v in out.items() if v.dtype != tf.string})
    return batches


def drift_report(reference: list[dict], exported: list[dict]) -> dict:
    """The drift of `exported`'s outputs from `reference`'s (float32's), batch by batch as `serve`
    gives them: the numbers of the kind's measure and "drift" (DRIFT_IS says what it is).

    Example:
    >>> ref = [{"probabilities": np.array([[0.9, 0.1], [0.4, 0.6]]), "label_id": np.array([0, 1])}]
    >>> got = [{"probabilities": np.array([[0.8, 0.2], [0.6, 0.4]]), "label_id": np.array([0, 0])}]
    >>> report = drift_report(ref, got)
    >>> report["kind"], report["agreement"], report["drift"], round(report["probability_error_max"], 6)
    ('classifier', 0.5, 0.5, 0.2)
    """
    kind = head_kind(reference[0])
    parts = [_compare(kind, want, got) for want, got in zip(reference, exported)]
    values = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    report = {"kind": kind, "drift_is": DRIFT_IS[kind]}
    if kind in ("embedding", "encoder"):
        cosines = values["cosine"]
        report.update(cosine_median=float(np.median(cosines)), cosine_min=float(cosines.min()))
        if kind == "encoder":
            tokens = values["token_cosine"]
            report.update(token_cosine_median=float(np.median(tokens)), token_cosine_min=float(tokens.min()))
            report["drift"] = 1.0 - min(report["cosine_min"], report["token_cosine_min"])
        else:
            report["drift"] = 1.0 - report["cosine_min"]
    elif kind in ("classifier", "tagger"):
        report["agreement"] = float(values["agree"].mean())
        if kind == "classifier":
            errors = values["probability_error"]
            report.update(probability_error_max=float(errors.max()), probability_error_mean=float(errors.mean()))
        report["drift"] = 1.0 - report["agreement"]
    else:
        errors = values["error"]
        report.update(error_max=float(errors.max()), error_mean=float(errors.mean()))
        report["drift"] = report["error_max"]
    return report


def _compare(kind: str, want: dict, got: dict) -> dict:
    """One batch's per-item numbers (a cosine per vector, an agreement per label, an error per value)."""
    if kind == "embedding":
        return {"cosine": _cosine(want["embedding"], got["embedding"])}
    if kind == "encoder":
        real = want["input_mask"] == 1
        return {
            "cosine": _cosine(want["pooled_output"], got["pooled_output"]),
            "token_cosine": _cosine(want["sequence_output"][real], got["sequence_output"][real]),
        }
    if kind == "classifier":
        return {
            "agree": want["label_id"] == got["label_id"],
            "probability_error": np.abs(want["probabilities"] - got["probabilities"]).ravel(),
        }
    if kind == "tagger":
        real = want["input_mask"] == 1 if "input_mask" in want else np.ones(want["label_id"].shape, bool)
        return {"agree": want["label_id"][real] == got["label_id"][real]}
    return {"error": np.abs(np.asarray(want["score"], np.float64) - got["score"]).ravel()}


def _cosine(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
    return (a * b).sum(-1) / norms


def measure_drift(reference_path: str, export_path: str, texts: list, texts_b: list | None = None) -> dict:
    """The drift report of the export at `export_path` from the float32 export at
    `reference_path`, both served on the same texts (`serve`, `drift_report`), with how many texts."""
    report = drift_report(serve(reference_path, texts, texts_b), serve(export_path, texts, texts_b))
    return {**report, "texts": len(texts)}


def check_drift(report: dict, max_drift: float | None, precision: str):
    """Refuse a drift past `max_drift` (None: any drift), saying both numbers and what they are."""
    if max_drift is not None and report["drift"] > max_drift:
        lower = "bfloat16 or float32" if precision == "int8" else "float32"
        raise KbertError(
            f"the {precision} export drifts {report['drift']:.6g} from float32 over {report['texts']} calibration "
            f"texts, past {option('max_drift', max_drift)} (its drift: {report['drift_is']}); nothing was written: "
            f"raise {option('max_drift')}, or export with {option('precision')} {lower}"
        )
