"""Make tests/fixtures/tiny-hf-bert: a tiny random Hugging Face BERT and its reference outputs.

The fixture stands in for bert-base-chinese in tests/test_hf_import.py, which checks that
`trainformer.interop.hf_import` reproduces what `transformers` computes. It is a BertForPreTraining
(what bert-base-chinese is: encoder + pooler + MLM head + NSP head) with a tiny config
(hidden 32, 2 layers, 2 heads, intermediate 64, 64 positions, 2 token types, exact "gelu"),
every parameter random and seeded, biases and LayerNorm parameters included (all-zero biases or
unit LayerNorm scales would let a wrong mapping pass). Its vocab.txt is laid out like
bert-base-chinese's: [PAD] at 0, [unused1..99], [UNK] [CLS] [SEP] [MASK] at 100-103, then
punctuation, digits, letters, CJK characters and ## pieces; do_lower_case is true.

Files written (save_pretrained with safetensors, then ours):
    config.json, model.safetensors    the model
    vocab.txt, tokenizer_config.json  the vocabulary, do_lower_case
    reference.npz                     input_ids, attention_mask (one padded row), token_type_ids
                                      (zeros), last_hidden_state, pooler_output, mlm_logits, and
                                      tokenizer references: texts, text_ids (-1 padded)

torch and transformers are needed only here, never by trainformer or its tests. Run it from the
repository root in a separate virtual environment (torch==2.13.0 resolves to a CPU wheel):

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0
    /tmp/hfvenv/bin/pip install transformers==5.24.0 safetensors numpy
    /tmp/hfvenv/bin/python scripts/make_tiny_hf_bert.py [OUT_DIR]   # default tests/fixtures/tiny-hf-bert

The output is deterministic for a given torch/transformers version.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertForPreTraining, BertTokenizer

SEED = 20260601
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-hf-bert"

PUNCTUATION = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("，。、！？：；“”（）《》")
CJK = list("人民日报社论中国的一是在不了有和我们大年这为上个来到时会发出就地说要学生经济工作新闻")
WORDS = ["hello", "world", "bert", "the", "##s", "##ing", "##llo", "##ld", "##er"]
PIECES = ["##" + c for c in "人民日报国的年学"]


def vocabulary() -> list[str]:
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "<T>"]
    vocab += PUNCTUATION + list("0123456789") + list("abcdefghijklmnopqrstuvwxyz") + CJK + WORDS + PIECES
    assert len(vocab) == len(set(vocab)), "duplicate vocabulary entries"
    return vocab


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter random: weights ~ N(0, 0.2), biases ~ N(0, 0.3), LayerNorm scales 1 + N(0, 0.3)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # tied parameters appear once
            noise = torch.randn(parameter.shape, generator=generator)
            if "LayerNorm.weight" in name:
                parameter.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.3 * noise)
            else:
                parameter.copy_(0.2 * noise)


def main(out: Path) -> None:
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    vocab = vocabulary()
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12, pad_token_id=0, attn_implementation="eager",
    )
    model = BertForPreTraining(config)
    randomize(model, generator)
    model.eval()

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 64}, indent=2) + "\n")

    # Reference batch: ids over the whole vocabulary ([unused*] and ## pieces included, so the
    # vocabulary permutation matters), one row padded after 7 tokens.
    rng = np.random.default_rng(SEED)
    batch, seq = 3, 12
    input_ids = rng.integers(0, len(vocab), (batch, seq)).astype(np.int64)
    input_ids[:, 0] = vocab.index("[CLS]")
    input_ids[0, 5] = vocab.index("[MASK]")
    input_ids[0, -1] = input_ids[2, 6] = vocab.index("[SEP]")
    attention_mask = np.ones((batch, seq), np.int64)
    attention_mask[2, 7:] = 0
    input_ids[2, 7:] = 0
    token_type_ids = np.zeros_like(input_ids)
    with torch.no_grad():
        encoded = model.bert(
            input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask),
            token_type_ids=torch.from_numpy(token_type_ids),
        )
        mlm_logits = model.cls.predictions(encoded.last_hidden_state)

    tokenizer = BertTokenizer.from_pretrained(out)  # reads vocab.txt and tokenizer_config.json
    assert tokenizer.do_lower_case and tokenizer.convert_ids_to_tokens(100) == "[UNK]"
    texts = ["人民日报社论", "Hello 世界! 中国的经济", "BERT 学生们 2026年"]
    text_ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(len(ids) for ids in text_ids)
    padded = np.full((len(texts), width), -1, np.int64)
    for row, ids in enumerate(text_ids):
        padded[row, : len(ids)] = ids

    np.savez_compressed(
        out / "reference.npz",
        input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
        last_hidden_state=encoded.last_hidden_state.numpy(), pooler_output=encoded.pooler_output.numpy(),
        mlm_logits=mlm_logits.numpy(), texts=np.array(texts), text_ids=padded,
    )
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total / 1024:.0f} KB): {', '.join(sorted(p.name for p in out.iterdir()))}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
