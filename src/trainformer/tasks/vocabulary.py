"""A run's vocabulary, the same for every task: kept once made, else taken from the run it
starts from (model.init_from), from tokenizer.vocab_file, or learned from the training texts."""

from __future__ import annotations

import time
from pathlib import Path

from trainformer.config import ExperimentConfig
from trainformer.data.tokenizer import VOCAB_FILE, Tokenizer, copy_vocab, read_settings, train_vocab
from trainformer.errors import UserError


def run_vocabulary(config: ExperimentConfig, tokenizer_dir: Path, texts: list[str], say=print,
                   may_create: bool = True) -> Tokenizer:
    """The run's tokenizer, made first if it is not there yet.

    may_create=False (non-chief workers): the chief has made it; it must be there.
    """
    tok = config.tokenizer
    if (tokenizer_dir / VOCAB_FILE).is_file():
        pass  # a run keeps its vocabulary: token ids must not change under a checkpoint
    elif not may_create:
        raise UserError(f"{tokenizer_dir.parent}: the chief's vocabulary is not there; the run directory must be "
                        f"on storage every worker sees")
    elif config.model.init_from:
        # The encoder's embedding rows are indexed by the pretraining run's ids: use its vocabulary.
        source = Path(config.model.init_from) / "tokenizer"
        settings = read_settings(source)
        copied = copy_vocab(str(source / VOCAB_FILE), tokenizer_dir, settings["lowercase"], settings["words"])
        say(f"vocabulary: {copied} "
            f"(from model.init_from={config.model.init_from})")
    elif tok.vocab_file:
        say(f"vocabulary: {copy_vocab(tok.vocab_file, tokenizer_dir, tok.lowercase, tok.words)} (from {tok.vocab_file})")
    else:
        started = time.perf_counter()
        train_vocab(texts, tokenizer_dir, tok.vocab_size, tok.min_frequency, tok.lowercase, tok.words)
        kind = "word-aware (tokenizer.words), " if tok.words else ""
        say(f"vocabulary: {kind}trained in {time.perf_counter() - started:.1f}s -> {tokenizer_dir / VOCAB_FILE}")
    return Tokenizer.load(tokenizer_dir)
