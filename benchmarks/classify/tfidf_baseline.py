"""The bar a fine-tuned classifier must clear: character 1-3-gram TF-IDF + logistic regression,
trained on the train split and scored on the test split of the very split `trainformer` uses
(trainformer.data.labelled.load_labelled), next to the majority-class baseline.

The regularisation strength C is picked on the valid split (never on test) from a small grid.

    python benchmarks/classify/tfidf_baseline.py                    # both labelled recipes
    python benchmarks/classify/tfidf_baseline.py --corpus my.jsonl --json
    python benchmarks/classify/tfidf_baseline.py --ngram-max 5 --min-df 2   # longer n-grams
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score

from trainformer.data.labelled import LabelledCorpus, load_labelled
from trainformer.data.recipes import LABELLED

GRID_C = (0.25, 1.0, 4.0, 16.0)


def fit_on_train(corpus: LabelledCorpus, ngram_max: int = 3, min_df: int = 1):
    """(vectorizer, model, C, valid accuracy): TF-IDF (vocabulary and idf from train only) and
    the logistic regression whose C scored best on valid."""
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, ngram_max), min_df=min_df, sublinear_tf=True)
    x_train = vectorizer.fit_transform(corpus.train.texts)
    x_valid = vectorizer.transform(corpus.valid.texts)
    best = None
    for c in GRID_C:
        model = LogisticRegression(C=c, max_iter=2000).fit(x_train, corpus.train.labels)
        valid_accuracy = accuracy_score(corpus.valid.labels, model.predict(x_valid))
        if best is None or valid_accuracy > best[3]:
            best = (vectorizer, model, c, valid_accuracy)
    return best


def evaluate(corpus_name: str, valid_fraction: float, test_fraction: float, ngram_max: int = 3,
             min_df: int = 1) -> dict:
    corpus = load_labelled(corpus_name, valid_fraction, test_fraction)
    if not corpus.test:
        raise SystemExit(f"{corpus_name}: --test-fraction is 0, nothing to score on")
    start = time.perf_counter()
    vectorizer, model, c, valid_accuracy = fit_on_train(corpus, ngram_max, min_df)
    predicted = model.predict(vectorizer.transform(corpus.test.texts))

    majority = Counter(corpus.train.labels).most_common(1)[0][0]
    return {
        "corpus": corpus_name,
        "labels": len(corpus.labels),
        "train": len(corpus.train),
        "valid": len(corpus.valid),
        "test": len(corpus.test),
        "fingerprint": corpus.fingerprint,
        "majority_label": corpus.labels[majority],
        "majority_accuracy": accuracy_score(corpus.test.labels, [majority] * len(corpus.test)),
        "majority_macro_f1": f1_score(corpus.test.labels, [majority] * len(corpus.test), average="macro",
                                      labels=range(len(corpus.labels)), zero_division=0),
        "ngrams": f"1-{ngram_max}",
        "C": c,
        "features": len(vectorizer.vocabulary_),
        "valid_accuracy": valid_accuracy,
        "test_accuracy": accuracy_score(corpus.test.labels, predicted),
        "test_macro_f1": f1_score(corpus.test.labels, predicted, average="macro",
                                  labels=range(len(corpus.labels)), zero_division=0),
        "seconds": time.perf_counter() - start,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| corpus | labels | train / valid / test | majority acc (macro-F1) | char n-grams | TF-IDF+LR test acc "
        "| macro-F1 | C (valid acc) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['corpus']} | {r['labels']} | {r['train']:,} / {r['valid']:,} / {r['test']:,} "
            f"| {r['majority_accuracy']:.1%} ({r['majority_macro_f1']:.3f}) | {r['ngrams']} | {r['test_accuracy']:.1%} "
            f"| {r['test_macro_f1']:.3f} | {r['C']:g} ({r['valid_accuracy']:.1%}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", action="append", help=f"recipe or file (default: {', '.join(LABELLED)})")
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--ngram-max", type=int, default=3, help="longest character n-gram (default 3)")
    parser.add_argument("--min-df", type=int, default=1, help="drop n-grams in fewer training texts")
    parser.add_argument("--json", action="store_true", help="one JSON object per corpus instead of the table")
    args = parser.parse_args()
    results = [evaluate(name, args.valid_fraction, args.test_fraction, args.ngram_max, args.min_df)
               for name in args.corpus or LABELLED]
    if args.json:
        for result in results:
            print(json.dumps(result))
    else:
        print(table(results))


if __name__ == "__main__":
    main()
