"""Why one model's training step is slower than another's under the same XLA: compare their graphs.

Builds the jitted training step (forward, backward, AdamW; bf16 mixed) of our masked LM and of
KerasHub's BertMaskedLM at one shape, on Keras 3's JAX backend, and prints side by side:
- the StableHLO XLA is given, before any backend pass: op counts, and every matmul, gather and
  scatter with its operand dtypes (a bf16 scatter-add is a compare-and-swap loop on GPUs:
  openxla/xla#26371; a float32 matmul misses the tensor cores);
- what the backend compiled it to: fusions by kind and library calls (cuBLAS, cuDNN on a GPU),
  and XLA's cost analysis (FLOPs, bytes);
- with --profile N: the device time of each compiled kernel over N steps, from a JAX profiler
  trace, ranked (on a GPU these are the CUDA kernels; on CPU the XLA ops).

The KerasHub step is the one Keras' JAX trainer jits for train_on_batch (stateless_call,
value_and_grad, optimizer.stateless_apply), written out so both steps lower the same way.

Usage (a venv with jax, keras 3.15.1 and keras-hub 0.32.0; our model from $TRAINFORMER_SRC, default src):
    python benchmarks/gpu/hlo_compare.py [--batch 8 --seq 128 --layers 2 --hidden 256 ...] [--profile 5]
    python benchmarks/gpu/hlo_compare.py --peers tfm@old/src,tfm,kerashub   # another tree beside ours
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")
p = argparse.ArgumentParser()
p.add_argument("--peers", default="tfm,kerashub",
               help="comma-separated: kerashub, tfm (our model from $TRAINFORMER_SRC or src), tfm@DIR (from DIR)")
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--inter", type=int, default=1024)
p.add_argument("--vocab", type=int, default=21128)
p.add_argument("--dropout", type=float, default=0.1)
p.add_argument("--profile", type=int, default=0, help="profile this many steps (0: no profile)")
p.add_argument("--top", type=int, default=15, help="kernels shown per peer")
p.add_argument("--json", help="also write every table to this file")
a = p.parse_args()

import jax  # noqa: E402  (after KERAS_BACKEND)
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

MASKED = int(round(0.15 * a.seq))
TENSOR = r"tensor<((?:[0-9]+x)*[a-z]+[0-9]*)>"


def build(peer):
    """(model, one batch of inputs) for a peer, bf16 mixed, at the command line's shape."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(min(1000, a.vocab // 2), a.vocab, (a.batch, a.seq)), jnp.int32)
    positions = jnp.asarray(np.stack([rng.permutation(a.seq)[:MASKED] for _ in range(a.batch)]), jnp.int32)
    mask = jnp.ones((a.batch, a.seq), bool)
    if peer == "kerashub":
        import keras_hub

        keras.config.set_dtype_policy("mixed_bfloat16")
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=a.vocab, num_layers=a.layers, num_heads=a.heads, hidden_dim=a.hidden,
            intermediate_dim=a.inter, max_sequence_length=512, dropout=a.dropout)
        model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
        keras.config.set_dtype_policy("float32")
        return model, {"token_ids": ids, "padding_mask": mask, "segment_ids": jnp.zeros_like(ids),
                       "mask_positions": positions}
    source = peer.partition("@")[2] or os.environ.get("TRAINFORMER_SRC", "src")
    for name in [m for m in sys.modules if m.split(".")[0] == "trainformer"]:
        del sys.modules[name]  # another tree's model code may have been imported before
    sys.path.insert(0, source)
    from trainformer.config import ModelConfig
    from trainformer.model.heads import build_masked_lm

    config = ModelConfig(d_model=a.hidden, num_layers=a.layers, num_heads=a.heads, dff=a.inter,
                         dropout=a.dropout, norm="post", position="learned")
    model = build_masked_lm(config, vocab_size=a.vocab, max_length=512, dtype="mixed_bfloat16")
    sys.path.remove(source)
    return model, {"token_ids": ids, "padding_mask": mask, "masked_positions": positions}


def training_step(model):
    """The jitted stateless step and its initial state, as Keras' JAX trainer builds it."""
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)

    def loss_fn(trainable, non_trainable, batch, labels):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, batch, training=True)
        loss = ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        return loss, non_trainable

    def step(state, batch, labels):
        trainable, non_trainable, slots = state
        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, non_trainable, batch,
                                                                                 labels)
        trainable, slots = optimizer.stateless_apply(slots, grads, trainable)
        return loss, (trainable, non_trainable, slots)

    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    return jax.jit(step), state


def tensor_types(line):
    """['8x128x256xbf16', ...] of an MLIR line's signature, operands then results."""
    signature = line.rsplit(" : ", 1)[-1]
    return re.findall(TENSOR, signature)


