"""bench/bench_plan.py reads the estimate the plan prints: the two must keep one format."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from multipos.runs import plan, speed

REPO = Path(__file__).resolve().parents[1]


def _bench():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_plan", REPO / "bench" / "bench_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_reads_the_minutes_the_plan_prints():
    job = speed.Job(model="m", corpora=(speed.Corpus("nfcorpus", ("a passage",) * 3000, 256),), train_queries=2500,
                    batch_size=64, query_max_length=32, epochs=9, seeds=3, dev_queries=300, test_queries=300)
    rate = speed.Speed(passages_per_s={"nfcorpus": 50.0}, step_s=0.5, queries_per_s=200.0, precision="fp32",
                       measured_at="2026-12-02 10:00", measuring_s=12.0)
    prediction = speed.predict(job, rate)
    line = f"  expected wall time: {plan.describe_estimate(prediction, rate, job, warm=False)}"
    assert _bench().predicted_minutes(f"make train: ...\n{line}\n") == round(prediction["total"] / 60)
    assert _bench().predicted_minutes("no plan here") is None
