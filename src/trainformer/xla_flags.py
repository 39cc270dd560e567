"""XLA:CPU settings trainformer's own kernels need, put in XLA_FLAGS before XLA first reads it.

TensorFlow 2.21's XLA:CPU hands some reductions to YNNPACK (fusions of kind `__ynn_fusion`: in
our jit-compiled cross-entropy, tasks/losses.py, the max and the sum over the vocabulary). A
fused kernel builds its YNNPACK executable on first use, and two executions of one kernel at
once race doing so: the micro-batches of an accumulated step (train.accumulate > 1) run side by
side, and a process died of SIGSEGV in xla::cpu::EmitYnnSubgraph (the gdb backtrace and how
often: docs/measured.md). With the fusion type list empty XLA emits those reductions itself.
A user's own setting of the flag is left as it is; a process whose XLA has already compiled
something keeps the flags it read then.
"""

from __future__ import annotations

import os

YNN_FUSION = "--xla_cpu_experimental_ynn_fusion_type"


def without_ynn_fusion(flags: str) -> str:
    """flags (XLA_FLAGS' value) with YNNPACK fusions off, unless flags already choose them."""
    if YNN_FUSION in flags:
        return flags
    return f"{flags} {YNN_FUSION}=".strip()


def set_xla_flags(environ=os.environ) -> None:
    environ["XLA_FLAGS"] = without_ynn_fusion(environ.get("XLA_FLAGS", ""))
