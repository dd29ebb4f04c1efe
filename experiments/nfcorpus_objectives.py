"""Compare objectives on NFCorpus with the default recipe, and render the paper-style table.

One ``train.py`` run per objective, everything else as ``make train`` (heterogeneous groups: one gold
positive first, then silver ones ordered by the starting model; G=8, M=4, B=16, 1 epoch, lr 2e-5,
seed 42), evaluated on NFCorpus test and on the ``hybrid_annotation`` views of the same queries
(gold-only = grade 2, silver-only = grade 1). TREC DL is left out to save time. The table comes from
``python -m multipos.report`` with its paired t-test markers (+/- vs SingleLH, ♣/♦ vs Rand1LH) and is
written to ``experiments/results/nfcorpus_objectives.md``.

    python experiments/nfcorpus_objectives.py                      # singlelh rand1lh lsepair
    python experiments/nfcorpus_objectives.py jointlh summarglh    # more objectives into the same table

A finished run (``metrics.json`` present) is not re-run. One run takes ~13 min on 2 CPU cores.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "outputs" / "nfcorpus_objectives"
RESULTS = REPO / "experiments" / "results" / "nfcorpus_objectives.md"
EVAL = ["~eval.test_sets.trec_dl19", "~eval.test_sets.trec_dl20",
        "+evalset@eval.test_sets.hybrid_annotation=hybrid_annotation", "trainer.enable_progress_bar=false"]
COLUMNS = ["nfcorpus_test:ndcg@10", "nfcorpus_test:mrr@10", "nfcorpus_test:recall@100",
           "hybrid_annotation.gold:ndcg@10", "hybrid_annotation.gold:recall@100",
           "hybrid_annotation.silver:ndcg@10", "hybrid_annotation.silver:recall@100"]
DEFAULT = ["singlelh", "rand1lh", "lsepair"]


def train(objective: str) -> Path:
    run_dir = OUT / objective
    if not (run_dir / "metrics.json").is_file():
        cmd = [sys.executable, "train.py", f"loss={objective}", "data=nfcorpus_hetero", "model=minilm",
               f"hydra.run.dir={run_dir}", *EVAL]
        subprocess.run(cmd, cwd=REPO, check=True)
    return run_dir


def table() -> str:
    cmd = [sys.executable, "-m", "multipos.report", str(OUT), "--table", "NFCorpus test, objectives (heterogeneous, G=8, M=4)",
           "--columns", *COLUMNS, "--format", "both", "--out", str(RESULTS)]
    return subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout


if __name__ == "__main__":
    for objective in sys.argv[1:] or DEFAULT:
        train(objective)
    print(table())
