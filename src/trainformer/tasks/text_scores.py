"""BLEU, chrF and ROUGE of generated text, with the libraries the field reports them with.

- BLEU and chrF: sacrebleu's corpus scores; its `zh` tokenizer for Chinese targets (every CJK
  character a token), `13a` otherwise.
- ROUGE-1/2/L: Google's rouge-score (the ROUGE-1.5.5 reimplementation), F-measure averaged over
  the examples. Its default tokenizer keeps only [a-z0-9] words and would drop every Chinese
  character, so Chinese is scored per character (the usual practice for Chinese summaries).

References and outputs are both NFKC-normalised first: the model reads and writes NFKC text
(the tokenizer normalises, e.g. `，` becomes `,`), and a score should not count that as an error.
"""

from __future__ import annotations

import unicodedata

import sacrebleu
from rouge_score import rouge_scorer, tokenizers

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class CharacterTokenizer(tokenizers.Tokenizer):
    """Every non-space character is a token."""

    def tokenize(self, text):
        return [character for character in text if not character.isspace()]


def text_scores(outputs: list[str], references: list[str], language: str) -> dict[str, float]:
    """{"bleu", "chrf", "rouge1", "rouge2", "rougeL"}, each 0-100, of outputs against one
    reference each; language "zh" picks the Chinese tokenisation."""
    outputs = [unicodedata.normalize("NFKC", text) for text in outputs]
    references = [unicodedata.normalize("NFKC", text) for text in references]
    chinese = language == "zh"
    scores = {
        "bleu": sacrebleu.corpus_bleu(outputs, [references], tokenize="zh" if chinese else "13a").score,
        "chrf": sacrebleu.corpus_chrf(outputs, [references]).score,
    }
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=CharacterTokenizer() if chinese else None)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for output, reference in zip(outputs, references):
        for name, score in scorer.score(reference, output).items():
            totals[name] += score.fmeasure
    return {**scores, **{name: 100 * total / max(len(outputs), 1) for name, total in totals.items()}}
