"""XLA:CPU's YNNPACK fusions stay out of our kernels (trainformer/xla_flags.py): two
executions of one at once crashed a training process."""

import os
import subprocess
import sys

import pytest

from trainformer.xla_flags import YNN_FUSION, without_ynn_fusion

# The fused cross-entropy over a vocabulary's logits, forward and backward, in a fresh process
# (XLA reads XLA_FLAGS once); `set_xla_flags()` first where the first argument says so.
COMPILE = """
import sys
if sys.argv[1] == "set":
    from trainformer.xla_flags import set_xla_flags
    set_xla_flags()
import tensorflow as tf
from trainformer.tasks.losses import fused_cross_entropy
logits = tf.random.stateless_normal([16, 5, 5000], seed=[1, 2])
with tf.GradientTape() as tape:
    tape.watch(logits)
    losses, _ = fused_cross_entropy(logits, tf.zeros([16, 5], tf.int32))
tape.gradient(losses, logits).numpy()
"""


def ynn_fusions(tmp_path, how: str) -> int:
    """How many YNNPACK fusions XLA compiled into the cross-entropy's kernels."""
    dump = tmp_path / how
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "XLA_FLAGS": f"--xla_dump_to={dump}"}
    subprocess.run([sys.executable, "-c", COMPILE, how], env=env, check=True, capture_output=True)
    optimized = [path.read_text() for path in dump.glob("*after_optimizations.txt")]
    assert optimized, f"XLA dumped nothing into {dump}"
    return sum(text.count("__ynn_fusion") for text in optimized)


def test_our_kernels_compile_without_ynnpack_fusions(tmp_path):
    if not ynn_fusions(tmp_path, "default"):  # what this TensorFlow's XLA does left alone
        pytest.skip("XLA makes no YNNPACK fusion of these kernels on this CPU: nothing to keep out")
    assert ynn_fusions(tmp_path, "set") == 0


def test_a_users_own_setting_is_kept_and_others_flags_too():
    assert without_ynn_fusion("") == f"{YNN_FUSION}="
    assert without_ynn_fusion("--xla_dump_to=/tmp/x") == f"--xla_dump_to=/tmp/x {YNN_FUSION}="
    assert without_ynn_fusion(f"{YNN_FUSION}=individual_dot") == f"{YNN_FUSION}=individual_dot"
