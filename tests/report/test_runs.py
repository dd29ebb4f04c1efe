"""Tests for multipos.report.runs: loading run directories and sweeps."""

from __future__ import annotations

import pytest

from multipos.report import collect, load_run, row_label
from tests.report.fakes import EXPECTED_MD, SET, make_run, qmap


def test_load_run_reads_config_without_resolving_interpolations(tmp_path):
    d = make_run(tmp_path, "run", "lsepair_maxp", {SET: {"ndcg@10": qmap([0.5, 0.7])}}, G=16, M=2, seed=7)
    run = load_run(d)
    assert run.objective == "lsepair_maxp"
    assert run.config["data.group_size"] == 16 and run.config["data.max_positives"] == 2
    assert run.config["seed"] == 7 and run.config["data.positive_selection"] == "first"
    assert run.metrics[SET]["ndcg@10"] == pytest.approx(0.6)
    assert run.per_query[SET]["ndcg@10"]["q001"] == 0.7
    assert run.overrides == ["loss=lsepair_maxp", "data.group_size=16"]
    assert run.get("data.tokenizer") == "${model.name_or_path}"  # raw, unresolved
    assert row_label(run, "G,M") == "G=16,M=2"
    assert row_label(run, "objective,data.max_positives,seed") == "lsepair_maxp,M=2,seed=7"
    with pytest.raises(ValueError, match="no config key 'data.nope'"):
        row_label(run, "data.nope")


def test_the_regime_is_read_from_the_stage_plan_of_old_and_new_runs(tmp_path):
    """A run's regime is its stages' (``homogeneous then gold`` for the curriculum); a run from before the regime
    group kept it in ``data.regime`` and its single stage interpolated it; an evaluation has none; an objective that
    trained the evaluated model (``objective``, Table 3) is the run's objective."""
    stages = "stages:\n  main:\n    regime: heterogeneous\n"
    old = make_run(tmp_path, "old", "jointlh", {SET: {"ndcg@10": qmap([0.5])}}, extra_config="")
    text = (old / ".hydra" / "config.yaml").read_text().replace(stages, "")
    (old / ".hydra" / "config.yaml").write_text(
        text.replace("data:\n", "data:\n  regime: homogeneous\n", 1) + "stages:\n  main:\n    regime: ${data.regime}\n")
    assert load_run(old).config["regime"] == "homogeneous" and load_run(old).get("regime") == "homogeneous"
    new = make_run(tmp_path, "new", "jointlh", {SET: {"ndcg@10": qmap([0.5])}})
    config = new / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace(
        stages, "stages:\n  silver:\n    regime: homogeneous\n  gold:\n    regime: gold\n"))
    assert load_run(new).config["regime"] == "homogeneous then gold"
    evaluated = make_run(tmp_path, "evaluated", "x", {SET: {"ndcg@10": qmap([0.5])}}, overrides=["objective=summarglh"])
    config = evaluated / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace(stages, "").replace("  name: x\n", "  name: null\n")
                      + "objective: summarglh\n")
    run = load_run(evaluated)
    assert run.config["regime"] is None and run.objective == "summarglh"


def test_collect_finds_runs_in_sweep_dir(sweep, tmp_path):
    runs = collect([sweep])
    assert sorted(r.objective for r in runs) == sorted(EXPECTED_MD)
    assert [r.path for r in runs] == sorted(r.path for r in runs)  # deterministic order
    # the same runs reached twice (sweep + one of its run dirs) are loaded once
    one = next(r.path for r in runs if r.objective == "jointlh")
    again = collect([one, sweep])
    assert len(again) == 6 and again[0].path == one
    assert collect([one])[0].objective == "jointlh"


def test_errors_name_the_path(tmp_path, sweep):
    empty = tmp_path / "empty_run"
    (empty / ".hydra").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"empty_run/metrics\.json: not found"):
        load_run(empty)
    with pytest.raises(FileNotFoundError, match="empty_run: no metrics.json found"):
        collect([empty])
    with pytest.raises(FileNotFoundError, match="does_not_exist: no such run"):
        collect([tmp_path / "does_not_exist"])
    d = make_run(tmp_path, "no_pq", "singlelh", metrics={SET: {"ndcg@10": 0.5}, "trec_dl19": {"ndcg@10": 0.6}})
    with pytest.raises(FileNotFoundError, match=r"no_pq/per_query\.trec_dl19\.json: per-query file missing"):
        load_run(d, sets=["trec_dl19"], metrics=["ndcg@10"])
    lenient = load_run(d, sets=["trec_dl19"], metrics=["ndcg@10"], require_per_query=False)
    assert lenient.value("trec_dl19", "ndcg@10") == 0.6
    with pytest.raises(ValueError, match=r"no_pq/metrics\.json: no eval set 'trec_dl20'"):
        load_run(d, sets=["trec_dl20"], require_per_query=False)
    (d / "metrics.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"no_pq/metrics\.json: invalid JSON"):
        load_run(d)
