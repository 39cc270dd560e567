"""Text classification (intent, sentiment): `[CLS] text [SEP]` -> one of the run's labels."""

from __future__ import annotations

import json

import keras
import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw

from trainformer.config import ExperimentConfig
from trainformer.data.classify_pipeline import (
    cache_file,
    cached_encode,
    encode,
    eval_batches,
    length_order,
    load_cached,
    train_dataset,
)
from trainformer.data.labelled import LabelledCorpus
from trainformer.data.tokenizer import Tokenizer, frame
from trainformer.errors import UserError
from trainformer.files import write_atomic
from trainformer.images import colorize, plain_font
from trainformer.model.heads import build_classifier, layer_decay_multipliers
from trainformer.run_dir import RunDir
from trainformer.tasks import dtype_policy
from trainformer.tasks.losses import fused_cross_entropy
from trainformer.tasks.serving import TEXT, TaskServing
from trainformer.tasks.vocabulary import run_vocabulary
from trainformer.tokens import PAD_ID

SPLITS = ("train", "valid", "test")
LABELS_FILE = "labels.json"


def classify_sums(logits: tf.Tensor, targets: dict, label_smoothing: float = 0.0) -> dict[str, tf.Tensor]:
    """Cross-entropy and accuracy summed over the rows. logits: (batch, labels) float32. The
    cross-entropy is against the labels, with label_smoothing of each target's probability
    spread evenly over every label (Szegedy et al. 2016; training only: eval scores the labels
    as they are), or against targets["soft"] (batch, labels), the teachers' probabilities, where
    a distilled run's training batches carry them; accuracy always counts the labels."""
    labels = targets["labels"]  # (batch,)
    if "soft" in targets:
        losses = tf.nn.softmax_cross_entropy_with_logits(targets["soft"], logits)
    elif label_smoothing:
        losses, _ = fused_cross_entropy(logits, labels, label_smoothing)  # (batch,)
    else:
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
    return {"loss_sum": tf.reduce_sum(losses), "correct": tf.reduce_sum(hits),
            "count": tf.cast(tf.shape(labels)[0], tf.float32)}


def rdrop_sums(logits: tf.Tensor, targets: dict, weight: float, label_smoothing: float = 0.0) -> dict[str, tf.Tensor]:
    """classify_sums, plus, where the rows come in pairs (a training batch under train.rdrop:
    each text twice, two dropout draws), weight / 2 times the symmetric KL divergence of each
    pair's predictions (Liang et al. 2021's loss, summed like the cross-entropy)."""
    sums = classify_sums(logits, targets, label_smoothing)
    if "paired" not in targets:  # an eval batch, or a run without R-Drop: one row per text
        return sums
    log_p = tf.reshape(tf.nn.log_softmax(logits), [-1, 2, logits.shape[-1]])  # (texts, 2 draws, labels)
    # KL(p||q) + KL(q||p) = sum over labels of (p - q) * (log p - log q)
    symmetric_kl = tf.reduce_sum((tf.exp(log_p[:, 0]) - tf.exp(log_p[:, 1])) * (log_p[:, 0] - log_p[:, 1]))
    return {**sums, "loss_sum": sums["loss_sum"] + weight / 2 * symmetric_kl}


