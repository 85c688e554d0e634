"""Checkpoint converters: google-research/bert TF1 checkpoints, Hugging Face safetensors, TF Hub
encoders and keras-hub presets into kbert, and out.

keras-hub presets: `kbert.converters.keras_hub` (not imported here: keras-hub adds about a
second to every converter's start).
"""

import importlib

# Each name from its module on first use: the Hugging Face converter runs on every Keras backend,
# the TF1 and TF Hub ones import TensorFlow.
_EXPORTS = {
    "find_checkpoint": "kbert.converters.tf1",
    "load_hf_model": "kbert.converters.hf",
    "load_tf1_checkpoint": "kbert.converters.tf1",
    "load_tfhub_encoder": "kbert.converters.tfhub",
    "save_hf_model": "kbert.converters.hf",
    "save_tf1_checkpoint": "kbert.converters.tf1",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kbert.converters' has no attribute {name!r}")


__all__ = [
    "find_checkpoint",
    "load_hf_model",
    "load_tf1_checkpoint",
    "load_tfhub_encoder",
    "save_hf_model",
    "save_tf1_checkpoint",
]
