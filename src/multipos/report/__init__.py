"""Paper-style result tables with significance markers, built from finished run directories.

Input: run directories written by :func:`multipos.train.train` (``metrics.json``,
``per_query.<eval set>.json``, ``.hydra/config.yaml``, ``.hydra/overrides.yaml`` and optionally
``references.json`` and ``run_info.json``), or sweep directories containing such runs at any depth.
Output: a Markdown or LaTeX table with one row per configuration and one column per (eval set, metric):
either the full grid ``sets`` × ``metrics`` or an explicit list of ``columns`` (different metrics per set, as
in the paper's tables, e.g. NQ Acc@20 / Acc@100 next to MS MARCO MRR@10 / R@1000 and a BEIR average).

Modules (one concept each; everything public is re-exported here):

* :mod:`~multipos.report.runs` — :class:`RunResult`, :func:`load_run`, :func:`collect`, config reading;
* :mod:`~multipos.report.seeds` — :class:`SeedGroup`, :func:`group_seeds` (seed aggregation);
* :mod:`~multipos.report.significance` — :func:`paired_ttest`, :func:`markers`, :func:`resolve_baseline`;
* :mod:`~multipos.report.tables` — :func:`render_table` (Markdown / LaTeX), :func:`render_grid`, labels (a job's
  ``results.txt`` table is :func:`multipos.evaluation.runner.format_plain`);
* :mod:`~multipos.report.plots` — the positive–negative ratio ablation figure;
* :mod:`~multipos.report.cli` — ``python -m multipos.report`` (:func:`main`);
* :mod:`~multipos.report.render` — ``python -m multipos.report.render <sweep dir>``: a study's table files
  laid out by the ``report:`` node of its experiment config (:func:`render_sweep`).

Conventions (the paper's, with the choices made here):

* **Seeds** — runs that differ only by ``seed`` (their ``.hydra/config.yaml`` agree on every key but
  ``seed`` and the keys that only name or place a run, their specs, :mod:`multipos.report.seeds`)
  form one row. The cell shows the mean over seeds and, with two seeds or more, ``± <sample std>``
  (``ddof=1``): Markdown ``0.3210 ± 0.0012``, LaTeX ``0.3210$_{\\pm 0.0012}$``. A single-seed row shows
  its run's value exactly as before. Two runs with the same configuration and seed are an error.
* **Significance** — two-sided paired t-test over the queries of an eval set
  (:func:`paired_ttest`, ``scipy.stats.ttest_rel``), at ``alpha = 0.05`` by default. For a row of
  several seeds, each query's value is first averaged over the row's seeds (mean per query over
  seeds), and the t-test is run on those per-query means (n = number of queries, not queries ×
  seeds). Both rows must have per-query values for exactly the same queries (and so must the seeds
  of one row): a mismatch raises ``ValueError`` (nothing is silently dropped). The direction of a
  significant difference is the sign of the mean per-query difference.
* **Baselines** — a row is compared with the row of the baseline objective that agrees with it on
  every config key of :data:`CONFIG_KEYS` except the objective (``loss.name``, ``objective``) and ``seed`` (data,
  regime, G, M, positive selection, candidate set); several such rows are ambiguous (an error), none means no marker
  for that baseline (the table's notes name the rows left without one).
* **Markers** (appended to the value, SingleLH marker first) — ``+`` / ``-``: significantly better /
  worse than SingleLH; ``♣`` / ``♦``: significantly better / worse than Rand1LH. Markdown uses the
  ASCII ``-`` for a drop (the paper prints a minus sign, U+2212); LaTeX uses one superscript per
  cell: ``$^{+}$``, ``$^{-}$``, ``$^{\\clubsuit}$``, ``$^{\\diamondsuit}$`` (e.g. ``$^{+\\diamondsuit}$``;
  with a std: ``$^{+}_{\\pm 0.0012}$``). A row is never compared with itself, so the SingleLH row
  carries only ♣/♦ and the Rand1LH row only +/-. A column whose eval set has per-query values in *no*
  run (e.g. ``beir_average``, an average over sets with no ``per_query.<set>.json``) carries no
  markers; when some run has them, every compared run must have them.
* **Numbers** — the values of ``metrics.json`` with 4 decimals (as in ``results.txt``); with
  ``percent=True`` ×100 with 2 decimals (the std too).
* **Best / second best** — per column, among the run rows only (the BM25 / zero-shot floor rows from
  ``references.json`` are shown above the runs, without markers, and never ranked). Ranking uses the
  *displayed* (rounded) means with dense ranking: every row showing the highest value is bold, every
  row showing the next distinct value is underlined (so two tied best rows are both bold and the
  next value is still "second"). A column with a single distinct value is all bold, nothing
  underlined. Higher is better for every metric.

Positive–negative ratio ablation plot (:func:`plot_ratio_ablation`): x = M (``data.max_positives``),
one line per objective, one subplot column per G (``data.group_size``), one subplot row per metric;
runs sharing (objective, G, M) — e.g. several seeds — are averaged.

Command line::

    python -m multipos.report outputs/ multirun/2025-01-01_00-00-00 --table main \\
        --sets nfcorpus_test trec_dl19 --metrics ndcg@10 mrr@10 --format both --out table.md
    python -m multipos.report outputs/ --table main --format latex \\
        --columns nq_test:acc@20 nq_test:acc@100 msmarco_dev:mrr@10 beir_average:ndcg@10
    python -m multipos.report multirun/ratio_sweep --sets nfcorpus_test --plot-ratio ratio.png
    python -m multipos.report.render multirun/table2_homogeneous-cpu --out experiments/results
"""

