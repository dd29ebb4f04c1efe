"""Hand-built run directories for the multipos.report tests (no training, no assets)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

SET = "nfcorpus_test"
N = 40  # queries
CONFIG = """\
data:
  name: {data}
  group_size: {G}
  max_positives: {M}
  positive_selection: first
  tokenizer: ${{model.name_or_path}}
  source:
    teacher: ${{model.name_or_path}}
model:
  name_or_path: all-MiniLM-L6-v2
loss:
  _target_: multipos.losses.ContrastiveLoss
  name: {objective}
stages:
  main:
    regime: heterogeneous
seed: {seed}
paths:
  output_dir: ${{hydra:runtime.output_dir}}
"""


def make_run(root: Path, name: str, objective: str, per_query: dict[str, dict[str, dict[str, float]]] | None = None,
             metrics: dict | None = None, refs: dict | None = None, G: int = 8, M: int = 4, seed: int = 42,
             data: str = "nfcorpus_hetero", extra_config: str = "", overrides: list[str] | None = None,
             run_info: dict | None = None) -> Path:
    """A fake finished run: metrics.json (= per-query means unless given), per_query.<set>.json, .hydra/.

    ``extra_config``: YAML appended to ``.hydra/config.yaml`` (e.g. a ``report:`` node); ``overrides``:
    the lines of ``.hydra/overrides.yaml`` (default: ``loss=…``, ``data.group_size=…``); ``run_info``:
    written as ``run_info.json`` (default ``{"status": "complete"}``: a finished run,
    :func:`multipos.runs.folder.is_finished`)."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    per_query = per_query or {}
    if metrics is None:
        metrics = {s: {m: float(np.mean(list(v.values()))) for m, v in pq.items()} for s, pq in per_query.items()}
    (d / "metrics.json").write_text(json.dumps(metrics))
    for s, pq in per_query.items():
        (d / f"per_query.{s}.json").write_text(json.dumps(pq))
    if refs is not None:
        (d / "references.json").write_text(json.dumps(refs))
    (d / "run_info.json").write_text(json.dumps({"status": "complete"} if run_info is None else run_info))
    cfg = CONFIG.format(data=data, G=G, M=M, objective=objective, seed=seed) + extra_config
    (d / ".hydra" / "config.yaml").write_text(cfg)
    overrides = [f"loss={objective}", f"data.group_size={G}"] if overrides is None else overrides
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return d


def qmap(values) -> dict[str, float]:
    return {f"q{i:03d}": float(v) for i, v in enumerate(values)}


def scenario_values() -> dict[str, np.ndarray]:
    """Per-query nDCG@10 crafted for known significance outcomes (n=40, alpha=0.05)."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, N)

    def noise(scale=0.01):
        e = rng.normal(0, scale, N)
        return e - e.mean()

    alt = np.tile([0.01, -0.01], N // 2)  # zero-mean wiggle: t = 0 against the run it is added to
    rand1lh = base + 0.05 + noise()
    return {
        "singlelh": base,
        "rand1lh": rand1lh,                       # + vs SingleLH
        "jointlh": base + 0.02 + noise(),         # + vs SingleLH, ♦ vs Rand1LH
        "lsepair": rand1lh + alt,                 # + vs SingleLH, same mean as Rand1LH → no ♣/♦
        "summarglh": base + alt,                  # same mean as SingleLH → no +/-, ♦ vs Rand1LH
        "recontriever": base - 0.03 + noise(),    # - vs SingleLH, ♦ vs Rand1LH
    }


EXPECTED_MD = {"singlelh": "♦", "rand1lh": "+", "jointlh": "+♦", "lsepair": "+", "summarglh": "♦",
               "recontriever": "-♦"}
REFS = {"bm25": {SET: {"ndcg@10": 0.9, "mrr@10": 0.1}}, "zero-shot": {SET: {"ndcg@10": 0.3}}}


def md_rows(md: str) -> dict[str, list[str]]:
    out = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("|:"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0]] = cells[1:]
    return out


def unstyled(cell: str) -> str:
    return re.sub(r"\*\*|</?u>|\\textbf\{|\\underline\{|\}(?=\$|$)", "", cell)


AVG = "beir_average"  # an average over sets: in metrics.json, no per_query.<set>.json
QRELS_VIEW = "hybrid_annotation.gold"
COLUMNS = [("nq_test", "acc@20"), ("nq_test", "acc@100"), ("msmarco_dev", "mrr@10"), ("msmarco_dev", "recall@1000"),
           (QRELS_VIEW, "ndcg@10"), (AVG, "ndcg@10")]
# best / second best of the average column differ from the per-query columns (rand1lh = lsepair best, jointlh second)
AVG_VALUES = {"singlelh": 0.45, "rand1lh": 0.40, "jointlh": 0.47, "lsepair": 0.47, "summarglh": 0.30,
              "recontriever": 0.20}
MIXED_REFS = {"bm25": {"nq_test": {"acc@20": 0.6, "acc@100": 0.75},
                       "msmarco_dev": {"mrr@10": 0.18, "recall@1000": 0.86}},
              "zero-shot": {"nq_test": {"acc@20": 0.5}, AVG: {"ndcg@10": 0.41}}}


SEEDS = (1, 2)


def seeded_values() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-query nDCG@10 of two seeds per objective (n=40), crafted so that the seed convention matters.

    Each seed of jointlh is the SingleLH level + 0.01 plus a large seed-specific term (±``big``, sd 0.2)
    that cancels in the mean over the two seeds: on per-query means over seeds jointlh is significantly
    better than singlelh and rand1lh, while one seed alone, or both seeds pooled as 80 pairs, is not.
    rand1lh's per-query means differ from singlelh's by a zero-mean ±0.01 wiggle (t = 0: no marker).
    """
    rng = np.random.default_rng(1)
    base = rng.uniform(0.3, 0.6, N)
    big, big2 = rng.normal(0, 0.2, N), rng.normal(0, 0.2, N)
    a, f = rng.normal(0, 0.01, N), rng.normal(0, 0.003, N)
    alt = np.tile([0.01, -0.01], N // 2)
    return {
        "singlelh": (base + a, base - a),
        "rand1lh": (base + big2 + alt, base - big2 + alt),
        "jointlh": (base + 0.01 + big + f, base + 0.01 - big + f),
    }
