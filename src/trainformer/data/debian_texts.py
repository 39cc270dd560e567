"""Readers of the Chinese text some Debian packages install: fortunes, manual pages, the Debian
Reference. Each yields one raw document per paragraph (None for one that is not valid UTF-8) and
knows nothing of cleaning; recipes.py names them, corpus.py cleans what they yield.

Each checks now that its package is installed, raising one line with the `apt-get install`
command when it is not, and reads lazily. Line breaks inside a paragraph are source wrapping:
they are joined without a space between Chinese characters and with one between Latin words.
"""

from __future__ import annotations

import gzip
import re
import unicodedata
from pathlib import Path
from typing import Iterable, Iterator

from trainformer.data.markup import Markup
from trainformer.errors import NotInstalled, UserError


def is_wide(char: str) -> bool:
    """A CJK character or full-width form: Chinese writes no space beside one."""
    return unicodedata.east_asian_width(char) in ("W", "F")


def join_lines(lines: Iterable[str]) -> str:
    """The lines of one wrapped paragraph as one line, inner runs of whitespace made one space."""
    parts: list[str] = []
    for line in lines:
        line = " ".join(line.split())
        if not line:
            continue
        if parts and not (is_wide(parts[-1][-1]) or is_wide(line[0])):
            parts.append(" ")
        parts.append(line)
    return "".join(parts)


def missing(package: str, what: Path) -> NotInstalled:
    install = f"apt-get install {package}"
    return NotInstalled(f"data.corpus: {package}: no {what}: not installed: {install}", install)


# --- fortunes-zh ----------------------------------------------------------------------------------

FORTUNE_FOLDER = "/usr/share/games/fortunes"
FORTUNE_FILES = ("chinese", "tang300", "song100")  # sayings, proverbs, Debian tips; Tang poems; Song ci
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # the files colour titles and authors for a terminal


def read_fortunes(folder: Path) -> Iterator[str | None]:
    """fortunes-zh: one document per fortune (the files separate them with lines of "%")."""
    for name in FORTUNE_FILES:
        if not (folder / name).is_file():
            raise missing("fortunes-zh", folder / name)
    return fortunes(folder)


def fortunes(folder: Path) -> Iterator[str | None]:
    for name in FORTUNE_FILES:
        for raw in re.split(rb"\r?\n%\r?\n", (folder / name).read_bytes()):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield None
                continue
            yield join_lines(strip_colours(text).splitlines())


def strip_colours(text: str) -> str:
    """Text without terminal colour codes. A broken code can hold another ("\x1b[;\x1b[34;1mm"
    in the Debian tips): strip until none is left."""
    while (stripped := ANSI_ESCAPE.sub("", text)) != text:
        text = stripped
    return text.replace("\x1b", "")


# --- debian-reference-zh-cn -----------------------------------------------------------------------

DEBIAN_REFERENCE_FOLDER = "/usr/share/debian-reference"
PARAGRAPH_TAGS = {"p", "td"}


class HtmlParagraphs(Markup):
    """The text of every <p> and table cell (<td>: a tool and what it does) of a DocBook HTML page,
    tags dropped and entities unescaped. Command listings (<pre> blocks) are left out."""

    def __init__(self):
        self.paragraphs: list[str] = []
        self.parts: list[str] | None = None  # the <p> being read

    def handle_starttag(self, tag: str, attribute_text: str) -> None:
        if tag in PARAGRAPH_TAGS:
            self.parts = []
        elif tag == "br" and self.parts is not None:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in PARAGRAPH_TAGS and self.parts is not None:
            self.paragraphs.append(join_lines("".join(self.parts).splitlines()))
            self.parts = None

    def handle_data(self, data: str) -> None:
        if self.parts is not None:
            self.parts.append(data)


def read_debian_reference(folder: Path) -> Iterator[str | None]:
    """debian-reference-zh-cn: the paragraphs of its Simplified Chinese HTML pages."""
    pages = sorted(folder.glob("*.zh-cn.html"))
    if not pages:
        raise missing("debian-reference-zh-cn", folder / "*.zh-cn.html")
    return html_paragraphs(pages)


