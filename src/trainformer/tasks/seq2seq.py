"""Sequence to sequence (translation, summarization): source text -> target text.

Training is teacher-forced (the target shifted right, [CLS] first, [SEP] last) with
label-smoothed cross-entropy over every target token; outputs come from model/search.py's
in-graph greedy or beam search, the same function in eval, predict and a served model.
"""

from __future__ import annotations

import json
import time

import keras
import numpy as np
import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.data.parallel import ParallelCorpus
from trainformer.data.seq2seq_pipeline import (
    cached_encode_pairs,
    eval_batches,
    load_cached_pairs,
    pairs_cache_file,
    train_dataset,
)
from trainformer.data.tokenizer import Tokenizer, frame
from trainformer.errors import UserError
from trainformer.files import write_atomic
from trainformer.model import search
from trainformer.model.seq2seq import build_seq2seq
from trainformer.run_dir import RunDir
from trainformer.tasks import dtype_policy
from trainformer.tasks.losses import fused_cross_entropy
from trainformer.tasks.serving import TEXT, TaskServing
from trainformer.tasks.text_scores import text_scores
from trainformer.tasks.vocabulary import run_vocabulary
from trainformer.tokens import PAD_ID

SPLITS = ("train", "valid", "test")
HELD_OUT = ("valid", "test")


def seq2seq_sums(logits: tf.Tensor, targets: dict, smoothing: float = 0.0) -> dict[str, tf.Tensor]:
    """Label-smoothed cross-entropy and token accuracy summed over the real (non-[PAD]) target
    tokens. logits: (batch, t, vocab) float32; targets["labels"]: (batch, t) int32.

    With smoothing e the target distribution is (1 - e) on the label plus e spread evenly over
    the vocabulary (Szegedy et al. 2016, as in "Attention Is All You Need"). `items`: the real
    source and target tokens, what the progress line's tok/s counts."""
    labels = targets["labels"]
    real = tf.cast(labels != PAD_ID, tf.float32)  # (batch, t)
    losses, hits = fused_cross_entropy(logits, labels, smoothing)  # (batch, t) each
    count = tf.reduce_sum(real)
    return {"loss_sum": tf.reduce_sum(losses * real), "correct": tf.reduce_sum(hits * real), "count": count,
            "items": count + tf.cast(tf.reduce_sum(targets["source_tokens"]), tf.float32)}


class DecodeProgress:
    """Says "decoding test: 128/1,736 sentences, 1.2/s, ETA 9m" every `every_s` seconds through
    `say` (nothing when say is None), and how long the whole split took at the end."""

    def __init__(self, split: str, total: int, say=None, every_s: float = 5.0, clock=time.monotonic):
        self.split, self.total, self.say, self.every_s, self.clock = split, total, say, every_s, clock
        self.done = 0
        self.started = self.last = clock()

    def advance(self, count: int) -> None:
        self.done += count
        now = self.clock()
        if self.say and now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            rate = self.done / max(now - self.started, 1e-9)
            self.say(f"decoding {self.split}: {self.done:,}/{self.total:,} sentences, {rate:.1f}/s, "
                     f"ETA {short_duration((self.total - self.done) / max(rate, 1e-9))}")

    def finish(self) -> None:
        if self.say:
            self.say(f"decoded {self.split}: {self.done:,} sentences in {short_duration(self.clock() - self.started)}")


