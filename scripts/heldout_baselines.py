"""What a model that ignores context scores on held-out pretraining records.

usage: python scripts/heldout_baselines.py RECORDS [--max-seq-length 128 --max-predictions-per-seq 20]
Prints one JSON object: the masked-LM accuracy of always predicting the most frequent masked
token (the unigram baseline, with that token), the unigram model's cross-entropy (its MLM loss,
fitted on the same records, so a lower bound for any context-free model), and the
next-sentence accuracy of always answering the majority label.
"""

import argparse
import collections
import json
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from kbert.config import DEFAULT_MAX_SEQ_LENGTH
from kbert.pretraining.tf_dataset import pretraining_dataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("records", nargs="+")
    parser.add_argument("--max-seq-length", type=int, default=DEFAULT_MAX_SEQ_LENGTH)
    parser.add_argument("--max-predictions-per-seq", type=int, default=20)
    args = parser.parse_args()

    labels, nsp = collections.Counter(), collections.Counter()
    ds = pretraining_dataset(args.records, 256, args.max_seq_length, args.max_predictions_per_seq, training=False)
    for _, y in ds:
        ids, weights = y["masked_lm_ids"].numpy(), y["masked_lm_weights"].numpy()
        labels.update(ids[weights > 0].tolist())
        nsp.update(y["next_sentence_labels"].numpy().tolist())
    total = sum(labels.values())
    top_id, top_count = labels.most_common(1)[0]
    entropy = -sum(c / total * math.log(c / total) for c in labels.values())
    print(
        json.dumps(
            {
                "masked_positions": total,
                "unigram_mlm_accuracy": round(top_count / total, 4),
                "most_frequent_masked_id": top_id,
                "unigram_mlm_loss": round(entropy, 4),
                "nsp_majority_accuracy": round(max(nsp.values()) / sum(nsp.values()), 4),
            }
        )
    )


if __name__ == "__main__":
    main()
