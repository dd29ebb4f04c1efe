"""Choose the default NFCorpus recipe on NFCorpus **dev** (never test).

Runs ``train.py`` once per recipe with validation on NFCorpus dev only (no test sets, no references),
reads the per-epoch dev nDCG@10 from each run's CSV log, and writes a Markdown table to
``experiments/results/nfcorpus_recipe_search.md``. The zero-shot dev number of the starting model is
measured by ``evaluate.py`` on the same dev set.

    python experiments/nfcorpus_recipe_search.py            # all recipes below
    python experiments/nfcorpus_recipe_search.py r2 r4      # some of them

Each recipe is a list of Hydra overrides on top of the default ``make train`` configuration
(``loss=lsepair data=nfcorpus_hetero model=minilm``).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "outputs" / "recipe_search"
RESULTS = REPO / "experiments" / "results" / "nfcorpus_recipe_search.md"
DEV_ONLY = ["~eval.test_sets.nfcorpus_test", "~eval.test_sets.trec_dl19", "~eval.test_sets.trec_dl20",
            "eval.references=false", "trainer.enable_progress_bar=false"]
# one epoch of the default configuration takes ~10 min on 2 CPU cores (58 steps of ~10 s) + ~1.5 min validation

RECIPES: dict[str, list[str]] = {
    "a": ["optim.lr=1e-5", "trainer.max_epochs=1"],
    "b": ["optim.lr=5e-6", "trainer.max_epochs=1"],
    "c": ["optim.lr=2e-5", "trainer.max_epochs=1"],
}


def dev_curve(run_dir: Path) -> list[float]:
    """Dev nDCG@10 after each epoch, from the run's CSV log."""
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    return [float(r["val/ndcg@10"]) for r in rows if r.get("val/ndcg@10")]


def run(name: str, overrides: list[str]) -> dict:
    run_dir = OUT / name
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *DEV_ONLY, *overrides]
    subprocess.run(cmd, cwd=REPO, check=True)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"name": name, "overrides": " ".join(overrides), "dev_per_epoch": dev_curve(run_dir),
            "dev_kept": metrics["nfcorpus_dev"]["ndcg@10"]}


def main(names: list[str]) -> None:
    rows = [run(n, RECIPES[n]) for n in (names or list(RECIPES))]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    lines = ["| recipe | overrides | dev nDCG@10 per epoch | kept checkpoint dev nDCG@10 |", "|---|---|---|---|"]
    for r in rows:
        curve = ", ".join(f"{v:.4f}" for v in r["dev_per_epoch"])
        lines.append(f"| {r['name']} | `{r['overrides']}` | {curve} | {r['dev_kept']:.4f} |")
    with RESULTS.open("a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