def classification_metrics(labels: np.ndarray, predictions: np.ndarray, names: list[str], majority: int) -> dict:
    """Accuracy, macro-F1, per-class precision/recall/F1, support, the confusion matrix (rows:
    true label, columns: predicted) and the accuracy of always answering the majority label."""
    n = len(names)
    confusion = np.zeros([n, n], np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    hits = np.diag(confusion).astype(np.float64)
    support, predicted = confusion.sum(axis=1), confusion.sum(axis=0)
    precision = np.divide(hits, predicted, out=np.zeros(n), where=predicted > 0)
    recall = np.divide(hits, support, out=np.zeros(n), where=support > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros(n), where=precision + recall > 0)
    total = max(len(labels), 1)
    return {
        "accuracy": float(hits.sum() / total),
        "macro_f1": float(f1.mean()),
        "baseline_accuracy": float(support[majority] / total),
        "num_examples": int(len(labels)),
        "per_class": {name: {"precision": float(p), "recall": float(r), "f1": float(f)}
                      for name, p, r, f in zip(names, precision, recall, f1)},
        "support": {name: int(s) for name, s in zip(names, support)},
        "confusion": confusion.tolist(),
    }


class ClassifyTask:
    """Fine-tuning a classifier on a LabelledCorpus, one example per row."""

    accuracy_name = "accuracy"
    unit = "ex"
    shape_generic = False  # a few batch widths: one trace each

    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.vocab_size = config.tokenizer.vocab_size  # until prepare() loads the run's vocabulary
        t = config.train
        self.loss_sums = lambda logits, targets: rdrop_sums(logits, targets, t.rdrop, t.label_smoothing)
        self.items_per_step = config.train.accumulate * config.train.batch_size

    def prepare(self, run: RunDir, corpus: LabelledCorpus, say=print, may_create_vocabulary: bool = True) -> None:
        """Vocabulary (once per run), the label list (run/labels.json) and the tokenized
        splits (cached)."""
        say(f"data: {corpus.summary()}")
        self.corpus = corpus
        self.tokenizer = run_vocabulary(self.config, run.tokenizer_dir, corpus.train.texts, say, may_create_vocabulary)
        self.vocab_size = self.tokenizer.vocab_size
        self.labels = list(corpus.labels)
        if may_create_vocabulary:
            write_atomic(run.root / LABELS_FILE, json.dumps(self.labels, ensure_ascii=False) + "\n")
        self.examples, self.was_cached = {}, True
        for split in SPLITS:
            examples = getattr(corpus, split)
            self.examples[split], cached = cached_encode(run.cache_dir, self.tokenizer, examples.texts, examples.labels,
                                                         corpus.fingerprint, split, self.config.data.seq_len)
            self.was_cached &= cached
        if len(corpus.train) < self.config.train.batch_size:
            raise UserError(f"train.batch_size: {self.config.train.batch_size} is more than the {len(corpus.train)} "
                            f"training examples in {corpus.source}")

    def prepare_from_cache(self, run: RunDir) -> bool:
        """For eval and predict: labels, vocabulary and the tokenized splits from the run
        (False when the cache is gone: then prepare() reads the data again)."""
        self.tokenizer = Tokenizer.load(run.tokenizer_dir)
        self.vocab_size = self.tokenizer.vocab_size
        self.labels = json.loads((run.root / LABELS_FILE).read_text(encoding="utf-8"))
        fingerprint = run.read_manifest().get("data", {}).get("fingerprint")
        files = {split: cache_file(run.cache_dir, self.tokenizer, fingerprint, split, self.config.data.seq_len)
                 for split in SPLITS}
        if not fingerprint or not all(path.is_file() for path in files.values()):
            return False
        self.examples = {split: load_cached(path) for split, path in files.items()}
        return True

    def learn_from(self, probabilities: np.ndarray) -> None:
        """Train on teachers' probabilities (examples, labels), one row per training text in
        its order, instead of the labels (train.distill_from)."""
        expected = (len(self.examples["train"]["labels"]), len(self.labels))
        if probabilities.shape != expected:
            raise ValueError(f"teachers' probabilities of shape {probabilities.shape}, expected {expected}")
        self.examples["train"] = {**self.examples["train"], "soft": probabilities.astype(np.float32)}

    def probabilities(self, model: keras.Model, texts: list[str]) -> np.ndarray:
        """(texts, labels) float32: the model's probabilities of each label, in self.labels'
        order, read in batches of similar length."""
        flat, lengths = encode(self.tokenizer, texts, self.config.data.seq_len)
        examples = {"flat": flat, "lengths": lengths, "labels": np.zeros(len(lengths), np.int32)}
        logits_of = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True, autograph=False)
        batches = eval_batches(examples, self.config.train.batch_size, self.config.data.seq_len)
        read = np.concatenate([tf.nn.softmax(tf.cast(logits_of(inputs), tf.float32)).numpy() for inputs, _ in batches])
        in_order = np.empty_like(read)
        in_order[length_order(lengths)] = read  # row i of read is the i-th shortest text
        return in_order

    @property
    def majority(self) -> int:
        """The most frequent training label: the baseline that always answers it."""
        return int(np.bincount(self.examples["train"]["labels"], minlength=len(self.labels)).argmax())

    def build_model(self) -> keras.Model:
        c = self.config
        return build_classifier(c.model, self.vocab_size, c.model.max_length or c.data.seq_len, len(self.labels),
                                dtype=dtype_policy(c.train.precision))

    def learning_rate_multipliers(self, model: keras.Model) -> dict[str, float] | None:
        """{variable path: learning-rate factor} under train.layer_decay; None when it is off
        (1.0), so the optimizer steps as it always has."""
        decay = self.config.train.layer_decay
        return layer_decay_multipliers(model, decay) if decay != 1.0 else None

    def train_batches(self, start_batch: int) -> tf.data.Dataset:
        t = self.config.train
        return train_dataset(self.examples["train"], t.batch_size, t.seed, self.config.data.seq_len, start_batch,
                             self.config.data.input_mask_rate, twice=t.rdrop > 0)

    def attention_windows(self) -> np.ndarray:
        valid = self.examples["valid"]
        return valid["flat"][: valid["lengths"][0]][None]  # (1, length): the first valid example

    def evaluator(self, model: keras.Model):
        """evaluate(split) -> loss and classification_metrics on every example of the split."""
        logits_of = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True, autograph=False)
        batches = {}

        def evaluate(split: str = "valid") -> dict:
            if split not in batches:
                batches[split] = self.eval_batches(split)
            losses, labels, predictions = 0.0, [], []
            for inputs, targets in batches[split]:
                logits = logits_of(inputs)
                losses += float(classify_sums(logits, targets)["loss_sum"])
                labels.append(targets["labels"].numpy())
                predictions.append(tf.argmax(logits, axis=-1, output_type=tf.int32).numpy())
            labels, predictions = np.concatenate(labels), np.concatenate(predictions)
            metrics = classification_metrics(labels, predictions, self.labels, self.majority)
            return {"loss": losses / max(len(labels), 1), **metrics}

        return evaluate

    def eval_batches(self, split: str) -> list[tuple[dict, dict]]:
        """Every example of a split once: fixed (inputs, targets) batches of similar length."""
        if not len(self.examples[split]["lengths"]):
            raise UserError(f"eval --split {split}: this run has no {split} examples "
                            f"(data.test_fraction is {self.config.data.test_fraction})")
        return eval_batches(self.examples[split], self.config.train.batch_size, self.config.data.seq_len)

    def on_eval(self, monitor, step: int, metrics: dict) -> None:
        """The confusion matrix as a TensorBoard image (Images -> confusion_matrix)."""
        monitor.log_image(step, "confusion_matrix", confusion_image(np.array(metrics["confusion"]), self.labels))

    @staticmethod
    def eval_line(metrics: dict) -> str:
        return (f"loss {metrics['loss']:.4f}  accuracy {metrics['accuracy']:.2%}  macro-F1 {metrics['macro_f1']:.3f} "
                f"(majority baseline {metrics['baseline_accuracy']:.2%}, {metrics['num_examples']:,} examples)")

    def summary_lines(self) -> list[str]:
        t = self.config.train
        accumulate = f" x {t.accumulate} accumulated" if t.accumulate > 1 else ""
        sizes = " / ".join(f"{len(self.examples[split]['lengths']):,} {split}" for split in SPLITS)
        pooling = "; the head pools the mean of the tokens" if self.config.model.pooling == "mean" else ""
        distilled = "soft" in self.examples["train"]
        taught = "; the loss reads the teachers' probabilities, not the labels" if distilled else ""
        twice = f"; R-Drop: each text twice, weight {t.rdrop:g}" if t.rdrop else ""
        return [f"examples: {sizes}, {len(self.labels)} labels, up to {self.config.data.seq_len} tokens "
                f"(length-bucketed batches); batch {t.batch_size}{accumulate}{pooling}{taught}{twice}"]

    @staticmethod
    def result_lines(final: dict) -> list[str]:
        return [f"valid accuracy {final['accuracy']:.2%}, macro-F1 {final['macro_f1']:.3f} vs majority baseline "
                f"{final['baseline_accuracy']:.2%}, on {final['num_examples']:,} examples "
                f"(the test split: trainformer eval RUN_DIR --split test)"]

    def manifest_data(self) -> dict:
        corpus = self.corpus
        return {
            "source": corpus.source,
            "fingerprint": corpus.fingerprint,
            "examples": corpus.num_examples,
            "labels": self.labels,
            "class_counts": corpus.class_counts(),
            "skipped_lines": dict(corpus.skipped),
        }

    def serving(self, model: keras.Model) -> "ClassifyServing":
        return ClassifyServing(model, self.tokenizer, self.labels, self.config.data.seq_len)


