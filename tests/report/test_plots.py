"""Tests for multipos.report.plots: the positive–negative ratio ablation plot (hand-built run dirs, no assets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multipos import report
from multipos.report import collect, load_run, main, plot_ratio_ablation, ratio_ablation_figure, ratio_ablation_points
from multipos.training import loggers
from tests.report.fakes import CONFIG, SET  # the same fake .hydra/config.yaml layout


def make_run(root: Path, name: str, objective: str, metrics: dict, G: int | None = 8, M: int | None = 4,
             seed: int = 42, data: str = "nfcorpus_hetero") -> Path:
    """A fake finished run: metrics.json and .hydra/ (no per-query files: the plot does not need them).
    ``G`` / ``M`` = None → the key is left out of the config."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(metrics))
    cfg = CONFIG.format(data=data, G=G, M=M, objective=objective, seed=seed)
    if G is None:
        cfg = "\n".join(line for line in cfg.splitlines() if "group_size" not in line) + "\n"
    if M is None:
        cfg = "\n".join(line for line in cfg.splitlines() if "max_positives" not in line) + "\n"
    (d / ".hydra" / "config.yaml").write_text(cfg)
    (d / ".hydra" / "overrides.yaml").write_text(f"- loss={objective}\n")
    return d


def value(obj: str, G: int, M: int, seed: int, metric: str) -> float:
    """A deterministic, distinct value per (objective, G, M, seed, metric)."""
    base = {"singlelh": 0.30, "jointlh": 0.35, "lsepair": 0.33}[obj] + 0.01 * M - 0.002 * G
    return round(base + 0.004 * seed + (0.1 if metric == "mrr@10" else 0.0), 6)


# objective → G → Ms (lsepair only at G=8, so the G=16 panels have 2 lines and the G=4/8 ones 3)
GRID = {"singlelh": {4: [1, 2], 8: [1, 2, 4], 16: [1, 4, 8]},
        "jointlh": {4: [1, 2], 8: [1, 2, 4], 16: [1, 4, 8]},
        "lsepair": {4: [2], 8: [2, 4]}}
SEEDS = (1, 2)


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "ratio_sweep"
    for obj, per_g in GRID.items():
        for G, ms in per_g.items():
            for M in ms:
                for seed in SEEDS:
                    metrics = {SET: {m: value(obj, G, M, seed, m) for m in ("mrr@10", "ndcg@10")},
                               "other": {"ndcg@10": 0.0}}
                    make_run(root / f"seed{seed}", f"{obj}-G{G}-M{M}", obj, metrics, G=G, M=M, seed=seed)
    return root


def test_points_average_seeds(sweep):
    runs = collect([sweep], require_per_query=False)
    assert len(runs) == 2 * sum(len(ms) for per_g in GRID.values() for ms in per_g.values())
    pts = ratio_ablation_points(runs, SET)
    assert list(pts) == ["mrr@10", "ndcg@10"]
    assert list(pts["ndcg@10"]) == [4, 8, 16]
    assert list(pts["ndcg@10"][16]) == ["jointlh", "singlelh"]  # order of first appearance (collect sorts paths)
    for m in ("mrr@10", "ndcg@10"):
        for obj, per_g in GRID.items():
            for G, ms in per_g.items():
                got = pts[m][G][obj]
                assert [p[0] for p in got] == ms and all(p[2] == len(SEEDS) for p in got)
                for M, mean, _ in got:
                    expected = sum(value(obj, G, M, s, m) for s in SEEDS) / len(SEEDS)
                    assert mean == pytest.approx(expected, abs=1e-12)
                    # the mean really is between seeds, not one seed's value
                    assert value(obj, G, M, 1, m) < mean < value(obj, G, M, 2, m)


