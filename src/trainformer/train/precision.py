"""`train.precision: auto` (the default): bf16 where the hardware runs it fast, float32 elsewhere.

Measured (DESIGN.md, docs/measured.md): bf16 mixed precision is 1.2-2x fp32 on CPUs with
AVX512-BF16 or AMX and 2-3x *slower* without them; GPUs from compute capability 8.0 (Ampere)
have bf16 tensor cores, older ones only fp16 ones; TPUs compute in bf16 natively.

The instructions are not the whole story: a 2-core Xeon VM listing AVX512-BF16 (no AMX) ran
bf16 matmuls at 0.65x fp32 and trained zh-bert-small 30% faster in fp32 (issue 21). So a CPU
with bf16 instructions times one matmul both ways (half a second, once per process; up to
PROBES times while bf16 reads slow) and bf16 must win by BF16_MIN_SPEEDUP. A machine near that
ratio could resolve differently in two processes; set train.precision to pin it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

BF16_CPU_FEATURES = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 dot products
BF16_GPU_CAPABILITY = (8, 0)  # Ampere: the first GPUs with bf16 tensor cores
BF16_MIN_SPEEDUP = 1.1  # bf16 over fp32 matmul throughput a CPU must show: bf16 also costs casts
PROBES = 3  # readings a CPU below BF16_MIN_SPEEDUP gets before it trains in fp32 (best_of_probes)


def read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux
        return ""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of /proc/cpuinfo text (its first `flags` line)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def choose_precision(gpus: list[tuple[str, tuple[int, int] | None]], tpu: bool, flags: set[str],
                     bf16_speedup: Callable[[], float]) -> tuple[str, str]:
    """(precision, why) for a machine: gpus as (name, compute capability), a TPU, the CPU's
    flags, and bf16_speedup() measuring bf16 over fp32 matmul throughput on the CPU (called
    only for a CPU with bf16 instructions)."""
    if tpu:
        return "bf16", "TPU: bf16 is its native matmul type"
    if gpus:
        old = [(name, capability) for name, capability in gpus if (capability or (0, 0)) < BF16_GPU_CAPABILITY]
        if old:
            name, capability = old[0]
            version = ".".join(map(str, capability)) if capability else "unknown"
            return "fp32", (f"{name} (compute capability {version}) has no bf16 tensor cores; "
                            f"train.precision=fp16 would use its fp16 ones")
        return "bf16", f"{gpus[0][0]} has bf16 tensor cores"
    fast = [flag for flag in BF16_CPU_FEATURES if flag in flags]
    if fast:
        names = "/".join(flag.upper().replace("_", "-") for flag in fast)
        speedup = bf16_speedup()
        if speedup >= BF16_MIN_SPEEDUP:
            return "bf16", f"this CPU has {names} and ran bf16 matmuls at {speedup:.2f}x fp32"
        return "fp32", (f"this CPU has {names}, but ran bf16 matmuls at {speedup:.2f}x fp32 "
                        f"(bf16 needs {BF16_MIN_SPEEDUP}x)")
    return "fp32", "this CPU has no AVX512-BF16 or AMX, where bf16 runs 2-3x slower than fp32"


@functools.cache
def resolve_precision(setting: str) -> tuple[str, str]:
    """(fp32 | bf16 | fp16, why) for a `train.precision` setting on this machine."""
    if setting != "auto":
        return setting, "train.precision"
    import tensorflow as tf  # here: doctor imports this module and must run where TensorFlow is broken
    details = [tf.config.experimental.get_device_details(gpu) for gpu in tf.config.list_physical_devices("GPU")]
    gpus = [(gpu.get("device_name", "GPU"), gpu.get("compute_capability")) for gpu in details]
    tpu = bool(tf.config.list_physical_devices("TPU"))  # physical: the runtime is not started yet
    precision, why = choose_precision(gpus, tpu, cpu_flags(read_cpuinfo()), cpu_bf16_speedup)
    return precision, f"auto: {why}"


def cpu_bf16_speedup(size: int = 1024, rounds: int = 10) -> float:
    """bf16 over fp32 throughput of a (size x size) matmul on this CPU: 0 where bf16 cannot run."""
    # imported here, as TensorFlow is in resolve_precision
    from trainformer.train.peak import relative_speed

    return best_of_probes(lambda: relative_speed("bf16", "fp32", size, rounds), BF16_MIN_SPEEDUP, PROBES)


def best_of_probes(probe: Callable[[], float], enough: float, tries: int) -> float:
    """The best of up to `tries` readings of probe(), stopping at the first that reaches `enough`.

    Another process busy on the same cores can pull the bf16/fp32 reading down: on a 2-core
    Zen 4 that reads 1.82-1.99x, a probe taken while another run wrote its last checkpoint read
    1.06x, and that fine-tune ran in fp32 at 0.6x the speed (docs/measured.md). A CPU where bf16
    truly loses reads low every time (the Xeon VM: 0.65-1.07x) and pays the extra probes, half a
    second each, once per process."""
    best = probe()
    for _ in range(tries - 1):
        if best >= enough:
            break
        best = max(best, probe())
    return best


def resolved(config):
    """(config with train.precision resolved for this machine, why it is what it is)."""
    precision, why = resolve_precision(config.train.precision)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision)), why
