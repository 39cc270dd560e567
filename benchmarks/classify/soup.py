"""What averaging fine-tunes would score: the uniform soup (the runs' best checkpoints' weights
averaged, one model; Wortsman et al. 2022, "Model soups") and the ensemble (their probabilities
averaged, N models), beside each run alone.

A diagnostic on the valid split unless --split says otherwise; every run must have fine-tuned
the same architecture from the same pretraining run (a soup of different starts is noise).

    python benchmarks/classify/soup.py runs/zh-sentiment runs/zh-sentiment-s7
    python benchmarks/classify/soup.py runs/zh-sentiment runs/zh-sentiment-s7 --split test --ensemble-only
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainformer.data.labelled import load_labelled
from trainformer.run.inference import load_run
from trainformer.run_dir import RunDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="classify runs fine-tuned from the same pretraining run")
    parser.add_argument("--split", default="valid", choices=["valid", "test"])
    parser.add_argument("--ensemble-only", action="store_true",
                        help="leave the soup out (test scores only what valid chose: no soup has won there)")
    args = parser.parse_args()
    configs = [RunDir(Path(run)).load_config() for run in args.runs]
    starts = {config.model.init_from for config in configs}
    if len(starts) != 1:
        raise SystemExit(f"the runs start from different pretraining runs: {sorted(starts)}")
    data = configs[0].data
    examples = getattr(load_labelled(data.corpus, data.valid_fraction, data.test_fraction), args.split)
    truth = np.array(examples.labels)  # (examples,), label indices in the corpus' (and each run's) order

    loaded = [load_run(Path(run), "best") for run in args.runs]
    alone = []
    for run, (task, model, _, step) in zip(args.runs, loaded):
        alone.append(task.probabilities(model, examples.texts))  # (examples, labels)
        print(f"{run} (step {step}): {np.mean(alone[-1].argmax(1) == truth):.2%}")
    ensemble = np.mean(alone, axis=0)
    print(f"ensemble of {len(alone)}: {np.mean(ensemble.argmax(1) == truth):.2%}")
    if args.ensemble_only:
        return

    task, soup, _, _ = loaded[0]
    for weight, *others in zip(soup.weights, *(model.weights for _, model, _, _ in loaded[1:])):
        if "float" in str(weight.dtype):  # not the dropout layers' seed states
            weight.assign(tf.add_n([weight, *others]) / len(loaded))
    print(f"uniform soup of {len(loaded)}: {np.mean(task.probabilities(soup, examples.texts).argmax(1) == truth):.2%}")


if __name__ == "__main__":
    main()
