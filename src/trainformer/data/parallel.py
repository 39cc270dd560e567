"""(source, target) pairs for seq2seq (translation, summarization): from a parallel recipe or
the user's file, cleaned, de-duplicated, counted and split by content hash, grouped by source.

Cleaning follows labelled.py: empty and undecodable lines are skipped and counted, never fatal;
a structurally broken line (not JSON, a missing or non-string field, the wrong number of
columns) is a user error naming file and line. Each side is stripped and its whitespace runs
collapsed to one space (help pages and user files wrap lines at random places). Two more
drops, both counted:
- an exact repeat of a (source, target) pair keeps only its first copy;
- "untranslated": a target equal to its source, or, when the targets are Chinese, a target
  without one Chinese character (half the LibreOffice zh-CN help is still English).

The split is deterministic by content and grouped by source: distinct sources are ranked by
sha1(source); the first round(n * valid_fraction) of the n sources go to valid with all their
pairs, the next round(n * test_fraction) to test, the rest to train (at least 1 each). So no
source text is in train and in valid/test at once, even with two translations of it, and a
file in another order gives the same splits, element for element: each split is listed in
(sha1(source), sha1(target)) order.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from trainformer.data.labelled import decoded_lines, split_sizes
from trainformer.data.recipes import PARALLEL, read_parallel_recipe, split_recipe_name
from trainformer.errors import UserError

SUFFIXES = (".jsonl", ".tsv")
HEADER = ["source", "target"]
# CJK unified ideographs (+ extension A, compatibility, extensions B-F): "is this Chinese?"
HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef]")
LANGUAGE_SAMPLE = 1000  # targets looked at to guess a user file's target language


@dataclass(frozen=True)
class Pairs:
    """One split as parallel lists, ready for tf.data.Dataset.from_tensor_slices((sources, targets))."""

    sources: list[str]
    targets: list[str]

    def __len__(self) -> int:
        return len(self.sources)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(zip(self.sources, self.targets))


@dataclass
class ParallelCorpus:
    source: str  # where the pairs came from: "recipe (path)" or the file path
    train: Pairs
    valid: Pairs
    test: Pairs  # empty when test_fraction is 0
    skipped: Counter = field(default_factory=Counter)  # reason -> pairs dropped
    fingerprint: str = ""  # sha256 over (split, source, target) of every pair, in order
    target_language: str = ""  # "zh", "en" or "" (unknown): decides sacrebleu's tokenizer

    @property
    def num_examples(self) -> int:
        return len(self.train) + len(self.valid) + len(self.test)

    def summary(self) -> str:
        splits = f"{len(self.train):,} train / {len(self.valid):,} valid"
        if self.test:
            splits += f" / {len(self.test):,} test"
        sources = [len(s) for part in (self.train, self.valid, self.test) for s in part.sources]
        targets = [len(t) for part in (self.train, self.valid, self.test) for t in part.targets]
        lengths = (f"source {statistics.fmean(sources):.0f} / target {statistics.fmean(targets):.0f} chars on "
                   f"average (median {statistics.median(sources):.0f} / {statistics.median(targets):.0f})")
        dropped = ", ".join(f"{n:,} {why}" for why, n in sorted(self.skipped.items())) or "none"
        return f"{self.source}: {splits} pairs, {lengths}; dropped: {dropped}"


def load_parallel(name_or_path: str, valid_fraction: float, test_fraction: float) -> ParallelCorpus:
    """Read, clean, de-duplicate and split (source, target) pairs from a parallel recipe name
    (optionally `NAME:PATH`) or a .jsonl ({"source": ..., "target": ...}) / .tsv (source, target) file."""
    if not 0 < valid_fraction < 1 or not 0 <= test_fraction < 1 or valid_fraction + test_fraction >= 1:
        raise UserError(
            f"data.valid_fraction={valid_fraction}, data.test_fraction={test_fraction}: need 0 < valid, "
            f"0 <= test and valid + test < 1"
        )
    skipped: Counter = Counter()
    if split_recipe_name(name_or_path)[0]:
        raw, source, target_language = read_parallel_recipe(name_or_path)
        pairs = list(clean(raw, skipped))
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise UserError(
                f"data.corpus: {name_or_path}: no such file and not a parallel recipe ({', '.join(PARALLEL)})"
            )
        if path.suffix not in SUFFIXES:
            raise UserError(
                f"data.corpus: {path}: unsupported file type for (source, target) pairs (use .jsonl with "
                f"{{\"source\", \"target\"}} or .tsv with columns source, target; or a recipe: {', '.join(PARALLEL)})"
            )
        source = str(path)
        pairs = list(clean(read_file(path, skipped), skipped))
        target_language = guess_language([target for _, target in pairs[:LANGUAGE_SAMPLE]])
    pairs = drop_untranslated(deduplicate(pairs, skipped), target_language, skipped)
    if not pairs:
        raise UserError(f"data.corpus: {source}: no usable (source, target) pairs after cleaning ({dict(skipped)})")
    sources = len({s for s, _ in pairs})
    need = 3 if test_fraction > 0 else 2
    if sources < need:
        raise UserError(
            f"data.corpus: {source}: {sources} distinct source text(s); train, valid"
            f"{' and test' if test_fraction > 0 else ''} need at least {need}"
        )
    train, valid, test = split(pairs, valid_fraction, test_fraction)
    splits = [Pairs([s for s, _ in part], [t for _, t in part]) for part in (train, valid, test)]
    return ParallelCorpus(source, *splits, skipped=skipped, target_language=target_language,
                          fingerprint=fingerprint({"train": train, "valid": valid, "test": test}))


# --- reading ------------------------------------------------------------------------------------

def read_file(path: Path, skipped: Counter) -> Iterator[tuple[str, str]]:
    """(source, target) per line; undecodable lines are counted in `skipped` and left out,
    blank lines come out as ("", "") for the cleaner to count."""
    line_number = [0]
    lines = decoded_lines(path, skipped, line_number)
    for line in lines:
        where = f"{path}:{line_number[0]}"
        if not line.strip():
            yield "", ""
        elif path.suffix == ".jsonl":
            yield jsonl_pair(line, where)
        else:
            row = line.rstrip("\r\n").split("\t")
            if line_number[0] == 1 and [cell.strip().lower() for cell in row] == HEADER:
                continue
            if len(row) != 2:
                raise UserError(f"{where}: expected 2 tab-separated columns (source, target), got {len(row)}")
            yield row[0], row[1]


def jsonl_pair(line: str, where: str) -> tuple[str, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected an object with string \"source\" and \"target\"")
    for key in HEADER:
        if not isinstance(record.get(key), str):
            got = "missing" if key not in record else f"{type(record[key]).__name__} {record[key]!r}"
            raise UserError(f"{where}: \"{key}\" must be a string, got {got}")
    return record["source"], record["target"]


def guess_language(targets: list[str]) -> str:
    """"zh" when most targets are mostly Chinese characters (of their letters), else ""."""
    chinese = sum(1 for t in targets if 2 * len(HAN.findall(t)) > sum(c.isalpha() for c in t))
    return "zh" if targets and 2 * chinese > len(targets) else ""


# --- cleaning -----------------------------------------------------------------------------------

def clean(pairs: Iterable[tuple[str | None, str | None]], skipped: Counter) -> Iterator[tuple[str, str]]:
    """Strip and collapse whitespace on both sides; count and drop undecodable (None) and
    empty-sided pairs."""
    for source, target in pairs:
        if source is None or target is None:
            skipped["undecodable"] += 1
            continue
        source, target = " ".join(source.split()), " ".join(target.split())
        if not source or not target:
            skipped["empty"] += 1
        else:
            yield source, target


def deduplicate(pairs: list[tuple[str, str]], skipped: Counter) -> list[tuple[str, str]]:
    """Keep the first copy of each exact (source, target) pair."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for pair in pairs:
        if pair in seen:
            skipped["duplicate"] += 1
        else:
            seen.add(pair)
            kept.append(pair)
    return kept


