"""Tests for multipos.report.significance: the paired t-test, markers and baseline resolution."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from multipos import report
from multipos.report import load_run, markers, paired_ttest, render_table
from tests.report.fakes import EXPECTED_MD, SET, make_run, qmap


def test_paired_ttest_matches_scipy_and_hand_computation():
    a = {"q1": 0.1, "q2": 0.4, "q3": 0.35, "q4": 0.8}
    b = {"q1": 0.2, "q2": 0.3, "q3": 0.30, "q4": 0.5}
    t, p = paired_ttest(a, b)
    d = np.array([-0.1, 0.1, 0.05, 0.3])
    t_hand = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    ref = stats.ttest_rel([0.1, 0.4, 0.35, 0.8], [0.2, 0.3, 0.30, 0.5])
    assert t == pytest.approx(t_hand, rel=1e-12)
    assert t == pytest.approx(float(ref.statistic), rel=1e-12)
    assert p == pytest.approx(float(ref.pvalue), rel=1e-12)
    assert 0.2 < p < 0.4  # not significant: a sanity check of the two-sided p
    # order of qids in the dicts does not matter (pairs are matched by qid)
    t2, p2 = paired_ttest(dict(reversed(list(a.items()))), b)
    assert (t2, p2) == pytest.approx((t, p))
    assert paired_ttest(b, a)[0] == pytest.approx(-t)


def test_paired_ttest_identical_inputs_give_p_one():
    a = qmap(np.linspace(0, 1, 10))
    t, p = paired_ttest(a, dict(a))
    assert (t, p) == (0.0, 1.0)
    assert not math.isnan(p)


def test_paired_ttest_takes_a_seed_mean_of_identical_values_as_equal_to_the_value():
    """Three seeds identical to a reference: their mean differs from it by one unit in the last place for some values
    (6 of the 30 here), and scipy alone gives an arbitrary p for those differences; the test takes them as equal. A
    real difference among rounding ones is tested as if the others were exactly 0."""
    values = np.linspace(0.05, 0.95, 30)
    ref = qmap(values)
    seed_mean = {q: math.fsum([v] * 3) / 3 for q, v in ref.items()}
    assert seed_mean != ref  # the rounding this test is about
    assert paired_ttest(seed_mean, ref) == (0.0, 1.0)
    changed = dict(seed_mean, q000=seed_mean["q000"] + 0.5)
    exact = dict(ref, q000=ref["q000"] + 0.5)
    assert paired_ttest(changed, ref) == pytest.approx(paired_ttest(exact, ref), rel=1e-9)


def test_paired_ttest_rejects_different_query_sets_with_counts():
    a = qmap([0.1, 0.2, 0.3, 0.4])
    b = {k: v for k, v in a.items() if k != "q003"} | {"qX": 0.5, "qY": 0.6}
    with pytest.raises(ValueError, match=r"4 vs 5 queries, 3 in common, 1 only in the first.*2 only in the second"):
        paired_ttest(a, b)
    with pytest.raises(ValueError, match="at least 2 queries"):
        paired_ttest({"q": 0.1}, {"q": 0.2})



def test_markers_follow_paper_convention(runs):
    s, r = runs["singlelh"], runs["rand1lh"]
    got = {obj: markers(run, s, r, SET, "ndcg@10") for obj, run in runs.items()}
    assert got == EXPECTED_MD
    # sanity of the crafted data: the "not significant" comparisons really are far from alpha
    _, p = paired_ttest(runs["lsepair"].query_values(SET, "ndcg@10"), r.query_values(SET, "ndcg@10"))
    assert p > 0.5
    _, p = paired_ttest(runs["jointlh"].query_values(SET, "ndcg@10"), s.query_values(SET, "ndcg@10"))
    assert p < 1e-6
    # LaTeX: one superscript per cell
    assert markers(runs["jointlh"], s, r, SET, "ndcg@10", fmt="latex") == r"$^{+\diamondsuit}$"
    assert markers(runs["recontriever"], s, r, SET, "ndcg@10", fmt="latex") == r"$^{-\diamondsuit}$"
    assert markers(runs["summarglh"], s, r, SET, "ndcg@10", fmt="latex") == r"$^{\diamondsuit}$"
    assert markers(s, s, r, SET, "ndcg@10", fmt="latex") == r"$^{\diamondsuit}$"
    # a run compared with itself / with a missing baseline gets nothing
    assert markers(s, s, None, SET, "ndcg@10") == ""
    assert markers(r, s, r, SET, "ndcg@10") == "+"
    assert markers(runs["jointlh"], None, None, SET, "ndcg@10") == ""
    # alpha below the p-value → not significant → no marker
    _, p_sum = paired_ttest(runs["summarglh"].query_values(SET, "ndcg@10"), r.query_values(SET, "ndcg@10"))
    assert markers(runs["summarglh"], s, r, SET, "ndcg@10", alpha=p_sum / 2) == ""


def test_markers_refuse_mismatched_queries(tmp_path):
    a = load_run(make_run(tmp_path, "a", "jointlh", {SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}}))
    b = load_run(make_run(tmp_path, "b", "singlelh", {SET: {"ndcg@10": qmap([0.1, 0.2])}}))
    with pytest.raises(ValueError, match=r"nfcorpus_test/ndcg@10: .*a vs .*b: .*3 vs 2 queries"):
        markers(a, b, None, SET, "ndcg@10")


def test_baseline_resolution_prefers_matching_config_and_rejects_ambiguity(tmp_path):
    pq = lambda v: {SET: {"ndcg@10": qmap(v)}}  # noqa: E731
    lo, hi = np.linspace(0.1, 0.5, 20), np.linspace(0.1, 0.5, 20) + np.linspace(0.05, 0.06, 20)
    s8 = load_run(make_run(tmp_path, "s8", "singlelh", pq(lo), G=8))
    s16 = load_run(make_run(tmp_path, "s16", "singlelh", pq(hi + 0.1), G=16))
    run8 = load_run(make_run(tmp_path, "j8", "jointlh", pq(hi), G=8))
    pool = [s8, s16, run8]
    assert report.resolve_baseline(run8, pool, "singlelh") is s8
    assert report.resolve_baseline(s16, pool, "singlelh") is s16  # itself → no marker
    assert report.resolve_baseline(run8, pool, "rand1lh") is None
    table = render_table(pool, [SET], ["ndcg@10"], row_key="objective,G", baselines=("singlelh", None))
    assert "| jointlh,G=8 | <u>0.3550</u>+ |" in table  # + against s8, not a - against s16
    s8b = load_run(make_run(tmp_path, "s8b", "singlelh", pq(lo), G=8))
    with pytest.raises(ValueError, match="ambiguous singlelh baseline"):
        report.resolve_baseline(run8, [s8, s8b, run8], "singlelh")


def test_a_control_baseline_marks_each_setting_against_the_control_of_its_objective(tmp_path):
    """``baselines=("negative_filter=none", None)`` (experiment=negative_filter): each filtered row is tested
    against the unfiltered row of the same objective, read from the sweep override; the control rows get no
    marker; the legend names the control."""
    pq = lambda v: {SET: {"ndcg@10": qmap(v)}}  # noqa: E731
    base = np.linspace(0.1, 0.5, 20)
    runs = []
    for objective, shift in (("lsepair", 0.0), ("summarglh", 0.2)):
        for filt, delta in (("none", 0.0), ("share95", np.linspace(0.05, 0.06, 20))):
            runs.append(load_run(make_run(tmp_path, f"{objective}-{filt}", objective, pq(base + shift + delta),
                                          extra_config=f"negative_filter_preset: {filt}\n",
                                          overrides=[f"loss={objective}", f"negative_filter={filt}"])))
    pool = list(runs)
    assert report.resolve_baseline(runs[1], pool, "negative_filter=none") is runs[0]   # lsepair: its own control
    assert report.resolve_baseline(runs[3], pool, "negative_filter=none") is runs[2]   # not lsepair's
    assert report.resolve_baseline(runs[0], pool, "negative_filter=none") is runs[0]   # the control itself
    table = render_table(pool, [SET], ["ndcg@10"], row_key="objective,negative_filter",
                         baselines=("negative_filter=none", None))
    assert "| lsepair,negative_filter=share95 | 0.3550+ |" in table
    assert "| summarglh,negative_filter=share95 | **0.5550**+ |" in table
    assert "| lsepair,negative_filter=none | 0.3000 |" in table
    assert "+/-: significantly better/worse than negative_filter=none (same objective" in table
    # against SingleLH (the default) a study without SingleLH rows marks nothing
    assert "+" not in render_table(pool, [SET], ["ndcg@10"], row_key="objective,negative_filter").split("**bold**")[0]


def test_a_baseline_is_taken_from_the_same_sweep_cell_when_config_keys_tie(tmp_path):
    """Cells that differ only in a key outside the matched config keys (the label-noise rate) each get the baseline
    of their own cell, not an ambiguity error."""
    from multipos.report import collect
    from multipos.report.significance import resolve_baseline

    for rate in ("0.1", "0.5"):
        for objective in ("singlelh", "lsepair"):
            make_run(tmp_path, f"loss={objective},rate={rate}", objective,
                     per_query={SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}},
                     overrides=[f"loss={objective}", f"data.source.label_noise.rate={rate}"])
    runs = collect([tmp_path])
    for run in runs:
        if run.objective == "lsepair":
            base = resolve_baseline(run, runs, "singlelh")
            assert base.name == run.name.replace("lsepair", "singlelh")


def test_a_control_on_a_matched_key_compares_rows_that_differ_only_in_that_key(tmp_path):
    """Appendix B (``--baselines data.positive_selection=first``): each random-M row against the first-M row of its
    objective and M — the control's key is itself one of the matched config keys."""
    pq = lambda v: {SET: {"ndcg@10": qmap(v)}}  # noqa: E731
    base = np.linspace(0.1, 0.5, 20)
    runs = {}
    for M in (4, 8):
        for selection, delta in (("first", 0.0), ("random", -np.linspace(0.05, 0.06, 20))):
            name = f"jointlh-M{M}-{selection}"
            path = make_run(tmp_path, name, "jointlh", pq(base + delta + M / 100), M=M,
                            overrides=["loss=jointlh", f"data.max_positives={M}",
                                       f"data.positive_selection={selection}"])
            cfg = path / ".hydra" / "config.yaml"
            cfg.write_text(cfg.read_text().replace("positive_selection: first", f"positive_selection: {selection}"))
            runs[(M, selection)] = load_run(path)
    pool = list(runs.values())
    control = "data.positive_selection=first"
    assert report.resolve_baseline(runs[(8, "random")], pool, control) is runs[(8, "first")]
    assert report.resolve_baseline(runs[(4, "random")], pool, control) is runs[(4, "first")]
    table = render_table(pool, [SET], ["ndcg@10"], row_key="objective,M,selection", baselines=(control, None))
    assert "| jointlh,M=4,selection=random | 0.2850- |" in table
    assert "| jointlh,M=8,selection=random | 0.3250- |" in table
    assert "| jointlh,M=4,selection=first | <u>0.3400</u> |" in table  # the control rows carry no marker
