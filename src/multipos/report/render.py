"""A study's result files from its sweep directory: ``python -m multipos.report.render <sweep dir>``.

The layout comes from the ``report:`` node that the experiment config (``conf/experiment/<study>.yaml``)
puts into every run's composed config::

    report:
      name: table2_homogeneous     # output stem: <out>/<name>.md, <name>.tex (and <name>.png with a plot)
      title: "Table 2: ..."        # table caption
      kind: table                  # table (default) | trials (one row per run, e.g. a recipe search)
      row_key: objective           # as render_table's row_key, e.g. "objective,G,M"
      columns: [nfcorpus_test:ndcg@10, trec_dl19:ndcg@10]   # SET:METRIC
      plot: null                   # or {kind: ratio_ablation, eval_set: nfcorpus_test, metrics: [ndcg@10]}, or
                                   # {kind: interpolation, key: wise_ft.alpha, eval_sets: [...], metrics: [ndcg@10]}
      notes: ""                    # free text under the table

Only complete runs (with ``metrics.json``) are tabulated; incomplete run directories are named in a
warning and in the notes. A ``table`` aggregates seeds and carries floor rows and significance markers
(:func:`multipos.report.tables.render_table`); ``trials`` lists every run sorted by the optimised metric
(``optimized_metric``, else the first column), with its sweep overrides, metrics, wall time and device.
Both end with a provenance line generated from the runs (count, seeds, sweep, wall time, device).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

from tqdm.auto import tqdm

from multipos import atomic
from multipos.report.plots import PLOT_METRICS, ratio_ablation_figure, sweep_figure
from multipos.report.runs import RunResult, config_node, load_run, override_map
from multipos.report.seeds import config_difference, group_seeds, sort_seeds
from multipos.report.setting import check_one_setting
from multipos.report.significance import DEFAULT_BASELINES, is_baseline_row
from multipos.report.tables import PER_RUN_KEYS, metric_label, parse_column, render_grid, render_table, row_label
from multipos.runs.find import sweep_runs
from multipos.runs.folder import read_run_info

KINDS = ("table", "trials")
PLOT_KINDS = ("ratio_ablation", "interpolation")


def read_spec(dirs: Sequence[Path]) -> dict:
    """The ``report`` node of the first run's config, checked: every run of ``dirs`` must agree on
    ``report.name`` (``ValueError`` naming two disagreeing directories)."""
    names = [(d, config_node(d, "report.name")) for d in dirs]
    for d, n in names[1:]:
        if n != names[0][1]:
            raise ValueError(f"runs disagree on report.name: {names[0][0]} has {names[0][1]!r}, {d} has {n!r}")
    cfg = dirs[0] / ".hydra" / "config.yaml"
    spec = config_node(dirs[0], "report")
    if not isinstance(spec, Mapping):
        raise ValueError(f"{cfg}: no `report:` node (the experiment config sets it: name, title, row_key, columns)")
    defaults = {"title": None, "kind": "table", "row_key": "objective", "plot": None, "notes": ""}
    spec = {**defaults, **{k: v for k, v in spec.items() if v is not None}}
    if not spec.get("name") or not spec.get("columns") or isinstance(spec["columns"], str):
        raise ValueError(f"{cfg}: report needs a name and a list of SET:METRIC columns, got {dict(spec)}")
    if spec["kind"] not in KINDS:
        raise ValueError(f"{cfg}: unknown report.kind {spec['kind']!r} (choose from {', '.join(KINDS)})")
    plot = spec["plot"]
    if plot is not None and (not isinstance(plot, Mapping) or plot.get("kind") not in PLOT_KINDS
                             or (plot["kind"] == "ratio_ablation" and not plot.get("eval_set"))
                             or (plot["kind"] == "interpolation" and not (plot.get("key") and plot.get("eval_sets")))):
        raise ValueError(f"{cfg}: report.plot must be null, {{kind: ratio_ablation, eval_set: SET, metrics: [...]}} "
                         f"or {{kind: interpolation, key: CONFIG.KEY, eval_sets: [...], metrics: [...]}}, got {plot!r}")
    return spec


def _scale_settings(run_dir: Path) -> Mapping:
    """The ``scale`` node of a run's saved config (``{}`` when none); runs made before 2026-12-04 kept the scale's
    settings in a ``size`` node (the ``size`` group, since folded into ``scale``)."""
    node = config_node(run_dir, "scale")
    node = node if isinstance(node, Mapping) else config_node(run_dir, "size")
    return node if isinstance(node, Mapping) else {}


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.2f} h"


def provenance(sweep: Path, runs: Sequence[RunResult], infos: Sequence[Mapping], rows: int | None = None) -> str:
    """One line: number of runs (and rows), seeds, sweep name (and the archive, for a sweep of an archived study,
    ``experiments/sweeps/<archive>/<sweep>``, or a copy of one in another folder named ``sweeps``), runs copied from
    an equivalent finished run (``run_info.json`` ``reused_from``, :mod:`multipos.runs.reuse`) or whose results are
    another study's run of the same cell (``copied_from``, :mod:`multipos.report.consistency`), wall time of the
    others (total and mean per run, from ``run_info.json`` ``wall_s``, left out when no run has it; called a lower
    bound when runs were resumed, ``run_info.json`` ``resumed``, since an attempt that was killed never records its
    time) and device(s) (``run_info.json`` ``device``; several: each with its number of runs)."""
    seeds = sort_seeds({r.config.get("seed") for r in runs if r.config.get("seed") is not None})
    parts = [f"{len(runs)} run{'s' * (len(runs) != 1)}"
             + (f" ({rows} row{'s' * (rows != 1)})" if rows is not None else "")
             + f" in sweep `{sweep.resolve().name}`"
             + (f" of archive `experiments/sweeps/{sweep.resolve().parent.name}`"
                if sweep.resolve().parent.parent.name == "sweeps" else "")]
    if seeds:
        parts.append(f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}")
    reused = sum(1 for i in infos if i.get("reused_from"))
    if reused:
        parts.append(f"{reused} of them copied from an equivalent finished run (`reused_from` in their "
                     f"`run_info.json`: the same model and evaluation), not trained again")
    copied = [[i["copied_from"]] if isinstance(i["copied_from"], str) else list(i["copied_from"])
              for i in infos if i.get("copied_from")]
    cells = sum(any("(references:" not in c for c in entries) for entries in copied)
    refs = sum(any("(references:" in c for c in entries) for entries in copied)
    for n, what in ((cells, "results"), (refs, "reference rows")):
        if n:
            parts.append(f"{n} of them: their {what} copied from the one run of that cell or key kept in another "
                         "sweep (`copied_from` in `run_info.json`, `python -m multipos.report.consistency --resolve`)")
    walls = [float(i["wall_s"]) for i in infos
             if isinstance(i.get("wall_s"), (int, float)) and not i.get("reused_from")]
    if walls:
        trained = len(runs) - reused
        over = f" (over {len(walls)} of {trained} runs)" if len(walls) < trained else ""
        resumed = sum(1 for i in infos if i.get("resumed") and not i.get("reused_from"))
        if resumed:  # a killed attempt never writes its wall_s (multipos.runs.lifecycle sums the recorded ones)
            over += (f" (a lower bound: {resumed} of them resumed after a stop, whose time before the stop is not "
                     f"recorded)")
        parts.append(f"wall time {_duration(math.fsum(walls))} in total, {_duration(math.fsum(walls) / len(walls))} "
                     f"per {'trained ' * bool(reused)}run{over}")
    devices = Counter(str(i["device"]) for i in infos if i.get("device"))
    if len(devices) == 1:
        parts.append(f"device: {next(iter(devices))}")
    elif devices:  # a device description holds commas itself ("CPU AMD EPYC, 2 cores"): one per part, with its runs
        parts.append("devices: " + " / ".join(f"{d} ({n} run{'s' * (n != 1)})" for d, n in devices.items()))
    return "Provenance: " + "; ".join(parts) + "."


def _label_clashes(runs: Sequence[RunResult], row_key: str, sweep: Path) -> list[str]:
    """Notes (and warnings) for rows that share a label although their configs differ, e.g. seeds that were run
    with another configuration and so did not join their row."""
    firsts: dict[str, RunResult] = {}
    notes = []
    for g in group_seeds(runs):
        label = row_label(g, row_key)
        if label in firsts:
            diff = config_difference(firsts[label], g.first)
            notes.append(f"rows labelled {label!r} differ in {', '.join(diff[:5]) or 'nothing'}"
                         f"{' …' if len(diff) > 5 else ''} (`{firsts[label].path.relative_to(sweep)}` vs "
                         f"`{g.path.relative_to(sweep)}`)")
        firsts.setdefault(label, g.first)
    for note in notes:
        warnings.warn(note, stacklevel=3)
    return notes


def _table(spec: Mapping, runs: list[RunResult], sweep: Path,
           baselines: Sequence[str | None] | None = None) -> tuple[str, str, list[str]]:
    cols = [parse_column(c) for c in spec["columns"]]
    for r in runs:
        for s, m in cols:
            r.value(s, m)
    chosen = list(baselines or spec.get("baselines") or DEFAULT_BASELINES)
    if len(chosen) > 2:
        raise ValueError(f"at most two baselines (the +/- and the ♣/♦ one), got {chosen!r}")
    chosen += [None] * (2 - len(chosen))
    # a baseline that no run belongs to (e.g. a study without SingleLH) marks nothing
    baselines = tuple(b if b is not None and any(is_baseline_row(r, b) for r in runs) else None
                      for b in chosen)
    sig = any(s in r.per_query for r in runs for s, _ in cols)
    kw = dict(columns=cols, row_key=spec["row_key"], baselines=baselines, title=spec["title"], significance=sig)
    md, tex = (render_table(runs, fmt=f, **kw) for f in ("markdown", "latex"))
    per_run = any(p.strip() in PER_RUN_KEYS for p in str(spec["row_key"]).split(","))
    return md, tex, [] if per_run else _label_clashes(runs, spec["row_key"], sweep)


def _trials(spec: Mapping, runs: list[RunResult], infos: list[Mapping], first: Path) -> tuple[str, str, list[str]]:
    cols = [parse_column(c) for c in spec["columns"]]
    opt = config_node(first, "optimized_metric")
    key = tuple(str(opt).split("/", 1)) if opt and "/" in str(opt) else cols[0]
    cols = cols if key in cols else [key, *cols]
    scores = [r.value(*key) for r in runs]
    order = sorted(range(len(runs)), key=lambda i: (-scores[i], str(runs[i].path)))
    ovs = [override_map(r.overrides) for r in runs]
    keys = list(dict.fromkeys(k for o in ovs for k in o))
    varying = [k for k in keys if len(runs) == 1 or len({o.get(k) for o in ovs}) > 1]
    common = [f"{k}={ovs[0][k]}" for k in keys if k not in varying]
    header = ["#", *varying, *(f"{s} {metric_label(m)}" for s, m in cols), "wall time", "device"]
    rows = []
    for n, i in enumerate(order, 1):
        wall = infos[i].get("wall_s")
        rows.append([str(n), *(ovs[i].get(k, "—") for k in varying), *(f"{runs[i].value(s, m):.4f}" for s, m in cols),
                     _duration(float(wall)) if isinstance(wall, (int, float)) else "—",
                     str(infos[i].get("device") or "—")])
    align = "r" + "l" * len(varying) + "r" * len(cols) + "rl"
    md, tex = (render_grid(header, rows, f, title=spec["title"], align=align) for f in ("markdown", "latex"))
    notes = [f"Sorted by {key[0]} {metric_label(key[1])} (descending)."]
    per_value = best_per_value([scores[i] for i in order], [ovs[i] for i in order], varying)
    if per_value:
        notes.append(f"Best trial per value of each searched setting ({key[0]} {metric_label(key[1])}; trials in "
                     "parentheses; a value's best trial also differs in the other settings):\n"
                     + "\n".join(f"- `{k}`: " + ", ".join(f"{v} {best:.4f} ({n})" for v, best, n in values)
                                  for k, values in per_value))
    if common:
        notes.append("Overrides common to every run: " + " ".join(f"`{c}`" for c in common) + ".")
    return md, tex, notes


def best_per_value(values: Sequence[float], overrides: Sequence[Mapping[str, str]], keys: Sequence[str],
                   max_values: int = 8) -> list[tuple[str, list[tuple[str, float, int]]]]:
    """The best trial for each value of each searched setting: which objective, regime or M did best in a recipe
    search, at a glance. ``values[i]``: trial i's optimised metric; ``overrides[i]``: its sweep overrides (key →
    value; a key it lacks reads "—"). A setting is listed when it took from 2 to ``max_values`` values and some value
    was tried more than once (a continuous setting such as the learning rate, one value per trial, is left out).

    Returns ``[(key, [(value, best metric, trials), …]), …]`` in the order of ``keys``, each setting's values best
    first (ties: the value seen first in ``values``' order). Raises ValueError when ``values`` and ``overrides``
    differ in length."""
    if len(values) != len(overrides):
        raise ValueError(f"best_per_value: {len(values)} metric values for {len(overrides)} trials")
    out = []
    for k in keys:
        seen: dict[str, list[float]] = {}
        for v, o in zip(values, overrides):
            seen.setdefault(str(o.get(k, "—")), []).append(v)
        if 2 <= len(seen) <= max_values and len(seen) < len(values):
            ranked = sorted(seen.items(), key=lambda kv: -max(kv[1]))  # stable: first seen wins a tie
            out.append((k, [(v, max(vs), len(vs)) for v, vs in ranked]))
    return out


def render_sweep(sweep_dir: str | Path, out: str | Path = "experiments/results", name: str | None = None,
                 wandb_project: str | None = None, baselines: Sequence[str | None] | None = None,
                 title: str | None = None, allow_mixed_settings: bool = False) -> str:
    """Render the study in ``sweep_dir`` to ``<out>/<name>.md`` and ``.tex`` (and ``.png`` with a plot).

    The runs must share one setting, device kind and precision (:func:`multipos.report.setting.check_one_setting`):
    otherwise ``MixedSettingsError`` names each setting's runs, unless ``allow_mixed_settings``, which renders them
    together with a note under the table that says so.

    ``baselines`` (at most two: the ``+``/``-`` one, then the ``♣``/``♦`` one) replaces ``report.baselines`` and
    the default (SingleLH, Rand1LH): objective names or controls ``"<key>=<value>"``, e.g.
    ``["negative_filter=none"]`` marks each filter against no filter for the same objective
    (:func:`multipos.report.significance.resolve_baseline`).

    ``title`` replaces ``report.title`` as the table caption (runs made with the overrides of a recipe under another
    experiment's config carry that experiment's title).

    ``name`` replaces ``report.name`` as the output stem; without it, a study run as a variant (``scale.suffix``, e.g.
    ``scale=cpu_query_side``) writes ``<report.name>_<suffix>`` and one at paper scale
    ``<report.name>_paper[_<suffix>]``, so neither overwrites the CPU-scale study. Files are written atomically
    (temporary sibling, then ``os.replace``). Runs are loaded with a progress bar (on a terminal).
    ``wandb_project``: also log the table as a ``wandb.Table`` and the figure to a W&B run of that project, grouped by
    the study (:func:`multipos.training.loggers.log_report`; offline under ``<sweep_dir>/wandb`` without a network).
    Returns the Markdown text. Raises ``FileNotFoundError`` when the sweep
    holds no complete run, ``ValueError`` for a missing / malformed ``report`` node, runs disagreeing on
    ``report.name``, or anything :func:`~multipos.report.tables.render_table` rejects; warns (``UserWarning``)
    about incomplete run directories.
    """
    sweep = Path(sweep_dir)
    complete, incomplete = sweep_runs(sweep)
    if not complete:
        raise FileNotFoundError(f"{sweep}: no complete run (run directory with .hydra/config.yaml and metrics.json)"
                                + (f"; {len(incomplete)} incomplete" if incomplete else ""))
    spec = read_spec(complete + incomplete)
    if title is not None:
        spec["title"] = title
    # a variant of a study (scale=cpu_query_side: scale.suffix "-query_side") renders beside the study's own
    # files, never over them: table2_homogeneous_query_side.md next to table2_homogeneous.md; so does the study at
    # paper scale (scale.name paper...): table2_homogeneous_paper.md, table2_homogeneous_paper_query_side.md
    scale = _scale_settings(complete[0])
    suffix = str(scale.get("suffix") or "").strip("-")
    if str(scale.get("name") or "").startswith("paper"):
        suffix = "_".join(filter(None, ("paper", suffix)))
    if suffix:
        spec["title"] = f"{spec['title']} ({suffix.replace('_', '-')})" if spec["title"] else None
    stem = name or str(spec["name"]) + (f"_{suffix}" if suffix else "")
    bar = tqdm(complete, desc=f"{sweep.name}: {len(complete)} complete runs, {len(incomplete)} in progress",
               unit="run", disable=None, leave=False)
    runs = [load_run(d, require_per_query=False) for d in bar]
    infos = [read_run_info(d) for d in complete]
    mixed = check_one_setting([(str(d.relative_to(sweep)), i, d) for d, i in zip(complete, infos)], f"`{sweep.name}`",
                              allow_mixed_settings)
    if spec["kind"] == "trials":
        md, tex, notes = _trials(spec, runs, infos, complete[0])
    else:
        md, tex, notes = _table(spec, runs, sweep, baselines)
    if spec["notes"]:
        notes.insert(0, str(spec["notes"]).strip())
    if mixed:
        notes.insert(0, mixed)
    if incomplete:
        rel = ", ".join(f"`{d.relative_to(sweep)}`" for d in incomplete)
        warnings.warn(f"{sweep}: {len(incomplete)} incomplete run dir(s) (no metrics.json) left out: {rel}",
                      stacklevel=2)
        notes.append(f"Incomplete runs (no metrics.json), not in the table: {rel}.")
    rows = None if spec["kind"] == "trials" else len(group_seeds(runs))
    notes.append(provenance(sweep, runs, infos, rows))
    out, fig = Path(out), None
    if spec["plot"] is not None:
        plot = spec["plot"]
        metrics = plot.get("metrics") or PLOT_METRICS
        metrics = [metrics] if isinstance(metrics, str) else list(metrics)
        if plot["kind"] == "interpolation":
            fig = sweep_figure(runs, str(plot["key"]), list(plot["eval_sets"]), metrics)
        else:
            fig = ratio_ablation_figure(runs, plot["eval_set"], metrics)
        with atomic.writer(out / f"{stem}.png", "wb") as f:
            fig.savefig(f, format="png", dpi=120)
        md += f"\n\n![{spec['title'] or stem}]({stem}.png)"
    md = md + "\n\n" + "\n\n".join(notes) + "\n"
    tex = tex + "\n" + "".join(f"% {line}\n" for n in notes for line in n.splitlines())
    atomic.write_text(out / f"{stem}.md", md)
    atomic.write_text(out / f"{stem}.tex", tex)
    if wandb_project:
        from multipos.training.loggers import log_report

        log_report(stem, md, fig, project=wandb_project, save_dir=str(sweep))
    return md


def main(argv: Sequence[str] | None = None) -> str:
    """CLI entry point: render the study (:func:`render_sweep`) and print the Markdown.
    Errors exit with status 2 and the message on stderr."""
    p = argparse.ArgumentParser(prog="python -m multipos.report.render",
                                description="A study's result tables from its sweep directory (laid out by report:).")
    p.add_argument("sweep_dir", help="the study's sweep directory (run directories at any depth)")
    p.add_argument("--out", default="experiments/results", help="output folder (default: %(default)s)")
    p.add_argument("--name", help="output stem (default: report.name of the runs' config)")
    p.add_argument("--title", help="table caption (default: report.title of the runs' config)")
    p.add_argument("--wandb", nargs="?", const="multipos", metavar="PROJECT",
                   help="also log the table (wandb.Table) and figure to W&B project PROJECT (default: %(const)s)")
    p.add_argument("--baselines", nargs="+", metavar="BASELINE",
                   help="the +/- baseline and optionally the ♣/♦ one: objective names or controls KEY=VALUE, e.g. "
                        "negative_filter=none (default: report.baselines of the runs' config, else singlelh rand1lh)")
    p.add_argument("--allow-mixed-settings", action="store_true",
                   help="render runs of several device kinds or precisions together, with a note saying so (default: "
                        "refuse, naming each setting's runs)")
    args = p.parse_args(argv)
    try:
        md = render_sweep(args.sweep_dir, args.out, args.name, wandb_project=args.wandb, baselines=args.baselines,
                          title=args.title, allow_mixed_settings=args.allow_mixed_settings)
    except (FileNotFoundError, ValueError) as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    print(md, end="")
    return md


if __name__ == "__main__":
    main(sys.argv[1:])
