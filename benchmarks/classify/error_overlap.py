"""Where a classifier's errors are: which examples of the valid split fine-tuned runs and the
TF-IDF baseline get wrong, how many errors they share, what averaging their probabilities
would score, their accuracy by the text's length (where a pretrained encoder's lead lives), and
a sample of the texts every one of them gets wrong (to read: label noise, or sentiment a model
should have seen?).

A diagnostic on the valid split: it chooses nothing, and the test split is never read.

    pip install -c constraints.txt -r benchmarks/classify/requirements.txt
    python benchmarks/classify/error_overlap.py runs/zh-sentiment runs/zh-sentiment-s7 --show 40
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
from tfidf_baseline import fit_on_train

from trainformer.data.labelled import load_labelled
from trainformer.run.inference import predictor
from trainformer.run_dir import RunDir


def run_probabilities(run_dir: str, texts: list[str], labels: list[str]) -> np.ndarray:
    """(examples, labels) probabilities from the run's best checkpoint, columns in `labels` order."""
    answers = predictor(Path(run_dir), "best")(texts)
    return np.array([[answer["probabilities"][label] for label in labels] for answer in answers])


def row(name: str, probabilities: np.ndarray, truth: np.ndarray, tfidf_wrong: np.ndarray | None) -> str:
    wrong = probabilities.argmax(axis=1) != truth
    shared = f"{(wrong & tfidf_wrong).sum():,}" if tfidf_wrong is not None else "-"
    return f"| {name} | {1 - wrong.mean():.2%} | {wrong.sum():,} | {shared} |"


# Text lengths in characters (about tokens, for Chinese): the edges of zh-bert-small's 64-token
# pretraining windows and of zh-sentiment's 128 / 256-token inputs.
LENGTH_EDGES = (0, 32, 64, 128, 256)


def by_length(texts: list[str], truth: np.ndarray, named: dict[str, np.ndarray]) -> str:
    """A table: each model's accuracy per length bucket (columns), from `named` probabilities."""
    lengths = np.array([len(text) for text in texts])  # (examples,)
    buckets = np.digitize(lengths, LENGTH_EDGES[1:])  # (examples,), 0..len(LENGTH_EDGES)-1
    names = [f"{lo}-{hi - 1}" for lo, hi in zip(LENGTH_EDGES, LENGTH_EDGES[1:])] + [f"{LENGTH_EDGES[-1]}+"]
    masks = [buckets == b for b in range(len(names))]  # one (examples,) bool per bucket
    lines = ["| characters | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names),
             "| examples | " + " | ".join(f"{mask.sum():,}" for mask in masks) + " |"]
    for name, probabilities in named.items():
        right = probabilities.argmax(axis=1) == truth
        cells = [f"{right[mask].mean():.1%}" if mask.any() else "-" for mask in masks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="classify run directories fine-tuned on the same corpus and split")
    parser.add_argument("--ngram-max", type=int, default=5, help="the TF-IDF baseline's longest n-gram (default 5)")
    parser.add_argument("--min-df", type=int, default=2, help="the TF-IDF baseline's min_df (default 2)")
    parser.add_argument("--show", type=int, default=20, help="how many shared errors to print (default 20)")
    args = parser.parse_args()

    data = RunDir(Path(args.runs[0])).load_config().data
    corpus = load_labelled(data.corpus, data.valid_fraction, data.test_fraction)
    for run_dir in args.runs:
        if RunDir(Path(run_dir)).read_manifest().get("data", {}).get("fingerprint") != corpus.fingerprint:
            raise SystemExit(f"{run_dir}: trained on another split than {data.corpus}'s {corpus.fingerprint[:8]}")
    texts, truth = corpus.valid.texts, np.array(corpus.valid.labels)

    vectorizer, model, c, _ = fit_on_train(corpus, args.ngram_max, args.min_df)
    tfidf = model.predict_proba(vectorizer.transform(texts))  # (examples, labels), classes 0..n-1
    tfidf_wrong = tfidf.argmax(axis=1) != truth
    runs = [run_probabilities(run_dir, texts, corpus.labels) for run_dir in args.runs]

    print(f"{data.corpus}, valid split ({len(texts):,} examples, fingerprint {corpus.fingerprint[:8]})\n")
    print("| model | accuracy | errors | shared with TF-IDF |\n|---|---:|---:|---:|")
    print(row(f"TF-IDF + LR, char 1-{args.ngram_max}, C {c:g}", tfidf, truth, None))
    for run_dir, probabilities in zip(args.runs, runs):
        print(row(run_dir, probabilities, truth, tfidf_wrong))
    mean = np.mean(runs, axis=0)
    if len(runs) > 1:
        print(row(f"mean of the {len(runs)} runs' probabilities", mean, truth, tfidf_wrong))
    print(row("mean of the runs' and TF-IDF's", (mean + tfidf) / 2, truth, tfidf_wrong))

    print("\naccuracy by length\n")
    print(by_length(texts, truth, {"TF-IDF + LR": tfidf, **dict(zip(args.runs, runs))}))

    every = tfidf_wrong & np.all([p.argmax(axis=1) != truth for p in runs], axis=0)
    print(f"\nwrong in every model: {every.sum():,} ({every.mean():.1%} of the split)")
    shown = random.Random(0).sample(list(np.flatnonzero(every)), min(args.show, int(every.sum())))
    for i in shown:
        print(f"{corpus.labels[truth[i]]}\t{texts[i][:150]}")


if __name__ == "__main__":
    main()