class ClassifyServing(TaskServing):
    """A classify run's answers as in-graph functions (tasks/serving.py): texts -> labels.

    Example:
        serving = task.serving(model)
        serving.text(tf.constant(["今天天气怎么样"]))["label"]  # (1,) string
    """

    def __init__(self, model: keras.Model, tokenizer: Tokenizer, labels: list[str], seq_len: int):
        super().__init__(model, tokenizer, seq_len, name="classify_serving")
        self.label_names = labels
        self.labels = tf.constant(labels)

    @tf.function(input_signature=[TEXT], autograph=False)
    def encode(self, text):
        """Texts -> ({token_ids (batch, L) int32}, truncated (batch,) bool), as training encodes."""
        ids, truncated = frame(self.tokenizer(text), self.seq_len)
        return {"token_ids": ids.to_tensor(PAD_ID)}, truncated

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")], autograph=False)
    def ids(self, token_ids):
        """`[CLS] ... [SEP]` ids padded with [PAD] (batch, L) -> logits and probabilities
        (batch, labels) float32, label_ids (batch,) int32."""
        logits = self.model({"token_ids": token_ids, "padding_mask": token_ids != PAD_ID}, training=False)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits),
                "label_ids": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    @tf.function(input_signature=[TEXT], autograph=False)
    def text(self, text):
        """Texts (batch,) -> ids' outputs plus label (batch,) string and truncated (batch,) bool
        (the text was longer than data.seq_len tokens and its end was dropped, as in training)."""
        inputs, truncated = self.encode(text)
        answer = self.ids(**inputs)
        return {**answer, "label": tf.gather(self.labels, answer["label_ids"]), "truncated": truncated}

    def answer(self, texts: list[str]) -> list[dict]:
        """`trainformer predict`: the label, its probability and every label's probability."""
        probabilities = self.text(tf.constant(texts))["probabilities"].numpy()  # (texts, labels)
        return [{"text": text, "label": self.label_names[int(row.argmax())], "probability": round(float(row.max()), 6),
                 "probabilities": {label: round(float(p), 6) for label, p in zip(self.label_names, row)}}
                for text, row in zip(texts, probabilities)]


def confusion_image(confusion: np.ndarray, labels: list[str], cell: int = 28) -> np.ndarray:
    """A heatmap of the confusion matrix, each row normalised (rows: true label, columns:
    predicted), with the counts written in: (1, H, W, 3) uint8."""
    rates = confusion / np.maximum(confusion.sum(axis=1, keepdims=True), 1)
    font = plain_font(11)
    margin = 8 + 7 * max(len(label) for label in labels)
    size = len(labels) * cell
    image = Image.new("RGB", (margin + size + 8, margin + size + 8), "white")
    image.paste(Image.fromarray(np.kron(colorize(rates), np.ones([cell, cell, 1])).astype(np.uint8)), (margin, margin))
    draw = ImageDraw.Draw(image)
    for i, label in enumerate(labels):
        draw.text((4, margin + i * cell + cell // 3), label, fill="black", font=font)
        draw.text((margin + i * cell + 2, 4), label[: cell // 7], fill="black", font=font)
        for j in range(len(labels)):
            ink = "black" if rates[i, j] > 0.6 else "white"
            draw.text((margin + j * cell + 3, margin + i * cell + cell // 3), str(confusion[i, j]), fill=ink, font=font)
    return np.asarray(image)[None]
