"""ELECTRA pretraining (model/electra.py): masked-LM's packed windows and masks, a generator
that fills the masks, and the encoder trained to detect replaced tokens at every position.

The data is masked-LM's (tasks/mlm.py, which this task extends: same corpus, windows, cache
and vocabulary); what differs is the model, the loss and what an eval reports.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from trainformer.data.pipeline import ELECTRA_KEYS
from trainformer.errors import UserError
from trainformer.model.electra import Electra
from trainformer.model.heads import build_encoder
from trainformer.run_dir import positions
from trainformer.tasks import dtype_policy
from trainformer.tasks.mlm import MaskedLMTask, masked_lm_sums


# A discriminator this close to the constant answer has learned next to nothing: every pilot and full
# run of zh-bert-small stayed within ~0.7 points of it (benchmarks/classify/README.md, 10th and 43rd passes).
LEARNED_LITTLE = 0.01


def generator_layers(config) -> int:
    """model.generator_layers, or a third of the encoder's layers (at least one): ELECTRA's
    best generators are 1/4-1/2 of the discriminator's size."""
    return config.model.generator_layers or max(1, config.model.num_layers // 3)


def electra_sums(outputs: dict, targets: dict, weight: float) -> dict:
    """The generator's masked-LM loss plus `weight` x the discriminator's mean binary loss over
    every real token (ELECTRA: weight 50), as sums over the masked count the Trainer divides by.

    outputs: generator_logits (batch, P, vocab), discriminator_logits and replaced (batch, seq);
    targets: masked_ids, masked_weights (batch, P), padding_mask (batch, seq).
    """
    sums = masked_lm_sums(outputs["generator_logits"], targets)
    tokens = tf.cast(targets["padding_mask"], tf.float32)  # (batch, seq)
    logits, replaced = outputs["discriminator_logits"], outputs["replaced"]
    detection = tf.nn.sigmoid_cross_entropy_with_logits(labels=replaced, logits=logits) * tokens
    # The Trainer divides by the masked count: scale the per-token mean to that count.
    detection_sum = tf.reduce_sum(detection) * sums["count"] / tf.maximum(tf.reduce_sum(tokens), 1.0)
    hits = tf.cast(tf.equal(tf.cast(logits > 0, tf.float32), replaced), tf.float32) * tokens
    return {
        **sums,
        "loss_sum": sums["loss_sum"] + weight * detection_sum,
        "generator_loss_sum": sums["loss_sum"],
        "detection_loss_sum": tf.reduce_sum(detection),
        "detection_correct": tf.reduce_sum(hits),
        "replaced": tf.reduce_sum(replaced * tokens),
        "tokens": tf.reduce_sum(tokens),
    }


class ElectraTask(MaskedLMTask):
    """Replaced-token detection on a Corpus. The logged accuracy is the generator's on masked
    tokens; an eval also reports the discriminator's on every token."""

    accuracy_name = "masked_accuracy"
    batch_keys = ELECTRA_KEYS

    def __init__(self, config):
        super().__init__(config)
        weight = config.train.discriminator_weight
        self.loss_sums = lambda outputs, targets: electra_sums(outputs, targets, weight)

    def build_model(self) -> keras.Model:
        c = self.config
        encoder = build_encoder(c.model, self.vocab_size, positions(c), dtype_policy(c.train.precision))
        return Electra(encoder, generator_layers(c), name="electra")

    def _eval_sums(self, model: keras.Model, inputs: dict, targets: dict) -> dict:
        sums = self.loss_sums(model(inputs, training=False), targets)
        baseline_hits = tf.cast(tf.equal(targets["masked_ids"], self.baseline_id), tf.float32)
        return {**sums, "baseline_correct": tf.reduce_sum(baseline_hits * targets["masked_weights"])}

    @staticmethod
    def metrics_of(totals: dict) -> dict:
        """masked-LM's metrics (the generator's; "loss" is the combined loss) plus the
        discriminator's loss and accuracy on every token, and the accuracy of answering
        "original" everywhere."""
        tokens = max(totals["tokens"], 1.0)
        generator_loss = totals["generator_loss_sum"] / max(totals["count"], 1.0)
        return {**MaskedLMTask.metrics_of(totals), "perplexity": math.exp(min(generator_loss, 50.0)),
                "generator_loss": generator_loss,
                "detection_loss": totals["detection_loss_sum"] / tokens,
                "detection_accuracy": totals["detection_correct"] / tokens,
                "detection_baseline": 1.0 - totals["replaced"] / tokens}

    @staticmethod
    def eval_line(metrics: dict) -> str:
        return (f"loss {metrics['loss']:.4f}  generator masked acc {metrics['masked_accuracy']:.2%}  "
                f"replaced-token detection acc {metrics['detection_accuracy']:.2%} "
                f"(all-original {metrics['detection_baseline']:.2%})")

    @staticmethod
    def result_lines(final: dict) -> list[str]:
        lines = [f"replaced-token detection accuracy {final['detection_accuracy']:.2%} vs all-original "
                 f"{final['detection_baseline']:.2%}, loss {final['detection_loss']:.4f}",
                 f"generator masked-token accuracy {final['masked_accuracy']:.2%} vs most-frequent-token baseline "
                 f"{final['baseline_accuracy']:.2%}, on {final['num_targets']:,} masked tokens"]
        lead = final["detection_accuracy"] - final["detection_baseline"]
        if lead < LEARNED_LITTLE:
            # Said at the end because nothing else would: the encoder is what init_from takes.
            lines.append(f"warning: the discriminator, the encoder a fine-tune starts from, leads answering "
                         f"\"original\" everywhere by {lead:+.2%} only: it learned little in these steps. On "
                         f"CPU budgets masked-LM (task.type=mlm) pretrained better (benchmarks/classify/README.md, "
                         f"\"forty-third pass\")")
        return lines

    def serving(self, model: keras.Model):
        raise UserError("an electra run pretrains an encoder and has no answers to serve: fine-tune from it "
                        "(trainformer train CONFIG --set model.init_from=RUN) and use that run")
