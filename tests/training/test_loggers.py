"""W&B logging never blocks (offline when the server cannot be reached) and records the config, curves, final
metrics and a study's rendered table."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from multipos.report import render_sweep
from multipos.train import train
from multipos.training import loggers
from tests.helpers import compose_cfg, tiny_overrides
from tests.report.fakes import make_run, qmap

# wandb is a dependency (pyproject.toml); the lent GPU machine's image lacks it (docs/gpu.md)
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")


@needs_wandb
def test_wandb_logger_goes_offline_without_network(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(loggers, "wandb_reachable", lambda *a, **k: False)
    start = time.monotonic()
    logger = loggers.wandb_logger(project="multipos-test", name="t", save_dir=str(tmp_path))
    logger.log_metrics({"train/loss": 1.0}, step=0)
    logger.experiment.finish()
    assert time.monotonic() - start < 120
    assert logger._offline is True
    assert any((tmp_path / "wandb").glob("offline-run-*"))


def test_unreachable_host_is_detected_quickly():
    start = time.monotonic()
    assert loggers.wandb_reachable("127.0.0.1", port=9, timeout=1.0) is False
    assert time.monotonic() - start < 5


def _run_file(folder: Path, needles: tuple[bytes, ...], timeout: float = 60.0) -> bytes:
    """The bytes of the one offline run under ``folder/wandb`` (its ``.wandb`` file holds protobuf records: the
    config's JSON and the summary keys are stored as plain UTF-8 inside them), once every one of ``needles`` is in
    it or ``timeout`` seconds have passed.

    The file is written by W&B's service process, which may still be flushing it when ``run.finish()`` returns
    (CI once read only its 7-byte header), so the file is read again until the records are there."""
    runs = sorted((folder / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline run under {folder / 'wandb'}, found {runs}"
    files = list(runs[0].glob("run-*.wandb"))
    assert files, f"no .wandb file in {runs[0]}"
    deadline = time.monotonic() + timeout
    while True:
        data = files[0].read_bytes()
        if all(n in data for n in needles) or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


@needs_wandb
def test_wandb_run_holds_resolved_config_curves_and_test_metrics(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setattr(loggers, "wandb_reachable", lambda *a, **k: False)
    out = tmp_path / "run"
    cfg = compose_cfg("train", ["logger=wandb", "experiment_name=wandb_probe", "callbacks=diagnostics",
                                "callbacks.gradient_diagnostics.every_n_steps=1",
                                *tiny_overrides(tiny_beir, tiny_bert, out), "eval.references=false"])
    train(cfg)
    # resolved config (nested keys and an interpolated value), the group, curves and the final metrics per set
    needles = (b"negative_depth", b"max_positives", str(tiny_bert).encode(), b"wandb_probe", b"train/loss",
               b"val/ndcg@10", b"diag/lsepair/grad_share_top", b"test/tiny_test/ndcg@10", b"test/tiny_dev/ndcg@10")
    data = _run_file(out, needles)
    for needle in needles:
        assert needle in data, needle
    assert sys.modules["wandb"].run is None  # the run was finished: a sweep's next run starts its own


def test_markdown_rows_reads_the_rendered_table():
    md = ("Title\n\n| objective | set nDCG@10 |\n|:---|---:|\n| lsepair | **0.3208**♣ |\n| jointlh | 0.3039- |\n"
          "\nnotes\n")
    assert loggers.markdown_rows(md) == (["objective", "set nDCG@10"], [["lsepair", "**0.3208**♣"],
                                                                        ["jointlh", "0.3039-"]])
    with pytest.raises(ValueError, match="no Markdown table"):
        loggers.markdown_rows("no table here")


@needs_wandb
def test_render_logs_the_table_and_figure_to_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(loggers, "wandb_reachable", lambda *a, **k: False)
    sweep = tmp_path / "sweep"
    report = ("report:\n  name: probe_table\n  title: Probe\n  row_key: objective,G,M\n"
              "  columns: [nfcorpus_test:ndcg@10]\n"
              "  plot: {kind: ratio_ablation, eval_set: nfcorpus_test, metrics: [ndcg@10]}\n")
    for i, (obj, m) in enumerate([("lsepair", 2), ("lsepair", 4), ("jointlh", 2), ("jointlh", 4)]):
        pq = {"nfcorpus_test": {"ndcg@10": qmap([0.1 * (i + 1) + 0.01 * q for q in range(6)])}}
        make_run(sweep, f"run{i}", obj, pq, M=m, extra_config=report)
    md = render_sweep(sweep, out=tmp_path / "results", wandb_project="multipos-test")
    data = _run_file(sweep, (b"report/probe_table", b"report/probe_table_figure"))
    assert b"report/probe_table" in data and b"report/probe_table_figure" in data
    tables = list((sweep / "wandb").glob("offline-run-*/files/media/table/**/*.table.json"))
    assert tables, "the wandb.Table was not written"
    logged = json.loads(tables[0].read_text())
    assert logged["columns"] == loggers.markdown_rows(md)[0] and len(logged["data"]) == 4


def _rows(path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_kill_while_the_csv_header_is_rewritten_loses_no_row(tmp_path, monkeypatch):
    """A new metric name makes the writer rewrite ``metrics.csv``; killed before the new file takes the old one's
    place, the old file is whole, and the resumed writer appends to it."""
    import fsspec.implementations.local as local

    from multipos.training.loggers import _AppendingWriter

    writer = _AppendingWriter(str(tmp_path))
    for step in range(3):
        writer.log_metrics({"train/loss": 1.0 - step / 10}, step)
        writer.save()

    def killed(*_a, **_k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(local.LocalFileSystem, "mv", killed)
    writer.log_metrics({"val/ndcg@10": 0.3}, 2)
    with pytest.raises(KeyboardInterrupt):
        writer.save()
    monkeypatch.undo()
    assert [r["step"] for r in _rows(tmp_path / "metrics.csv")] == ["0", "1", "2"]

    resumed = _AppendingWriter(str(tmp_path))
    resumed.log_metrics({"train/loss": 0.5, "val/ndcg@10": 0.31}, 3)
    resumed.save()
    rows = _rows(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[0]["train/loss"] == "1.0" and rows[3]["val/ndcg@10"] == "0.31" and rows[0]["val/ndcg@10"] == ""


def test_a_row_cut_short_by_a_kill_is_dropped_when_the_csv_is_reopened(tmp_path):
    from multipos.training.loggers import _AppendingWriter

    writer = _AppendingWriter(str(tmp_path))
    for step in range(2):
        writer.log_metrics({"train/loss": 0.9}, step)
        writer.save()
    with open(tmp_path / "metrics.csv", "a", newline="") as f:
        f.write("2,0.8")  # killed half-way through the third row
    resumed = _AppendingWriter(str(tmp_path))
    assert resumed.metrics_keys == ["step", "train/loss"]
    resumed.log_metrics({"train/loss": 0.7}, 2)
    resumed.save()
    assert [(r["step"], r["train/loss"]) for r in _rows(tmp_path / "metrics.csv")] == [
        ("0", "0.9"), ("1", "0.9"), ("2", "0.7")]
