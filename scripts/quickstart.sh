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
say "Done. The kbert model directory is $OUT/tiny; load it in Python with kbert.load(\"$OUT/tiny\")."
