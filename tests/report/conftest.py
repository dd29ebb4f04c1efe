"""Fixtures of the multipos.report tests: sweeps of fake finished runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from multipos.report import collect
from tests.report.fakes import AVG, AVG_VALUES, MIXED_REFS, QRELS_VIEW, REFS, SET, make_run, qmap, scenario_values


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A sweep dir with the six scenario runs at different depths, plus an unfinished run (no metrics)."""
    root = tmp_path / "multirun"
    vals = scenario_values()
    for i, (obj, v) in enumerate(vals.items()):
        sub = root / ("day1" if i % 2 else "day2")
        pq = {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(np.clip(v + 0.2, 0, 1))}}
        make_run(sub, f"{i}-loss={obj}", obj, pq, refs=REFS if obj == "singlelh" else None)
    (root / "day1" / "unfinished" / ".hydra").mkdir(parents=True)
    return root


@pytest.fixture
def runs(sweep):
    return {r.objective: r for r in collect([sweep])}


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Six runs with different metrics per set (NQ Acc@k, MS MARCO MRR@10 / R@1000, a qrels view) and a BEIR average.

    Every per-query column is a constant shift of the scenario values, so its markers are :data:`EXPECTED_MD`."""
    root = tmp_path / "mixed"
    for obj, v in scenario_values().items():
        pq = {"nq_test": {"acc@20": qmap(v), "acc@100": qmap(v + 0.3)},
              "msmarco_dev": {"mrr@10": qmap(v - 0.1), "recall@1000": qmap(v + 0.35)},
              QRELS_VIEW: {"ndcg@10": qmap(v)}}
        metrics = {s: {m: float(np.mean(list(q.values()))) for m, q in d.items()} for s, d in pq.items()}
        metrics[AVG] = {"ndcg@10": AVG_VALUES[obj]}
        make_run(root, f"run-{obj}", obj, pq, metrics=metrics, refs=MIXED_REFS if obj == "singlelh" else None)
    return root
