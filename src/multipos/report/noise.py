"""The label-noise study's answer in numbers: each objective's score against the noise rate ρ, and its slope.

For each objective and kind of false positive (:mod:`multipos.data.label_noise`), the runs of one or more sweeps give
points (ρ, score of one seed); runs without noise (``data.source.label_noise`` null or rate 0) count for every kind.
The slope is the ordinary least-squares fit of score on ρ over all those points (``scipy.stats.linregress``), with a
two-sided 95 % confidence interval from the t distribution with n − 2 degrees of freedom: the score lost per unit ρ.

    python -m multipos.report.noise multirun/label_noise-cpu-query_side multirun/table2_homogeneous-cpu-query_side \\
        --out experiments/results/label_noise_slopes.md
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from multipos import atomic
from multipos.report.runs import load_run
from multipos.runs.find import sweep_runs

__all__ = ["noise_points", "noise_slopes", "format_slopes", "main"]


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


def noise_points(sweep_dirs: Sequence[str | Path], eval_set: str, metric: str) -> dict[tuple[str, str], list]:
    """{(objective, kind) → [(ρ, score), ...]} of the finished runs of ``sweep_dirs``; a noise-free run is a point
    at ρ = 0 of every kind that the sweeps hold. Raises FileNotFoundError when they hold no finished run."""
    runs = []
    for d in sweep_dirs:
        runs += [load_run(r, require_per_query=False) for r in sweep_runs(d)[0]]
    if not runs:
        raise FileNotFoundError(f"{', '.join(map(str, sweep_dirs))}: no finished run")
    clean, noisy = defaultdict(list), defaultdict(list)
    for run in runs:
        rate, kind = _noise(run)
        if eval_set not in run.metrics or metric not in run.metrics[eval_set]:
            continue
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
               "slope": None, "ci_low": None, "ci_high": None}
        if len(pts) >= 3 and len(by_rate) >= 2:
            fit = stats.linregress([r for r, _ in pts], [v for _, v in pts])
            half = stats.t.ppf(0.975, len(pts) - 2) * fit.stderr
            row.update(slope=fit.slope, ci_low=fit.slope - half, ci_high=fit.slope + half)
        rows.append(row)
    return rows


def format_slopes(rows: Sequence[dict], eval_set: str, metric: str) -> str:
    """A Markdown table: mean score at each ρ and the slope with its 95 % interval."""
    rates = sorted({r for row in rows for r in row["means"]})
    head = ["objective", "false positives", *(f"ρ={r:g}" for r in rates), "slope per unit ρ [95 % CI]"]
    lines = [f"Table: {eval_set} {metric} against the share ρ of positives replaced by false positives", "",
             "| " + " | ".join(head) + " |", "|:---|:---|" + "---:|" * (len(rates) + 1)]
    for row in rows:
        cells = [f"{row['means'][r]:.4f}" if r in row["means"] else "" for r in rates]
        slope = ("n/a" if row["slope"] is None or math.isnan(row["slope"]) else
                 f"{row['slope']:+.4f} [{row['ci_low']:+.4f}, {row['ci_high']:+.4f}]")
        lines.append(f"| {row['objective']} | {row['kind']} | " + " | ".join(cells) + f" | {slope} |")
    n = sorted({row["n"] for row in rows})
    lines += ["", f"Mean over seeds at each ρ; slope: least-squares fit over every (ρ, seed) point ({n} points per "
              "row), 95 % interval from the t distribution. Written by `python -m multipos.report.noise`."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m multipos.report.noise", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dirs", nargs="+")
    ap.add_argument("--set", default="nfcorpus_test")
    ap.add_argument("--metric", default="ndcg@10")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    text = format_slopes(noise_slopes(noise_points(args.sweep_dirs, args.set, args.metric)), args.set, args.metric)
    print(text)
    if args.out:
        atomic.write_text(Path(args.out), text)
    return text


if __name__ == "__main__":
    main()
