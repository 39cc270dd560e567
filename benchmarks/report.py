"""Print the results table (markdown) from a results.jsonl written by run_all.sh.

usage: python report.py results/<run>/results.jsonl

"vs KerasHub" is tokens/s over KerasHub's on the same shape: padded tokens/s for random ids,
effective (non-pad) tokens/s for real text (KerasHub pads each document; trainformer packs).
"""
import json
import os
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
machine = os.path.join(os.path.dirname(sys.argv[1]), "machine.txt")
if os.path.exists(machine):
    print("".join(open(machine)).strip(), "\n")
peaks = [r for r in rows if r["kind"] == "peak"]
fp32 = max((r["gflops_best"] for r in peaks if r["dtype"] == "float32"), default=None)

print("Matmul peak (2048x2048, best / median of reps, GFLOP/s):")
for r in peaks:
    print(f"- {r['framework']} {r['dtype']}: {r['gflops_best']:.1f} / {r['gflops_median']:.1f}"
          f" ({r['threads']}, {r['version']})")
print(f"\nMFU denominator = best fp32 peak above = {fp32} GFLOP/s\n")


INPUTS = {"synthetic": "random ids", "text": "People's Daily"}


def reference(r):
    """KerasHub's row for the same shape and input mode."""
    for k in rows:
        if k["kind"] == "train" and k["config"] == r["config"] and k.get("mode", "synthetic") == r.get("mode", "synthetic") \
                and k["peer"].startswith("kerashub") and "jit=1" not in k["peer"]:
            return k
    return None


print("| peer | shape | input | step ms (p10-p90) | tokens/s | effective tokens/s | vs KerasHub | MFU | data-wait | RSS MB "
      "| params | cores own/other |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    if r["kind"] == "fail":
        print(f"| {r['peer']} | {r['config']} | | FAILED rc={r['rc']} (see logs/) | | | | | | | | |")
        continue
    if r["kind"] != "train":
        continue
    mode = r.get("mode", "synthetic")
    key = "effective_tokens_per_s" if mode == "text" else "tokens_per_s"
    ref = reference(r)
    ratio = f"{r[key] / ref[key]:.2f}x" if ref else ""
    mfu = r["model_gflop_per_step"] * 1e9 / (r["step_ms_median"] / 1e3) / (fp32 * 1e9) if fp32 else float("nan")
    noisy = r["other_cores"] > 0.25 or r["step_ms_p90"] / r["step_ms_p10"] > 1.25
    wait = f"{r['data_wait_pct']:.2f}%" if "data_wait_pct" in r else ""
    print(f"| {r['peer']} | {r['config'].replace('-bench', '')} | {INPUTS[mode]} "
          f"| {r['step_ms_median']:.0f} ({r['step_ms_p10']:.0f}-{r['step_ms_p90']:.0f}) | {r['tokens_per_s']:.0f} "
          f"| {r.get('effective_tokens_per_s', r['tokens_per_s']):.0f} | {ratio} | {100 * mfu:.1f}% | {wait} "
          f"| {r['peak_rss_mb']:.0f} | {r['params']:,} | {r['own_cores']:.2f}/{r['other_cores']:.2f}"
          f"{' NOISY' if noisy else ''} |")
print("\nstep ms = median of timed steps; MFU = model FLOPs per step (3x forward matmuls, attention included,"
      " MLM head on the 15% masked positions only) / median step / best fp32 matmul peak."
      "\ncores own/other = CPU cores this process / all other processes kept busy during the timed steps;"
      " NOISY = others used > 0.25 core or p90/p10 > 1.25: compare ratios with care.")
