"""How well valid predicts test over many fine-tunes: best and last valid accuracy beside test,
run by run and per configuration (runs named CONFIG-sSEED), with their correlations.

Reads what the runs already hold; it scores nothing. Each RUN's test figure is the first test
score `trainformer eval RUN --split test` kept in RUN/eval/scores.jsonl, or for runs scored
before eval kept its scores, the JSON `eval --json > RUN.test.json` saved (its last line):

    python benchmarks/classify/valid_vs_test.py runs/*-s42 runs/*-s7
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from trainformer.files import read_records
from trainformer.run_dir import RunDir


def valid_accuracies(run: Path) -> list[float]:
    """Valid accuracy (%) at every evaluation of the run, in order."""
    return [100 * row["accuracy"] for row in read_records(RunDir(run).metrics_file) if row.get("split") == "valid"]


def test_accuracy(run: Path) -> float | None:
    """Test accuracy (%): the run's first test score (RUN/eval/scores.jsonl), else the JSON
    saved beside it (runs scored before eval kept its scores); None where neither holds one."""
    recorded = [row["accuracy"] for row in read_records(RunDir(run).scores_file)
                if row.get("split") == "test" and "accuracy" in row]
    if recorded:
        return 100 * recorded[0]
    saved = run.parent / f"{run.name}.test.json"
    if not saved.exists():
        return None
    accuracy = json.loads(saved.read_text(encoding="utf-8").strip().splitlines()[-1]).get("accuracy")
    return None if accuracy is None else 100 * accuracy


def summary(name: str, best: list[float], test: list[float]) -> str:
    """Means, spreads and correlation; a spread or correlation that two values cannot give (or
    a constant column) reads n/a."""
    def spread(values: list[float]) -> str:
        return f"{statistics.stdev(values):.2f}" if len(values) > 1 else "n/a"

    try:
        correlation = f"{statistics.correlation(best, test):.2f}"
    except statistics.StatisticsError:  # under two pairs, or a column without spread
        correlation = "n/a"
    return (f"{name}: n {len(best)}, best valid {statistics.mean(best):.2f} (sd {spread(best)}), "
            f"test {statistics.mean(test):.2f} (sd {spread(test)}), correlation {correlation}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="fine-tune run directories scored on test")
    print("| run | best valid | last valid | test |\n|---|---:|---:|---:|")
    best, last, test = [], [], []
    configs = defaultdict(list)  # CONFIG -> [(best valid, test)] over its seeds
    for run in parser.parse_args().runs:
        scored = test_accuracy(run)
        if scored is None:
            continue
        valid = valid_accuracies(run)
        best.append(max(valid))
        last.append(valid[-1])
        test.append(scored)
        configs[run.name.rsplit("-s", 1)[0]].append((best[-1], scored))
        print(f"| {run.name} | {best[-1]:.2f} | {last[-1]:.2f} | {scored:.2f} |")
    print(summary("runs", best, test) + f"; last valid {statistics.mean(last):.2f}")
    seed_means = [(statistics.mean(b for b, _ in pairs), statistics.mean(t for _, t in pairs))
                  for pairs in configs.values() if len(pairs) > 1]
    if seed_means:
        print(summary("configurations (seed means)", [b for b, _ in seed_means], [t for _, t in seed_means]))


if __name__ == "__main__":
    main()
