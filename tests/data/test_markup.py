"""The fast page reader (trainformer/data/markup.py) gives html.parser's events: on a snippet of
every construct it handles, and as the paragraphs of the real LibreOffice help and
debian-reference pages the corpora are built from."""

from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trainformer.data.debian_texts import DEBIAN_REFERENCE_FOLDER, HtmlParagraphs
from trainformer.data.markup import Markup, attributes
from trainformer.data.recipes import HELP_FOLDER, HelpParagraphs


class ThroughHtmlParser(HTMLParser):
    """html.parser's events handed to a Markup handler, each tag's attributes written back as
    text for it to parse."""

    def __init__(self, handler: Markup):
        super().__init__(convert_charrefs=True)
        self.handler = handler

    def handle_starttag(self, tag, attrs):
        text = " ".join(name if value is None else f'{name}="{escape(value)}"' for name, value in attrs)
        self.handler.handle_starttag(tag, text)

    def handle_endtag(self, tag):
        self.handler.handle_endtag(tag)

    def handle_data(self, data):
        self.handler.handle_data(data)


class Events(Markup):
    def __init__(self):
        self.events = []

    def handle_starttag(self, tag, attribute_text):
        self.events.append(("start", tag, attributes(attribute_text)))

    def handle_endtag(self, tag):
        self.events.append(("end", tag))

    def handle_data(self, data):
        if self.events and self.events[-1][0] == "data":  # html.parser may cut text elsewhere
            data = self.events.pop()[1] + data
        self.events.append(("data", data))


SNIPPET = """<!DOCTYPE html><html><head><style>p > span { color: red }</style>
<script type="text/javascript">if (a < b && c) { x = "<p>"; }</script></head>
<BODY><!-- a comment with <p> inside --><?xml-stylesheet href="x"?>
<p id="par_id1" class='a&amp;b' data-x=unquoted>Fish &amp; chips &lt;3, 1 < 2 &#x4E2D;&#25991;<br/>
<span hidden class="MAC">Cmd</span><span hidden>Ctrl</span> <a href="x?a=1&amp;b=>2">link</a></p>
<h2 id="bm_id2">hidden bookmark</h2><td>cell</TD>tail &amp; end"""


def through_html_parser(handler: Markup, page: str) -> Markup:
    parser = ThroughHtmlParser(handler)
    parser.feed(page)
    parser.close()
    return handler


def through_markup(handler: Markup, page: str) -> Markup:
    handler.feed(page)
    return handler


def test_a_snippet_gives_html_parsers_events():
    fast = through_markup(Events(), SNIPPET).events
    assert fast == through_html_parser(Events(), SNIPPET).events
    assert ("start", "p", [("id", "par_id1"), ("class", "a&b"), ("data-x", "unquoted")]) in fast
    assert ("data", "Fish & chips <3, 1 < 2 中文") in fast  # references unescaped, a lone < kept
    assert ("data", 'if (a < b && c) { x = "<p>"; }') in fast  # a script's text is not markup
    assert ("start", "span", [("hidden", None), ("class", "MAC")]) in fast
    assert ("start", "a", [("href", "x?a=1&b=>2")]) in fast  # '>' inside quotes


def same_on(pages: list[Path], handler: type[Markup], result: str) -> None:
    assert pages
    for page in pages:
        text = page.read_bytes().decode("utf-8")
        assert getattr(through_markup(handler(), text), result) == \
            getattr(through_html_parser(handler(), text), result), page


@pytest.mark.skipif(not Path(HELP_FOLDER, "zh-CN").is_dir(), reason="apt-get install libreoffice-help-zh-cn")
def test_help_pages_give_html_parsers_paragraphs():
    pages = sorted(Path(HELP_FOLDER).glob("*/text/**/*.html"))[::10]  # one page in ten, both languages
    same_on(pages, HelpParagraphs, "texts")


@pytest.mark.skipif(not Path(DEBIAN_REFERENCE_FOLDER).is_dir(), reason="apt-get install debian-reference-zh-cn")
def test_debian_reference_pages_give_html_parsers_paragraphs():
    same_on(sorted(Path(DEBIAN_REFERENCE_FOLDER).glob("*.zh-cn.html")), HtmlParagraphs, "paragraphs")
