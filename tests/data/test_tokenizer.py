"""WordPiece vocabulary learned by our deterministic trainer, run in-graph with tensorflow-text
and checked against the HF tokenizer: the two must agree id for id, or training and serving
would see different inputs."""

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from trainformer.data.tokenizer import Tokenizer, copy_vocab

from trainformer.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID
from trainformer.data.wordpiece import hf_wordpiece
from trainformer.errors import UserError

# What train_vocab writes to vocab.txt, without train_vocab's TensorFlow import (seconds per process).
TRAIN_IN_ANOTHER_PROCESS = """
import json, sys
from trainformer.data.corpus import load_corpus
from trainformer.data.wordpiece import train_wordpiece
vocab = train_wordpiece(load_corpus("people-daily-1998", 0.05).train, 8000, 2, True, json.loads(sys.argv[1]))
sys.stdout.buffer.write("".join(f"{token}\\n" for token in vocab).encode("utf-8"))
"""


def test_vocab_starts_with_special_tokens(vocab_dir, tokenizer):
    vocab = (vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID) == (0, 1, 2, 3, 4)
    assert tokenizer.vocab == vocab
    assert len(set(vocab)) == len(vocab)
    assert 1000 < tokenizer.vocab_size <= 8000
    settings = json.loads((vocab_dir / "tokenizer.json").read_text())
    assert settings["lowercase"] is True and settings["normalization"] == "NFKC"


def test_vocab_is_byte_identical_when_trained_in_other_processes(vocab_dir):
    """HF's own trainer gave 5,658 to 5,661 tokens from process to process
    (huggingface/tokenizers#1794); ours must not depend on the process, its hash seed included."""
    processes = [
        subprocess.Popen([sys.executable, "-c", TRAIN_IN_ANOTHER_PROCESS, json.dumps(SPECIAL_TOKENS)],
                         env={**os.environ, "PYTHONHASHSEED": seed}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for seed in ("1", "2")
    ]
    expected = (vocab_dir / "vocab.txt").read_bytes()
    for process in processes:
        out, err = process.communicate()
        assert process.returncode == 0, err.decode()
        assert out == expected


def test_vocab_is_what_hf_trainer_learns_up_to_ties(corpus, tokenizer):
    """Same algorithm as HF's WordPiece trainer with every order fixed: the two vocabularies
    differ only where HF broke a tie between equally frequent pairs (8 to 23 of ~5,660 tokens
    measured)."""
    hf = hf_wordpiece(lowercase=True)
    hf.train_from_iterator(corpus.train, vocab_size=8000, min_frequency=2, limit_alphabet=1_000_000,
                           special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    theirs, ours = set(hf.get_vocab()), set(tokenizer.vocab)
    assert abs(len(theirs) - len(ours)) <= 0.01 * len(ours)
    assert len(theirs ^ ours) <= 0.01 * len(ours)
    assert {t for t in theirs if not t.startswith("##") and len(t) == 1} <= ours  # every character


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


def test_text_turns_ids_back_into_the_normalised_text(corpus, tokenizer):
    """What a seq2seq model's output ids read as: Chinese without spaces, NFKC as the tokenizer
    read it, English words still apart, [UNK] kept, specials and padding gone."""
    import unicodedata

    paragraphs = [p[:80] for p in corpus.valid[:50]]
    ids = tokenizer(tf.constant(paragraphs))
    framed = tf.concat([tf.fill([len(paragraphs), 1], 2), ids, tf.fill([len(paragraphs), 1], 3)], axis=1)
    texts = [t.decode("utf-8") for t in tokenizer.text(framed.to_tensor(0)).numpy()]
    unknown = 0
    for paragraph, text, row in zip(paragraphs, texts, ids.to_list()):
        if 1 in row:  # [UNK]: a character outside the vocabulary stands as "[UNK]"
            unknown += 1
            continue
        assert text == "".join(unicodedata.normalize("NFKC", paragraph).lower().split())
    assert unknown < 5
    mixed = tokenizer.text(tokenizer(tf.constant(["在 windows 中打开 the file, 25 %"])).to_tensor(0)).numpy()[0]
    assert mixed.decode("utf-8") == "在windows中打开the file,25%"
