"""Masked-LM loss and accuracy of a kbert pretraining model, split at a position: how well a
model grown by `kbert extend --max-position-embeddings` reads the positions past its old ones.

usage: python scripts/positions_loss.py MODEL_DIR RECORDS --max-seq-length N
       [--max-predictions-per-seq 20] [--split 512] [--batch-size 4] [--old-vocab VOCAB]
Prints {"before": {"loss", "accuracy", "positions"}, "after": {...}} as JSON: the masked
positions before `--split` and from it on, every record of RECORDS (create-data's output).
With --old-vocab (the vocab.txt a model had before `kbert extend --words/--corpus`), it splits
the masked positions by their target instead: "old_tokens" and "new_words".
"""

import argparse
import json

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("records")
    parser.add_argument("--max-seq-length", type=int, required=True)
    parser.add_argument("--max-predictions-per-seq", type=int, default=20)
    parser.add_argument("--split", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--old-vocab")
    args = parser.parse_args()

    import kbert
    from kbert.pretraining.record_checks import find_files
    from kbert.pretraining.tf_dataset import pretraining_dataset

    model = kbert.load(args.model_dir)
    data = pretraining_dataset(
        find_files(args.records), args.batch_size, args.max_seq_length, args.max_predictions_per_seq, training=False
    )
    losses, hits, positions, targets = [], [], [], []
    for features, labels in data:
        logits = np.asarray(model(features, training=False)["mlm_logits"], np.float64)
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        ids = labels["masked_lm_ids"].numpy()
        real = labels["masked_lm_weights"].numpy() > 0
        picked = np.take_along_axis(log_probs, ids[..., None], -1)[..., 0]
        losses.append(-picked[real])
        hits.append((log_probs.argmax(-1) == ids)[real])
        positions.append(features["masked_lm_positions"].numpy()[real])
        targets.append(ids[real])
    losses, hits, positions, targets = map(np.concatenate, (losses, hits, positions, targets))
    result = {}
    splits = (("before", positions < args.split), ("after", positions >= args.split))
    if args.old_vocab:
        from kbert.text.tokenizer import vocab_tokens

        old, new = vocab_tokens(args.old_vocab), vocab_tokens(model.vocab_file)
        is_new = np.array([i >= len(old) or new[i] != old[i] for i in range(len(new))])
        splits = (("old_tokens", ~is_new[targets]), ("new_words", is_new[targets]), ("all", targets >= 0))
    for name, where in splits:
        result[name] = {
            "loss": round(float(losses[where].mean()), 4) if where.any() else None,
            "accuracy": round(float(hits[where].mean()), 4) if where.any() else None,
            "positions": int(where.sum()),
        }
    print(json.dumps(result if args.old_vocab else {"split": args.split, **result}))


if __name__ == "__main__":
    main()