def short_duration(seconds: float) -> str:
    """4s, 9m, 1h12m: an ETA needs no more precision than that."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Seq2SeqTask:
    """Training an encoder-decoder on a ParallelCorpus, batched by a token budget."""

    accuracy_name = "token_accuracy"
    unit = "tok"
    shape_generic = True  # rows and widths vary with the token budget: one trace for all (train/loop.py)

    def __init__(self, config: ExperimentConfig):
        self.config = config
        d, t = config.data, config.train
        self.source_len, self.target_len = d.seq_len, d.target_len or d.seq_len
        self.max_output = config.decode.max_length or self.target_len  # output tokens, [SEP] included
        self.vocab_size = config.tokenizer.vocab_size
        self.loss_sums = lambda logits, targets: seq2seq_sums(logits, targets, t.label_smoothing)
        self.items_per_step = None  # tokens vary per batch: loss sums count them (`items`)

    # --- data -----------------------------------------------------------------------------------

    def prepare(self, run: RunDir, corpus: ParallelCorpus, say=print, may_create_vocabulary: bool = True) -> None:
        """Joint vocabulary over both sides (once per run), the tokenized splits (cached) and the
        held-out texts (references for BLEU/ROUGE, kept in the cache so eval needs no corpus)."""
        say(f"data: {corpus.summary()}")
        self.run, self.corpus = run, corpus
        self.language = corpus.target_language
        train = corpus.train
        self.tokenizer = run_vocabulary(self.config, run.tokenizer_dir, train.sources + train.targets, say,
                                        may_create_vocabulary)
        self.vocab_size = self.tokenizer.vocab_size
        self.examples, self.texts, self.was_cached = {}, {}, True
        for split in SPLITS:
            pairs = getattr(corpus, split)
            self.examples[split], cached = cached_encode_pairs(
                run.cache_dir, self.tokenizer, pairs.sources, pairs.targets, corpus.fingerprint, split,
                self.source_len, self.target_len)
            self.was_cached &= cached
        for split in HELD_OUT:
            pairs = getattr(corpus, split)
            self.texts[split] = {"sources": pairs.sources, "targets": pairs.targets}
            path = self._texts_file(split, corpus.fingerprint)
            if not path.is_file():
                write_atomic(path, json.dumps(self.texts[split], ensure_ascii=False))

    def prepare_from_cache(self, run: RunDir) -> bool:
        """For eval and predict: vocabulary, tokenized splits and held-out texts from the run
        (False when the cache is gone: then prepare() reads the data again)."""
        self.run = run
        self.tokenizer = Tokenizer.load(run.tokenizer_dir)
        self.vocab_size = self.tokenizer.vocab_size
        data = run.read_manifest().get("data", {})
        fingerprint, self.language = data.get("fingerprint"), data.get("target_language", "")
        if not fingerprint:
            return False
        files = {split: pairs_cache_file(run.cache_dir, self.tokenizer, fingerprint, split, self.source_len,
                                         self.target_len) for split in SPLITS}
        texts = {split: self._texts_file(split, fingerprint) for split in HELD_OUT}
        if not all(path.is_file() for path in [*files.values(), *texts.values()]):
            return False
        self.examples = {split: load_cached_pairs(path) for split, path in files.items()}
        self.texts = {split: json.loads(path.read_text(encoding="utf-8")) for split, path in texts.items()}
        return True

    def _texts_file(self, split: str, fingerprint: str):
        return self.run.cache_dir / f"{split}-texts-{fingerprint[:16]}.json"

    def train_batches(self, start_batch: int) -> tf.data.Dataset:
        t = self.config.train
        return train_dataset(self.examples["train"], t.batch_tokens, t.seed, self.source_len, self.target_len,
                             start_batch)

    def eval_batches(self, split: str) -> list[tuple[dict, dict]]:
        """Every pair of a split once: fixed (inputs, targets) batches of similar length."""
        return [(inputs, targets) for inputs, targets, _ in self._eval_batches(split)]

    def _eval_batches(self, split: str):
        if split not in self.examples or not len(self.examples[split]["source_lengths"]):
            raise UserError(f"eval --split {split}: this run has no {split} pairs "
                            f"(data.test_fraction is {self.config.data.test_fraction})")
        return eval_batches(self.examples[split], self.config.train.batch_tokens, self.source_len, self.target_len)

    def attention_windows(self) -> np.ndarray:
        valid = self.examples["valid"]
        return valid["source_flat"][: valid["source_lengths"][0]][None]  # (1, length): the first valid source

    # --- model and evaluation -------------------------------------------------------------------

    def build_model(self) -> keras.Model:
        c = self.config
        return build_seq2seq(c.model, self.vocab_size, c.model.max_length or self.source_len, self.target_len,
                             dtype=dtype_policy(c.train.precision))

    def evaluator(self, model: keras.Model, progress=None):
        """evaluate(split) -> teacher-forced loss and token accuracy, then the whole split
        decoded (decode.*) and scored: BLEU, chrF, ROUGE-1/2/L, decode speed. The outputs are
        kept for save_outputs. `progress(line)`, when given, hears how far decoding is every
        few seconds (beam search over a test split takes minutes)."""
        # eval batches come in many shapes: one shape-generic trace, not one per shape
        logits_of = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True, autograph=False)
        serving = self.serving(model)
        batches = {}

        def evaluate(split: str = "valid") -> dict:
            sums = dict.fromkeys(("loss_sum", "correct", "count", "items"), 0.0)
            texts = self.texts.get(split)
            if texts is None:
                raise UserError(f"eval --split {split}: only valid and test keep their texts to score against")
            outputs = [""] * len(texts["targets"])
            decode_seconds = 0.0
            if split not in batches:
                batches[split] = self._eval_batches(split)
            meter = DecodeProgress(split, len(outputs), progress)
            for inputs, targets, indices in batches[split]:
                for key, value in seq2seq_sums(logits_of(inputs), targets, self.config.train.label_smoothing).items():
                    sums[key] += float(value)
                started = time.perf_counter()
                decoded = serving.ids(inputs["source_ids"])["output"].numpy()
                decode_seconds += time.perf_counter() - started
                for index, text in zip(indices, decoded):
                    outputs[index] = text.decode("utf-8")
                meter.advance(len(decoded))
            meter.finish()
            self.outputs = {"split": split, "sources": texts["sources"], "references": texts["targets"],
                            "outputs": outputs}
            count = max(sums["count"], 1.0)
            return {"loss": sums["loss_sum"] / count, "token_accuracy": sums["correct"] / count,
                    **text_scores(outputs, texts["targets"], self.language),
                    "num_examples": len(outputs), "sentences_per_s": len(outputs) / max(decode_seconds, 1e-9),
                    "decode": self.decode_settings()}

        return evaluate

    def decode_settings(self) -> dict:
        d = self.config.decode
        settings = {"strategy": d.strategy, "max_length": self.max_output}
        return {**settings, "beam_size": d.beam_size, "length_penalty": d.length_penalty} if d.strategy == "beam" \
            else settings

    def save_outputs(self, step: int):
        """RUN_DIR/eval/<split>-<step>.jsonl: source, reference and output of the last evaluate()."""
        rows = zip(self.outputs["sources"], self.outputs["references"], self.outputs["outputs"])
        path = self.run.root / "eval" / f"{self.outputs['split']}-{step}.jsonl"
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, "".join(json.dumps({"source": s, "reference": r, "output": o}, ensure_ascii=False) + "\n"
                                   for s, r, o in rows))
        return path

    def on_eval(self, monitor, step: int, metrics: dict) -> None:
        self.save_outputs(step)

    @staticmethod
    def eval_line(metrics: dict) -> str:
        return (f"loss {metrics['loss']:.4f}  token accuracy {metrics['token_accuracy']:.2%}  "
                f"BLEU {metrics['bleu']:.2f}  chrF {metrics['chrf']:.1f}  ROUGE-L {metrics['rougeL']:.1f} "
                f"({metrics['num_examples']:,} pairs, {metrics['decode']['strategy']}, "
                f"{metrics['sentences_per_s']:.1f} sentences/s)")

    def summary_lines(self) -> list[str]:
        t = self.config.train
        sizes = " / ".join(f"{len(self.examples[split]['source_lengths']):,} {split}" for split in SPLITS)
        accumulate = f" x {t.accumulate} accumulated" if t.accumulate > 1 else ""
        decode = ", ".join(f"{key} {value}" for key, value in self.decode_settings().items())
        m = self.config.model
        embeddings = "one embedding for source, target and output" if m.tie_embeddings else "separate embeddings"
        copy = "; copies source tokens (model.copy_source)" if m.copy_source else ""
        return [f"decoder: {m.decoder_layers or m.num_layers} layers (the layers above are the encoder's); {embeddings}"
                f"{copy}",
                f"pairs: {sizes}; source up to {self.source_len} tokens, target up to {self.target_len}; "
                f"batches of up to {t.batch_tokens:,} padded tokens{accumulate}, length-bucketed",
                f"decode: {decode}"]

    @staticmethod
    def result_lines(final: dict) -> list[str]:
        return [f"valid BLEU {final['bleu']:.2f}, chrF {final['chrf']:.1f}, ROUGE-1/2/L {final['rouge1']:.1f}/"
                f"{final['rouge2']:.1f}/{final['rougeL']:.1f} on {final['num_examples']:,} pairs "
                f"(the test split: trainformer eval RUN_DIR --split test)"]

    def manifest_data(self) -> dict:
        corpus = self.corpus
        return {"source": corpus.source, "fingerprint": corpus.fingerprint, "examples": corpus.num_examples,
                "target_language": corpus.target_language, "skipped_pairs": dict(corpus.skipped)}

    def serving(self, model: keras.Model) -> "Seq2SeqServing":
        return Seq2SeqServing(model, self.tokenizer, self.source_len, self.max_output, self.config.decode)


class Seq2SeqServing(TaskServing):
    """A seq2seq run's answers as in-graph functions (tasks/serving.py): texts -> texts, decoded
    by model/search.py with the run's decode settings.

    Example:
        serving = task.serving(model)
        serving.text(tf.constant(["Click OK."]))["output"]  # (1,) string
    """

    def __init__(self, model: keras.Model, tokenizer: Tokenizer, seq_len: int, max_output: int, decode):
        super().__init__(model, tokenizer, seq_len, name="seq2seq_serving")
        self.max_output = max_output
        self.beam_size = decode.beam_size if decode.strategy == "beam" else 1
        self.strategy = decode.strategy
        self.alpha = decode.length_penalty

    @tf.function(input_signature=[TEXT], autograph=False)
    def encode(self, text):
        """Texts -> ({source_ids (batch, L) int32}, truncated (batch,) bool), as training encodes."""
        ids, truncated = frame(self.tokenizer(text), self.seq_len)
        return {"source_ids": ids.to_tensor(PAD_ID)}, truncated

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")], autograph=False)
    def ids(self, source_ids):
        """`[CLS] ... [SEP]` source ids padded with [PAD] (batch, L) -> output (batch,) string,
        output_ids (batch, max_output) int32 (0 after [SEP]), score (batch,) float32; with beam
        search also the n-best: outputs (batch, beam) string, scores (batch, beam)."""
        mask = source_ids != PAD_ID
        batch = tf.shape(source_ids)[0]
        state = search.initial_state(self.model, source_ids, mask, self.max_output)
        step = search.cached_step(self.model)
        if self.strategy == "greedy":
            tokens, log_probs = search.greedy_search(step, state, batch, self.max_output)
            return {"output": self.tokenizer.text(tokens), "output_ids": tokens, "score": log_probs}
        tokens, scores, _ = search.beam_search(step, state, batch, self.max_output, self.beam_size, self.alpha)
        texts = tf.reshape(self.tokenizer.text(tf.reshape(tokens, [batch * self.beam_size, -1])), [batch, -1])
        return {"output": texts[:, 0], "output_ids": tokens[:, 0], "score": scores[:, 0],
                "outputs": texts, "scores": scores}

    @tf.function(input_signature=[TEXT], autograph=False)
    def text(self, text):
        """Texts (batch,) -> ids' outputs plus truncated (batch,) bool (the source was longer than
        data.seq_len tokens and its end was dropped, as in training)."""
        inputs, truncated = self.encode(text)
        return {**self.ids(**inputs), "truncated": truncated}

    def answer(self, texts: list[str], nbest: bool = False) -> list[dict]:
        """`trainformer predict`: the output text and its score (and with nbest, the beam's list)."""
        answer = {key: value.numpy() for key, value in self.text(tf.constant(texts)).items()}
        rows = []
        for i, text in enumerate(texts):
            row = {"text": text, "output": answer["output"][i].decode("utf-8"), "score": round(float(answer["score"][i]), 4)}
            if answer["truncated"][i]:
                row["truncated"] = True
            if nbest and "outputs" in answer:
                row["nbest"] = [{"output": out.decode("utf-8"), "score": round(float(score), 4)}
                                for out, score in zip(answer["outputs"][i], answer["scores"][i])]
            rows.append(row)
        return rows
