"""notebooks/quickstart.ipynb, executed end to end by a Jupyter kernel of this interpreter:
40 steps of a smaller model on the real corpus (QUICKSTART_STEPS: the notebook's own 2,000 would
take minutes), then every plot, the accuracy against the baseline and the [MASK] answers."""

import json
import math
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from trainformer.images import find_cjk_font

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"
STEPS = 40
SMALL = ("model.d_model=32 model.num_layers=1 model.num_heads=2 model.dff=64 data.seq_len=32 "
         "train.batch_size=16 data.valid_fraction=0.01 train.precision=fp32")  # cli_helpers.TINY's reasons
# Appended to the notebook for the test only: what the kernel computed, as one JSON line.
PROBE = """print(json.dumps({"executable": sys.executable, "losses": [r["loss"] for r in train],
                  "steps": [r["step"] for r in train], "answers": answers, "encoding_shape": encoding.shape}))"""


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def stream_text(cell, name: str | None = None) -> str:
    """What the cell printed: stdout and stderr, or only the stream called name."""
    return "".join(output.get("text", "") for output in cell.outputs
                   if output.output_type == "stream" and name in (None, output.get("name")))


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert all(not cell.outputs and cell.execution_count is None for cell in code_cells(notebook))


def test_quickstart_runs_and_shows_real_results(tmp_path, monkeypatch, vocab_dir):
    run_dir = tmp_path / "quickstart"
    monkeypatch.setenv("QUICKSTART_STEPS", str(STEPS))
    monkeypatch.setenv("QUICKSTART_RUN_DIR", str(run_dir))
    monkeypatch.setenv("QUICKSTART_SET", f"{SMALL} tokenizer.vocab_file={vocab_dir / 'vocab.txt'}")  # the session's
    monkeypatch.setenv("QUICKSTART_DEFAULT_RUN", str(tmp_path / "no-default-run"))  # so it trains its own
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    probe = nbformat.v4.new_code_cell(PROBE)
    notebook.cells.append(probe)
    train_cell = next(cell for cell in code_cells(notebook) if "subprocess.Popen" in cell.source)
    # Then the training cell again with the finished run as the default run: used as it is.
    again = nbformat.v4.new_code_cell("DEFAULT_RUN = RUN_DIR\n" + train_cell.source)

    # kernel "python3": jupyter_client starts it with sys.executable (the probe checks it)
    client = NotebookClient(notebook, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        notebook.cells.append(again)
        client.execute_cell(again, len(notebook.cells) - 1)

    cells = code_cells(notebook)
    assert f"step {STEPS}/{STEPS}" in stream_text(train_cell)  # the CLI's own progress lines
    assert (run_dir / "checkpoints" / "checkpoint").is_file()
    assert stream_text(again, "stdout").strip() == f"{run_dir} is a finished default run: nothing to train here"

    plots = [cell for cell in cells if "plt.show()" in cell.source]
    assert len(plots) == 3  # loss and accuracy, positional encoding, attention
    for cell in plots:
        assert any("image/png" in output.get("data", {}) for output in cell.outputs), cell.source[:60]
    manifest = json.loads((run_dir / "manifest.json").read_text())["final_eval"]
    assert (f"held-out masked accuracy {manifest['masked_accuracy']:.2%}, most-frequent-token baseline "
            f"{manifest['baseline_accuracy']:.2%}") in stream_text(plots[0])

    result = json.loads(stream_text(probe, "stdout"))
    assert Path(result["executable"]).resolve() == Path(sys.executable).resolve()
    assert result["steps"] == list(range(2, STEPS + 1, 2))  # log_every = STEPS // 20
    assert all(math.isfinite(loss) for loss in result["losses"]) and result["losses"][-1] < result["losses"][0]
    assert result["encoding_shape"] == [32, 32]  # (seq_len, d_model) of the run
    vocab = (run_dir / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    check_attention_labels(stream_text(plots[2], "stdout"), vocab)

    first = result["answers"][0]
    assert first["text"] == "今天[MASK]气很好" and len(first["masks"]) == 1
    candidates = first["masks"][0]
    assert len(candidates) == 5 and all(c["token"] and 0 < c["probability"] <= 1 for c in candidates)
    assert all(c["token"] in vocab for c in candidates)
    predict_cell = next(cell for cell in cells if "predictor(" in cell.source)
    assert all(c["token"] in stream_text(predict_cell) for c in candidates)


def check_attention_labels(text: str, vocab: list[str]) -> None:
    """The sentence is printed as tokens; where the picture can only show ids (no CJK font),
    one legend line per token says which token each id is."""
    lines = text.splitlines()
    tokens = lines[0].removeprefix("sentence: ").split(" ")
    assert lines[0].startswith("sentence: [CLS]") and all(token in vocab for token in tokens)
    if find_cjk_font() is None:
        legend = [line.split() for line in lines[2:]]
        assert [(int(i), token) for i, token in legend] == [(vocab.index(token), token) for token in tokens]
    else:
        assert len(lines) == 1
