"""Mixed precision's 16-bit type: which one a run computes in, and the names --mixed-precision-dtype takes.

Free of Keras, so that the options modules check the name where the flags are read.

>>> mixed_precision_policy("auto", compute_capability=9.0)
'mixed_bfloat16'
"""

from __future__ import annotations

from kbert.runtime.errors import KbertError, option

MIXED_PRECISION_DTYPES = ("auto", "bfloat16", "float16")


def check_mixed_precision_dtype(dtype: str):
    """Refuse, in one line, a --mixed-precision-dtype that is not one of `MIXED_PRECISION_DTYPES`.

    >>> check_mixed_precision_dtype("fp16")
    Traceback (most recent call last):
    ...
    kbert.runtime.errors.KbertError: mixed_precision_dtype='fp16': use auto, bfloat16 or float16
    """
    if dtype not in MIXED_PRECISION_DTYPES:
        raise KbertError(
            f"{option('mixed_precision_dtype', dtype)}: use {', '.join(MIXED_PRECISION_DTYPES[:-1])} or "
            f"{MIXED_PRECISION_DTYPES[-1]}"
        )


def resolved_mixed_precision_dtype(dtype: str, compute_capability: float | None) -> str:
    """The 16-bit type `dtype` names on a device of this `compute_capability` (None: not a GPU, or
    one whose backend does not say). "auto" is bfloat16 (CPUs, TPUs, GPUs from the A100 on:
    compute capability 8.0), and float16 on older GPUs, whose tensor cores lack bfloat16; under
    float16 the loss is scaled (its narrow range would otherwise flush small gradients to zero).

    >>> resolved_mixed_precision_dtype("auto", None), resolved_mixed_precision_dtype("auto", 9.0)
    ('bfloat16', 'bfloat16')
    >>> resolved_mixed_precision_dtype("auto", 7.0), resolved_mixed_precision_dtype("float16", None)
    ('float16', 'float16')
    """
    if dtype == "auto":
        return "float16" if compute_capability is not None and compute_capability < 8.0 else "bfloat16"
    return dtype


def mixed_precision_policy(dtype: str, compute_capability: float | None) -> str:
    """Keras' mixed policy for `dtype` (`resolved_mixed_precision_dtype`).

    >>> mixed_precision_policy("auto", 7.0), mixed_precision_policy("bfloat16", 7.0)
    ('mixed_float16', 'mixed_bfloat16')
    """
    return f"mixed_{resolved_mixed_precision_dtype(dtype, compute_capability)}"
