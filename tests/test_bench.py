"""`trainformer bench` end to end on a tiny shape, and the rule that speed never changes the math
silently: each optimisation of the step is checked against the plain path it replaced.

No timing is asserted here (this machine is shared and noisy): speed lives in benchmarks/.
"""

import json

import keras
import pytest
import tensorflow as tf
from cli_helpers import TINY, in_process
from keras import ops

from trainformer.config import load_config
from trainformer.data.pipeline import pack, tokenize_documents, train_dataset
from trainformer.model.layers import TransformerEncoderBlock
from trainformer.ops.bench import NonPadCounter, time_steps, traced_note, typical_step
from trainformer.ops.flops import train_flops_per_step
from trainformer.tasks.mlm import MaskedLMTask, masked_lm_sums
from trainformer.train.loop import Trainer
from trainformer.train.optim import make_optimizer
from trainformer.train.precision import resolve_precision
from trainformer.train.strategy import make_strategy

KEYS = {"step_ms", "tokens_per_s", "effective_tokens_per_s", "mfu", "data_wait_pct", "num_params", "precision",
        "compile_s", "peak_memory_mb", "peak_gflops"}


def bench_json(*args):
    result = in_process("bench", *TINY, "--steps", "3", "--warmup", "1", "--json", *args)
    return json.loads(result.stdout)  # stdout holds the JSON object only


def test_synthetic_bench_reports_consistent_numbers():
    r = bench_json("--synthetic", "--set", "train.precision=auto")
    assert KEYS <= r.keys()
    assert r["precision"] == resolve_precision("auto")[0]  # what train would choose on this machine
    assert r["num_params"] > 0 and r["mode"] == "synthetic"
    assert (r["batch_size"], r["seq_len"]) == (16, 32)
    assert_rates_follow_from_the_step_time(r)
    assert r["effective_tokens_per_s"] == pytest.approx(r["tokens_per_s"], rel=1e-3)  # random ids: no padding
    assert 0 <= r["data_wait_pct"] < 100


def assert_rates_follow_from_the_step_time(r: dict) -> None:
    """Every rate in bench's JSON is its batch of 16 x 32 tokens, or the FLOPs of the tiny
    config's step, over the median step time (each rounded where it is printed)."""
    seconds = r["step_ms"] / 1e3
    # The rates are computed from the unrounded median, the test from step_ms rounded to 0.01 ms:
    # each expected rate carries that relative error on top of its own printed rounding.
    step_rounding = 0.005 / r["step_ms"]

    def close(printed, expected, printed_abs):
        return abs(printed - expected) <= printed_abs + expected * step_rounding + 1e-9

    assert (r["steps"], r["seq_len"]) == (3, 32) and r["step_statistic"] == "median"  # one batch shape
    assert close(r["tokens_per_s"], 16 * 32 / seconds, 0.05)
    assert close(r["examples_per_s"], 16 / seconds, 0.05)
    gflop = train_flops_per_step(load_config(None, TINY[1::2]).model, r["vocab_size"], 16, 32, 0.15) / 1e9
    assert r["model_gflop_per_step"] == pytest.approx(gflop, abs=5e-4)
    assert close(r["achieved_gflops"], gflop / seconds, 5e-3)
    peak = r["peak_gflops"].get(r["precision"]) or r["peak_gflops"]["fp32"]
    mfu = gflop / seconds / peak
    assert close(r["mfu"], mfu, 5e-5 + mfu * 0.05 / peak)  # printed to 4 places, over a peak printed to 0.1
    assert r["step_ms_p10"] <= r["step_ms"] <= r["step_ms_p90"]


def test_real_text_bench_counts_only_real_tokens_and_keeps_its_own_cache(tmp_path):
    cache = tmp_path / "bench-cache"
    r = bench_json("--cache-dir", str(cache))
    assert r["mode"] == "real-text"
    assert_rates_follow_from_the_step_time(r)
    assert 0 < r["effective_tokens_per_s"] <= r["tokens_per_s"] * (1 + 1e-6)
    assert r["vocab_size"] < 8000  # the vocabulary trained on People's Daily, not the config's size
    assert list(cache.glob("*/tokenizer/vocab.txt")) and not (cache / "config.yaml").exists()


def test_bench_tells_steps_on_a_new_batch_width_from_steps_on_a_traced_one():
    """Length-bucketed batches come in several widths, and the step traces once per width: a
    timed step on a width not seen before is compilation, which bench leaves out."""
    def batch(width, real):
        mask = tf.sequence_mask([real, width], width)  # (2, width): one padded row, one full
        return {"token_ids": tf.zeros((2, width), tf.int32), "padding_mask": mask}, {}

    counter = NonPadCounter(iter([batch(16, 4), batch(16, 8), batch(32, 30), batch(16, 16), batch(32, 1)]))
    taken = []
    for fetches in (1, 1, 1, 2):  # the last step fetches two batches (train.accumulate 2)
        for _ in range(fetches):
            next(counter)
        taken.append(counter.take())
    assert taken == [(20, 32, True), (24, 32, False), (62, 64, True), (65, 96, False)]
    assert "2 more traced a new batch width" in traced_note({"traced_steps": 2, "all_traced": False})
    assert "raise --steps" in traced_note({"traced_steps": 3, "all_traced": True})
    assert traced_note({"traced_steps": 0, "all_traced": False}) == ""


