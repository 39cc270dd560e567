"""The run directory's safety rules, without training: the lock, what counts as a run, what a
new config may replace, the data a run trains on, and metrics.jsonl after a resume."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from trainformer.config import load_config
from trainformer.errors import UserError
from trainformer.run_dir import RunDir, resolve_train_config
from trainformer.train.monitor import keep_records_until


def make_run(root, config, checkpoint=True, fingerprint="f" * 64):
    """A run directory as train leaves it: config.yaml, manifest.json, a checkpoint state file."""
    run = RunDir(root)
    run.prepare(config)
    run.write_manifest({"data": {"fingerprint": fingerprint, "train_documents": 90, "valid_documents": 10}})
    if checkpoint:
        run.checkpoints_dir.mkdir()
        (run.checkpoints_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    return run


def test_a_second_lock_on_a_run_is_refused_with_the_holders_pid(tmp_path):
    run = RunDir(tmp_path / "run")
    with run.lock():
        with pytest.raises(UserError, match=f"another trainformer train is running .*pid {os.getpid()}"):
            with RunDir(tmp_path / "run").lock():
                pass
    with run.lock():  # released on exit
        pass


def test_the_lock_of_a_killed_process_is_free(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from trainformer.run_dir import RunDir
        with RunDir(Path({str(tmp_path / 'run')!r})).lock():
            print("locked", flush=True)
            input()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    with pytest.raises(UserError, match=f"pid {holder.pid}"):
        with RunDir(tmp_path / "run").lock():
            pass
    holder.kill()
    holder.wait()
    with RunDir(tmp_path / "run").lock():  # the OS released it with the process
        pass


def test_a_file_or_a_folder_of_other_files_is_not_a_run_dir(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a directory"):
        RunDir(tmp_path / "file").check_usable()
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_text("x")
    with pytest.raises(UserError, match=r"holds other files \(cat.jpg\) but no run"):
        RunDir(tmp_path / "photos").check_usable()
    RunDir(tmp_path / "new").check_usable()
    (tmp_path / "empty").mkdir()
    RunDir(tmp_path / "empty").check_usable()
    with RunDir(tmp_path / "empty").lock():  # its own lock file does not make it "other files"
        pass
    RunDir(tmp_path / "empty").check_usable()


def test_a_run_with_a_checkpoint_refuses_another_experiment_and_says_how_to_resume(tmp_path):
    run = make_run(tmp_path / "run", load_config(None, ["model.d_model=64"]))
    with pytest.raises(UserError) as info:
        run.check_resume(load_config(None))
    assert "model.d_model was 64 in this run, now 128" in str(info.value)
    assert f"trainformer train --run-dir {run.root}" in str(info.value)
    run.check_resume(load_config(None, ["model.d_model=64", "train.steps=9000"]))  # extending is fine


def test_a_run_without_a_checkpoint_is_replaced_by_a_new_config(tmp_path):
    """A failed first attempt (bad corpus, batch too large...) must not block the fixed command."""
    run = make_run(tmp_path / "run", load_config(None, ["train.batch_size=100000"]), checkpoint=False)
    run.tokenizer_dir.mkdir()
    (run.tokenizer_dir / "vocab.txt").write_text("[PAD]\n")
    run.metrics_file.write_text('{"split": "train", "step": 5}\n')
    fixed = load_config(None, ["train.batch_size=16"])
    run.check_resume(fixed)
    run.prepare(fixed)
    assert yaml.safe_load(run.config_file.read_text())["train"]["batch_size"] == 16
    assert (run.tokenizer_dir / "vocab.txt").is_file()  # same corpus and tokenizer settings: kept
    assert not run.metrics_file.exists() and not run.manifest_file.exists()  # that attempt's records go
    run.prepare(load_config(None, ["tokenizer.min_frequency=3"]))
    assert not run.tokenizer_dir.exists()  # another vocabulary will be trained


def test_a_changed_corpus_is_refused_on_resume(tmp_path):
    run = make_run(tmp_path / "run", load_config(None), fingerprint="a" * 64)
    run.check_same_data("news.txt", "a" * 64, 100)
    with pytest.raises(UserError, match=r"news.txt has changed since this run trained on it \(100 -> 101 documents"):
        run.check_same_data("news.txt", "b" * 64, 101)
    fresh = make_run(tmp_path / "fresh", load_config(None), checkpoint=False, fingerprint="a" * 64)
    fresh.check_same_data("news.txt", "b" * 64, 101)  # not a run yet: anything goes


def test_records_past_the_restored_step_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [{"split": "train", "step": s} for s in (5, 10, 15)] + [{"event": "resume", "step": 10}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"split": "tra')  # torn by a crash
    keep_records_until(path, 10)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [records[0], records[1], records[3]]


def test_train_without_config_resumes_the_run_with_its_own_config(tmp_path):
    run = make_run(tmp_path / "run", load_config(None, ["data.corpus=my.txt", "model.d_model=64"]))
    config, resolved = resolve_train_config(None, ["train.steps=9000"], run.root)
    assert resolved == run
    assert (config.data.corpus, config.model.d_model, config.train.steps) == ("my.txt", 64, 9000)
    config, resolved = resolve_train_config(None, [], tmp_path / "new")  # no run there: the default
    assert config == load_config(None) and resolved.root == tmp_path / "new"
    config, resolved = resolve_train_config("zh-bert-80m", [], None)
    assert resolved.root.as_posix() == "runs/zh-bert-80m"
