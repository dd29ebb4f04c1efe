"""``python -m multipos.report``: paper-style tables (and the ratio ablation plot) from run directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from multipos.report.plots import plot_ratio_ablation
from multipos.report.runs import collect
from multipos.report.significance import DEFAULT_BASELINES
from multipos.report.tables import parse_column, render_table, table_columns

DEFAULT_METRICS = ("ndcg@10", "mrr@10")


def _column_arg(text: str) -> tuple[str, str]:
    """argparse ``type`` of ``--columns`` items (:func:`parse_column`, errors as argparse errors)."""
    try:
        return parse_column(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m multipos.report",
                                description="Paper-style tables with significance markers from run directories.")
    p.add_argument("paths", nargs="+", help="run directories or sweep directories (searched recursively)")
    p.add_argument("--table", help="table name, used as title / caption (required unless --plot-ratio)")
    p.add_argument("--sets", nargs="+", help="eval sets (default: the sets every run has)")
    p.add_argument("--metrics", nargs="+",
                   help=f"metrics, one column per set × metric (default: {' '.join(DEFAULT_METRICS)})")
    p.add_argument("--columns", nargs="+", type=_column_arg, metavar="SET:METRIC",
                   help="explicit columns in display order, e.g. nq_test:acc@20 nq_test:acc@100 msmarco_dev:mrr@10 "
                        "beir_average:ndcg@10 (instead of --sets/--metrics; a set without per-query files in any "
                        "run, such as an average, gets no significance markers)")
    p.add_argument("--format", choices=["markdown", "latex", "both"], default="markdown")
    p.add_argument("--out", help="also write the table(s) to this file")
    p.add_argument("--row-key", default="objective", help='row labels: "objective", "name" or keys like "G,M"')
    p.add_argument("--baselines", nargs=2, default=list(DEFAULT_BASELINES), metavar=("SINGLELH", "RAND1LH"),
                   help='baseline objectives for +/- and ♣/♦ ("none" to disable one)')
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default: %(default)s)")
    p.add_argument("--percent", action="store_true", help="values ×100 with 2 decimals (default: 4 decimals)")
    p.add_argument("--no-significance", action="store_true", help="no markers (per-query files not needed)")
    p.add_argument("--no-references", action="store_true", help="no BM25 / zero-shot floor rows")
    p.add_argument("--per-seed", action="store_true",
                   help="one row per run (default: runs that differ only by seed form one row, mean ± std)")
    p.add_argument("--plot-ratio", metavar="FILE.png",
                   help="also save the positive–negative ratio ablation plot (x = M, one panel per G, one line "
                        "per objective, --metrics as rows) of the first of --sets to this PNG (with --columns: "
                        "the set of the first column, with that set's metrics)")
    return p


def main(argv: Sequence[str] | None = None) -> str:
    """CLI entry point: print the requested table(s) and return the printed text.

    ``--format both`` prints the Markdown table then the LaTeX table. ``--columns SET:METRIC …``
    gives explicit columns (mutually exclusive with ``--sets`` / ``--metrics``; an item without a
    single ':' or with an empty side is an argparse error); a set of those columns that has per-query
    values in no run (e.g. ``beir_average``) gets no markers and a note on stderr, while a run lacking
    per-query values of a set that other runs have is an error. ``--plot-ratio FILE.png`` also
    saves :func:`plot_ratio_ablation` of the first of ``--sets`` (default: of the sets every run has;
    with ``--columns``: the first column's set, with its metrics) and names the file on stderr; with
    ``--plot-ratio`` the table (``--table``) is optional. Runs that differ only by seed form one row
    (mean ± sample std, markers on per-query means over seeds); ``--per-seed`` shows one row per run.
    Errors (missing run files, mismatched queries, ambiguous baselines, runs without G / M, …) exit
    with status 2 and the message on stderr.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    table = args.table is not None
    if not table and not args.plot_ratio:
        parser.error("one of --table / --plot-ratio is required")
    if args.out and not table:
        parser.error("--out writes the table: it needs --table")
    if args.columns:
        clash = [o for o, v in (("--sets", args.sets), ("--metrics", args.metrics)) if v]
        if clash:
            parser.error(f"argument --columns: not allowed with {' / '.join(clash)} "
                         "(give either explicit columns or --sets/--metrics)")
    try:
        sig = not args.no_significance and table
        if args.columns:
            runs = collect(args.paths, require_per_query=False)
            cols = table_columns(None, None, args.columns)
            plot_set = cols[0][0]
            plot_metrics = [m for s, m in cols if s == plot_set]
        else:
            metrics = args.metrics or list(DEFAULT_METRICS)
            runs = collect(args.paths, args.sets, metrics, require_per_query=sig)
            sets = args.sets or [s for s in runs[0].metrics if all(s in r.metrics for r in runs)]
            if not sets:
                raise ValueError("the runs share no eval set; pass --sets or --columns")
            cols = [(s, m) for s in sets for m in metrics]
            plot_set, plot_metrics = sets[0], metrics
        for r in runs:  # sets chosen by default / by --columns still need every value
            for s, m in cols:
                r.value(s, m)
        if sig:  # per-query values up front: every run for a set some run has them for, else no markers
            for s in dict.fromkeys(s for s, _ in cols):
                if any(s in r.per_query for r in runs):
                    for r in runs:
                        for m in (m for c, m in cols if c == s):
                            r.query_values(s, m)
                else:
                    print(f"note: no run has per-query values for {s!r} (e.g. an average over sets): "
                          "its columns carry no significance markers", file=sys.stderr)
        baselines = tuple(None if b.lower() == "none" else b for b in args.baselines)
        fmts = ["markdown", "latex"] if args.format == "both" else [args.format]
        text = "\n\n".join(render_table(runs, row_key=args.row_key, fmt=f, baselines=baselines, title=args.table,
                                        alpha=args.alpha, references=not args.no_references, significance=sig,
                                        percent=args.percent, columns=cols, aggregate=not args.per_seed)
                         for f in fmts) if table else ""
        if args.plot_ratio:
            png = plot_ratio_ablation(runs, plot_set, plot_metrics, out_png=args.plot_ratio)
            print(f"ratio ablation plot ({plot_set}): {png}", file=sys.stderr)
    except (FileNotFoundError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if not table:
        return text
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return text