def html_paragraphs(pages: list[Path]) -> Iterator[str | None]:
    for page in pages:
        try:
            html = page.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            yield None
            continue
        parser = HtmlParagraphs()
        parser.feed(html)
        yield from parser.paragraphs


# --- manpages-zh ------------------------------------------------------------------------------------

# /usr/share/man/zh_CN also holds the pages of other packages (passwd, man-db): the package's own
# file list says which are its.
MANPAGES_LIST = "/var/lib/dpkg/info/manpages-zh.list"
MANPAGES_FOLDER = "/usr/share/man/zh_CN/"


def read_manpages(listing: Path) -> Iterator[str | None]:
    """manpages-zh: the plain-text paragraphs of its Simplified Chinese manual pages (roff markup
    stripped, see roff_paragraphs); alias pages (symbolic links) are read once, as their target."""
    if not listing.is_file():
        raise missing("manpages-zh", listing)
    names = listing.read_text(encoding="utf-8").splitlines()
    pages = [Path(name) for name in names if name.startswith(MANPAGES_FOLDER) and name.endswith(".gz")]
    pages = [page for page in pages if page.is_file() and not page.is_symlink()]
    if not pages:  # a slim image may install a package without its manual pages (dpkg path-exclude)
        raise UserError(f"data.corpus: manpages-zh: none of the pages {listing} lists is on disk "
                        f"(excluded by dpkg's path-exclude?): reinstall it with them: apt-get install manpages-zh")
    return manpage_paragraphs(sorted(pages))


def manpage_paragraphs(pages: list[Path]) -> Iterator[str | None]:
    for page in pages:
        try:
            source = gzip.decompress(page.read_bytes()).decode("utf-8")
        except UnicodeDecodeError:
            yield None
            continue
        yield from roff_paragraphs(source.splitlines())


# The requests that end a paragraph (man, mdoc and pod2man's macros), those whose arguments are
# running text in another font, and the blocks skipped whole: code listings and tables, macro
# definitions, ignored blocks.
BREAKS = {"SH", "SS", "PP", "P", "LP", "TP", "IP", "HP", "sp", "Sp", "RS", "RE", "TH", "Pp", "Sh", "Ss",
          "It", "Bl", "El", "Bd", "Ed", "Dl", "in", "ti", "bp", "ne", "TQ"}
HEADINGS = {"SH", "SS", "Sh", "Ss", "TH"}  # "名称", "描述" on every page: not prose
FONT_MACROS = {"B", "I", "SM", "SB"}  # arguments joined with spaces
ALTERNATING = {"BR", "BI", "IR", "RB", "IB", "RI"}  # arguments joined without
SKIPPED_BLOCKS = {"nf": "fi", "Vb": "Ve", "EX": "EE", "CS": "CE", "TS": "TE", "de": ".", "de1": ".",
                  "am": ".", "ig": "."}
ROFF_ESCAPE = re.compile(
    r"\\(?:"
    r"\((?P<glyph2>..)"  # \(em: a special character
    r"|\[(?P<glyph>[^\]]*)\]"  # \[em]
    r"|\*(?:\((?P<string2>..)|\[(?P<string>[^\]]*)\]|(?P<string1>.))"  # \*(L": a defined string
    r"|[fFgkmMnVY](?:\(..|\[[^\]]*\]|.)"  # font, register, colour: nothing to print
    r"|s(?:[+-]?\(\d\d|\([+-]?\d\d|\[[^\]]*\]|'[^']*'|[+-]?\d)"  # type size
    r"|[hHvwlLoXbDSxNRZC]'[^']*'"  # motions, widths, drawn lines, overstrikes
    r"|(?P<char>.)"
    r")"
)
GLYPHS = {"em": "—", "en": "–", "hy": "-", "mi": "-", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘",
          "cq": "’", "bu": "•", "co": "©", "rg": "®", "tm": "™", "mu": "×", "di": "÷", "pl": "+", "eq": "=",
          ">=": "≥", "<=": "≤", "!=": "≠", "->": "→", "<-": "←", "ti": "~", "ha": "^", "rs": "\\", "sl": "/",
          "ba": "|", "bv": "|", "br": "|", "ul": "_", "ru": "_", "de": "°", "+-": "±", "sc": "§", "dg": "†"}
