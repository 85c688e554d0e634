"""Checkpoint converters: google-research/bert TF1 checkpoints in and out of kbert."""

from kbert.converters.tf1 import find_checkpoint, load_tf1_checkpoint, save_tf1_checkpoint

__all__ = ["find_checkpoint", "load_tf1_checkpoint", "save_tf1_checkpoint"]