def test_figure_layout_lines_and_averaged_ydata(sweep):
    runs = collect([sweep], require_per_query=False)
    metrics = ("mrr@10", "ndcg@10")
    fig = ratio_ablation_figure(runs, SET, metrics)
    gs = [4, 8, 16]
    assert len(fig.axes) == len(gs) * len(metrics)
    for i, m in enumerate(metrics):
        for j, G in enumerate(gs):
            ax = fig.axes[i * len(gs) + j]
            objs = [o for o in GRID if G in GRID[o]]
            assert len(ax.lines) == len(objs), (m, G)
            by_label = {line.get_label(): line for line in ax.lines}
            assert set(by_label) == set(objs)
            for obj in objs:
                line = by_label[obj]
                assert list(line.get_xdata()) == GRID[obj][G]
                expected = [sum(value(obj, G, M, s, m) for s in SEEDS) / len(SEEDS) for M in GRID[obj][G]]
                assert list(line.get_ydata()) == pytest.approx(expected, abs=1e-12)
            if i == 0:
                assert ax.get_title() == f"G={G}"
            if j == 0:
                assert ax.get_ylabel() == report.METRIC_NAMES[m]
    # same colour for an objective in every panel
    colours = {}
    for ax in fig.axes:
        for line in ax.lines:
            assert colours.setdefault(line.get_label(), line.get_color()) == line.get_color()
    # a single metric → one row
    assert len(ratio_ablation_figure(runs, SET, ["ndcg@10"]).axes) == len(gs)


def test_plot_writes_png(sweep, tmp_path):
    runs = collect([sweep], require_per_query=False)
    out = plot_ratio_ablation(runs, SET, out_png=tmp_path / "plots" / "ratio.png")
    assert out == tmp_path / "plots" / "ratio.png"
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_logs_to_wandb_run(sweep, tmp_path, monkeypatch):
    class StubRun:
        def __init__(self):
            self.calls = []

        def log(self, data, **kwargs):
            self.calls.append((data, kwargs))

    runs = collect([sweep], require_per_query=False)
    seen = []
    monkeypatch.setattr(loggers, "wandb_image", lambda fig: seen.append(fig) or ("image", fig))
    stub = StubRun()
    plot_ratio_ablation(runs, SET, ["ndcg@10"], out_png=tmp_path / "r.png", wandb_run=stub)
    assert len(stub.calls) == 1
    data, _ = stub.calls[0]
    assert list(data) == [f"ratio_ablation/{SET}"]
    assert data[f"ratio_ablation/{SET}"] == ("image", seen[0]) and len(seen[0].axes) == 3


def test_plot_logs_real_wandb_image(sweep, tmp_path):
    """The default indirection builds a real ``wandb.Image`` offline (no wandb.init needed)."""
    wandb = pytest.importorskip("wandb")
    logged = []

    class StubRun:
        def log(self, data):
            logged.append(data)

    runs = collect([sweep], require_per_query=False)
    plot_ratio_ablation(runs, SET, ["ndcg@10"], out_png=tmp_path / "r.png", wandb_run=StubRun())
    assert isinstance(logged[0][f"ratio_ablation/{SET}"], wandb.Image)