STRINGS = {'L"': "“", 'R"': "”", "lq": "“", "rq": "”", "--": "—", "Aq": "'", "R": "®", "Tm": "™"}
CHARACTERS = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": " ", "'": "'", "`": "`", ".": "."}
COMMENT = re.compile(r'\\".*')  # \" to the end of the line


def unescape(text: str) -> str:
    """Roff escapes to the characters they print; fonts, sizes and motions to nothing."""
    def replace(match: re.Match) -> str:
        glyph = match["glyph2"] or match["glyph"]
        if glyph is not None:
            return GLYPHS.get(glyph, "")
        string = match["string2"] or match["string"] or match["string1"]
        if string is not None:
            return STRINGS.get(string, "")
        return CHARACTERS.get(match["char"], "") if match["char"] else ""

    return ROFF_ESCAPE.sub(replace, text)


def request_arguments(text: str) -> list[str]:
    """A request's arguments: words, or "double quoted" ones that may hold spaces."""
    return [quoted or word for quoted, word in re.findall(r'"((?:[^"]|"")*)"?|(\S+)', text)]


def roff_paragraphs(lines: list[str]) -> list[str]:
    """Plain-text paragraphs of a man page: running text and the text of font requests (.B, .BR)
    joined; comments, headings, macro definitions, conditionals, code listings and tables left
    out; a .TP tag (the option a paragraph describes) is a paragraph of its own."""
    reader = RoffReader()
    for line in lines:
        reader.feed(line)
    reader.end_paragraph()
    return reader.paragraphs


class RoffReader:
    """A man page read line by line into paragraphs, with what it is inside of as state."""

    def __init__(self):
        self.paragraphs: list[str] = []
        self.lines: list[str] = []  # of the paragraph being read
        self.block_end = ""  # inside a skipped block: the request that ends it ("." for "..")
        self.braces = 0  # inside a conditional's \{ ... \} block: typesetter-specific, skipped
        self.tag_next = False  # the next text is a .TP tag
        self.heading_next = False  # the next text line is a heading (.SH without arguments)

    def feed(self, line: str) -> None:
        if self.block_end:
            if ends_block(line, self.block_end):
                self.block_end = ""
            return
        if self.braces or "\\{" in line:
            self.braces = max(0, self.braces + line.count("\\{") - line.count("\\}"))
            return
        line = COMMENT.sub("", line)
        if not line.strip():  # a blank line ends a paragraph, as in troff
            self.end_paragraph()
        elif line.startswith((".", "'")):
            name, _, arguments = line[1:].strip().partition(" ")
            self.request(name, arguments)
        elif self.heading_next:
            self.heading_next = False
        else:
            self.text(line)

    def request(self, name: str, arguments: str) -> None:
        if name in SKIPPED_BLOCKS:
            self.block_end = SKIPPED_BLOCKS[name]
        if name in BREAKS or name in SKIPPED_BLOCKS:
            self.end_paragraph()
            self.tag_next = name in ("TP", "TQ")
            self.heading_next = name in HEADINGS and not arguments.strip()
        if name in FONT_MACROS:
            self.text(" ".join(request_arguments(arguments)))
        elif name in ALTERNATING:
            self.text("".join(request_arguments(arguments)))

    def text(self, line: str) -> None:
        self.lines.append(unescape(line))
        if self.tag_next:
            self.tag_next = False
            self.end_paragraph()

    def end_paragraph(self) -> None:
        if self.lines:
            self.paragraphs.append(join_lines(self.lines))
        self.lines = []


def ends_block(line: str, end: str) -> bool:
    if end == ".":
        return line.strip() == ".."
    return line.startswith((".", "'")) and line[1:].split()[:1] == [end]
