"""The label-noise study's answer in numbers: each objective's score against the noise rate ρ, and its slope.

For each objective and kind of false positive (:mod:`multipos.data.label_noise`), the runs of one or more sweeps give
points (ρ, score of one seed); runs without noise (``data.source.label_noise`` null or rate 0) count for every kind,
once per run key (the rate-0 runs of each kind share one spec).
The slope is the ordinary least-squares fit of score on ρ over all those points (``scipy.stats.linregress``), with a
two-sided 95 % confidence interval from the t distribution with n − 2 degrees of freedom: the score lost per unit ρ.
Each slope is also compared with a reference objective's slope for the same kind (default SingleLH): the difference
with its 95 % interval (standard errors of two independent fits added in quadrature, Welch–Satterthwaite degrees of
freedom), so "degrades less than SingleLH" is claimed only where that interval excludes 0.

    python -m multipos.report.noise multirun/label_noise-cpu-query_side \\
        --metrics ndcg@10 recall@100 --out experiments/results/label_noise_slopes.md \\
        --plot experiments/results/label_noise.png
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from multipos import atomic
from multipos.report.runs import load_run
from multipos.report.setting import check_one_setting
from multipos.runs.find import sweep_runs
from multipos.runs.folder import read_run_info

__all__ = ["noise_points", "noise_slopes", "slope_differences", "format_slopes", "noise_figure", "noise_provenance",
           "main"]


def _noise(run) -> tuple[float, str | None]:
    rate = run.get("data.source.label_noise.rate") if _has(run, "data.source.label_noise.rate") else None
    kind = run.get("data.source.label_noise.kind") if _has(run, "data.source.label_noise.kind") else None
    return (float(rate) if rate is not None else 0.0), (str(kind) if rate else None)


def _has(run, key: str) -> bool:
    try:
        run.get(key)
    except ValueError:
        return False
    return True


def noise_points(sweep_dirs: Sequence[str | Path], eval_set: str, metric: str,
                 allow_mixed_settings: bool = False) -> dict[tuple[str, str], list]:
    """{(objective, kind) → [(ρ, score), ...]} of the finished runs of ``sweep_dirs``; a noise-free run is a point
    at ρ = 0 of every kind that the sweeps hold. Raises FileNotFoundError when they hold no finished run, and
    :class:`multipos.report.setting.MixedSettingsError` when the runs were made in several settings (device kinds,
    precisions) unless ``allow_mixed_settings``: a slope through points of two machines fits their offset too."""
    runs, dirs = [], []
    for d in sweep_dirs:
        found = sweep_runs(d)[0]
        dirs += found
        runs += [load_run(r, require_per_query=False) for r in found]
    if not runs:
        raise FileNotFoundError(f"{', '.join(map(str, sweep_dirs))}: no finished run")
    check_one_setting([(f"{Path(r).parent.name}/{Path(r).name}", read_run_info(r), r) for r in dirs],
                      "the label-noise points", allow_mixed_settings)
    clean, noisy = defaultdict(list), defaultdict(list)
    seen_clean: set[str] = set()
    for run, folder in zip(runs, dirs):
        rate, kind = _noise(run)
        if eval_set not in run.metrics or metric not in run.metrics[eval_set]:
            continue
        if not kind:  # a rate-0 run of every kind is one run (one spec, copied): one point
            key = read_run_info(folder).get("run_key") or str(folder)
            if key in seen_clean:
                continue
            seen_clean.add(key)
        point = (rate, float(run.metrics[eval_set][metric]))
        (noisy[(run.label, kind)] if kind else clean[run.label]).append(point)
    kinds = sorted({k for _, k in noisy}) or ["none"]
    points = {key: list(v) for key, v in noisy.items()}
    for objective, pts in clean.items():
        for kind in kinds:
            points.setdefault((objective, kind), []).extend(pts)
    return points


def noise_slopes(points: dict[tuple[str, str], list]) -> list[dict]:
    """One row per (objective, kind): ``objective, kind, means ({ρ: mean score}), n, slope, ci_low, ci_high`` (the
    slope and its 95 % interval; None with fewer than 3 points or a single ρ)."""
    from scipy import stats

    rows = []
    for (objective, kind), pts in sorted(points.items()):
        by_rate = defaultdict(list)
        for rate, value in pts:
            by_rate[rate].append(value)
        row = {"objective": objective, "kind": kind, "n": len(pts),
               "means": {r: sum(v) / len(v) for r, v in sorted(by_rate.items())},
               "slope": None, "ci_low": None, "ci_high": None, "stderr": None}
        if len(pts) >= 3 and len(by_rate) >= 2:
            fit = stats.linregress([r for r, _ in pts], [v for _, v in pts])
            half = stats.t.ppf(0.975, len(pts) - 2) * fit.stderr
            row.update(slope=fit.slope, ci_low=fit.slope - half, ci_high=fit.slope + half, stderr=fit.stderr)
        rows.append(row)
    return rows


def slope_differences(rows: Sequence[dict], reference: str = "singlelh") -> None:
    """Add ``diff, diff_low, diff_high`` to each row of :func:`noise_slopes`: its slope minus the ``reference``
    objective's slope for the same kind, with a two-sided 95 % interval (independent fits: standard errors added in
    quadrature, Welch–Satterthwaite degrees of freedom from each fit's n − 2). None where either slope is missing."""
    from scipy import stats

    ref = {row["kind"]: row for row in rows if row["objective"] == reference}
    for row in rows:
        other = ref.get(row["kind"])
        row.update(diff=None, diff_low=None, diff_high=None)
        if row is other or other is None or row["stderr"] is None or other["stderr"] is None:
            continue
        v1, v2 = row["stderr"] ** 2, other["stderr"] ** 2
        se = math.sqrt(v1 + v2)
        dof = (v1 + v2) ** 2 / (v1 ** 2 / (row["n"] - 2) + v2 ** 2 / (other["n"] - 2)) if se > 0 else 1.0
        half = stats.t.ppf(0.975, dof) * se
        diff = row["slope"] - other["slope"]
        row.update(diff=diff, diff_low=diff - half, diff_high=diff + half)