def stablehlo_inventory(text):
    """Op counts and the data-movement ops worth reading, from the StableHLO module."""
    counts = collections.Counter(re.findall(r'"?stablehlo\.([a-z_]+)"?[( ]', text))
    lines = text.splitlines()
    notable = collections.Counter()
    for index, line in enumerate(lines):
        for op in ("dot_general", "gather", "scatter", "while"):
            if f"stablehlo.{op}" in line:
                if op == "scatter":  # its signature closes the region a few lines below
                    line = next(l for l in lines[index:] if l.lstrip().startswith("})"))
                types = tensor_types(line)
                notable[f"{op} " + ", ".join(types[:3] if op != "while" else types[2:4])] += 1
    return counts, notable


def compiled_inventory(text):
    """Fusion kinds and library calls of the backend's optimized HLO."""
    inventory = collections.Counter()
    for kind in re.findall(r"kind=(k[A-Za-z]+)", text):
        inventory[f"fusion {kind}"] += 1
    for target in re.findall(r'custom_call_target="([^"]+)"', text):
        inventory[f"custom-call {target}"] += 1
    for op in ("scatter", "gather", "copy", "transpose", "while"):
        inventory[f"top-level {op}"] = len(re.findall(rf"= \S+ {op}\(", text))
    return inventory


def kernel_times(step, state, batch, labels, steps):
    """{kernel or XLA op name: (total µs per step, calls per step)} from a profiler trace."""
    loss, state = step(state, batch, labels)
    loss.block_until_ready()
    folder = tempfile.mkdtemp(prefix="hlo_compare_")
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        for _ in range(steps):
            loss, state = step(state, batch, labels)
        loss.block_until_ready()
    (trace_file,) = glob.glob(f"{folder}/**/perfetto_trace.json.gz", recursive=True)
    events = json.load(gzip.open(trace_file))
    events = events["traceEvents"] if isinstance(events, dict) else events
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = [e for e in events if e.get("ph") == "X" and "/device:" in processes.get(e.get("pid"), "")
              and "Stream" not in e.get("name", "") and "Xla" not in processes.get(e.get("pid"), "Xla")]
    if not device:  # CPU: XLA ops run on host threads
        device = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    totals, calls = collections.Counter(), collections.Counter()
    for e in device:
        name = e.get("args", {}).get("hlo_op") or e["name"]
        totals[name] += float(e.get("dur", 0)) / steps
        calls[name] += 1 / steps
    return {name: (round(total, 1), round(calls[name], 1)) for name, total in totals.most_common()}


def side_by_side(title, tables, peers):
    keys = sorted(set().union(*(t.keys() for t in tables.values())),
                  key=lambda k: (-max(abs(t.get(k, 0)) for t in tables.values()), k))
    differing = [k for k in keys if len({tables[q].get(k, 0) for q in peers}) > 1]
    width = max(12, *(len(q) + 2 for q in peers))
    print(f"\n{title} (only rows that differ)")
    print("  " + "".join(f"{q:>{width}}" for q in peers))
    for k in differing:
        print("  " + "".join(f"{tables[q].get(k, 0):>{width}}" for q in peers) + f"  {k}")


def main():
    peers = a.peers.split(",")
    report = {}
    for peer in peers:
        model, batch = build(peer)
        step, state = training_step(model)
        labels = jnp.zeros((a.batch, MASKED), jnp.int32)
        lowered = step.lower(state, batch, labels)
        counts, notable = stablehlo_inventory(lowered.as_text())
        compiled = lowered.compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        report[peer] = {
            "stablehlo_ops": dict(counts), "data_movement": dict(notable),
            "compiled": dict(compiled_inventory(compiled.as_text())),
            "cost": {"GFLOP": round(cost.get("flops", 0) / 1e9, 2), "GB": round(cost.get("bytes accessed", 0) / 1e9, 3)},
        }
        if a.profile:
            report[peer]["kernels_us_per_step"] = kernel_times(step, state, batch, labels, a.profile)
        del model, state, step
        keras.backend.clear_session()
    print(f"backend {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
          f"batch {a.batch} x seq {a.seq}, {a.layers} x {a.hidden}, vocab {a.vocab}, dropout {a.dropout}")
    for peer in peers:
        print(f"  {peer:>10}: {report[peer]['cost']['GFLOP']} GFLOP, {report[peer]['cost']['GB']} GB accessed")
    side_by_side("StableHLO ops", {q: report[q]["stablehlo_ops"] for q in peers}, peers)
    side_by_side("matmuls, gathers, scatters and loops by operand types", {q: report[q]["data_movement"] for q in peers},
                 peers)
    side_by_side("compiled for the backend", {q: report[q]["compiled"] for q in peers}, peers)
    if a.profile:
        for peer in peers:
            kernels = report[peer]["kernels_us_per_step"]
            total = sum(t for t, _ in kernels.values())
            print(f"\n{peer}: device time {total / 1e3:.2f} ms per step; top kernels (µs/step, calls/step)")
            for name, (t, n) in list(kernels.items())[: a.top]:
                print(f"  {t:>10.1f} {n:>6.1f}  {name[:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
