"""Framework-neutral helpers shared by every peer script (numpy + stdlib only).

A peer script must:
  * build the model for one of CONFIGS,
  * make its data with make_token_ids() (same ids for every peer),
  * call run_timed(step_fn, warmup, steps) with a step_fn that does one full
    training step (forward + backward + AdamW update) and returns only after
    the work is done,
  * call emit() once to print and append one JSON result line ($PEER_SUFFIX, if set, is added
    to its peer name: before_after.sh names the source tree that ran).
trainformer plugs in the same way (peer_trainformer.py, run with the project's own venv).
"""

import argparse
import json
import os
import resource
import statistics
import time

import numpy as np

# ---------------------------------------------------------------- benchmark definition
BATCH = 32
SEQ = 128
MASK_RATE = 0.15
LR = 1e-4
TOKEN_LOW, TOKEN_HIGH = 1000, 21128  # uniform in [low, high)
SEED = 1234
MASK_TOKEN_ID = 103  # [MASK] in the bert-base-chinese vocab

CONFIGS = {
    "bert-mini-bench": dict(vocab=21128, hidden=256, layers=4, heads=4,
                            intermediate=1024, max_pos=512, dropout=0.1),
    "bert-small-bench": dict(vocab=21128, hidden=512, layers=8, heads=8,
                             intermediate=2048, max_pos=512, dropout=0.1),
    # issue 21's held-out shape (MiniLM-L6-H384): 12 heads of 32 dims
    "minilm-bench": dict(vocab=21128, hidden=384, layers=6, heads=12,
                         intermediate=1536, max_pos=512, dropout=0.1),
}


def parse_args(extra=None):
    """Common CLI: --config --steps --warmup --threads --out (+ peer extras)."""
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="bert-mini-bench", choices=sorted(CONFIGS))
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps (include compilation)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads")
    p.add_argument("--out", default=None, help="append the JSON result line to this file")
    if extra:
        extra(p)
    return p.parse_args()


def make_token_ids(n_batches, seed=SEED):
    """Random ids, shape (n_batches, BATCH, SEQ), int32, identical for every peer."""
    rng = np.random.default_rng(seed)
    return rng.integers(TOKEN_LOW, TOKEN_HIGH, size=(n_batches, BATCH, SEQ), dtype=np.int32)


# ---------------------------------------------------------------- FLOP model
def model_flops_per_step(cfg, batch=BATCH, seq=SEQ, mask_rate=MASK_RATE):
    """Training FLOPs of one step = 3 x forward matmul FLOPs (fwd + 2x for bwd).

    Per token and layer: 2*(4h^2 + 2hI) for the dense layers (= 2 * non-embedding
    params) plus 4*s*h for QK^T and AV (the PaLM attention term).
    MLM head (dense h->h + tied projection h->V) counted only on the masked
    positions (mask_rate * tokens), i.e. the work the task needs.  A peer that
    computes vocab logits on every position does extra work that MFU does NOT
    credit.  Embedding lookups, layer norms, softmax, GELU, biases: not counted.
    """
    h, L, I, V = cfg["hidden"], cfg["layers"], cfg["intermediate"], cfg["vocab"]
    tokens = batch * seq
    encoder = tokens * L * (2 * (4 * h * h + 2 * h * I) + 4 * seq * h)
    head = mask_rate * tokens * 2 * (h * h + h * V)
    return 3 * (encoder + head)


def param_counts(cfg):
    """Analytic parameter counts for the BERT layout (tied output embedding)."""
    h, L, I, V, P = cfg["hidden"], cfg["layers"], cfg["intermediate"], cfg["vocab"], cfg["max_pos"]
    emb = V * h + P * h + 2 * h + 2 * h  # word + pos + type + LN
    layer = 4 * h * h + 4 * h + 2 * h * I + I + h + 4 * h  # qkvo, ffn, 2 LN
    head = h * h + h + 2 * h + V  # transform dense + LN + output bias
    return dict(embedding=emb, non_embedding=L * layer, head=head, total=emb + L * layer + head)


# ---------------------------------------------------------------- timing / resources
def _proc_stat_busy():
    """Jiffies the whole machine spent busy (all CPUs), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v[:8]) - idle


def run_timed(step_fn, warmup, steps):
    """Run warmup untimed steps, then time `steps` steps one by one."""
    t0 = time.perf_counter()
    for i in range(warmup):
        step_fn(i)
    warmup_s = time.perf_counter() - t0

    hz = os.sysconf("SC_CLK_TCK")
    busy0, cpu0, wall0 = _proc_stat_busy(), os.times(), time.perf_counter()
    times = []
    for i in range(steps):
        t = time.perf_counter()
        step_fn(warmup + i)
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - wall0
    busy1, cpu1 = _proc_stat_busy(), os.times()
    own = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    machine = (busy1 - busy0) / hz
    return dict(
        times=times,
        warmup_s=warmup_s,
        own_cores=own / wall,                       # cores this process kept busy
        other_cores=max(0.0, machine - own) / wall,  # cores others used meanwhile (noise flag)
    )


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def emit(args, peer, timing, params=None, threads=None, notes="", mode="synthetic", nonpad_tokens=None,
         flops=None):
    """Print one JSON result line and append it to args.out (MFU if a peak line is there).

    mode: "synthetic" (random full-length ids) or "text" (real text; nonpad_tokens = real tokens
    in the timed batches gives effective tokens/s). flops: model FLOPs per step, when the
    vocabulary is not the config's (real text)."""
    cfg = CONFIGS[args.config]
    t = sorted(timing["times"])
    med = statistics.median(t)
    flops = flops or model_flops_per_step(cfg)
    p10 = t[max(0, int(0.1 * (len(t) - 1)))]
    p90 = t[int(round(0.9 * (len(t) - 1)))]
    res = dict(
        kind="train", peer=peer + os.environ.get("PEER_SUFFIX", ""), config=args.config, batch=BATCH, seq=SEQ,
        steps=len(t), warmup=args.warmup, warmup_s=round(timing["warmup_s"], 2),
        step_ms_median=round(1e3 * med, 2), step_ms_min=round(1e3 * t[0], 2),
        step_ms_p10=round(1e3 * p10, 2), step_ms_p90=round(1e3 * p90, 2),
        tokens_per_s=round(BATCH * SEQ / med, 1),
        effective_tokens_per_s=round((nonpad_tokens or BATCH * SEQ * len(t)) / len(t) / med, 1), mode=mode,
        model_gflop_per_step=round(flops / 1e9, 2),
        achieved_gflops=round(flops / med / 1e9, 2),
        peak_rss_mb=round(peak_rss_mb(), 1),
        own_cores=round(timing["own_cores"], 2), other_cores=round(timing["other_cores"], 2),
        params=params, threads=threads, notes=notes,
        loadavg=os.getloadavg()[0],
    )
    peak_gflops = read_peak(args.out)
    if peak_gflops:
        res["peak_gflops"] = peak_gflops
        res["mfu"] = round(flops / med / 1e9 / peak_gflops, 4)
    line = json.dumps(res)
    print("RESULT " + line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return res


def read_peak(path):
    """Best fp32 matmul GFLOP/s recorded in the results file (any framework)."""
    best = None
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("kind") == "peak" and r.get("dtype") == "float32":
                    best = max(best or 0.0, r["gflops_best"])
    return best
