"""`trainformer bench`: time the real training step of a config and say how close it runs to
the device's matmul peak.

The step timed is `Trainer.train_step`, the one `train` runs, on the model, optimizer and
precision the config builds. Two input modes:
  * real text (default): the config's corpus through the training pipeline (vocabulary and
    token cache under a bench directory, never in a training run), so data-wait and padding
    are those of training;
  * synthetic: random fixed-length ids masked once and replayed from memory, so models can be
    compared shape for shape with nothing else in the way.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import statistics
import time
from pathlib import Path

import keras
import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.data.pipeline import NUM_SPECIAL, distribute, mask_batch, split_targets
from trainformer.errors import UserError
from trainformer.ops.flops import train_flops_per_step
from trainformer.train.peak import matmul_gflops
from trainformer.run.session import build_trainer
from trainformer.run_dir import RunDir
from trainformer.tasks import load_source, task_for
from trainformer.tasks.mlm import MaskedLMTask
from trainformer.train.loop import Trainer
from trainformer.train.precision import resolved
from trainformer.train.strategy import configure_devices, describe_devices, make_strategy

SYNTHETIC_BATCHES = 8  # distinct batches replayed: enough that no step sees the same masks twice in a row


def bench(config: ExperimentConfig, steps: int = 20, warmup: int = 3, synthetic: bool = False,
          cache_dir: Path | None = None, say=print) -> dict:
    """Time `steps` training steps of config after `warmup` untimed ones; return the metrics."""
    if steps < 1 or warmup < 1:
        raise UserError(f"--steps and --warmup must be >= 1, got {steps} and {warmup}")
    if config.task.type == "seq2seq":  # its FLOP model (flops.py) and token count are the encoder's
        raise UserError("bench: seq2seq configs are not benched yet; `trainformer train` prints their tokens/s "
                        "(real source + target tokens) and data-wait")
    configure_devices(config.runtime)  # first: GPU memory growth is refused once devices are up
    config, _ = resolved(config)  # auto -> what train would choose here
    train_cfg = config.train
    keras.utils.set_random_seed(train_cfg.seed)
    if synthetic:
        if config.task.type != "mlm":
            raise UserError("--synthetic: random masked ids are for masked-LM configs; bench a "
                            f"{config.task.type} config on its data (without --synthetic)")
        task = MaskedLMTask(config)  # vocab_size: tokenizer.vocab_size
        dataset = synthetic_dataset(task.vocab_size, config)
    else:
        task = task_for(config)
        task.prepare(bench_run_dir(config, cache_dir or Path("runs") / f"bench-{config.name}"), load_source(config), say)
        dataset = task.train_batches(0)
    vocab_size = task.vocab_size

    trainer, batches = make_trainer(config, task, dataset)
    batches = NonPadCounter(batches)
    model = trainer.model
    say(f"bench: {config.name}, {model.count_params():,} parameters, {train_cfg.precision}, "
        f"{'synthetic ids' if synthetic else 'real text'}; {warmup} warm-up + {steps} timed steps")
    timing = time_steps(trainer, batches, warmup, steps)

    peaks = {"fp32": matmul_gflops("fp32")}
    if train_cfg.precision != "fp32":
        peaks[train_cfg.precision] = matmul_gflops(train_cfg.precision)
    return summarize(config, vocab_size, model.count_params(), timing, peaks, synthetic)


def make_trainer(config: ExperimentConfig, task, dataset: tf.data.Dataset) -> tuple[Trainer, object]:
    """The model, optimizer and Trainer `train` would build for config (on one device), and an
    iterator over dataset distributed the way `train` distributes it."""
    strategy = make_strategy()
    return build_trainer(config, task, strategy), iter(distribute(strategy, dataset))


def synthetic_dataset(vocab_size: int, config: ExperimentConfig) -> tf.data.Dataset:
    """Random ids of full length (no padding), masked as in training, computed once and
    replayed from memory: the input costs nothing, only the model is timed."""
    batch, seq_len = config.train.batch_size, config.data.seq_len
    seed = config.train.seed

    @tf.autograph.experimental.do_not_convert
    def masked(number):
        ids = tf.random.stateless_uniform([batch, seq_len], tf.stack([tf.constant(seed, tf.int64), number]),
                                          minval=NUM_SPECIAL, maxval=vocab_size, dtype=tf.int32)
        # at the highest rate a schedule reaches: the masked positions training's batches are sized for
        return split_targets(mask_batch(ids, tf.stack([tf.constant(seed + 1, tf.int64), number]),
                                        config.data.mask_rate + config.data.mask_spread, vocab_size))

    return tf.data.Dataset.range(SYNTHETIC_BATCHES).map(masked).cache().repeat().prefetch(2)


def bench_run_dir(config: ExperimentConfig, cache_dir: Path) -> RunDir:
    """The folder under cache_dir that holds the vocabulary and token cache for config's corpus
    and tokenizer settings (created if missing)."""
    if (cache_dir / "config.yaml").is_file():
        raise UserError(f"{cache_dir}: holds a training run; give bench its own --cache-dir")
    key = json.dumps({"corpus": config.data.corpus, "valid": config.data.valid_fraction,
                      "tokenizer": vars(config.tokenizer)}, sort_keys=True)
    run = RunDir(cache_dir / hashlib.sha256(key.encode()).hexdigest()[:12])
    run.root.mkdir(parents=True, exist_ok=True)
    return run


class NonPadCounter:
    """Passes batches through and keeps their padding masks, for effective tokens/s, and the
    batch widths seen so far: a step on a new width traces the step again (one trace per width,
    train/loop.py), so its time is compilation, not the step.

    Counting happens in `take()`, after each timed step: an op here would run inside the
    timed fetch and be reported as data-wait.
    """

    def __init__(self, iterator):
        self.iterator = iterator
        self.masks: list[tf.Tensor] = []  # (batch, seq) bool each: seq varies with length buckets
        self.widths: set[int] = set()

    def __iter__(self):
        return self

    def __next__(self):
        inputs, targets = next(self.iterator)
        self.masks.append(inputs["padding_mask"])
        return inputs, targets

    def take(self) -> tuple[int, int, bool]:
        """(real tokens, padded tokens, whether a width was new) of the batches fetched since
        the last take()."""
        real = sum(int(tf.math.count_nonzero(mask)) for mask in self.masks)
        padded = sum(int(tf.size(mask)) for mask in self.masks)
        widths = {int(mask.shape[1]) for mask in self.masks}
        new_width = not widths <= self.widths
        self.widths |= widths
        self.masks = []
        return real, padded, new_width


def time_steps(trainer: Trainer, batches: NonPadCounter, warmup: int, steps: int) -> dict:
    """Wall time of each step, waited for (the loss comes back to the host, as in training's
    per-step finiteness check), and the part of it spent waiting for input. Timed steps on a
    batch width not seen before (length-bucketed tasks: the first batches of each width) are
    tracing and compilation: they are left out of the figures and counted in "traced_steps"."""

    def one_step() -> tuple[float, float, int, int, bool]:
        started = time.perf_counter()
        results = trainer.train_step(batches)
        results["loss_sum"].numpy()
        return (time.perf_counter() - started, results["data_wait_s"], *batches.take())

    first_step_s = one_step()[0]  # tracing and graph optimisation happen here
    for _ in range(warmup - 1):
        one_step()
    cpu0, busy0, wall0 = os.times(), machine_busy_s(), time.perf_counter()
    timed = [one_step() for _ in range(steps)]
    wall, cpu1 = time.perf_counter() - wall0, os.times()
    own = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    kept = [step for step in timed if not step[4]]
    step_s, wait_s, real, padded, _ = zip(*(kept or timed))  # every step a new width: nothing better to report
    return {
        "step_s": sorted(step_s), "wait_s": sum(wait_s), "first_step_s": first_step_s,
        "tokens": (sum(real), sum(padded)), "shapes_vary": len(set(padded)) > 1,
        "traced_steps": len(timed) - len(kept), "all_traced": not kept,
        "own_cores": own / wall,
        "other_cores": max(0.0, machine_busy_s() - busy0 - own) / wall,
    }


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (/proc/stat), to flag runs disturbed by
    other processes; 0 where /proc is missing."""
    try:
        with open("/proc/stat") as f:
            jiffies = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return 0.0
    return (sum(jiffies) - jiffies[3] - jiffies[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def summarize(config: ExperimentConfig, vocab_size: int, num_params: int, timing: dict, peaks: dict,
              synthetic: bool) -> dict:
    step_s = timing["step_s"]
    statistic, step = typical_step(step_s, timing["shapes_vary"])
    batch, steps = config.train.batch_size * config.train.accumulate, len(step_s)
    real, padded = timing["tokens"]
    seq_len = padded / (steps * batch)  # data.seq_len, or the mean padded length of length-bucketed batches
    # the head scores every masked position a batch is sized for; a classifier head is negligible
    head_share = config.data.mask_rate + config.data.mask_spread if config.task.type == "mlm" else 0.0
    flops = train_flops_per_step(config.model, vocab_size, batch, round(seq_len), head_share)
    peak = peaks.get(config.train.precision) or peaks["fp32"]
    return {
        "config": config.name,
        "mode": "synthetic" if synthetic else "real-text",
        "precision": config.train.precision,
        "num_params": num_params,
        "vocab_size": vocab_size,
        "batch_size": batch,
        "seq_len": round(seq_len, 1),
        "steps": steps,
        "traced_steps": timing["traced_steps"],  # timed steps on a new batch width
        "all_traced": timing["all_traced"],  # then the figures are theirs: compilation, not the step
        "step_ms": round(1e3 * step, 2),
        "step_statistic": statistic,
        "step_ms_p10": round(1e3 * step_s[int(0.1 * (steps - 1))], 2),
        "step_ms_p90": round(1e3 * step_s[round(0.9 * (steps - 1))], 2),
        "tokens_per_s": round(padded / steps / step, 1),
        # non-pad share of the timed steps' tokens, at the typical step time
        "effective_tokens_per_s": round(real / steps / step, 1),
        "examples_per_s": round(batch / step, 1),
        "model_gflop_per_step": round(flops / 1e9, 3),
        "achieved_gflops": round(flops / step / 1e9, 2),
        "peak_gflops": {k: (round(v, 1) if v else None) for k, v in peaks.items()},
        "mfu": round(flops / step / 1e9 / peak, 4),
        "data_wait_pct": round(100 * timing["wait_s"] / sum(step_s), 3),
        "compile_s": round(timing["first_step_s"] - step, 2),  # first step beyond a normal one
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "devices": describe_devices(),
        "own_cores": round(timing["own_cores"], 2),
        "other_cores": round(timing["other_cores"], 2),  # > 0.25: others shared the CPU; compare with care
        "loadavg": round(os.getloadavg()[0], 2),
    }


def typical_step(step_s: list[float], shapes_vary: bool) -> tuple[str, float]:
    """("median" | "mean", seconds): the step the rates are computed from. The median where every
    batch has one shape: robust to a moment of contention. The mean where length buckets vary
    the shape, as a run's time is the sum of its steps: zh-sentiment's median read 76 examples/s
    on a 2-core Zen 4 in bf16 where the run trained at 55 (its p90 step was 5x the median)."""
    return ("mean", statistics.fmean(step_s)) if shapes_vary else ("median", statistics.median(step_s))


def peak_memory_mb() -> float:
    """Peak device memory on GPU, else the process's peak resident set (Linux: KiB)."""
    if tf.config.list_physical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def traced_note(r: dict) -> str:
    if r["all_traced"]:
        return " (each traced a new batch width: compilation, not the step; raise --steps)"
    return f" ({r['traced_steps']} more traced a new batch width: left out)" if r["traced_steps"] else ""


def format_result(r: dict) -> str:
    """The human-readable report."""
    peaks = ", ".join(f"{k} {v if v else 'n/a'}" for k, v in r["peak_gflops"].items())
    noisy = "  (NOISY: other processes used the CPU)" if r["other_cores"] > 0.25 else ""
    return "\n".join([
        f"step          {r['step_ms']:.1f} ms {r['step_statistic']} (p10 {r['step_ms_p10']:.1f}, p90 {r['step_ms_p90']:.1f}) "
        f"over {r['steps']} steps of {r['batch_size']} x {r['seq_len']}"
        + traced_note(r),
        f"tokens/s      {r['tokens_per_s']:,.0f} padded, {r['effective_tokens_per_s']:,.0f} effective (non-pad); "
        f"{r['examples_per_s']:,.1f} examples/s",
        f"MFU           {r['mfu']:.1%} ({r['achieved_gflops']:.1f} GFLOP/s of {r['model_gflop_per_step']:.2f} "
        f"GFLOP/step; matmul peak GFLOP/s: {peaks})",
        f"data-wait     {r['data_wait_pct']:.2f}% of step time",
        f"compile       {r['compile_s']:.1f} s (first step beyond a normal one)",
        f"peak memory   {r['peak_memory_mb']:,.0f} MB",
        f"model         {r['num_params']:,} parameters, {r['precision']}, vocab {r['vocab_size']:,}, {r['mode']}",
        f"machine       {', '.join(r['devices'])}; cores own/other {r['own_cores']}/{r['other_cores']}, "
        f"load {r['loadavg']}{noisy}",
    ])