def drop_untranslated(pairs: list[tuple[str, str]], target_language: str, skipped: Counter) -> list[tuple[str, str]]:
    """Drop pairs whose target is the source itself, or has no Chinese character when the
    target language is Chinese."""
    kept = []
    for source, target in pairs:
        if target == source or (target_language == "zh" and not HAN.search(target)):
            skipped["untranslated"] += 1
        else:
            kept.append((source, target))
    return kept


# --- splitting ----------------------------------------------------------------------------------

def text_hash(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()


def split(pairs: list[tuple[str, str]], valid_fraction: float, test_fraction: float):
    """Content-hash split grouped by source -> (train, valid, test) lists of (source, target).

    The n distinct sources are ranked by sha1(source): ranks [0, v) -> valid, [v, v+t) -> test,
    the rest -> train, (v, t) = split_sizes(n), each source with all its pairs. Each split is
    ordered by (sha1(source), sha1(target)). Independent of the input order; valid does not
    change when test_fraction does (test is taken from train's side).
    """
    ranked = sorted((text_hash(s), text_hash(t), s, t) for s, t in pairs)
    sources = sorted({digest for digest, _, _, _ in ranked})
    valid, test = split_sizes(len(sources), valid_fraction, test_fraction)
    rank = {digest: i for i, digest in enumerate(sources)}
    parts: dict[str, list[tuple[str, str]]] = {"train": [], "valid": [], "test": []}
    for digest, _, source, target in ranked:
        name = "valid" if rank[digest] < valid else "test" if rank[digest] < valid + test else "train"
        parts[name].append((source, target))
    return parts["train"], parts["valid"], parts["test"]


def fingerprint(splits: dict[str, list[tuple[str, str]]]) -> str:
    """sha256 over what training and evaluation see: split, source and target of every pair,
    in order. The same pairs in another file order give the same fingerprint."""
    digest = hashlib.sha256()
    for name, pairs in splits.items():
        for source, target in pairs:
            digest.update(f"{name}\t{source}\t{target}\n".encode("utf-8"))
    return digest.hexdigest()