def test_errors(tmp_path):
    ok = load_run(make_run(tmp_path, "ok", "singlelh", {SET: {"mrr@10": 0.5, "ndcg@10": 0.4}}))
    no_g = load_run(make_run(tmp_path, "no_g", "jointlh", {SET: {"mrr@10": 0.5, "ndcg@10": 0.4}}, G=None))
    no_m = load_run(make_run(tmp_path, "no_m", "jointlh", {SET: {"mrr@10": 0.5, "ndcg@10": 0.4}}, M=None))
    other = load_run(make_run(tmp_path, "other", "jointlh", {"trec_dl19": {"mrr@10": 0.5, "ndcg@10": 0.4}}))
    no_metric = load_run(make_run(tmp_path, "no_metric", "jointlh", {SET: {"ndcg@10": 0.4}}))
    out = tmp_path / "x.png"
    with pytest.raises(ValueError, match=r"no_g/\.hydra/config\.yaml: data\.group_size \(G\) is missing"):
        plot_ratio_ablation([ok, no_g], SET, out_png=out)
    with pytest.raises(ValueError, match=r"no_m/\.hydra/config\.yaml: data\.max_positives \(M\) is missing"):
        plot_ratio_ablation([ok, no_m], SET, out_png=out)
    with pytest.raises(ValueError, match=r"other/metrics\.json: no eval set 'nfcorpus_test' \(has: trec_dl19\)"):
        plot_ratio_ablation([ok, other], SET, out_png=out)
    with pytest.raises(ValueError, match=r"no_metric/metrics\.json: no 'mrr@10' for eval set 'nfcorpus_test'"):
        plot_ratio_ablation([ok, no_metric], SET, out_png=out)
    with pytest.raises(ValueError, match="no runs to plot"):
        plot_ratio_ablation([], SET, out_png=out)
    # runs of different data sets are never averaged into one point
    hetero = load_run(make_run(tmp_path, "d1", "jointlh", {SET: {"mrr@10": 0.5, "ndcg@10": 0.4}}, seed=1))
    homo = load_run(make_run(tmp_path, "d2", "jointlh", {SET: {"mrr@10": 0.5, "ndcg@10": 0.4}}, seed=2,
                             data="nfcorpus_homo"))
    with pytest.raises(ValueError, match=r"objective=jointlh, G=8, M=4 differ in data\.name"):
        plot_ratio_ablation([hetero, homo], SET, out_png=out)
    assert not out.exists()


def test_cli_plot_ratio(sweep, tmp_path, capsys):
    png = tmp_path / "cli" / "ratio.png"
    # plot only: --table not needed, per-query files not needed, the first of --sets is plotted
    text = main([str(sweep), "--sets", SET, "other", "--metrics", "ndcg@10", "--plot-ratio", str(png)])
    captured = capsys.readouterr()
    assert text == "" and captured.out == ""
    assert f"ratio ablation plot ({SET}): {png}" in captured.err
    assert png.read_bytes()[:4] == b"\x89PNG"
    # with a table as well (significance off: the fake runs have no per-query files)
    png2 = tmp_path / "cli" / "ratio2.png"
    text = main([str(sweep), "--table", "t", "--sets", SET, "--no-significance", "--plot-ratio", str(png2)])
    assert "| objective |" in text and png2.stat().st_size > 0
    # neither → usage error
    with pytest.raises(SystemExit) as exc:
        main([str(sweep)])
    assert exc.value.code == 2 and "one of --table / --plot-ratio is required" in capsys.readouterr().err
    # runs without M → exit 2 naming the file
    bad = tmp_path / "bad"
    make_run(bad, "r", "singlelh", {SET: {"mrr@10": 0.5, "ndcg@10": 0.4}}, M=None)
    with pytest.raises(SystemExit) as exc:
        main([str(bad), "--sets", SET, "--plot-ratio", str(tmp_path / "bad.png")])
    assert exc.value.code == 2 and "data.max_positives (M) is missing" in capsys.readouterr().err


def test_cli_table_only_unchanged(sweep, tmp_path, capsys):
    """Without --plot-ratio the CLI behaves as before: the table is printed, significance needs per-query files."""
    text = main([str(sweep), "--table", "t", "--sets", SET, "--no-significance", "--metrics", "ndcg@10"])
    assert capsys.readouterr().out.strip() == text.strip() and text.startswith("Table: t")
    assert not list(tmp_path.rglob("*.png"))
    with pytest.raises(SystemExit) as exc:  # significance on by default → the fake runs lack per-query files
        main([str(sweep), "--table", "t", "--sets", SET])
    assert exc.value.code == 2 and "per-query file missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(sweep), "--sets", SET, "--plot-ratio", str(tmp_path / "p.png"), "--out", str(tmp_path / "t.md")])
    assert exc.value.code == 2 and "--out writes the table: it needs --table" in capsys.readouterr().err
