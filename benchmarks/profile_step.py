"""Where a training step's time goes: TF profiler op time per op type, for one config.

    python profile_step.py bert-mini-bench [--set key=value ...]   # project venv; ~1 min at mini
    python profile_step.py zh-sentiment --set model.init_from=runs/zh-bert-small   # a fine-tune (its sizes)

Runs `trainformer bench`'s setup (the real Trainer step): a masked-LM config on synthetic ids,
any other task on the widest batch of its own training data, replayed. Profiles 3 steps after
3 warm-up steps and prints op time per op type and the top ops by name (summed over threads, so
it exceeds wall time on 2 cores; shares are what to compare). Reads the profiler's XSpace
protobuf directly (no TensorBoard plugin needed). The trace stays in $BENCH_TMP/profile for
TensorBoard's profile plugin.
"""
import argparse
import itertools
import os
import shutil
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from trainformer.ops.bench import bench_run_dir, make_trainer, synthetic_dataset
from trainformer.run_dir import load_starting_config
from trainformer.tasks import load_source, task_for
from trainformer.tasks.mlm import MaskedLMTask
from trainformer.train.precision import resolved
from xspace import print_op_times

p = argparse.ArgumentParser()
p.add_argument("config")
p.add_argument("--set", dest="overrides", action="append", default=[])
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()
bench_tmp = Path(os.environ.get("BENCH_TMP", "/tmp/trainformer-bench"))
logdir = str(bench_tmp / "profile")
shutil.rmtree(logdir, ignore_errors=True)

config, _ = resolved(load_starting_config(args.config, args.overrides))  # precision auto -> what train picks here
if config.task.type == "mlm":
    task = MaskedLMTask(config)
    trainer, batches = make_trainer(config, task, synthetic_dataset(task.vocab_size, config))
else:  # the widest of the first 50 real batches, every step: one shape, the costliest
    task = task_for(config)
    task.prepare(bench_run_dir(config, bench_tmp / "data"), load_source(config), print)
    widest = max(task.train_batches(0).take(50), key=lambda batch: batch[0]["token_ids"].shape[1])
    trainer, _ = make_trainer(config, task, task.train_batches(0))
    batches = itertools.repeat(widest)
    print(f"profiling batches of shape {widest[0]['token_ids'].shape}")
for _ in range(3):
    trainer.train_step(batches)["loss_sum"].numpy()
tf.profiler.experimental.start(logdir)
for _ in range(args.steps):
    trainer.train_step(batches)["loss_sum"].numpy()
tf.profiler.experimental.stop()

print_op_times(logdir, args.steps)
