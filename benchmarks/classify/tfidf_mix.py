"""Does the TF-IDF baseline know what a fine-tune does not? Each run's probabilities (its best
checkpoint) plus `w` x those of the TF-IDF baseline (char 1-5, C chosen on valid, as
tfidf_baseline.py), scored for several w: what a "wide" lexical model beside the network would
add (issue 21, lever 6; benchmarks/classify/README.md, "forty-third pass").

The weight is chosen on valid (the default split); --split test scores one weight, once, after
that choice.

    pip install -c constraints.txt -r benchmarks/classify/requirements.txt
    python benchmarks/classify/tfidf_mix.py runs/zh-sentiment runs/zh-sentiment-s7               # valid, w 0-1
    python benchmarks/classify/tfidf_mix.py runs/zh-sentiment runs/zh-sentiment-s7 --split test --weights 0.5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from error_overlap import run_probabilities
from tfidf_baseline import fit_on_train

from trainformer.data.labelled import load_labelled
from trainformer.run_dir import RunDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="classify run directories fine-tuned on the same corpus and split")
    parser.add_argument("--split", choices=("valid", "test"), default="valid")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                        help="TF-IDF's weights beside the run's probabilities (default 0.25 0.5 1)")
    args = parser.parse_args()

    data = RunDir(Path(args.runs[0])).load_config().data
    corpus = load_labelled(data.corpus, data.valid_fraction, data.test_fraction)
    split = getattr(corpus, args.split)
    texts, truth = split.texts, np.array(split.labels)
    vectorizer, model, c, _ = fit_on_train(corpus, ngram_max=5, min_df=2)
    tfidf = model.predict_proba(vectorizer.transform(texts))  # (examples, labels)

    weights = [0.0, *args.weights]
    print(f"{data.corpus}, {args.split} split ({len(texts):,} examples); TF-IDF + LR (char 1-5, C {c:g}) "
          f"alone {np.mean(tfidf.argmax(axis=1) == truth):.2%}\n")
    print("| run | " + " | ".join(f"w {w:g}" for w in weights) + " |\n|---|" + "---:|" * len(weights))
    table = []
    for run_dir in args.runs:
        probabilities = run_probabilities(run_dir, texts, corpus.labels)  # (examples, labels)
        table.append([np.mean((probabilities + w * tfidf).argmax(axis=1) == truth) for w in weights])
        print(f"| {run_dir} | " + " | ".join(f"{a:.2%}" for a in table[-1]) + " |")
    print("| mean | " + " | ".join(f"{a:.2%}" for a in np.mean(table, axis=0)) + " |")


if __name__ == "__main__":
    main()
