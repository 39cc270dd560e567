"""Built-in configs keep the size their name promises, on their own built-in data."""

from trainformer.config import load_config
from trainformer.data.corpus import load_corpus
from trainformer.data.tokenizer import Tokenizer, train_vocab
from trainformer.tasks.mlm import MaskedLMTask


def test_zh_bert_80m_has_80m_parameters_on_its_built_in_corpus(tmp_path):
    """What `trainformer train zh-bert-80m` builds: the embedding is sized by the vocabulary
    learned from its corpus (People's Daily runs out of pairs seen min_frequency times at ~5.7k
    tokens, far below tokenizer.vocab_size 21,128), so that vocabulary is what is counted."""
    config = load_config("zh-bert-80m", ["train.precision=fp32"])  # a task builds in a resolved precision
    corpus = load_corpus(config.data.corpus, config.data.valid_fraction)
    tok = config.tokenizer
    train_vocab(corpus.train, tmp_path, tok.vocab_size, tok.min_frequency, tok.lowercase)
    task = MaskedLMTask(config)
    task.vocab_size = vocab_size = Tokenizer.load(tmp_path).vocab_size
    num_params = task.build_model().count_params()
    assert 76_000_000 <= num_params <= 84_000_000, f"{num_params:,} parameters with {vocab_size:,} tokens"
