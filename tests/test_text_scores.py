"""BLEU, chrF and ROUGE of generated text (tasks/text_scores.py), through the real libraries."""

import pytest

from trainformer.tasks.text_scores import text_scores

REFERENCES = ["选择「格式」菜单中的「单元格」。", "国家主席江泽民发表新年讲话"]


def test_a_perfect_chinese_output_scores_100_and_nfkc_punctuation_is_no_error():
    outputs = ["选择「格式」菜单中的「单元格」.", "国家主席江泽民发表新年讲话"]  # 。-> . is not NFKC's; 「 」 are kept
    exact = text_scores(REFERENCES, REFERENCES, "zh")
    assert all(value == pytest.approx(100) for value in exact.values())
    nfkc = text_scores(["选择「格式」菜单中的「单元格」。", "国家主席江泽民发表新年讲话"], REFERENCES, "zh")
    assert nfkc == exact
    assert text_scores(outputs, REFERENCES, "zh")["bleu"] < 100


def test_chinese_is_scored_per_character():
    """rouge-score's own tokenizer drops every Chinese character (ROUGE 0): ours counts them."""
    half = text_scores(["选择「格式」", "国家主席"], REFERENCES, "zh")
    assert 0 < half["rouge1"] < 100 and 0 < half["chrf"] < 100
    assert text_scores(["江泽民讲话"], ["江泽民发表讲话"], "zh")["rougeL"] == pytest.approx(100 * 2 * 5 / 12)


def test_english_uses_word_tokens():
    scores = text_scores(["click the ok button"], ["Click the OK button."], "en")
    assert scores["rouge1"] == pytest.approx(100)  # rouge-score lowercases and drops punctuation
    assert scores["bleu"] < 100  # sacrebleu's 13a keeps case
