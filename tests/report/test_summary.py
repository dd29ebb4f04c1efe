"""Tests for multipos.report.summary: the main job's closing lines (hand-built run dirs, no training)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import ttest_rel

from multipos.report.summary import format_summary, main, summary_rows
from tests.report.fakes import SET, make_run, qmap


def _sweep(tmp_path, zero_shot_files=True):
    root = tmp_path / "default-cpu"
    rng = np.random.default_rng(0)
    zero = rng.uniform(0.2, 0.5, 30)
    seeds = {42: zero + 0.03 + rng.normal(0, 0.02, 30), 43: zero + 0.02 + rng.normal(0, 0.02, 30)}
    refs = {"bm25": {SET: {"ndcg@10": 0.31}}, "zero-shot": {SET: {"ndcg@10": float(zero.mean())}}}
    for seed, values in seeds.items():
        d = make_run(root, f"seed={seed}", "jointlh",
                     {SET: {"ndcg@10": qmap(values)}, "nfcorpus_dev": {"ndcg@10": qmap(values)}},
                     refs=refs, seed=seed)
        if zero_shot_files:
            (d / "references" / "zero-shot").mkdir(parents=True)
            (d / "references" / "zero-shot" / f"per_query.{SET}.json").write_text(json.dumps({"ndcg@10": qmap(zero)}))
    return root, seeds, zero


def test_rows_give_the_seed_spread_the_references_and_the_paired_test(tmp_path):
    root, seeds, zero = _sweep(tmp_path)
    (row,) = summary_rows(root)  # the dev set is left out
    assert row["set"] == SET and row["n_seeds"] == 2
    assert row["seeds"] == {42: pytest.approx(seeds[42].mean()), 43: pytest.approx(seeds[43].mean())}
    assert row["mean"] == pytest.approx((seeds[42].mean() + seeds[43].mean()) / 2)
    assert row["sd"] == pytest.approx(np.std([seeds[42].mean(), seeds[43].mean()], ddof=1))
    assert row["zero_shot"] == pytest.approx(zero.mean()) and row["bm25"] == 0.31
    assert row["p"] == pytest.approx(ttest_rel((seeds[42] + seeds[43]) / 2, zero).pvalue)
    text = main([str(root)])
    assert f"{SET}" in text and f"p = {row['p']:.1e}" in text and "BM25 0.3100" in text


def test_without_zero_shot_per_query_files_the_p_value_is_reported_missing(tmp_path):
    root, _, _ = _sweep(tmp_path, zero_shot_files=False)
    rows = summary_rows(root)
    assert rows[0]["p"] is None
    assert "p n/a: no zero-shot per-query file" in format_summary(rows)


def test_a_sweep_of_several_configurations_gets_one_block_each(tmp_path):
    """A study's sweep (two objectives × two seeds): each objective's seeds are summarised on their own, never
    pooled with the other's (which once printed one objective's values as "over 4 seeds")."""
    root, seeds, zero = _sweep(tmp_path)
    other = {42: zero + 0.10, 43: zero + 0.12}
    for seed, values in other.items():
        d = make_run(root, f"loss=lsepair,seed={seed}", "lsepair", {SET: {"ndcg@10": qmap(values)}},
                     refs={"zero-shot": {SET: {"ndcg@10": float(zero.mean())}}}, seed=seed)
        (d / "references" / "zero-shot").mkdir(parents=True)
        (d / "references" / "zero-shot" / f"per_query.{SET}.json").write_text(json.dumps({"ndcg@10": qmap(zero)}))
    rows = {r["config"]: r for r in summary_rows(root)}
    assert set(rows) == {"loss=lsepair", "jointlh"}  # run folders seed=42 / seed=43: named by the objective
    assert rows["loss=lsepair"]["n_seeds"] == rows["jointlh"]["n_seeds"] == 2
    assert rows["loss=lsepair"]["mean"] == pytest.approx(zero.mean() + 0.11)
    assert rows["jointlh"]["mean"] == pytest.approx((seeds[42].mean() + seeds[43].mean()) / 2)
    text = format_summary(list(rows.values()))
    assert "\nloss=lsepair:\n" in text and "\njointlh:\n" in text


def test_against_a_configuration_tests_every_other_one_on_seed_mean_per_query_values(tmp_path):
    """``--against loss=lsepair``: the other configuration's rows carry the difference of the seed means and the
    paired t-test of the per-query means over each configuration's own seeds (here three seeds against two);
    ``--dev`` keeps the dev set; an unknown configuration is named with those there are."""
    root, seeds, zero = _sweep(tmp_path)
    rng = np.random.default_rng(1)
    other = {s: zero + 0.05 + rng.normal(0, 0.02, 30) for s in (42, 43, 44)}
    for seed, values in other.items():
        make_run(root, f"loss=lsepair,seed={seed}", "lsepair",
                 {SET: {"ndcg@10": qmap(values)}, "nfcorpus_dev": {"ndcg@10": qmap(values)}}, seed=seed)
    rows = summary_rows(root, against="loss=lsepair", dev=True)
    mine = [r for r in rows if r["config"] == "jointlh"]
    assert {r["set"] for r in mine} == {SET, "nfcorpus_dev"}
    assert all("against" not in r for r in rows if r["config"] == "loss=lsepair")
    (test,) = [r for r in mine if r["set"] == SET]
    base = (other[42] + other[43] + other[44]) / 3
    assert test["against"] == "loss=lsepair" and test["against_mean"] == pytest.approx(base.mean())
    assert test["against_p"] == pytest.approx(ttest_rel((seeds[42] + seeds[43]) / 2, base).pvalue)
    text = main([str(root), "--against", "loss=lsepair", "--dev"])
    assert f"vs loss=lsepair {test['mean'] - test['against_mean']:+.4f}, p = {test['against_p']:.1e}" in text
    assert "nfcorpus_dev" in text and "nfcorpus_dev" not in main([str(root)])
    with pytest.raises(ValueError, match=r"'loss=singlelh': no such configuration.*'loss=lsepair'"):
        summary_rows(root, against="loss=singlelh")


def test_an_empty_sweep_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete run"):
        summary_rows(tmp_path)


def test_against_leaves_the_p_value_out_for_a_set_without_per_query_values(tmp_path):
    """Table 3's ``ood_average`` is an average of two sets, with metrics but no per-query file: ``--against`` gives
    its difference of means and no p-value, where it once raised FileNotFoundError (H8's Table 3, 2026-11-27)."""
    root = tmp_path / "table3_ood-cpu-gpu"
    rng = np.random.default_rng(1)
    for loss, shift in (("singlelh", 0.0), ("jointlh", -0.02)):
        for seed in (42, 43):
            values = rng.uniform(0.3, 0.7, 30) + shift
            make_run(root, f"loss={loss},seed={seed}", loss, {SET: {"ndcg@10": qmap(values)}},
                     metrics={SET: {"ndcg@10": float(values.mean())}, "ood_average": {"ndcg@10": float(values.mean())}},
                     seed=seed)
    rows = {(r["config"], r["set"]): r for r in summary_rows(root, against="loss=singlelh")}
    average = rows[("loss=jointlh", "ood_average")]
    assert average["against_p"] is None and average["against_mean"] == pytest.approx(
        rows[("loss=singlelh", "ood_average")]["mean"])
    assert rows[("loss=jointlh", SET)]["against_p"] is not None
    assert "p n/a: no per-query values" in main([str(root), "--against", "loss=singlelh"])


def test_with_bm25_per_query_files_the_summary_also_tests_against_bm25(tmp_path):
    root, seeds, zero = _sweep(tmp_path)
    bm25 = zero - 0.01 + np.random.default_rng(1).normal(0, 0.02, 30)
    for seed in seeds:
        folder = root / f"seed={seed}" / "references" / "bm25"
        folder.mkdir(parents=True)
        (folder / f"per_query.{SET}.json").write_text(json.dumps({"ndcg@10": qmap(bm25)}))
    (row,) = summary_rows(root)
    assert row["p_bm25"] == pytest.approx(ttest_rel((seeds[42] + seeds[43]) / 2, bm25).pvalue)
    assert f"BM25 0.3100 ({row['mean'] - 0.31:+.4f}, p = {row['p_bm25']:.1e})" in main([str(root)])
