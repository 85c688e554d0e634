"""What pretraining and fine-tuning share: the optimizer, checkpoints, event logs and the progress display.

- `optimization`: the original's AdamW (no bias correction, weight decay, global-norm clip) and its schedule;
- `progress`: the progress bar with rate and ETA, and the PNG loss curve;
- `event_log`: TensorBoard event files of scalars, written without TensorFlow;
- `checkpoints`: training checkpoints (weights, optimizer, dropout seeds) on any Keras backend, without TensorFlow.
"""
