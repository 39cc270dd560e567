"""WordPiece vocabulary trained with HF tokenizers, run in-graph with tensorflow-text: the
two must agree id for id, or training and serving would see different inputs."""

import json
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from trainformer.data.tokenizer import (
    CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID, Tokenizer, copy_vocab, hf_wordpiece,
)
from trainformer.errors import UserError


def test_vocab_starts_with_special_tokens(vocab_dir, tokenizer):
    vocab = (vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID) == (0, 1, 2, 3, 4)
    assert tokenizer.vocab == vocab
    assert len(set(vocab)) == len(vocab)
    assert 1000 < tokenizer.vocab_size <= 8000
    settings = json.loads((vocab_dir / "tokenizer.json").read_text())
    assert settings["lowercase"] is True and settings["normalization"] == "NFKC"


def test_most_frequent_characters_are_in_vocab(corpus, tokenizer):
    counts = Counter("".join(corpus.train))
    top = [ch for ch, _ in counts.most_common(300) if "\u4e00" <= ch <= "\u9fff"]
    vocab = set(tokenizer.vocab)
    assert {"的", "国", "人", "中", "年"} <= vocab
    assert all(ch in vocab for ch in top)


def test_unknown_rate_on_valid_split_is_below_one_percent(corpus, tokenizer):
    ids = tokenizer(tf.constant(corpus.valid)).flat_values.numpy()
    assert ids.size > 50_000
    assert np.mean(ids == UNK_ID) < 0.01
    assert ids.min() >= 0 and ids.max() < tokenizer.vocab_size
    assert not np.isin(ids, [PAD_ID, CLS_ID, SEP_ID, MASK_ID]).any()  # no specials from text


def test_in_graph_tokenizer_matches_hf_on_whole_valid_split(corpus, vocab_dir, tokenizer):
    hf = hf_wordpiece(lowercase=True, vocab=str(vocab_dir / "vocab.txt"))
    ours = tokenizer(tf.constant(corpus.valid)).to_list()
    assert len(ours) == len(corpus.valid)
    mismatches = [
        (doc, got, expected)
        for doc, got, expected in zip(
            corpus.valid, ours, (e.ids for e in hf.encode_batch(corpus.valid, add_special_tokens=False))
        )
        if got != expected
    ]
    assert not mismatches, f"{len(mismatches)} documents differ; first: {mismatches[0]}"


def test_hf_and_in_graph_agree_on_mixed_script_text(vocab_dir, tokenizer):
    texts = ["１９９８年ＡＢＣ公司", "Hello，世界！ 2024年", "江泽民主席在北京 GDP 增长 8.5%", "Ｅ-mail：ｗｗｗ"]
    hf = hf_wordpiece(lowercase=True, vocab=str(vocab_dir / "vocab.txt"))
    ours = tokenizer(tf.constant(texts)).to_list()
    assert ours == [hf.encode(t, add_special_tokens=False).ids for t in texts]


def test_full_width_and_ascii_digits_tokenize_identically(tokenizer):
    full, ascii_ = tokenizer(tf.constant(["１９９８年", "1998年"])).to_list()
    assert full == ascii_
    assert UNK_ID not in full
    assert tokenizer.detokenize(full)[-1] == "年"
    # without lowercasing (whose NFD pass hides it), NFKC alone must do the mapping
    cased = Tokenizer(tokenizer.vocab, lowercase=False)
    full, ascii_ = cased(tf.constant(["１９９８年", "1998年"])).to_list()
    assert full == ascii_ and UNK_ID not in full


def test_tokenizer_works_inside_tf_function(corpus, tokenizer):
    docs = tf.constant(corpus.valid[:64])
    graph = tf.function(tokenizer.__call__, input_signature=[tf.TensorSpec([None], tf.string)])
    assert graph(docs).to_list() == tokenizer(docs).to_list()


def test_vocab_without_special_tokens_first_is_rejected():
    with pytest.raises(ValueError, match="must start with"):
        Tokenizer(["a", "b", *SPECIAL_TOKENS])


def test_literal_special_token_text_never_becomes_a_special_id(tokenizer):
    """User text cannot inject [MASK]/[SEP]/...: they are tokenized as ordinary characters."""
    ids = tokenizer(tf.constant(["中国[MASK]人", "[SEP]", "[CLS] [PAD]"])).flat_values.numpy()
    assert not np.isin(ids, [PAD_ID, CLS_ID, SEP_ID, MASK_ID]).any()


def test_copy_vocab_reuses_a_vocabulary_exactly(vocab_dir, tmp_path):
    copied = copy_vocab(str(vocab_dir / "vocab.txt"), tmp_path / "tok", lowercase=True)
    assert copied.read_text(encoding="utf-8") == (vocab_dir / "vocab.txt").read_text(encoding="utf-8")
    assert Tokenizer.load(tmp_path / "tok").vocab == Tokenizer.load(vocab_dir).vocab


@pytest.mark.parametrize(
    "text, message",
    [("[PAD]\n[UNK]\n[CLS]\n[MASK]\n[SEP]\n中\n", "vocab.txt:4: expected special token [SEP]"),
     ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", "holds no tokens beyond the special tokens")],
)
def test_copy_vocab_rejects_a_file_without_our_special_tokens(tmp_path, text, message):
    source = tmp_path / "vocab.txt"
    source.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        copy_vocab(str(source), tmp_path / "tok", lowercase=True)
    assert not (tmp_path / "tok").exists()  # nothing half-written


def test_copy_vocab_names_a_missing_file(tmp_path):
    with pytest.raises(UserError, match="tokenizer.vocab_file: .*missing.txt: no such file"):
        copy_vocab(str(tmp_path / "missing.txt"), tmp_path / "tok", lowercase=True)
