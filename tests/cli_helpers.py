"""Running the real `trainformer` command in a process of its own, for end-to-end tests (forked
from this worker's command server when the environment allows: command_server.py), or its main()
in the test's own process where only what it prints is tested."""

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys

from command_server import CommandServer

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
# What a user who just installed trainformer has: TensorFlow's logging is left to trainformer.quiet.
CLEAN_ENV = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
# What TensorFlow printed on every command before quiet.py (the absl/glog records and their notices).
NOISE = re.compile(r"^(\[worker \d+\] )?([IWEF]\d{4} \d\d:\d\d:|WARNING: All log messages before absl)"
                   r"|oneDNN|cuInit|cuda drivers|StartAbort|coordination service", re.M)

# A tiny BERT on real People's Daily text: tens of steps take seconds. fp32: precision auto
# times a bf16 matmul in every process on CPUs with bf16 instructions (half a second); the tests
# of auto set it back.
TINY = [
    "--set", "model.d_model=32", "--set", "model.num_layers=1", "--set", "model.num_heads=2",
    "--set", "model.dff=64", "--set", "data.seq_len=32", "--set", "train.batch_size=16",
    "--set", "train.learning_rate=3e-3", "--set", "train.warmup_steps=5",
    "--set", "train.log_every=5", "--set", "train.eval_every=15", "--set", "train.checkpoint_every=10",
    "--set", "train.precision=fp32",
]
# The real chatterbot intent set split 80/10/10: a masked LM on it trains on its train split's texts.
INTENT_SPLIT = ["--set", "data.corpus=chatterbot-zh-intents", "--set", "data.valid_fraction=0.1",
                "--set", "data.test_fraction=0.1"]
# TINY on People's Daily (the default corpus) with 1% held out (~190 paragraphs, ~40 eval
# batches): the default 5% made an eval of such a run cost more than its steps.
TINY_NEWS = [*TINY, "--set", "data.valid_fraction=0.01"]

# TINY's sizes on the real People's Daily headlines, 20 deterministic steps, beam 2: conftest's
# headline_run.
HEADLINES = [*TINY, "--set", "task.type=seq2seq", "--set", "data.corpus=people-daily-headlines",
             "--set", "data.seq_len=64", "--set", "data.target_len=24", "--set", "data.valid_fraction=0.1",
             "--set", "data.test_fraction=0.1", "--set", "train.batch_tokens=1024", "--set", "decode.beam_size=2",
             "--set", "train.label_smoothing=0.1", "--set", "train.steps=20", "--set", "train.eval_every=20",
             "--set", "train.deterministic=true", "--set", "model.dropout=0.1"]
# TINY's sizes, a small joint vocabulary, 20 steps: ~35 s on 2 cores; the outputs are poor but
# not empty, so equality means something. data.valid_fraction 0.005: ~120 valid pairs (an
# export's parity check needs 64, eval decodes them all). The decoder copies (model.copy_source):
# the export's parity then covers the copy's decoding state in the SavedModel's search.
TRANSLATION = ["en-zh-translate", *TINY, "--set", "model.decoder_layers=1", "--set", "model.copy_source=true",
               "--set", "data.seq_len=48",
               "--set", "data.valid_fraction=0.005", "--set", "data.target_len=48", "--set", "train.batch_tokens=1024",
               "--set", "train.steps=20", "--set", "train.eval_every=20", "--set", "train.checkpoint_every=20",
               "--set", "tokenizer.vocab_size=2000", "--set", "decode.beam_size=2", "--set", "train.precision=fp32"]


# Commands run with ENV are forked from a process that has imported TensorFlow already; any other
# environment (CLEAN_ENV's log level, a PYTHONPATH) must be in place before the imports, so those
# start with `python -m trainformer`, as does a command given fork=False.
COMMANDS = CommandServer(ENV)


def trainformer(*args, check=True, env=ENV, fork=True):
    if fork and env is ENV:
        result = COMMANDS.run(list(args), env)
    else:
        result = subprocess.run([sys.executable, "-m", "trainformer", *args], capture_output=True, text=True, env=env)
    if check and result.returncode:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def in_process(*args, check=True) -> subprocess.CompletedProcess:
    """`trainformer ARGS` as trainformer.cli.main(ARGS) in this process, its stdout and stderr
    captured: for eval, predict, export and bench, whose tests read what they print and write,
    this spares the ~4 s of a new process importing TensorFlow. train always gets a process of
    its own: it makes op determinism process-wide, for good. What TensorFlow's C++ logs is not
    captured: tests of a quiet stderr start a process."""
    from trainformer.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse's usage errors
            code = exit.code
    result = subprocess.CompletedProcess(["trainformer", *args], code, stdout.getvalue(), stderr.getvalue())
    if check and result.returncode:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def start(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
    """`trainformer ARGS` running, forked (command_server.ForkedProcess: Popen's methods); stdout
    and stderr as Popen takes them (stdout=subprocess.PIPE: a text file to read)."""
    return COMMANDS.popen(list(args), ENV, stdout=stdout, stderr=stderr)


def stop_after_first_step(*args) -> str:
    """Start `trainformer train ARGS`, SIGTERM it once it has logged a step; its stdout."""
    return stop_after_line("step ", *args)


def stop_after_line(prefix: str, *args) -> str:
    """Start `trainformer train ARGS`, SIGTERM it once it has printed a line starting with
    prefix (leading spaces aside); its whole stdout."""
    process = start("train", *args, stdout=subprocess.PIPE)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.lstrip().startswith(prefix):
            break
    process.send_signal(signal.SIGTERM)
    stdout, _ = process.communicate(timeout=120)
    assert process.returncode == 0 and "SIGTERM: stopped at step" in stdout
    return "".join(seen) + stdout


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
