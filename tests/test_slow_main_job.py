"""train.py's default job end to end (two-tower LSEPair on heterogeneous NFCorpus groups with all-MiniLM-L6-v2, the
config with no experiment; `make train` runs the query-side recipe instead). `make test-slow` (this test and the slow
GradCache DDP case) took 11.0 min on the 2-core AMD EPYC (2026-11-26)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.assets
def test_default_main_job(assets, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "experiment=base", "loss=lsepair", "data=nfcorpus", "regime=heterogeneous",
           "model=minilm", f"hydra.run.dir={out}", "trainer.enable_progress_bar=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3 * 3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    refs = json.loads((out / "references.json").read_text())
    assert set(metrics) == {"nfcorpus_dev", "nfcorpus_test", "trec_dl19", "trec_dl20"}
    # independent references (BEIR / leaderboards): BM25 ~0.32, zero-shot MiniLM ~0.31-0.32 on NFCorpus test
    assert 0.28 < refs["bm25"]["nfcorpus_test"]["ndcg@10"] < 0.36
    assert 0.28 < refs["zero-shot"]["nfcorpus_test"]["ndcg@10"] < 0.36
    # fine-tuning must not break the retriever
    assert metrics["nfcorpus_test"]["ndcg@10"] > refs["zero-shot"]["nfcorpus_test"]["ndcg@10"] - 0.02
    assert (out / "model" / "model.safetensors").is_file()
