"""`trainformer diff`: one real tiny run, and copies of it with specific files edited, compared
through the library and the real command line."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from cli_helpers import ENV, TINY, trainformer

from trainformer.errors import UserError
from trainformer.ops.diff import diff_runs, format_differences


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """A real 10-step run on 1,500 People's Daily paragraphs (a small corpus: a smaller vocabulary
    to train and fewer windows to evaluate than the whole recipe)."""
    folder = tmp_path_factory.mktemp("diff")
    news = folder / "news.txt"
    news.write_text("\n".join(corpus.train[:1400] + corpus.valid[:100]) + "\n", encoding="utf-8")
    trainformer("train", *TINY, "--set", "train.steps=10", "--set", f"data.corpus={news}",
                "--set", "tokenizer.vocab_size=2000", "--run-dir", str(folder / "a"))
    return folder / "a"


@pytest.fixture
def copy(run, tmp_path):
    target = tmp_path / "b"
    shutil.copytree(run, target, ignore=shutil.ignore_patterns("cache", "checkpoints", "logs", ".lock"))
    return target


def edit_yaml(path, change):
    tree = yaml.safe_load(path.read_text())
    change(tree)
    path.write_text(yaml.safe_dump(tree, sort_keys=False, allow_unicode=True))


def edit_json(path, change):
    tree = json.loads(path.read_text())
    change(tree)
    path.write_text(json.dumps(tree, indent=2))


def test_a_run_and_its_copy_do_not_differ(run, copy):
    result = trainformer("diff", str(run), str(copy))
    assert result.stdout == "no differences\n"
    as_json = json.loads(trainformer("diff", str(run), str(copy), "--json").stdout)
    assert as_json == {"identical": True, "differences": []}


def test_differences_come_most_decisive_first(run, copy):
    def config(tree):
        tree["model"]["dropout"] = 0.1
        tree["train"]["learning_rate"] = 0.002
        tree["train"]["seed"] = 7
        tree["train"]["precision"] = "bf16"
        tree["runtime"]["cpu_devices"] = 2
        tree["train"]["brand_new_key"] = True  # only in b: a newer trainformer's key

    def manifest(tree):
        tree["seed"] = 7
        tree["precision"] = "fp16"  # what took effect (auto resolves per machine): never "fp16" in run
        tree["data"]["fingerprint"] = "0" * 64
        tree["data"]["skipped_lines"] = {"empty": 3}
        tree["packages"]["tensorflow"] = "2.22.0"
        tree["devices"] = ["GPU:0 NVIDIA H200", "OneDeviceStrategy: 1 replica(s) (gpu:0 here)"]
        tree["git_rev"] = "1234567890ab" + "c" * 28 + "+dirty"
        del tree["weights_sha256"]  # e.g. a run stopped by SIGTERM records no final weights
        tree["started_at"] = "2030-01-01T00:00:00+00:00"  # when, not what: never a difference

    edit_yaml(copy / "config.yaml", config)
    edit_json(copy / "manifest.json", manifest)
    with open(copy / "tokenizer" / "vocab.txt", "a", encoding="utf-8") as vocab:
        vocab.write("新词\n")
    records = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r.get("split") == "valid"][-1]
    loss_a = valid["loss"]
    valid["loss"] = loss_a - 0.1378
    for record in records:
        record["time"] += 1000.0
        if record.get("split") == "train":
            record["tokens_per_s"] *= 2  # speed is not a difference either
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    differences = diff_runs(run, copy)
    assert [found["what"] for found in differences] == [
        "model.dropout", "train.learning_rate", "train.brand_new_key",
        "seed",
        "data fingerprint", "data skipped_lines.empty",
        "vocabulary sha256",
        "package tensorflow",
        "devices", "runtime.cpu_devices",
        "train.precision", "precision used",
        "git revision",
        "valid loss", "weights sha256",
    ]
    by_what = {found["what"]: found for found in differences}
    assert by_what["model.dropout"] == {"what": "model.dropout", "a": 0.0, "b": 0.1}
    assert by_what["train.brand_new_key"] == {"what": "train.brand_new_key", "a": None, "b": True}
    assert by_what["seed"]["a"] == 42 and by_what["seed"]["b"] == 7
    assert by_what["data skipped_lines.empty"] == {"what": "data skipped_lines.empty", "a": None, "b": 3}
    assert by_what["valid loss"]["change"] == pytest.approx(-0.1378)
    assert by_what["weights sha256"]["b"] is None and len(by_what["weights sha256"]["a"]) == 64

    lines = format_differences(differences).splitlines()
    assert lines[0] == "model.dropout             0.0 -> 0.1"
    assert f"valid loss                {loss_a:.4f} -> {loss_a - 0.1378:.4f} (-0.1378)" in lines
    rev_a = by_what["git revision"]["a"]  # this checkout's commit, "+dirty" while files are edited
    assert f"git revision              {rev_a[:12]}{rev_a[40:]} -> 1234567890ab+dirty" in lines
    assert ("devices                   " + "; ".join(by_what["devices"]["a"])
            + " -> GPU:0 NVIDIA H200; OneDeviceStrategy: 1 replica(s) (gpu:0 here)") in lines
    assert lines[-1] == "15 differences"

    result = trainformer("diff", str(run), str(copy), "--json", check=False)
    assert result.returncode == 1
    assert json.loads(result.stdout) == {"identical": False, "differences": json.loads(json.dumps(differences))}


def test_diff_reads_files_only_and_never_imports_tensorflow(run, copy):
    edit_yaml(copy / "config.yaml", lambda tree: tree["train"].update(steps=20))
    probe = ("import sys; from trainformer.cli import main; code = main(['diff', sys.argv[1], sys.argv[2]]); "
             "print('tensorflow loaded' if 'tensorflow' in sys.modules else 'no tensorflow'); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe, str(run), str(copy)], capture_output=True, text=True,
                            env=ENV)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["train.steps  10 -> 20", "1 difference", "no tensorflow"]


def test_not_a_run_directory_is_a_user_error(run, tmp_path):
    result = trainformer("diff", str(run), str(tmp_path), check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"trainformer: error: {tmp_path}: not a run directory (no config.yaml)\n"
    with pytest.raises(UserError, match=r"config\.yaml: not a run directory \(a file\)"):
        diff_runs(run, run / "config.yaml")
    with pytest.raises(UserError, match=r"nowhere: not a run directory \(no such directory\)"):
        diff_runs(tmp_path / "nowhere", run)


def test_damaged_run_files_name_the_file(run, copy):
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(UserError, match=r"manifest\.json: not valid JSON"):
        diff_runs(run, copy)
    (copy / "manifest.json").unlink()  # a run that never reached its first step: compared on what it has
    assert "seed" not in [found["what"] for found in diff_runs(run, copy)]
    lines = len((copy / "metrics.jsonl").read_text().splitlines())
    with open(copy / "metrics.jsonl", "a") as metrics:
        metrics.write('{"split": "valid", "ste\n')
    with pytest.raises(UserError, match=rf"metrics\.jsonl:{lines + 1}: not a JSON record"):
        diff_runs(run, copy)
