"""Real-data smoke test: the `train.py` CLI for a few steps on a slice of NFCorpus with the MiniLM
assets, then evaluation (BM25, zero-shot and fine-tuned) on a slice of NFCorpus test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.assets
def test_train_cli_on_nfcorpus_slice(assets, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "experiment=base", "loss=lsepair", "data=nfcorpus", "regime=heterogeneous",
           f"hydra.run.dir={out}",
           "data.source.max_queries=40", "data.source.ordering=given", "data.batch_size=4", "data.group_size=4",
           "data.max_positives=2", "trainer.max_steps=2", "trainer.log_every_n_steps=1",
           "trainer.enable_progress_bar=false", "eval=nfcorpus_test", "eval.passage_max_length=128",
           "eval.validation={_target_: multipos.evaluation.sets.EvalSet, name: nfcorpus_dev, path: nfcorpus, "
           "split: dev, metrics: [ndcg@10], max_queries: 8, max_passages: 200}",
           "eval.test_sets.nfcorpus_test.max_queries=8", "eval.test_sets.nfcorpus_test.max_passages=200"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MULTIPOS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    refs = json.loads((out / "references.json").read_text())
    test = metrics["nfcorpus_test"]
    assert set(test) >= {"ndcg@10", "mrr@10", "recall@100", "recall@1000"}
    # MiniLM is a strong retriever: after 2 small steps it still ranks relevant abstracts on this slice.
    assert test["ndcg@10"] > 0.2
    assert refs["zero-shot"]["nfcorpus_test"]["ndcg@10"] > 0.2
    assert refs["bm25"]["nfcorpus_test"]["ndcg@10"] > 0.1
    assert (out / "run.nfcorpus_test.trec").is_file() and (out / "model" / "config.json").is_file()
    assert "this run" in proc.stdout and "zero-shot" in proc.stdout and "bm25" in proc.stdout


@pytest.mark.assets
def test_evaluate_cli_several_sets_then_rescore_its_run(assets, tmp_path):
    """`evaluate.py eval=a,b` on the MiniLM checkpoint over slices of NFCorpus test and the hybrid-annotation
    view set; re-scoring the written TREC run with `run_file=` reproduces the same numbers."""
    out = tmp_path / "eval"
    slice_ = [f"eval.test_sets.{s}.{k}={v}" for s in ("nfcorpus_test", "hybrid_annotation")
              for k, v in (("max_queries", 8), ("max_passages", 200))]
    cmd = [sys.executable, "evaluate.py", "eval=nfcorpus_test,hybrid_annotation", f"hydra.run.dir={out}",
           "eval.passage_max_length=128", "eval.references=true", *slice_]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MULTIPOS_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics) == ["nfcorpus_test", "hybrid_annotation", "hybrid_annotation.gold", "hybrid_annotation.silver"]
    assert metrics["nfcorpus_test"]["ndcg@10"] > 0.2
    assert set(json.loads((out / "references.json").read_text())["bm25"]) == set(metrics)
    for name in metrics:
        assert (out / f"per_query.{name}.json").is_file()

    rescored = tmp_path / "rescored"
    cmd = [sys.executable, "evaluate.py", "eval=nfcorpus_test", f"run_file={out / 'run.nfcorpus_test.trec'}",
           f"hydra.run.dir={rescored}", *slice_[:2]]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((rescored / "metrics.json").read_text())["nfcorpus_test"]
    assert again == pytest.approx(metrics["nfcorpus_test"], abs=1e-6)
