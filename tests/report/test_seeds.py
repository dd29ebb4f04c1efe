"""Tests for multipos.report.seeds: runs that differ only by seed form one row (mean ± std, per-query means)."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from multipos import report
from multipos.report import SeedGroup, collect, group_seeds, load_run, markers, render_table, row_label
from tests.report.fakes import SEEDS, SET, make_run, md_rows, qmap, seeded_values, unstyled


@pytest.fixture
def seeded(tmp_path) -> Path:
    """Two seeds of singlelh / rand1lh / jointlh (``seeded_values``), one folder per seed."""
    root = tmp_path / "seeded"
    for obj, per_seed in seeded_values().items():
        for seed, v in zip(SEEDS, per_seed):
            make_run(root / f"seed{seed}", obj, obj, {SET: {"ndcg@10": qmap(v)}}, seed=seed)
    return root


def _expected_marker(obj: str) -> str:
    """Markdown markers of ``obj`` computed here with scipy on the per-query means over seeds."""
    vals = seeded_values()
    mean = {o: (s1 + s2) / 2 for o, (s1, s2) in vals.items()}
    out = ""
    for base, (up, down) in (("singlelh", "+-"), ("rand1lh", "♣♦")):
        if base == obj:
            continue
        res = stats.ttest_rel(mean[obj], mean[base])
        if res.pvalue < 0.05:
            out += up if np.mean(mean[obj] - mean[base]) > 0 else down
    return out


def test_two_seeds_mean_std_and_markers_on_per_query_means(seeded):
    runs = collect([seeded])
    assert len(runs) == 6
    md = render_table(runs, [SET], ["ndcg@10"], references=False)
    rows = md_rows(md)
    assert list(rows) == ["objective", "singlelh", "rand1lh", "jointlh"]  # one row per objective
    for obj, per_seed in seeded_values().items():
        seed_means = [float(np.mean(v)) for v in per_seed]  # metrics.json of each seed
        mean, std = float(np.mean(seed_means)), float(np.std(seed_means, ddof=1))
        assert unstyled(rows[obj][0]) == f"{mean:.4f}{_expected_marker(obj)} ± {std:.4f}", obj
    assert {o: _expected_marker(o) for o in seeded_values()} == {"singlelh": "", "rand1lh": "", "jointlh": "+♣"}
    # best / second best on the displayed means
    means = {o: np.mean([np.mean(v) for v in vs]) for o, vs in seeded_values().items()}
    best = max(means, key=means.get)
    assert rows[best][0].startswith("**") and sum(r[0].startswith("**") for r in rows.values()) == 1
    assert "mean ± sample standard deviation over 2 seeds" in md
    assert "(two-sided paired t-test over queries on per-query means over seeds, p < 0.05)" in md
    # the convention matters for this data: one seed alone, or the seeds pooled as pairs, is not significant
    vals = seeded_values()
    assert stats.ttest_rel(vals["jointlh"][0], vals["singlelh"][0]).pvalue > 0.05
    pooled = stats.ttest_rel(np.concatenate(vals["jointlh"]), np.concatenate(vals["singlelh"]))
    assert pooled.pvalue > 0.05
    assert stats.ttest_rel(sum(vals["jointlh"]) / 2, sum(vals["singlelh"]) / 2).pvalue < 1e-6


def test_rows_with_fewer_seeds_are_named_in_the_note(seeded):
    """A study whose rows have different numbers of seeds (two_tower_objectives: SumMargLH two, the others three)
    says which rows have fewer, instead of a range that names none."""
    runs = [r for r in collect([seeded]) if not (r.objective == "jointlh" and r.config.get("seed") == 2)]
    md = render_table(runs, [SET], ["ndcg@10"], references=False)
    assert "mean ± sample standard deviation over 2 seeds (jointlh: 1)" in md
    tex = render_table(runs, [SET], ["ndcg@10"], fmt="latex", references=False, title="Seeds")
    assert r"mean $\pm$ sample standard deviation over 2 seeds (jointlh: 1)" in tex


def test_seed_group_values_and_query_means(seeded):
    groups = {g.objective: g for g in group_seeds(collect([seeded]))}
    j = groups["jointlh"]
    assert isinstance(j, SeedGroup) and j.n == 2 and sorted(j.seeds) == [1, 2]
    s1, s2 = seeded_values()["jointlh"]
    q = j.query_values(SET, "ndcg@10")
    assert q == pytest.approx(qmap((s1 + s2) / 2), abs=1e-15)
    per_seed = [r.value(SET, "ndcg@10") for r in j.runs]
    assert j.value(SET, "ndcg@10") == pytest.approx(sum(per_seed) / 2, abs=1e-15)
    assert j.std(SET, "ndcg@10") == pytest.approx(statistics.stdev(per_seed), abs=1e-15)
    assert j.get("seed") == (1, 2) and j.get("G") == 8
    # markers() accepts rows: the same symbols as the table
    assert markers(j, groups["singlelh"], groups["rand1lh"], SET, "ndcg@10") == "+♣"
    # a single-seed row is its run: same value, same per-query dict, no std
    one = SeedGroup([j.runs[0]])
    assert one.value(SET, "ndcg@10") == j.runs[0].value(SET, "ndcg@10") and one.std(SET, "ndcg@10") is None
    assert one.query_values(SET, "ndcg@10") is j.runs[0].query_values(SET, "ndcg@10")


def test_latex_cells_with_std(seeded):
    tex = render_table(collect([seeded]), [SET], ["ndcg@10"], fmt="latex", references=False, title="Seeds")
    row = {line.split(" & ")[0]: line.removesuffix(r" \\").split(" & ")[1]
           for line in tex.splitlines() if " & " in line}
    s1, s2 = (float(np.mean(v)) for v in seeded_values()["jointlh"])
    mean, std = (s1 + s2) / 2, float(np.std([s1, s2], ddof=1))
    cell = row["jointlh"]
    assert cell == rf"\textbf{{{mean:.4f}}}$^{{+\clubsuit}}_{{\pm {std:.4f}}}$"  # jointlh has the best mean
    assert "$$" not in tex  # markers and std share one math group
    s1, s2 = (float(np.mean(v)) for v in seeded_values()["singlelh"])
    assert row["singlelh"].endswith(rf"$_{{\pm {float(np.std([s1, s2], ddof=1)):.4f}}}$")
    assert r"mean $\pm$ sample standard deviation over 2 seeds" in tex


def test_grouping_rules(tmp_path, seeded):
    pq = {SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}}
    a = load_run(make_run(tmp_path, "a", "jointlh", pq, seed=1))
    b = load_run(make_run(tmp_path, "b", "jointlh", pq, seed=2))
    other_g = load_run(make_run(tmp_path, "c", "jointlh", pq, seed=3, G=16))
    assert [g.runs for g in group_seeds([a, other_g, b])] == [[a, b], [other_g]]  # G differs → its own row
    dup = load_run(make_run(tmp_path, "dup", "jointlh", pq, seed=1))
    with pytest.raises(ValueError, match=r"a and .*dup have the same configuration and seed \(1\)"):
        group_seeds([a, dup])
    # runs without a Hydra config are never grouped
    bare = [load_run(make_run(tmp_path, n, "x", pq)) for n in ("bare1", "bare2")]
    for r in bare:
        r.raw_config = {}
    assert len(group_seeds(bare)) == 2
    # one row per run: aggregate=False, or a row_key naming the seed
    runs = collect([seeded])
    per_run = render_table(runs, [SET], ["ndcg@10"], aggregate=False, references=False)
    assert sum(line.startswith("| ") for line in per_run.splitlines()) == 1 + 6  # header + one row per run
    assert "±" not in per_run
    per_seed = md_rows(render_table(runs, [SET], ["ndcg@10"], row_key="objective,seed", references=False))
    assert sorted(per_seed)[:3] == ["jointlh,seed=1", "jointlh,seed=2", "objective,seed"]
    assert "±" not in "".join(c for cells in per_seed.values() for c in cells)
    assert not unstyled(per_seed["jointlh,seed=1"][0]).endswith(("+", "♣"))  # one seed alone: not significant
    singles = [SeedGroup([r]) for r in runs]  # per-run rows are compared with the same seed's baseline run
    j1 = next(r for r in singles if r.objective == "jointlh" and r.get("seed") == 1)
    assert report.resolve_baseline(j1, singles, "singlelh").get("seed") == 1
    assert row_label(group_seeds(runs)[0], "objective,G") == "jointlh,G=8"  # collect sorts: seed1/jointlh first


def test_runs_with_a_spec_are_grouped_by_it(tmp_path):
    """Runs with ``spec.json`` are seeds of one row when their specs agree but for the seed, whatever their configs
    say about logging; a spec field that differs makes two rows; ``init_from`` counts as the config writes it."""
    pq = {SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}}
    a = load_run(make_run(tmp_path, "a", "jointlh", pq, seed=1))
    b = load_run(make_run(tmp_path, "b", "jointlh", pq, seed=2))
    spec = {"seed": 1, "init_from": None, "model": {"pooling": "mean"}, "stages": [{"objective": "jointlh"}]}
    a.spec, b.spec = spec, {**spec, "seed": 2}
    a.raw_config.setdefault("trainer", {})["log_every_n_steps"] = 1
    b.raw_config.setdefault("trainer", {})["log_every_n_steps"] = 10
    assert [g.runs for g in group_seeds([a, b])] == [[a, b]]
    b.spec = {**b.spec, "model": {"pooling": "cls"}}
    assert len(group_seeds([a, b])) == 2
    a.spec, b.spec = {**spec, "init_from": "m/seed=1/model"}, {**spec, "seed": 2, "init_from": "m/seed=2/model"}
    assert len(group_seeds([a, b])) == 2
    a.raw_config["init_from"] = b.raw_config["init_from"] = "m/seed=${seed}/model"
    assert [g.runs for g in group_seeds([a, b])] == [[a, b]]


def test_evaluations_of_models_trained_with_other_objectives_are_other_rows(tmp_path):
    """Table 3's cells (evaluation specs: no stages) evaluate ``.../loss=${objective},seed=${seed}/model``: the seeds
    of one objective make one row, each objective its own row."""
    pq = {SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}}
    spec = {"seed": None, "init_from": None, "model": {"pooling": "mean"}, "stages": []}
    runs = []
    for objective in ("singlelh", "jointlh"):
        for seed in (1, 2):
            run = load_run(make_run(tmp_path, f"{objective}{seed}", "x", pq, seed=seed,
                                    overrides=[f"objective={objective}", f"seed={seed}"]))
            run.objective = objective
            run.spec = {**spec, "init_from": f"t2/loss={objective},seed={seed}/model"}
            run.raw_config["init_from"] = "t2/loss=${objective},seed=${seed}/model"
            runs.append(run)
    rows = [[r.name for r in g.runs] for g in group_seeds(runs)]
    assert rows == [["singlelh1", "singlelh2"], ["jointlh1", "jointlh2"]]


def test_seeds_must_cover_the_same_queries(tmp_path):
    s = [load_run(make_run(tmp_path / f"s{i}", "s", "singlelh", {SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}}, seed=i))
         for i in (1, 2)]
    j1 = load_run(make_run(tmp_path / "j1", "j", "jointlh", {SET: {"ndcg@10": qmap([0.2, 0.3, 0.4])}}, seed=1))
    j2 = load_run(make_run(tmp_path / "j2", "j", "jointlh", {SET: {"ndcg@10": qmap([0.2, 0.3])}}, seed=2))
    with pytest.raises(ValueError, match=r"seeds of one row cover different queries: .*j1/j has 3, .*j2/j has 2"):
        render_table([*s, j1, j2], [SET], ["ndcg@10"])


def test_baseline_rows_match_on_everything_but_seed(tmp_path):
    v = np.linspace(0.2, 0.6, 20)
    pq = lambda x: {SET: {"ndcg@10": qmap(x)}}  # noqa: E731
    runs = []
    for seed in (1, 2):
        runs.append(load_run(make_run(tmp_path / f"s{seed}", "single8", "singlelh", pq(v), G=8, seed=seed)))
        runs.append(load_run(make_run(tmp_path / f"s{seed}", "single16", "singlelh", pq(v + 0.2), G=16, seed=seed)))
        runs.append(load_run(make_run(tmp_path / f"s{seed}", "joint8", "jointlh", pq(v + 0.01 + 0.001 * seed), G=8,
                                      seed=seed)))
        runs.append(load_run(make_run(tmp_path / f"s{seed}", "joint4", "jointlh", pq(v), G=4, seed=seed)))
    rows = group_seeds(runs)
    by = {row_label(r, "objective,G"): r for r in rows}
    assert report.resolve_baseline(by["jointlh,G=8"], rows, "singlelh") is by["singlelh,G=8"]
    assert report.resolve_baseline(by["jointlh,G=4"], rows, "singlelh") is None  # no singlelh with G=4
    md = render_table(runs, [SET], ["ndcg@10"], row_key="objective,G", baselines=("singlelh", None))
    cells = md_rows(md)
    assert unstyled(cells["jointlh,G=8"][0]).split(" ± ")[0].endswith("+")  # vs the G=8 singlelh, not the G=16 one
    assert not unstyled(cells["jointlh,G=4"][0]).split(" ± ")[0].endswith(("+", "-"))
    assert "no singlelh row with the same data, regime, G, M, selection, candidates for: jointlh,G=4" in md


def test_row_key_from_a_config_group_override(tmp_path):
    run = load_run(make_run(tmp_path, "r", "lsepair", {SET: {"ndcg@10": qmap([0.1, 0.2])}},
                            overrides=["experiment=table7_budget", "budget=m2_f50", "seed=42"]))
    assert run.get("budget") == "m2_f50"  # no `budget` key in the composed config: the group choice
    assert row_label(run, "budget") == "budget=m2_f50"
    assert report.override_map(["+a.b=1", "~c", "d=x=y"]) == {"a.b": "1", "d": "x=y"}
    with pytest.raises(ValueError, match="no config key 'nope'"):
        run.get("nope")
