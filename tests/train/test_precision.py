"""`train.precision: auto`: bf16 where the hardware runs it fast, float32 elsewhere."""

from pathlib import Path

import pytest

from trainformer.config import load_config
from trainformer.tasks import dtype_policy
from trainformer.train.precision import choose_precision, cpu_flags, resolve_precision, resolved

AMD_BF16 = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
INTEL_AMX = "flags\t\t: avx2 avx512f amx_tile amx_bf16 amx_int8\n"
OLD_XEON = "flags\t\t: sse2 avx avx2 avx512f\n"


@pytest.mark.parametrize("cpuinfo, precision, named", [
    (AMD_BF16, "bf16", "AVX512-BF16"),
    (INTEL_AMX, "bf16", "AMX-BF16"),
    (OLD_XEON, "fp32", "no AVX512-BF16 or AMX"),
    ("", "fp32", "no AVX512-BF16 or AMX"),  # not Linux: nothing known, the safe choice
])
def test_a_cpu_trains_in_bf16_only_with_bf16_instructions(cpuinfo, precision, named):
    chosen, why = choose_precision([], False, cpu_flags(cpuinfo))
    assert chosen == precision and named in why


def test_gpus_need_bf16_tensor_cores_and_a_tpu_always_has_them():
    assert choose_precision([("NVIDIA H200", (9, 0))], False, set()) == ("bf16", "NVIDIA H200 has bf16 tensor cores")
    chosen, why = choose_precision([("NVIDIA A100", (8, 0)), ("Tesla V100", (7, 0))], False, {"avx512_bf16"})
    assert chosen == "fp32" and "Tesla V100 (compute capability 7.0)" in why and "fp16" in why  # any old GPU: fp32
    assert choose_precision([("GPU", None)], False, set())[0] == "fp32"  # capability unknown: the safe choice
    assert choose_precision([], True, set())[0] == "bf16"


def test_auto_resolves_for_this_machine_and_a_set_precision_stays():
    # The expectation is read off /proc/cpuinfo here, not through the parser under test: this
    # suite runs on CPUs, and bf16 is chosen exactly where the kernel lists a bf16 instruction.
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    expected = "bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "fp32"
    precision, why = resolve_precision("auto")
    assert precision == expected and why.startswith("auto: ")
    assert resolve_precision("fp16") == ("fp16", "train.precision")
    config, _ = resolved(load_config())
    assert load_config().train.precision == "auto" and config.train.precision == expected
    assert dtype_policy(expected) == {"bf16": "mixed_bfloat16", "fp32": "float32"}[expected]
    with pytest.raises(ValueError, match="must be resolved"):  # a task never resolves auto itself
        dtype_policy("auto")