class OneBatchASteps:
    """The Trainer's side of time_steps: one batch from the iterator per step."""

    def train_step(self, iterator):
        next(iterator)
        return {"loss_sum": tf.constant(0.0), "data_wait_s": 0.0}


def test_bench_times_only_steps_on_a_width_already_traced():
    def timed(*widths):  # the first width is the warm-up step's
        batches = NonPadCounter(iter([({"padding_mask": tf.ones((2, w), tf.bool)}, {}) for w in widths]))
        return time_steps(OneBatchASteps(), batches, warmup=1, steps=len(widths) - 1)

    timing = timed(16, 16, 32, 16, 48, 32)  # 32 and 48 are new when timed
    assert (timing["traced_steps"], timing["all_traced"], len(timing["step_s"])) == (2, False, 3)
    assert timing["tokens"] == (2 * (16 + 16 + 32), 2 * (16 + 16 + 32))  # the kept steps' tokens only
    timing = timed(8, 16, 24)  # every timed step new: reported, and said to be
    assert (timing["traced_steps"], timing["all_traced"], len(timing["step_s"])) == (2, True, 2)


def test_bench_bad_input_is_one_line_exit_2(tmp_path):
    (tmp_path / "config.yaml").write_text("name: a training run\n")
    for args, message in ((["--synthetic", "--steps", "0"], "--steps"),
                          (["--cache-dir", str(tmp_path)], "holds a training run")):
        result = in_process("bench", *TINY, *args, check=False)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.startswith("trainformer: error:")]
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_flop_model_matches_the_peer_harness():
    """The FLOPs per step benchmarks/common.py reports for KerasHub at these shapes, so MFU
    compares across frameworks."""
    for name, gflop in (("bert-mini-bench", 103.93), ("bert-small-bench", 685.09)):
        model = load_config(name).model
        assert train_flops_per_step(model, 21128, 32, 128, 0.15) / 1e9 == pytest.approx(gflop, abs=0.01)


# ------------------------------------------------------------ optimisations keep the math

LOSS_TOLERANCE = 1e-5  # relative, per step: summation order may differ, the math may not


def sliced_heads(self, x, training=None):
    """The plain path replaced by ops.unstack in TransformerEncoderBlock._heads."""
    batch, seq_len = ops.shape(x)[0], ops.shape(x)[1]
    qkv = ops.reshape(self._qkv(x), (batch, seq_len, 3, self.num_heads, self.head_dim))
    return tuple(qkv[:, :, i] for i in range(3))


def fifty_step_losses(tokenizer, corpus) -> list[float]:
    """Per-step mean masked loss of 50 steps of a tiny post-LN BERT with dropout on real text."""
    config = load_config(None, ["model.d_model=32", "model.num_layers=2", "model.num_heads=2", "model.dff=64",
                                "model.dropout=0.1", "model.norm=post", "data.seq_len=32",
                                "train.batch_size=16", "train.learning_rate=3e-3", "train.warmup_steps=5",
                                "train.precision=fp32"])  # resolved: a task never resolves auto itself
    keras.utils.set_random_seed(7)
    windows = pack(tokenize_documents(tokenizer, corpus.train[:1500]), config.data.seq_len)
    strategy = make_strategy()
    with strategy.scope():
        task = MaskedLMTask(config)
        task.vocab_size = tokenizer.vocab_size
        model = task.build_model()
        optimizer = make_optimizer(3e-3, 5, 50, 0.01)
    trainer = Trainer(model, optimizer, strategy, config.train, masked_lm_sums)
    batches = iter(train_dataset(windows, 16, seed=7, mask_rate=0.15, vocab_size=tokenizer.vocab_size))
    losses = []
    for _ in range(50):
        results = trainer.train_step(batches)
        losses.append(float(results["loss_sum"]) / float(results["count"]))
    return losses


def test_unstacked_heads_train_like_sliced_heads(tokenizer, corpus, monkeypatch):
    fast = fifty_step_losses(tokenizer, corpus)
    monkeypatch.setattr(TransformerEncoderBlock, "_heads", sliced_heads)
    plain = fifty_step_losses(tokenizer, corpus)
    assert fast == pytest.approx(plain, rel=LOSS_TOLERANCE)
    assert fast[-1] < fast[0]  # it trained


def test_the_rates_of_length_bucketed_batches_come_from_the_mean_step():
    # A run's time is the sum of its steps: with long buckets 5x the short ones' step, a median
    # would promise a length-bucketed fine-tune twice the examples/s it trains at.
    steps = [0.4, 0.4, 0.4, 2.0]
    assert typical_step(steps, shapes_vary=True) == ("mean", pytest.approx(0.8))
    assert typical_step(steps, shapes_vary=False) == ("median", 0.4)  # one shape: a slow step is noise

    def timed(*widths):  # the first two widths are the warm-up steps'
        batches = NonPadCounter(iter([({"padding_mask": tf.ones((2, w), tf.bool)}, {}) for w in widths]))
        return time_steps(OneBatchASteps(), batches, warmup=2, steps=len(widths) - 2)

    assert not timed(16, 16, 16, 16)["shapes_vary"]
    assert timed(16, 32, 16, 32, 16)["shapes_vary"]
