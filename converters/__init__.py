"""Checkpoint converters: google-research/bert TF1 checkpoints and Hugging Face safetensors, in and out of kbert."""

from kbert.converters.hf import load_hf_model, save_hf_model
from kbert.converters.tf1 import find_checkpoint, load_tf1_checkpoint, save_tf1_checkpoint

__all__ = ["find_checkpoint", "load_hf_model", "load_tf1_checkpoint", "save_hf_model", "save_tf1_checkpoint"]
