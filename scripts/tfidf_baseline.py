"""TF-IDF + logistic regression on the same train/test split: the baseline for fine-tuned BERT.

usage: python scripts/tfidf_baseline.py DATA_DIR   (train.tsv, dev.tsv, test.tsv with text,label)
Prints one JSON object: accuracy and macro-F1 on dev and test (scikit-learn, `bench` extra).
The C of the regression is picked on dev, as the fine-tuning picks its best epoch on dev.
"""

import csv
import json
import os
import sys

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score


def read(path):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))[1:]
    return [r[0] for r in rows], [r[1] for r in rows]


def main(data_dir):
    (train_x, train_y), (dev_x, dev_y), (test_x, test_y) = (
        read(os.path.join(data_dir, f"{s}.tsv")) for s in ("train", "dev", "test")
    )
    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2)
    train = vectorizer.fit_transform(train_x)
    best = None
    for c in (1.0, 3.0, 10.0, 30.0, 100.0):
        model = LogisticRegression(C=c, max_iter=2000).fit(train, train_y)
        dev_acc = accuracy_score(dev_y, model.predict(vectorizer.transform(dev_x)))
        if best is None or dev_acc > best[0]:
            best = (dev_acc, c, model)
    dev_acc, c, model = best
    predicted = model.predict(vectorizer.transform(test_x))
    print(
        json.dumps(
            {
                "C": c,
                "dev_accuracy": round(dev_acc, 4),
                "test_accuracy": round(accuracy_score(test_y, predicted), 4),
                "test_macro_f1": round(f1_score(test_y, predicted, average="macro"), 4),
                "train": len(train_y),
                "dev": len(dev_y),
                "test": len(test_y),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
