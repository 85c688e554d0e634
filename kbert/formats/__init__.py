"""kbert's files: the model directory, every model source a command reads (one table of kinds),
and TFRecords read and written without TensorFlow."""