from __future__ import annotations

from multipos.report.cli import DEFAULT_METRICS, main
from multipos.report.plots import (
    AVERAGE_KEYS,
    PLOT_METRICS,
    plot_ratio_ablation,
    ratio_ablation_figure,
    ratio_ablation_points,
)
from multipos.report.runs import (
    CONFIG_KEYS,
    KEY_ALIASES,
    SHORT_NAMES,
    RunResult,
    collect,
    config_node,
    load_run,
    override_map,
)
from multipos.report.seeds import SEED_FREE_KEYS, SeedGroup, config_difference, group_seeds
from multipos.report.significance import (
    DEFAULT_BASELINES,
    FORMATS,
    MARKER_SYMBOLS,
    MATCH_KEYS,
    Row,
    marker_symbols,
    markers,
    paired_ttest,
    resolve_baseline,
)
from multipos.report.tables import (
    METRIC_NAMES,
    REFERENCE_ROWS,
    RowKey,
    latex_escape,
    metric_label,
    parse_column,
    render_grid,
    render_table,
    row_label,
    table_columns,
)

__all__ = [
    "AVERAGE_KEYS", "CONFIG_KEYS", "DEFAULT_BASELINES", "DEFAULT_METRICS", "FORMATS", "KEY_ALIASES", "MARKER_SYMBOLS",
    "MATCH_KEYS", "METRIC_NAMES", "PLOT_METRICS", "REFERENCE_ROWS", "SEED_FREE_KEYS", "SHORT_NAMES", "Row", "RowKey",
    "RunResult", "SeedGroup", "collect", "config_difference", "config_node", "group_seeds",
    "latex_escape", "load_run", "main", "marker_symbols", "markers", "metric_label", "override_map", "paired_ttest",
    "parse_column", "plot_ratio_ablation", "ratio_ablation_figure", "ratio_ablation_points", "render_grid",
    "render_sweep", "render_table", "resolve_baseline", "row_label", "table_columns",
]


def __getattr__(name: str):
    # render_sweep is imported on first use: importing multipos.report.render here would make
    # `python -m multipos.report.render` warn that the module was imported before it ran
    if name == "render_sweep":
        from multipos.report.render import render_sweep

        return render_sweep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
