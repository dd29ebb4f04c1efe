"""Positive–negative ratio ablation plot: x = M (``data.max_positives``), one line per objective, one subplot
column per G (``data.group_size``), one subplot row per metric; runs sharing (objective, G, M), e.g. several
seeds, are averaged. Rendered with matplotlib's Agg canvas (no pyplot state)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from multipos.report.runs import KEY_ALIASES, RunResult
from multipos.report.tables import metric_label

#: Metrics plotted by default (one subplot row each).
PLOT_METRICS = ("mrr@10", "ndcg@10")
#: Config keys that must agree between runs averaged into one point (seeds may differ).
AVERAGE_KEYS = ("data.name", "regime", "data.positive_selection")


def _int_key(run: RunResult, alias: str) -> int:
    """``run.get(alias)`` as an int (G or M); ``ValueError`` naming the config file when absent/not an integer."""
    key = KEY_ALIASES[alias]
    value = run.get(alias)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{run.path / '.hydra' / 'config.yaml'}: {key} ({alias}) is "
                         f"{'missing' if value is None else f'not an integer: {value!r}'} "
                         "(needed for the ratio ablation plot)")
    return value


#: Panel of the runs whose candidates are the whole corpus (``passages.candidates=corpus``: G plays no part).
CORPUS_PANEL = "corpus"


def _panel(run: RunResult) -> int | str:
    """The run's subplot column: its group size G, or :data:`CORPUS_PANEL` for corpus candidates."""
    try:
        candidates = run.get("passages.candidates")
    except ValueError:  # runs from before query-side training have no passages node
        candidates = None
    return CORPUS_PANEL if candidates == "corpus" else _int_key(run, "G")


def ratio_ablation_points(runs: Sequence[RunResult], eval_set: str, metrics: Sequence[str] = PLOT_METRICS
                          ) -> dict[str, dict[int, dict[str, list[tuple[int, float, int]]]]]:
    """The data of :func:`plot_ratio_ablation`: ``{metric: {G: {objective: [(M, mean, n_runs), …]}}}``; runs with every
    corpus passage a candidate (``passages.candidates=corpus``) form their own panel, :data:`CORPUS_PANEL`, after the G
    values.

    G, objectives and the points are sorted (G and M ascending, objectives in order of first
    appearance in ``runs``). ``mean`` is the plain mean of ``metrics.json[eval_set][metric]`` over the
    ``n_runs`` runs sharing (objective, G, M). Raises ``ValueError`` (naming the run) when there are
    no runs or metrics, when a run has no objective, no integer G / M, no ``eval_set`` or lacks a
    metric, or when runs averaged together differ in :data:`AVERAGE_KEYS` (different data / regime /
    positive selection must not be mixed into one point).
    """
    if not runs:
        raise ValueError("no runs to plot")
    metrics = list(metrics)
    if not metrics:
        raise ValueError("need at least one metric to plot")
    groups: dict[tuple[str, int, int], list[RunResult]] = {}
    for run in runs:
        if not run.objective:
            raise ValueError(f"{run.path}: no objective (loss.name) — cannot label its line")
        G, M = _panel(run), _int_key(run, "M")
        if eval_set not in run.metrics:
            raise ValueError(f"{run.path / 'metrics.json'}: no eval set {eval_set!r} "
                             f"(has: {', '.join(run.metrics) or 'nothing'})")
        for m in metrics:
            run.value(eval_set, m)
        groups.setdefault((run.objective, G, M), []).append(run)
    for (obj, G, M), members in groups.items():
        for key in AVERAGE_KEYS:
            values = {repr(r.config.get(key)) for r in members}
            if len(values) > 1:
                raise ValueError(f"runs with objective={obj}, G={G}, M={M} differ in {key} "
                                 f"({', '.join(sorted(values))}): "
                                 f"{', '.join(str(r.path) for r in members)}; plot them separately")
    objectives = list(dict.fromkeys(r.objective for r in runs))
    out: dict[str, dict[int, dict[str, list[tuple[int, float, int]]]]] = {}
    for m in metrics:
        per_g: dict[int, dict[str, list[tuple[int, float, int]]]] = {}
        for G in sorted({g for _, g, _ in groups}, key=lambda g: (isinstance(g, str), g)):
            lines = {}
            for obj in objectives:
                pts = [(M, math.fsum(r.value(eval_set, m) for r in rs) / len(rs), len(rs))
                       for (o, g, M), rs in groups.items() if o == obj and g == G]
                if pts:
                    lines[obj] = sorted(pts)
            per_g[G] = lines
        out[m] = per_g
    return out


