"""multipos.report.noise: scores against the label-noise rate, and the fitted slopes (hand-built runs)."""

from __future__ import annotations

import pytest
from scipy import stats

from multipos.report.noise import format_slopes, main, noise_points, noise_slopes, slope_differences
from tests.report.fakes import SET, make_run


def _sweeps(tmp_path):
    noisy, clean = tmp_path / "label_noise-cpu", tmp_path / "query_side_objectives-cpu"
    values = {}
    for objective, loss_per_rho in (("lsepair", -0.02), ("jointlh", -0.10)):
        for seed in (42, 43):
            base = 0.35 + 0.001 * (seed - 42)
            make_run(clean, f"loss={objective},seed={seed}", objective, metrics={SET: {"ndcg@10": base}}, seed=seed)
            values[(objective, 0.0, seed)] = base
            for kind in ("bm25", "random"):
                for rate in (0.1, 0.5):
                    v = base + loss_per_rho * rate * (2 if kind == "bm25" else 1)
                    extra = f"    label_noise:\n      rate: {rate}\n      kind: {kind}\n"
                    make_run(noisy, f"kind={kind},loss={objective},rate={rate},seed={seed}", objective,
                             metrics={SET: {"ndcg@10": v}}, seed=seed)
                    cfg = noisy / f"kind={kind},loss={objective},rate={rate},seed={seed}" / ".hydra" / "config.yaml"
                    cfg.write_text(cfg.read_text().replace("  source:\n", "  source:\n" + extra, 1))
                    values[(objective, kind, rate, seed)] = v
    return noisy, clean, values


def test_slopes_are_least_squares_over_seeds_with_the_clean_runs_at_rate_zero(tmp_path):
    noisy, clean, values = _sweeps(tmp_path)
    points = noise_points([noisy, clean], SET, "ndcg@10")
    assert sorted(points) == [("jointlh", "bm25"), ("jointlh", "random"), ("lsepair", "bm25"), ("lsepair", "random")]
    rows = {(r["objective"], r["kind"]): r for r in noise_slopes(points)}
    row = rows[("jointlh", "bm25")]
    xs = [0.0, 0.0, 0.1, 0.1, 0.5, 0.5]
    ys = [values[("jointlh", 0.0, 42)], values[("jointlh", 0.0, 43)]] + [
        values[("jointlh", "bm25", r, s)] for r in (0.1, 0.5) for s in (42, 43)]
    fit = stats.linregress(xs, ys)
    assert row["n"] == 6 and row["slope"] == pytest.approx(fit.slope) == pytest.approx(-0.2)
    assert row["ci_low"] <= row["slope"] <= row["ci_high"]
    assert rows[("lsepair", "random")]["slope"] == pytest.approx(-0.02)
    assert row["means"][0.5] == pytest.approx(0.3505 - 0.1)


def test_the_table_is_written_by_the_command(tmp_path):
    noisy, clean, _ = _sweeps(tmp_path)
    out = tmp_path / "label_noise_slopes.md"
    text = main([str(noisy), str(clean), "--out", str(out)])
    assert out.read_text() == text and "| jointlh | bm25 |" in text and "slope per unit ρ" in text
    assert "-0.2000 [" in format_slopes(noise_slopes(noise_points([noisy, clean], SET, "ndcg@10")), SET, "ndcg@10")


def test_slope_differences_use_welch_intervals_against_the_reference():
    rows = [{"objective": "singlelh", "kind": "bm25", "n": 20, "slope": -0.02, "stderr": 0.004},
            {"objective": "jointlh", "kind": "bm25", "n": 20, "slope": -0.10, "stderr": 0.003},
            {"objective": "jointlh", "kind": "random", "n": 20, "slope": -0.05, "stderr": 0.003}]
    slope_differences(rows, "singlelh")
    se = (0.004 ** 2 + 0.003 ** 2) ** 0.5
    dof = se ** 4 / (0.004 ** 4 / 18 + 0.003 ** 4 / 18)
    half = stats.t.ppf(0.975, dof) * se
    assert rows[1]["diff"] == pytest.approx(-0.08)
    assert (rows[1]["diff_low"], rows[1]["diff_high"]) == (pytest.approx(-0.08 - half), pytest.approx(-0.08 + half))
    assert rows[0]["diff"] is None and rows[2]["diff"] is None  # the reference itself; no reference for "random"


def test_several_metrics_and_the_figure_come_from_one_command(tmp_path):
    noisy, clean, _ = _sweeps(tmp_path)
    for run in [*noisy.iterdir(), *clean.iterdir()]:  # a second metric in every run
        metrics = (run / "metrics.json").read_text().replace('"ndcg@10"', '"recall@100": 0.5, "ndcg@10"')
        (run / "metrics.json").write_text(metrics)
    png = tmp_path / "noise.png"
    text = main([str(noisy), str(clean), "--metrics", "ndcg@10", "recall@100", "--plot", str(png)])
    assert text.count("Table: ") == 2 and "recall@100 against" in text and "slope − singlelh's" not in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rate_zero_run_of_each_kind_is_one_point(tmp_path):
    sweep = tmp_path / "label_noise-cpu"
    for kind in ("bm25", "random"):
        for rate, value in ((0, 0.30), (0.5, 0.25 if kind == "bm25" else 0.2)):
            name = f"kind={kind},loss=lsepair,rate={rate},seed=42"
            make_run(sweep, name, "lsepair", metrics={SET: {"ndcg@10": value}}, seed=42,
                     run_info={"status": "complete", "run_key": "clean" if rate == 0 else name})
            cfg = sweep / name / ".hydra" / "config.yaml"
            extra = f"    label_noise:\n      rate: {rate}\n      kind: {kind}\n"
            cfg.write_text(cfg.read_text().replace("  source:\n", "  source:\n" + extra, 1))
    points = noise_points([sweep], SET, "ndcg@10")
    assert sorted(points[("lsepair", "bm25")]) == [(0.0, 0.30), (0.5, 0.25)]
    assert sorted(points[("lsepair", "random")]) == [(0.0, 0.30), (0.5, 0.2)]


def test_the_provenance_line_counts_clean_runs_and_the_exclusion_rule_of_the_noisy_ones(tmp_path):
    from multipos.report.noise import noise_provenance

    noisy, clean, _ = _sweeps(tmp_path)
    line = noise_provenance([noisy, clean])
    assert "4 ρ = 0 (the labels as published)" in line and "16 ρ > 0 drawn with exclude=query" in line
