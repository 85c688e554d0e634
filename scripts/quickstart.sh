#!/usr/bin/env bash
# `make quickstart`: kbert's main job end to end on the bundled tiny checkpoint, which was
# written by google-research/bert's own code (tests/fixtures/tf1-tiny/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
KBERT=.venv/bin/kbert
OUT=quickstart-out
FIX=tests/fixtures/tf1-tiny
mkdir -p "$OUT"
say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

say "1. What does the original checkpoint hold?   kbert convert inspect $FIX"
$KBERT convert inspect "$FIX"

say "2. Convert it into a Keras model directory.   kbert convert from-tf1 $FIX $OUT/tiny"
$KBERT convert from-tf1 "$FIX" "$OUT/tiny" --overwrite

say "3. Does the Keras model compute what the original code computed? (max |difference|, float32)"
.venv/bin/python scripts/check_fixture.py "$OUT/tiny" "$FIX/expected.npz"

say "4. Write it back as an original checkpoint.   kbert convert to-tf1 $OUT/tiny $OUT/tiny-tf1"
$KBERT convert to-tf1 "$OUT/tiny" "$OUT/tiny-tf1" --overwrite

say "5. Is the round trip bit for bit?"
.venv/bin/python scripts/compare_checkpoints.py "$FIX" "$OUT/tiny-tf1"

say "6. The tokenizer is google-research/bert's, in Python and inside the TF graph:"
.venv/bin/python - <<'PY'
import json, kbert
from kbert.cli.common import import_tensorflow_quietly
import_tensorflow_quietly()
import tensorflow as tf
text = "Ｆｕｌｌ-width ™ café 東京 naïve\u200b text!"
python_tok = kbert.Tokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
graph_tok = kbert.GraphTokenizer("tests/fixtures/vocab-uncased.txt", do_lower_case=True)
tokens = python_tok.tokenize(text)
ids = python_tok.convert_tokens_to_ids(tokens)
print(json.dumps({"text": text, "tokens": tokens, "ids": ids,
                  "in_graph_ids_equal": graph_tok(tf.constant([text])).to_list()[0] == ids},
                 ensure_ascii=False))
PY
say "7. Pretraining records from the bundled sample text.   kbert create-data"
$KBERT create-data --input tests/fixtures/sample_text.txt --vocab "$FIX/vocab.txt" \
    --output "$OUT/sample.tfrecord" --max-seq-length 64 --max-predictions-per-seq 10 --dupe-factor 5 --overwrite

say "8. Continue pretraining the converted model on them (MLM + NSP).   kbert pretrain --init $OUT/tiny"
rm -rf "$OUT/pretrained"
$KBERT pretrain --model-dir "$OUT/pretrained" --init "$OUT/tiny" --data "$OUT/sample.tfrecord" \
    --max-seq-length 64 --max-predictions-per-seq 10 --steps 40 --batch-size 16 --learning-rate 5e-4 \
    --save-every 20 --eval-data "$OUT/sample.tfrecord" --eval-steps 2

say "9. What does it predict behind a [MASK]?   kbert fill-mask   (a 300-token toy vocabulary and random weights trained 40 steps: expect noise; see the README for a real run)"
$KBERT fill-mask "$OUT/pretrained" "the man went to the [MASK]." --top-k 3

say "Done. Model directories: $OUT/tiny (converted) and $OUT/pretrained (with checkpoints/, logs/ for TensorBoard, loss.png); load either with kbert.load(...)."
