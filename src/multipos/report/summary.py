"""The main job's closing summary: each test set's score over seeds next to BM25 and the zero-shot start.

``make train`` trains three seeds of ``experiment=default`` and ends with::

    python -m multipos.report.summary multirun/default-cpu [--metric ndcg@10]

which prints one line per test set (dev sets left out): mean ± sample sd over the seeds, each seed's value, the
zero-shot and BM25 references (``references.json``), the difference to zero-shot and a two-sided paired t-test
over queries of the per-query values averaged over seeds against the zero-shot ones (:func:`paired_ttest`;
``references/zero-shot/per_query.<set>.json`` written by training). A sweep of several configurations (a study
such as ``experiment=two_tower_objectives``) gets one block per configuration, named by its run folder without
the seed; ``--against <configuration>`` adds to every other configuration's lines its difference to that one and a
paired t-test of the two configurations' seed-mean per-query values (the p-values behind the rendered table's markers,
``python -m multipos.report.render``); ``--dev`` keeps the dev sets. Nothing is written.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Sequence

from multipos.report.runs import RunResult, load_run
from multipos.report.seeds import SeedGroup, group_seeds
from multipos.report.significance import paired_ttest
from multipos.runs.find import sweep_runs


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, sd


def _configuration(run: RunResult) -> str:
    """A configuration's name: its run folder's name without the ``seed=`` part (``loss=lsepair,seed=42`` →
    ``loss=lsepair``), else its objective."""
    name = ",".join(part for part in run.name.split(",") if not part.startswith("seed="))
    return name or run.label


def summary_rows(sweep_dir: str | Path, metric: str = "ndcg@10", against: str | None = None,
                 dev: bool = False) -> list[dict]:
    """One dict per configuration and test set of the complete runs in ``sweep_dir`` (the runs that differ only by seed
    form one configuration, :func:`multipos.report.seeds.group_seeds`): ``config, set, n_seeds, seeds ({seed:
    value}), mean, sd, zero_shot, bm25, p, p_bm25`` (``config``: :func:`_configuration` where the sweep holds more
    than one configuration, else None; ``p`` / ``p_bm25``: paired t-test of the per-query seed means vs zero-shot /
    BM25; None where a run lacks that reference's per-query file). Sets whose name contains ``dev`` (unless ``dev``)
    and qrels views (``set.view``) are left out. With ``against`` (a configuration name as ``config`` gives it, e.g.
    ``loss=singlelh``), each row of every other configuration also has ``against`` (that name), ``against_mean`` and
    ``against_p``: the paired t-test of the two configurations' per-query means over their own seeds; None for a set
    without per-query files (an aggregate such as Table 3's ``ood_average``).

    Raises FileNotFoundError when the sweep holds no complete run; ValueError when the runs disagree on their
    sets or queries (:func:`paired_ttest` names the difference), or naming the configurations there are when
    ``against`` is none of them.
    """
    complete, _ = sweep_runs(sweep_dir)
    if not complete:
        raise FileNotFoundError(f"{sweep_dir}: no complete run (metrics.json) to summarise")
    groups = group_seeds(load_run(d, require_per_query=False) for d in complete)
    names = [_configuration(g.runs[0]) for g in groups]
    if against is not None and against not in names:
        raise ValueError(f"--against {against!r}: no such configuration in {sweep_dir}; there are {names}")
    base = groups[names.index(against)] if against is not None else None
    rows = []
    for name, group in zip(names, groups):
        config = name if len(groups) > 1 else None
        for row in _configuration_rows(group, metric, dev):
            if base is not None and group is not base:
                s = row["set"]
                p = (paired_ttest(group.query_values(s, metric), base.query_values(s, metric))[1]
                     if _has_query_values(group, s, metric) and _has_query_values(base, s, metric) else None)
                row.update(against=against, against_mean=base.value(s, metric), against_p=p)
            rows.append({"config": config, **row})
    return rows


def _has_query_values(group: SeedGroup, eval_set: str, metric: str) -> bool:
    """Whether every run of ``group`` has per-query values of ``metric`` on ``eval_set`` (an aggregate set has none)."""
    return all(eval_set in run.per_query and metric in run.per_query[eval_set] for run in group.runs)


def _configuration_rows(group: SeedGroup, metric: str, dev: bool = False) -> list[dict]:
    """:func:`summary_rows` of the seeds of one configuration, without ``config``."""
    runs = group.runs
    sets = [s for s in runs[0].metrics if (dev or "dev" not in s) and "." not in s and metric in runs[0].metrics[s]]
    rows = []
    for s in sets:
        values = {run.get("seed"): run.value(s, metric) for run in runs}
        mean, sd = _mean_sd(list(values.values()))
        refs = runs[0].references
        row = {"set": s, "n_seeds": len(runs), "seeds": values, "mean": mean, "sd": sd,
               "zero_shot": (refs.get("zero-shot") or {}).get(s, {}).get(metric),
               "bm25": (refs.get("bm25") or {}).get(s, {}).get(metric), "p": None, "p_bm25": None}
        for key, reference in (("p", "zero-shot"), ("p_bm25", "bm25")):
            ref_file = runs[0].path / "references" / reference / f"per_query.{s}.json"
            if ref_file.is_file() and _has_query_values(group, s, metric):
                values_ref = json.loads(ref_file.read_text())[metric]
                row[key] = paired_ttest(group.query_values(s, metric), values_ref)[1]
        rows.append(row)
    return rows


def format_summary(rows: Sequence[dict], metric: str = "ndcg@10") -> str:
    """The lines :func:`main` prints (one per test set)."""
    lines = [f"{metric}, mean ± sd over seeds "
             "(paired t-tests of the seed-mean per-query values vs zero-shot and BM25):"]
    config = None
    for r in rows:
        if r.get("config") is not None and r["config"] != config:
            config = r["config"]
            lines.append(f"{config}:")
        seeds = ", ".join(f"{k}: {v:.4f}" for k, v in r["seeds"].items())
        ref = ""
        if r["zero_shot"] is not None:
            ref += f" | zero-shot {r['zero_shot']:.4f} ({r['mean'] - r['zero_shot']:+.4f}"
            ref += f", p = {r['p']:.1e})" if r["p"] is not None else ", p n/a: no zero-shot per-query file)"
        if r["bm25"] is not None:
            ref += f" | BM25 {r['bm25']:.4f}"
            if r.get("p_bm25") is not None:
                ref += f" ({r['mean'] - r['bm25']:+.4f}, p = {r['p_bm25']:.1e})"
        if r.get("against") is not None:
            ref += f" | vs {r['against']} {r['mean'] - r['against_mean']:+.4f}"
            ref += f", p = {r['against_p']:.1e}" if r["against_p"] is not None else ", p n/a: no per-query values"
        lines.append(f"  {r['set']:<16} {r['mean']:.4f} ± {r['sd']:.4f} over {r['n_seeds']} seeds ({seeds}){ref}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    """``python -m multipos.report.summary <sweep_dir> [--metric M] [--against CONFIG] [--dev]``: print
    :func:`format_summary` of a finished multi-seed sweep (one line per set) and return it."""
    ap = argparse.ArgumentParser(prog="python -m multipos.report.summary", description=__doc__.split("\n")[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--metric", default="ndcg@10")
    ap.add_argument("--against", default=None, metavar="CONFIG",
                    help="a configuration of the sweep (e.g. loss=singlelh): every other one is tested against it")
    ap.add_argument("--dev", action="store_true", help="keep the dev sets (left out by default)")
    args = ap.parse_args(argv)
    text = format_summary(summary_rows(args.sweep_dir, args.metric, args.against, args.dev), args.metric)
    print(text)
    return text


if __name__ == "__main__":
    main()
