"""`trainformer average`: a run whose weights are the mean of another's last checkpoints, which
eval and model.init_from read like any run."""

import json

import numpy as np

from trainformer.cli import main
from trainformer.run.inference import load_run
from trainformer.train.checkpoint import restore_model, restore_pretrained

def weights_at(run_dir, checkpoint: str) -> list[np.ndarray]:
    _, model, _, _ = load_run(run_dir)
    restore_model(model, str(run_dir / "checkpoints" / checkpoint))
    return [variable.numpy() for variable in model.weights]


def test_the_averaged_run_holds_the_mean_of_the_last_checkpoints_and_starts_fine_tunes(intent_pretraining, tmp_path):
    target = tmp_path / "lawa"
    assert main(["average", str(intent_pretraining), "--last", "2", "--run-dir", str(target)]) == 0

    _, averaged, path, step = load_run(target)
    assert (path, step) == (str(target / "checkpoints" / "ckpt-20"), 20)
    first, last = weights_at(intent_pretraining, "ckpt-10"), weights_at(intent_pretraining, "ckpt-20")
    floats = 0
    for variable, a, b in zip(averaged.weights, first, last):
        if np.issubdtype(a.dtype, np.floating):
            floats += not np.array_equal(a, b)
            np.testing.assert_array_equal(variable.numpy(), ((a.astype(np.float64) + b) / 2).astype(a.dtype),
                                          err_msg=variable.path)
        else:
            np.testing.assert_array_equal(variable.numpy(), b)  # e.g. dropout seeds: the newest's
    assert floats > 10  # the two checkpoints differ, so the mean is neither of them
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["averaged"] == {"from": str(intent_pretraining), "checkpoints": ["ckpt-10", "ckpt-20"]}
    vocabulary = (intent_pretraining / "tokenizer" / "vocab.txt").read_text()
    assert (target / "tokenizer" / "vocab.txt").read_text() == vocabulary

    _, fresh, _, _ = load_run(intent_pretraining)  # what model.init_from does with the averaged run
    restore_pretrained(fresh, target / "checkpoints")
    for ours, theirs in zip(fresh.encoder.weights, averaged.encoder.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_average_refuses_what_it_cannot_do_in_one_line_and_writes_nothing(intent_pretraining, tmp_path, capsys):
    target = tmp_path / "lawa"
    assert main(["average", str(intent_pretraining), "--last", "3", "--run-dir", str(target)]) == 2
    assert capsys.readouterr().err == (f"trainformer: error: --last 3: {intent_pretraining} keeps 2 checkpoints "
                                       f"(ckpt-10, ckpt-20); train with train.keep_checkpoints=3 (and "
                                       f"train.checkpoint_every for their spacing)\n")
    assert not target.exists() and not target.with_name("lawa.partial").exists()

    target.mkdir()
    assert main(["average", str(intent_pretraining), "--last", "2", "--run-dir", str(target)]) == 2
    assert "already exists" in capsys.readouterr().err and not any(target.iterdir())

    assert main(["average", str(intent_pretraining), "--last", "2", "--run-dir", str(tmp_path / "made")]) == 0
    assert main(["train", "--run-dir", str(tmp_path / "made")]) == 2  # not a run to go on training
    assert "an average of checkpoints, not a training run" in capsys.readouterr().err
