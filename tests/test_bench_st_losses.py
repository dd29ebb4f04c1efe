"""bench/bench_st_losses.py --resume reuses a model only when its line matches the run's settings and machine."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_bench


def _bench():
    return load_bench("bench/bench_st_losses.py", "bench_st_losses")


def test_resume_reuses_matching_models_only(tmp_path):
    bench = _bench()
    base = {"cpu": "AMD EPYC", "batch": 32, "group": 8, "epochs": 1, "train_queries": 542, "precision": "fp32"}
    lines = [{**base, "bench": "st_losses", "side": "mnrl", "seed": 42, "time": "t1", "ndcg@10": 0.31},
             {**base, "bench": "st_losses", "side": "mnrl", "seed": 42, "time": "t2", "ndcg@10": 0.32},
             {**base, "bench": "st_losses", "side": "jointlh", "seed": 42, "time": "t3", "epochs": 3},
             {**base, "bench": "st_losses", "side": "lsepair", "seed": 42, "time": "t4", "cpu": "Intel Xeon"},
             {**base, "bench": "st_losses_summary", "side": "lsepair", "seed": 43}]
    out = tmp_path / "st.jsonl"
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = bench.finished_models(out, base)
    assert list(found) == [("mnrl", 42)] and found["mnrl", 42]["time"] == "t2"
    assert bench.finished_models(tmp_path / "none.jsonl", base) == {}
    out.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"st\.jsonl:1: not a JSON line"):
        bench.finished_models(out, base)
