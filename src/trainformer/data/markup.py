"""A fast reader of machine-written HTML pages, for the corpora built from them.

html.parser.HTMLParser reads a page a character state at a time in Python: parsing the
2 x 2,561 pages of libreoffice-help-en-zh took ~11 s of a 2-core run's start. Markup splits the
page with one regular expression instead and calls the same handlers with the same events:
start tags (names lowercased; their attributes parsed on demand by attributes(), values
unquoted and unescaped, None for a bare attribute; `<br/>` gives a start and an end), end tags,
and the text between tags with character references unescaped. Comments, declarations and
processing instructions are skipped; the text of <script> and <style> is passed raw, as
HTMLParser does; a `<` that opens no tag is text. Malformed markup that HTMLParser repairs its
own way (an unclosed quote, a tag cut by the end of the page) is not repaired alike: the pages
read with it are generated, and tests/data/test_markup.py checks that both readers give the
same paragraphs on them.
"""

from __future__ import annotations

import re
from html import unescape

TAG = re.compile(
    r"<(?P<end>/?)(?P<name>[a-zA-Z][^\t\n\r\f />\x00]*)"  # <name or </name
    r"(?P<attrs>(?:[^>\"']+|\"[^\"]*\"|'[^']*')*)>"  # attributes, quoted values may hold '>'
    r"|<!--.*?-->|<![^>]*>|<\?[^>]*>",  # a comment, a declaration, a processing instruction
    re.S,
)
ATTRIBUTE = re.compile(r"""([^\s/>"'=][^\s/>"'=]*)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s>]+))?""")
RAW_TEXT = ("script", "style")  # their text is not markup


class Markup:
    """Subclass it with handle_starttag(tag, attribute_text), handle_endtag(tag) and
    handle_data(text), then feed(page) once. Unlike html.parser's, a start tag comes
    with the text of its attributes (`id="a" hidden`): attributes() parses it, for the few tags
    whose attributes matter (most pages' tags are read for their text alone)."""

    def handle_starttag(self, tag: str, attribute_text: str) -> None:
        pass

    def handle_endtag(self, tag: str) -> None:
        pass

    def handle_data(self, data: str) -> None:
        pass

    def feed(self, page: str) -> None:
        position = 0  # where the text not handled yet begins
        for found in TAG.finditer(page):
            start = found.start()
            if start < position:
                continue  # inside the raw text of a <script> or <style>
            if start > position:
                self.handle_data(unescape(page[position:start]))
            position = found.end()
            end, name, attrs = found.groups()
            if name is None:
                continue  # a comment, a declaration, a processing instruction
            tag = name.lower()
            if end:
                self.handle_endtag(tag)
                continue
            self.handle_starttag(tag, attrs)
            if attrs.endswith("/"):
                self.handle_endtag(tag)
            elif tag in RAW_TEXT:
                close = re.compile(rf"</{tag}", re.I).search(page, position)
                end_of_text = close.start() if close else len(page)
                if end_of_text > position:
                    self.handle_data(page[position:end_of_text])
                position = end_of_text
        if position < len(page):
            self.handle_data(unescape(page[position:]))


def attributes(text: str) -> list[tuple[str, str | None]]:
    """`id="a" hidden class='b'` -> [("id", "a"), ("hidden", None), ("class", "b")]."""
    found = []
    for name, raw in ATTRIBUTE.findall(text):
        value = raw[1:-1] if raw[:1] in ("'", '"') else raw
        found.append((name.lower(), unescape(value) if raw else None))
    return found