def ratio_ablation_figure(runs: Sequence[RunResult], eval_set: str, metrics: Sequence[str] = PLOT_METRICS):
    """Build the ratio ablation :class:`matplotlib.figure.Figure` (Agg canvas, no pyplot state).

    Layout: ``len(metrics)`` rows × ``len(G values)`` columns of axes (``fig.axes`` row by row); in
    each axes one line per objective that has runs with that G (x = M, y = mean metric, markers at
    the points), same colour per objective in every panel, one figure legend. Errors: see
    :func:`ratio_ablation_points`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = ratio_ablation_points(runs, eval_set, metrics)
    metrics = list(points)
    gs = list(points[metrics[0]])
    objectives = list(dict.fromkeys(r.objective for r in runs))
    colours = {obj: f"C{i % 10}" for i, obj in enumerate(objectives)}
    fig = Figure(figsize=(3.6 * len(gs) + 1.8, 2.8 * len(metrics) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics), len(gs), squeeze=False, sharex="col")
    handles = {}
    for i, m in enumerate(metrics):
        for j, G in enumerate(gs):
            ax = axes[i][j]
            ms = set()
            for obj, pts in points[m][G].items():
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                ms.update(xs)
                (handles[obj],) = ax.plot(xs, ys, marker="o", color=colours[obj], label=obj)
            ax.set_xticks(sorted(ms))
            ax.grid(True, alpha=0.3)
            if i == 0:
                ax.set_title("every corpus passage" if G == CORPUS_PANEL else f"G={G}")
            if i == len(metrics) - 1:
                ax.set_xlabel("M (positives per group)")
            if j == 0:
                ax.set_ylabel(metric_label(m))
    fig.suptitle(f"Positive–negative ratio ablation ({eval_set})")
    fig.legend([handles[o] for o in objectives if o in handles], [o for o in objectives if o in handles],
               loc="outside right center")
    return fig


def sweep_points(runs: Sequence[RunResult], key: str, eval_sets: Sequence[str], metric: str
                 ) -> dict[str, list[tuple[float, float, float, int]]]:
    """The data of :func:`sweep_figure`: ``{eval_set: [(x, mean, sd, n_runs), …]}``, x ascending.

    ``x`` is the run's config value ``key`` (a dotted key, e.g. ``wise_ft.alpha``) as a float; runs sharing
    one x (seeds) give the mean and the sample standard deviation (0 for one run) of
    ``metrics.json[eval_set][metric]``. Raises ValueError (naming the run's file) when there are no runs, a
    run lacks ``key`` or it is not a number, or lacks an eval set or the metric.
    """
    if not runs:
        raise ValueError("no runs to plot")
    values: dict[str, dict[float, list[float]]] = {s: {} for s in eval_sets}
    for run in runs:
        x = run.get(key)
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"{run.path / '.hydra' / 'config.yaml'}: {key} is {x!r}, not a number (the x axis)")
        for s in eval_sets:
            if s not in run.metrics:
                raise ValueError(f"{run.path / 'metrics.json'}: no eval set {s!r} (has: {', '.join(run.metrics)})")
            values[s].setdefault(float(x), []).append(run.value(s, metric))
    out = {}
    for s, by_x in values.items():
        out[s] = []
        for x in sorted(by_x):
            ys = by_x[x]
            mean = sum(ys) / len(ys)
            sd = math.sqrt(sum((y - mean) ** 2 for y in ys) / (len(ys) - 1)) if len(ys) > 1 else 0.0
            out[s].append((x, mean, sd, len(ys)))
    return out


def sweep_figure(runs: Sequence[RunResult], key: str, eval_sets: Sequence[str], metrics: Sequence[str] = ("ndcg@10",)):
    """One numeric setting against several eval sets: one subplot per eval set (each its own y scale, since
    in-domain and out-of-domain scores differ in level), x = ``key``, y = mean metric over seeds with ± sd
    bars (:func:`sweep_points`; the first metric). Used for the WiSE-FT curve (``report.plot.kind:
    interpolation``). Returns a :class:`matplotlib.figure.Figure` (Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = list(metrics)[0]
    points = sweep_points(runs, key, eval_sets, metric)
    fig = Figure(figsize=(3.4 * len(points) + 0.4, 3.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(points), squeeze=False)[0]
    for i, (ax, (s, pts)) in enumerate(zip(axes, points.items())):
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                    color=f"C{i}")
        ax.set_title(s)
        ax.set_xlabel(key)
        ax.set_xticks([p[0] for p in pts])
        ax.grid(True, alpha=0.3)
        if i == 0:
            ax.set_ylabel(f"{metric_label(metric)} (mean ± sd over seeds)")
    return fig


def plot_ratio_ablation(runs: Sequence[RunResult], eval_set: str, metrics: Sequence[str] = PLOT_METRICS, *,
                        out_png: str | Path, wandb_run=None) -> Path:
    """Plot the positive–negative ratio ablation of ``runs`` on ``eval_set`` and save it as a PNG.

    x = M (``data.max_positives``), one line per objective (``loss.name``), one subplot column per G
    (``data.group_size``), one subplot row per metric (:func:`ratio_ablation_figure`); runs sharing
    (objective, G, M), e.g. several seeds, are averaged. Rendered with matplotlib's non-interactive
    Agg canvas (no pyplot, no global backend change). ``out_png``'s parent directories are created.
    ``wandb_run`` (anything with a ``log`` method, e.g. a ``wandb`` run) → the figure is logged as a
    ``wandb.Image`` under ``ratio_ablation/<eval_set>``. Returns the PNG path. Raises ``ValueError``
    for runs lacking G / M / the set / a metric (see :func:`ratio_ablation_points`).
    """
    fig = ratio_ablation_figure(runs, eval_set, metrics)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=120)
    if wandb_run is not None:
        from multipos.training.loggers import wandb_image

        wandb_run.log({f"ratio_ablation/{eval_set}": wandb_image(fig)})
    return out
