"""Checkpoint converters: google-research/bert TF1 checkpoints, Hugging Face safetensors, TF Hub
encoders and keras-hub presets into kbert, and out.

keras-hub presets: `kbert.converters.keras_hub` (not imported here: keras-hub adds about a
second to every converter's start).
"""

from kbert.converters.hf import load_hf_model, save_hf_model
from kbert.converters.tf1 import find_checkpoint, load_tf1_checkpoint, save_tf1_checkpoint
from kbert.converters.tfhub import load_tfhub_encoder

__all__ = [
    "find_checkpoint",
    "load_hf_model",
    "load_tf1_checkpoint",
    "load_tfhub_encoder",
    "save_hf_model",
    "save_tf1_checkpoint",
]
