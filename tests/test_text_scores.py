"""BLEU, chrF and ROUGE of generated text (tasks/text_scores.py), through the real libraries."""

import unicodedata

import pytest

from trainformer.tasks.text_scores import text_scores

REFERENCES = ["选择「格式」菜单中的「单元格」。", "国家主席江泽民发表新年讲话"]


def test_a_perfect_chinese_output_scores_100_and_a_changed_stop_does_not():
    outputs = ["选择「格式」菜单中的「单元格」.", "国家主席江泽民发表新年讲话"]  # 。-> . is not NFKC's; 「 」 are kept
    exact = text_scores(REFERENCES, REFERENCES, "zh")
    assert all(value == pytest.approx(100) for value in exact.values())
    assert text_scores(outputs, REFERENCES, "zh")["bleu"] < 100


def test_text_that_nfkc_changes_scores_as_its_nfkc_form():
    """Full-width letters and digits, the fi ligature, half-width katakana and a Kangxi radical
    (the model writes their NFKC forms): an output equal to its reference after NFKC is perfect,
    and a partial one counts the NFKC characters as the matches they are."""
    outputs = ["国家主席发表ＡＢＣ１２３讲话", "the ﬁrst ﬁle", "ｶﾀｶﾅ⼀"]
    references = ["国家主席发表ABC123讲话", "the first file", "カタカナ一"]
    for output, reference in zip(outputs, references):  # inputs NFKC really changes
        assert unicodedata.normalize("NFKC", output) == reference != output
    assert all(value == pytest.approx(100) for value in text_scores(outputs, references, "zh").values())
    assert all(value == pytest.approx(100) for value in text_scores(references, outputs, "zh").values())
    # 8 characters out, 10 in the reference, all 8 in order (LCS 8): P 1, R 0.8, F 16/18
    partial = text_scores(["江泽民讲话ＡＢＣ"], ["江泽民发表讲话ABC"], "zh")
    assert partial["rougeL"] == pytest.approx(100 * 16 / 18) and partial["rouge1"] == pytest.approx(100 * 16 / 18)


def test_chinese_is_scored_per_character():
    """rouge-score's own tokenizer drops every Chinese character (ROUGE 0): ours counts them."""
    half = text_scores(["选择「格式」", "国家主席"], REFERENCES, "zh")
    assert 0 < half["rouge1"] < 100 and 0 < half["chrf"] < 100
    assert text_scores(["江泽民讲话"], ["江泽民发表讲话"], "zh")["rougeL"] == pytest.approx(100 * 2 * 5 / 12)


def test_english_uses_word_tokens():
    scores = text_scores(["click the ok button"], ["Click the OK button."], "en")
    assert scores["rouge1"] == pytest.approx(100)  # rouge-score lowercases and drops punctuation
    assert scores["bleu"] < 100  # sacrebleu's 13a keeps case
