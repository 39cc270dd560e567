"""Labelled examples for text classification: from a labelled recipe or the user's file,
cleaned, de-duplicated, counted and split (stratified, by content hash).

Cleaning follows corpus.py: empty and undecodable lines are skipped and counted, never fatal;
a structurally broken line (not JSON, a missing field, the wrong number of columns) is a user
error naming file and line. Two more drops keep the held-out scores honest, both counted:
- an exact repeat of a (text, label) pair keeps only its first copy, so no text can sit in
  train and in valid/test at once;
- a text found under two different labels is dropped under every label: the data cannot say
  which is right, and keeping one copy would teach noise.

The split is stratified and deterministic by content: within each label the examples are
ranked by sha1(text); the first round(n * valid_fraction) go to valid, the next
round(n * test_fraction) to test, the rest to train, with at least one in each split (so every
label with >= 3 examples — 2 without a test split — appears in every split, and a label seen
only in valid/test is impossible). A file in another order gives the same splits, element for
element: each split is listed in sha1 order too, which also interleaves the labels (a small
shuffle buffer still sees mixed batches).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from trainformer.data.recipes import LABELLED, read_labelled_recipe, split_recipe_name
from trainformer.errors import UserError

SUFFIXES = (".jsonl", ".tsv", ".csv")
HEADER = ["label", "text"]


@dataclass(frozen=True)
class Examples:
    """One split as parallel lists, ready for tf.data.Dataset.from_tensor_slices((texts, labels))."""

    texts: list[str]
    labels: list[int]  # index into LabelledCorpus.labels

    def __len__(self) -> int:
        return len(self.texts)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(zip(self.texts, self.labels))


@dataclass
class LabelledCorpus:
    source: str
    labels: list[str]  # sorted label names; a label's id is its index
    train: Examples
    valid: Examples
    test: Examples  # empty when test_fraction is 0
    skipped: Counter = field(default_factory=Counter)  # reason -> lines dropped
    fingerprint: str = ""  # sha256 of the three splits (split, label, text), in order

    @property
    def num_examples(self) -> int:
        return len(self.train) + len(self.valid) + len(self.test)

    def class_counts(self) -> dict[str, dict[str, int]]:
        """{split: {label: examples}}, every label present in every non-empty split."""
        counts = {}
        for name, split in (("train", self.train), ("valid", self.valid), ("test", self.test)):
            per_id = Counter(split.labels)
            counts[name] = {label: per_id[i] for i, label in enumerate(self.labels)}
        return counts

    def summary(self) -> str:
        total = len(self.train) + len(self.valid) + len(self.test)
        per_label = Counter()
        for split in (self.train, self.valid, self.test):
            per_label.update(split.labels)
        shares = [(per_label[i] / total, label) for i, label in enumerate(self.labels)]
        if len(shares) <= 6:
            balance = ", ".join(f"{label} {share:.0%}" for share, label in shares)
        else:
            smallest, largest = min(shares), max(shares)
            balance = f"largest {largest[1]} {largest[0]:.0%}, smallest {smallest[1]} {smallest[0]:.0%}"
        splits = f"{len(self.train):,} train / {len(self.valid):,} valid"
        if self.test:
            splits += f" / {len(self.test):,} test"
        dropped = ", ".join(f"{n:,} {why}" for why, n in sorted(self.skipped.items())) or "none"
        return f"{self.source}: {splits} examples, {len(self.labels)} labels ({balance}); dropped lines: {dropped}"


def load_labelled(name_or_path: str, valid_fraction: float, test_fraction: float) -> LabelledCorpus:
    """Read, clean, de-duplicate and split labelled examples from a labelled recipe name or a
    .jsonl ({"text": ..., "label": ...}) / .tsv / .csv (label, text) file."""
    if not 0 < valid_fraction < 1 or not 0 <= test_fraction < 1 or valid_fraction + test_fraction >= 1:
        raise UserError(
            f"data.valid_fraction={valid_fraction}, data.test_fraction={test_fraction}: need 0 < valid, "
            f"0 <= test and valid + test < 1"
        )
    skipped: Counter = Counter()
    recipe, _ = split_recipe_name(name_or_path)  # "NAME:DIR" too: a parallel recipe is refused by name
    if recipe:
        raw, source = read_labelled_recipe(recipe)
        pairs = list(clean(raw, skipped))
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise UserError(
                f"data.corpus: {name_or_path}: no such file and not a labelled recipe ({', '.join(LABELLED)})"
            )
        if path.suffix not in SUFFIXES:
            raise UserError(
                f"data.corpus: {path}: unsupported file type for labelled examples "
                f"(use .jsonl with {{\"text\", \"label\"}}, or .tsv / .csv with columns label, text)"
            )
        source = str(path)
        pairs = list(clean(read_file(path, skipped), skipped))
    if not pairs:
        raise UserError(f"data.corpus: {source}: no usable examples after cleaning ({dict(skipped)})")
    pairs = deduplicate(pairs, skipped)
    if not pairs:
        raise UserError(f"data.corpus: {source}: every text appears under 2+ labels ({dict(skipped)})")
    labels = sort_labels({label for _, label in pairs})
    if len(labels) < 2:
        raise UserError(
            f"data.corpus: {source}: every usable example has label {labels[0]!r}; classification needs "
            f"at least 2 labels"
        )
    check_enough_per_label(pairs, labels, valid_fraction, test_fraction, source)
    ids = {label: i for i, label in enumerate(labels)}
    train, valid, test = split(pairs, valid_fraction, test_fraction)
    splits = [Examples([t for t, _ in part], [ids[label] for _, label in part]) for part in (train, valid, test)]
    return LabelledCorpus(source, labels, *splits, skipped=skipped,
                          fingerprint=fingerprint({"train": train, "valid": valid, "test": test}))


# --- reading ------------------------------------------------------------------------------------

def read_file(path: Path, skipped: Counter) -> Iterator[tuple[str | None, str]]:
    """(text, label) per record; undecodable lines are counted in `skipped` and left out."""
    line_number = [0]  # the physical line the reader last consumed (a csv record may span lines)
    lines = decoded_lines(path, skipped, line_number)
    if path.suffix == ".jsonl":
        for line in lines:
            yield from jsonl_record(line, path, line_number[0])
        return
    rows = csv_rows(lines, path, line_number) if path.suffix == ".csv" else (
        line.rstrip("\r\n").split("\t") for line in lines)
    first = True
    for row in rows:
        where = f"{path}:{line_number[0]}"
        if not any(cell.strip() for cell in row):
            yield "", ""  # blank line: counted as empty
            continue
        fields = [cell.strip() for cell in row]
        if first and fields == HEADER:
            first = False
            continue
        if first and fields == HEADER[::-1]:
            raise UserError(f"{where}: header is 'text, label' but the columns must be label, text: swap them")
        first = False
        if len(row) != 2:
            raise UserError(
                f"{where}: expected 2 columns (label, text), got {len(row)}"
                + (" (quote a text that holds a comma)" if path.suffix == ".csv" else " (a tab inside the text?)")
            )
        if not fields[0]:
            raise UserError(f"{where}: empty label")
        yield row[1], fields[0]


def csv_rows(lines: Iterator[str], path: Path, line_number: list[int]) -> Iterator[list[str]]:
    rows = csv.reader(lines)
    while True:
        try:
            yield next(rows)
        except StopIteration:
            return
        except csv.Error as err:
            raise UserError(f"{path}:{line_number[0]}: not valid CSV ({err})") from None


def decoded_lines(path: Path, skipped: Counter, line_number: list[int]) -> Iterator[str]:
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # tolerate a BOM
            except UnicodeDecodeError:
                skipped["undecodable"] += 1
                continue
            line_number[0] = number
            yield line


def jsonl_record(line: str, path: Path, number: int) -> Iterator[tuple[str, str]]:
    if not line.strip():
        yield "", ""
        return
    try:
        record = json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise UserError(f"{path}:{number}: expected an object with a string \"text\" and a \"label\"")
    label = record.get("label")
    if isinstance(label, bool) or not isinstance(label, (str, int)) or not str(label).strip():
        raise UserError(f"{path}:{number}: \"label\" must be a non-empty string or an integer, got {label!r}")
    yield record["text"], str(label).strip()


# --- cleaning -----------------------------------------------------------------------------------

def clean(pairs: Iterable[tuple[str | None, str]], skipped: Counter) -> Iterator[tuple[str, str]]:
    """Strip each text; count and drop undecodable (None) and empty ones."""
    for text, label in pairs:
        if text is None:
            skipped["undecodable"] += 1
        elif not text.strip():
            skipped["empty"] += 1
        else:
            yield text.strip(), label


def deduplicate(pairs: list[tuple[str, str]], skipped: Counter) -> list[tuple[str, str]]:
    """Keep the first copy of each (text, label); drop a text seen under two labels entirely."""
    labels_of: dict[str, set[str]] = {}
    unique = []
    for text, label in pairs:
        seen = labels_of.setdefault(text, set())
        if label in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(label)
        unique.append((text, label))
    kept = []
    for text, label in unique:
        if len(labels_of[text]) > 1:
            skipped["text under 2+ labels"] += 1  # one line per label it was seen under
        else:
            kept.append((text, label))
    return kept


def sort_labels(labels: set[str]) -> list[str]:
    """Sorted label names; all-integer labels sort by value, so 0..9 keep their own ids."""
    if all(label.lstrip("-").isdigit() for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


# --- splitting ----------------------------------------------------------------------------------

def split_sizes(n: int, valid_fraction: float, test_fraction: float) -> tuple[int, int]:
    """(valid, test) examples out of a label's n: rounded shares, at least 1 each (test: only if
    test_fraction > 0), always leaving at least 1 for train. Needs n >= minimum_per_label."""
    valid = max(1, math.floor(n * valid_fraction + 0.5))
    test = max(1, math.floor(n * test_fraction + 0.5)) if test_fraction > 0 else 0
    while valid + test > n - 1 and max(valid, test) > 1:  # high fractions on a tiny label: give train one
        if valid >= test:
            valid -= 1
        else:
            test -= 1
    return valid, test


def minimum_per_label(test_fraction: float) -> int:
    return 3 if test_fraction > 0 else 2


def check_enough_per_label(pairs, labels, valid_fraction, test_fraction, source) -> None:
    counts = Counter(label for _, label in pairs)
    need = minimum_per_label(test_fraction)
    small = sorted((n, label) for label, n in counts.items() if n < need)
    if small:
        splits = "train, valid and test" if test_fraction > 0 else "train and valid"
        listed = ", ".join(f"{label!r} {n}" for n, label in small)
        raise UserError(
            f"data.corpus: {source}: every label needs at least {need} distinct examples to appear in {splits} "
            f"(after dropping duplicates and texts under 2+ labels); too few: {listed}: add examples or "
            f"remove those labels"
        )


def text_hash(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()


def split(pairs: list[tuple[str, str]], valid_fraction: float, test_fraction: float):
    """Stratified content-hash split of de-duplicated (text, label) pairs -> (train, valid, test).

    Within each label: rank by sha1(text); ranks [0, v) -> valid, [v, v+t) -> test, the rest ->
    train, (v, t) = split_sizes(n). Then each split is ordered by sha1(text). Independent of the
    input order; valid does not change when test_fraction does (test is taken from train's side).
    """
    by_label: dict[str, list[tuple[bytes, str]]] = {}
    for text, label in pairs:
        by_label.setdefault(label, []).append((text_hash(text), text))
    parts: dict[str, list[tuple[bytes, str, str]]] = {"train": [], "valid": [], "test": []}
    for label, ranked in by_label.items():
        ranked.sort()
        valid, test = split_sizes(len(ranked), valid_fraction, test_fraction)
        for rank, (digest, text) in enumerate(ranked):
            name = "valid" if rank < valid else "test" if rank < valid + test else "train"
            parts[name].append((digest, text, label))
    return tuple([(text, label) for _, text, label in sorted(parts[name])] for name in ("train", "valid", "test"))


def fingerprint(splits: dict[str, list[tuple[str, str]]]) -> str:
    """sha256 over what training and evaluation see: split, label and text of every example, in
    order. The same examples in another file order give the same fingerprint (the splits are equal)."""
    digest = hashlib.sha256()
    for name, pairs in splits.items():
        for text, label in pairs:
            digest.update(f"{name}\t{label}\t{text}\n".encode("utf-8"))
    return digest.hexdigest()
