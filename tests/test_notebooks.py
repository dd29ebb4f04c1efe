"""Every notebook in ``notebooks/`` runs headless (nbclient) on a tiny sweep of two real runs on the fixtures, and
the run-log helpers behind them (``multipos.runs.find``, ``multipos.runs.logs``) read curriculum runs and pick the
newest run by its run info.

``MULTIPOS_NB_UPDATE=1 pytest tests/test_notebooks.py`` also writes the executed notebooks, with their outputs,
back to ``notebooks/`` (how the committed outputs were made).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from multipos.runs.find import find_runs, latest_run
from multipos.runs.logs import series, stage_logs, training_log
from multipos.train import train
from tests.helpers import REPO, compose_cfg, tiny_overrides

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = REPO / "notebooks"
REPORT = ("report={name: tiny_objectives, title: 'Objectives on the tiny fixture', row_key: objective, "
          "columns: ['tiny_test:ndcg@10', 'tiny_test:mrr@10'], "
          "plot: {kind: ratio_ablation, eval_set: tiny_test, metrics: ['ndcg@10']}}")
RUNS = {"lsepair": ["loss=lsepair", "data=nfcorpus", "regime=heterogeneous"],
        "jointlh_curriculum": ["loss=jointlh", "data=nfcorpus", "regime=curriculum"]}


@pytest.fixture(scope="module")
def tiny_sweep(tiny_beir, tiny_bert, tmp_path_factory) -> Path:
    """A sweep folder with two finished tiny runs (LSEPair single stage; JointLH then SingleLH curriculum), both
    logging gradient diagnostics every step, with the ``report`` node and ``.hydra/`` files a Hydra sweep writes."""
    sweep = tmp_path_factory.mktemp("multirun") / "tiny_objectives-cpu"
    for name, choice in RUNS.items():
        out = sweep / name
        overrides = [*choice, "callbacks=diagnostics", "callbacks.gradient_diagnostics.every_n_steps=1",
                     "experiment_name=tiny_objectives", REPORT]
        cfg = compose_cfg("train", [*overrides, *tiny_overrides(tiny_beir, tiny_bert, out), "eval.references=false",
                                    "trainer.max_epochs=3", "module.optimizer.lr=1e-3"])
        train(cfg)
        (out / ".hydra").mkdir(exist_ok=True)
        OmegaConf.save(cfg, out / ".hydra" / "config.yaml", resolve=True)
        (out / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in choice))
    return sweep


def execute(name: str, monkeypatch, **env: str):
    """Run ``notebooks/<name>`` in a fresh kernel (cwd ``notebooks/``) with the given environment variables; returns
    the executed notebook and the text of all its outputs. ``MULTIPOS_NB_UPDATE=1`` writes it back."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
                            ).execute()
    if os.environ.get("MULTIPOS_NB_UPDATE") == "1":
        nbformat.write(nb, NOTEBOOKS / name)
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", "")
                        + "".join(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/")))
    return nb, "\n".join(text)


def images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == ["gradient_analysis.ipynb", "inspect_run.ipynb",
                                                                 "results.ipynb"]


def test_gradient_analysis_notebook(tiny_sweep, monkeypatch):
    nb, text = execute("gradient_analysis.ipynb", monkeypatch, MULTIPOS_RUN=str(tiny_sweep / "lsepair"))
    diffs = [float(x) for x in re.findall(r"max \|difference\| ([0-9.e+-]+)", text)]
    assert len(diffs) == 3 and max(diffs) < 1e-9  # autograd = App. A closed forms for the three objectives
    assert "run lsepair:" in text and "diagnostics, logged at" in text
    assert images(nb) == 3  # per-positive bars, shares vs lead, the run's diagnostics


def test_inspect_run_notebook_reads_a_curriculum_run(tiny_sweep, monkeypatch):
    nb, text = execute("inspect_run.ipynb", monkeypatch, MULTIPOS_RUN=str(tiny_sweep / "jointlh_curriculum"))
    assert "run jointlh_curriculum: complete, 2 stage(s)" in text
    assert re.search(r"val/ndcg@10 per stage and epoch: \[\(1, 0, [0-9.]+\), \(1, 1, [0-9.]+\), \(1, 2, [0-9.]+\), "
                     r"\(2, 0, [0-9.]+\)\]", text)  # 3 silver epochs, then 1 gold epoch
    assert "per_query.tiny_test.json" in text and images(nb) == 1


def test_results_notebook_shows_the_sweep_table_and_figure(tiny_sweep, monkeypatch):
    nb, text = execute("results.ipynb", monkeypatch, MULTIPOS_SWEEP=str(tiny_sweep))
    assert "2 complete runs, 0 in progress; report tiny_objectives" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| lsepair") for line in table) and any(line.startswith("| jointlh") for line in table)
    assert images(nb) == 2  # the rendered figure and the bars


def test_training_log_joins_curriculum_stages(tiny_sweep):
    run = tiny_sweep / "jointlh_curriculum"
    assert [p.parent.name for p in stage_logs(run)] == ["stage1", "stage2"]
    log = training_log(run)
    steps, _ = series(log, "train/loss")
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # steps continue across stages
    assert {r["stage"] for r in log} == {1, 2}
    first_of_2 = min(r["global_step"] for r in log if r["stage"] == 2)
    assert first_of_2 > max(r["global_step"] for r in log if r["stage"] == 1)
    with pytest.raises(FileNotFoundError, match="logger=csv"):
        stage_logs(tiny_sweep)


def test_newest_run_is_chosen_by_run_info_not_by_name(tmp_path):
    for name, status, age in (("z-old", "complete", 100), ("a-new", "complete", 0), ("b-running", "running", -10)):
        d = tmp_path / name
        d.mkdir()
        (d / "run_info.json").write_text(json.dumps({"status": status}))
        (d / "metrics.json").write_text("{}")  # finished = status complete and metrics.json (multipos.runs.folder)
        stamp = time.time() - age
        os.utime(d / "run_info.json", (stamp, stamp))
    assert latest_run(tmp_path) == tmp_path / "a-new"
    assert find_runs(tmp_path, complete=False)[0] == tmp_path / "b-running"
    with pytest.raises(FileNotFoundError, match="no complete run"):
        latest_run(tmp_path / "missing")