def format_slopes(rows: Sequence[dict], eval_set: str, metric: str, reference: str = "singlelh") -> str:
    """A Markdown table: mean score at each ρ, the slope with its 95 % interval and, where
    :func:`slope_differences` filled it, the slope's difference from ``reference``'s with its interval (``*``: the
    interval excludes 0)."""
    rates = sorted({r for row in rows for r in row["means"]})
    diffs = any(row.get("diff") is not None for row in rows)
    head = ["objective", "false positives", *(f"ρ={r:g}" for r in rates), "slope per unit ρ [95 % CI]",
            *([f"slope − {reference}'s [95 % CI]"] if diffs else [])]
    lines = [f"Table: {eval_set} {metric} against the share ρ of positives replaced by false positives", "",
             "| " + " | ".join(head) + " |", "|:---|:---|" + "---:|" * (len(head) - 2)]
    for row in rows:
        cells = [f"{row['means'][r]:.4f}" if r in row["means"] else "" for r in rates]
        slope = ("n/a" if row["slope"] is None or math.isnan(row["slope"]) else
                 f"{row['slope']:+.4f} [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]")
        if diffs:
            d = row.get("diff")
            star = "*" if d is not None and (row["diff_low"] > 0 or row["diff_high"] < 0) else ""
            cells.append(slope)
            slope = "" if d is None else f"{d:+.4f}{star} [{row['diff_low']:+.4f}, {row['diff_high']:+.4f}]"
        lines.append(f"| {row['objective']} | {row['kind']} | " + " | ".join(cells) + f" | {slope} |")
    n = sorted({row["n"] for row in rows})
    lines += ["", f"Mean over seeds at each ρ; slope: least-squares fit over every (ρ, seed) point ({n} points per "
              "row), 95 % interval from the t distribution"
              + (f"; `*`: the slope differs from {reference}'s (95 % interval of the difference excludes 0)"
                 if diffs else "") + ". Written by `python -m multipos.report.noise`."]
    return "\n".join(lines) + "\n"


