"""notebooks/quickstart.ipynb, executed end to end by a Jupyter kernel of this interpreter:
40 steps of a smaller model on the real corpus, then every plot and the [MASK] answers."""

import json
import math
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"
STEPS = 40
SMALL = ("model.d_model=32 model.num_layers=1 model.num_heads=2 model.dff=64 data.seq_len=32 "
         "train.batch_size=16")
# Appended to the notebook for the test only: what the kernel computed, as one JSON line.
PROBE = """print(json.dumps({"executable": sys.executable, "losses": [r["loss"] for r in train],
                  "steps": [r["step"] for r in train], "answers": answers, "encoding_shape": encoding.shape}))"""


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def stream_text(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert all(not cell.outputs and cell.execution_count is None for cell in code_cells(notebook))


def test_quickstart_runs_and_shows_real_results(tmp_path, monkeypatch):
    run_dir = tmp_path / "quickstart"
    monkeypatch.setenv("QUICKSTART_STEPS", str(STEPS))
    monkeypatch.setenv("QUICKSTART_RUN_DIR", str(run_dir))
    monkeypatch.setenv("QUICKSTART_SET", SMALL)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))

    # kernel "python3": jupyter_client starts it with sys.executable (the probe checks it)
    NotebookClient(notebook, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    cells = code_cells(notebook)
    train_cell = next(cell for cell in cells if "subprocess.Popen" in cell.source)
    assert f"step {STEPS}/{STEPS}" in stream_text(train_cell)  # the CLI's own progress lines
    assert (run_dir / "checkpoints" / "checkpoint").is_file()

    plots = [cell for cell in cells if "plt.show()" in cell.source]
    assert len(plots) == 3  # loss, positional encoding, attention
    for cell in plots:
        assert any("image/png" in output.get("data", {}) for output in cell.outputs), cell.source[:60]

    result = json.loads(stream_text(cells[-1]))
    assert Path(result["executable"]).resolve() == Path(sys.executable).resolve()
    assert result["steps"] == list(range(1, STEPS + 1))  # log_every = 1 at 40 steps: the whole curve
    assert all(math.isfinite(loss) for loss in result["losses"]) and result["losses"][-1] < result["losses"][0]
    assert result["encoding_shape"] == [32, 32]  # (seq_len, d_model) of the run
    first = result["answers"][0]
    assert first["text"] == "今天[MASK]气很好" and len(first["masks"]) == 1
    candidates = first["masks"][0]
    assert len(candidates) == 5 and all(c["token"] and 0 < c["probability"] <= 1 for c in candidates)
    vocab = (run_dir / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert all(c["token"] in vocab for c in candidates)
    predict_cell = next(cell for cell in cells if "predictor(" in cell.source)
    assert all(c["token"] in stream_text(predict_cell) for c in candidates)