def noise_figure(points_by_metric: dict[str, dict[tuple[str, str], list]]):
    """Score against ρ: one panel per (metric, kind of false positive), one line per objective, mean ± sd over the
    seeds at each ρ. ``points_by_metric``: ``{metric: noise_points(...)}``. Returns a matplotlib Figure (Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from multipos.report.tables import metric_label

    metrics = list(points_by_metric)
    kinds = sorted({k for pts in points_by_metric.values() for _, k in pts})
    fig = Figure(figsize=(3.6 * len(kinds) + 0.6, 2.9 * len(metrics) + 0.3), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics), len(kinds), squeeze=False)
    for i, metric in enumerate(metrics):
        objectives = sorted({o for o, _ in points_by_metric[metric]})
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for c, objective in enumerate(objectives):
                by_rate = defaultdict(list)
                for rate, value in points_by_metric[metric].get((objective, kind), []):
                    by_rate[rate].append(value)
                if not by_rate:
                    continue
                rates = sorted(by_rate)
                means = [sum(by_rate[r]) / len(by_rate[r]) for r in rates]
                sds = [_sd(by_rate[r]) for r in rates]
                ax.errorbar(rates, means, yerr=sds, marker="o", capsize=3, color=f"C{c}", label=objective)
            ax.set_title(f"false positives: {kind}")
            ax.set_xlabel("ρ (share of positives replaced)")
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel(f"{metric_label(metric)} (mean ± sd over seeds)")
    axes[0][-1].legend(fontsize="small")
    return fig


def _sd(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def noise_provenance(sweep_dirs: Sequence[str | Path]) -> str:
    """One line: how many runs the points come from, by ρ = 0 and by the ``exclude`` rule that drew the false
    positives (absent: ``query``, :class:`multipos.data.label_noise.LabelNoise`), and the settings (device kind,
    precisions, :func:`multipos.report.setting.run_setting`) they were made in."""
    from collections import Counter

    from multipos.report.setting import describe_settings, run_setting

    rules, settings, total = Counter(), {}, 0
    for d in sweep_dirs:
        for folder in sweep_runs(d)[0]:
            run = load_run(folder, require_per_query=False)
            rate, _ = _noise(run)
            exclude = (run.get("data.source.label_noise.exclude") if _has(run, "data.source.label_noise.exclude")
                       else None) or "query"
            rules["ρ = 0 (the labels as published)" if not rate else f"ρ > 0 drawn with exclude={exclude}"] += 1
            settings.setdefault(run_setting(read_run_info(folder), folder), []).append(Path(folder).name)
            total += 1
    parts = "; ".join(f"{n} {what}" for what, n in sorted(rules.items()))
    return (f"Provenance: {total} runs in {', '.join(f'`{d}`' for d in sweep_dirs)} ({parts}); "
            f"{describe_settings(settings)}.")


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m multipos.report.noise", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dirs", nargs="+")
    ap.add_argument("--set", default="nfcorpus_test")
    ap.add_argument("--metrics", nargs="+", default=["ndcg@10"])
    ap.add_argument("--reference", default="singlelh", help="the objective whose slope the others are compared with")
    ap.add_argument("--out", default=None, help="also write the tables to this file")
    ap.add_argument("--plot", default=None, help="also draw score against ρ to this PNG file")
    ap.add_argument("--allow-mixed-settings", action="store_true",
                    help="fit points made in several settings (device kinds, precisions); default: refuse")
    args = ap.parse_args(argv)
    points = {m: noise_points(args.sweep_dirs, args.set, m, args.allow_mixed_settings) for m in args.metrics}
    tables = []
    for metric, pts in points.items():
        rows = noise_slopes(pts)
        slope_differences(rows, args.reference)
        tables.append(format_slopes(rows, args.set, metric, args.reference))
    command = "python -m multipos.report.noise " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join(tables) + f"\n{noise_provenance(args.sweep_dirs)} Written by `{command}`.\n"
    print(text)
    if args.out:
        atomic.write_text(Path(args.out), text)
    if args.plot:
        with atomic.writer(Path(args.plot), "wb") as f:
            noise_figure(points).savefig(f, format="png", dpi=120)
    return text


if __name__ == "__main__":
    main()
