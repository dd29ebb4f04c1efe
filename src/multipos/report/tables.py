"""Tables: the paper-style table of runs (:func:`render_table`, Markdown / LaTeX) and a generic grid
(:func:`render_grid`), plus their labels."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping, Sequence, Union

from multipos.report.runs import KEY_ALIASES, SHORT_NAMES, RunResult
from multipos.report.seeds import SeedGroup, group_seeds, same_row, single_rows
from multipos.report.significance import (
    DEFAULT_BASELINES,
    FORMATS,
    MARKER_SYMBOLS,
    MATCH_KEYS,
    Row,
    is_baseline_row,
    is_control,
    markers,
    resolve_baseline,
)

#: Floor rows taken from ``references.json``: (key in the file, row label).
REFERENCE_ROWS = (("bm25", "BM25"), ("zero-shot", "zero-shot"))
#: Display labels of metrics in table headers and plot axes (see :func:`metric_label`).
METRIC_NAMES = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "R@100", "recall@1000": "R@1000",
                "acc@1": "Acc@1", "acc@5": "Acc@5", "acc@20": "Acc@20", "acc@100": "Acc@100"}
#: ``row_key`` parts that name one run, not one configuration: with them every run is its own row.
PER_RUN_KEYS = ("name", "seed")

RowKey = Union[str, Callable[[RunResult], str]]


def row_label(run: Row, row_key: RowKey = "objective") -> str:
    """A run's row label. ``"objective"`` → the objective (else the directory name); ``"name"`` → the
    directory name; a comma-separated list of keys → ``"<short>=<value>"`` parts joined by ``,``,
    where a key is an alias of :data:`KEY_ALIASES` (``G``, ``M``, ``selection``, ``seed``, …), a
    dotted config key (``data.group_size`` is shown as ``G``) or a config-group choice of the run's
    overrides (``budget``), and ``objective`` / ``name`` parts are shown bare; e.g. ``"G,M"`` →
    ``"G=8,M=4"``. A callable is called with the run."""
    if callable(row_key):
        return str(row_key(run))
    parts = []
    for part in (p.strip() for p in row_key.split(",")):
        if part == "objective":
            parts.append(run.label)
        elif part == "name":
            parts.append(run.name)
        elif part:
            key = KEY_ALIASES.get(part, part)
            short = part if part in KEY_ALIASES else SHORT_NAMES.get(key, key.rsplit(".", 1)[-1])
            parts.append(f"{short}={run.get(key)}")
    return ",".join(parts)


def metric_label(metric: str) -> str:
    """A metric's display label: :data:`METRIC_NAMES`, else ``acc@<k>`` → ``Acc@<k>``, else the name itself."""
    if metric in METRIC_NAMES:
        return METRIC_NAMES[metric]
    m = re.fullmatch(r"acc@(\d+)", metric)
    return f"Acc@{m.group(1)}" if m else metric


def parse_column(text: str) -> tuple[str, str]:
    """``"SET:METRIC"`` → ``(SET, METRIC)``, split on the ':' (eval set and metric names contain none).

    Raises ``ValueError`` when there is no ':', more than one, or an empty side.
    """
    if text.count(":") != 1:
        what = "no ':'" if ":" not in text else "more than one ':'"
        raise ValueError(f"column {text!r} has {what}: expected SET:METRIC, e.g. nq_test:acc@20")
    eval_set, metric = text.split(":", 1)
    if not eval_set or not metric:
        raise ValueError(f"column {text!r} has an empty {'eval set' if not eval_set else 'metric'}: "
                         "expected SET:METRIC, e.g. nq_test:acc@20")
    return eval_set, metric


def table_columns(sets: Sequence[str] | None, metrics: Sequence[str] | None,
                  columns: Iterable[tuple[str, str]] | None) -> list[tuple[str, str]]:
    """The table's (set, metric) columns: ``columns`` (validated) or the grid ``sets`` × ``metrics``."""
    if columns is None:
        if not sets or not metrics:
            raise ValueError("need at least one eval set and one metric (or explicit columns)")
        return [(s, m) for s in sets for m in metrics]
    if sets or metrics:
        raise ValueError("pass either columns or sets/metrics, not both")
    cols = []
    for c in columns:
        if isinstance(c, str) or len(c) != 2 or not all(isinstance(x, str) and x for x in c):
            raise ValueError(f"a column must be a (set, metric) pair of non-empty names, got {c!r}")
        cols.append((c[0], c[1]))
    if not cols:
        raise ValueError("need at least one column")
    dups = sorted({f"{s}:{m}" for s, m in cols if cols.count((s, m)) > 1})
    if dups:
        raise ValueError(f"duplicate columns: {', '.join(dups)}")
    return cols


def _number(v: float, percent: bool) -> str:
    return f"{100 * v:.2f}" if percent else f"{v:.4f}"


def _ranks(cells: list[str | None]) -> list[int | None]:
    """Dense rank (0 = best, 1 = second, …) of displayed numbers; ``None`` for missing cells."""
    distinct = sorted({float(c) for c in cells if c is not None}, reverse=True)
    return [None if c is None else distinct.index(float(c)) for c in cells]


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (for labels, captions and cells)."""
    repl = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(repl.get(ch, ch) for ch in text)


def _legend(baselines: Sequence, alpha: float, fmt: str, seeds: bool) -> str:
    parts = []
    for b, (up, down) in zip(baselines, MARKER_SYMBOLS[fmt]):
        name = b.label if isinstance(b, (RunResult, SeedGroup)) else b
        if name is None:
            continue
        if fmt == "latex":
            up, down, name = f"$^{{{up}}}$", f"$^{{{down}}}$", latex_escape(name)
        of = " (same objective and setting otherwise)" if is_control(name) else ""
        parts.append(f"{up}/{down}: significantly better/worse than {name}{of}")
    if not parts:
        return ""
    p = f"$p < {alpha:g}$" if fmt == "latex" else f"p < {alpha:g}"
    on = " on per-query means over seeds" if seeds else ""
    return "; ".join(parts) + f" (two-sided paired t-test over queries{on}, {p})"


def _as_row(b, rows: Sequence[SeedGroup]):
    """A baseline given as a run → the row holding it (a row of its own when it is not in the table)."""
    if isinstance(b, RunResult):
        return next((g for g in rows if same_row(g, b)), SeedGroup([b]))
    return b


def render_table(runs: Sequence[RunResult], sets: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                 row_key: RowKey = "objective", fmt: str = "markdown",
                 baselines: Sequence[str | RunResult | None] = DEFAULT_BASELINES, *,
                 title: str | None = None, alpha: float = 0.05, references: bool | Mapping = True,
                 significance: bool = True, percent: bool = False,
                 columns: Sequence[tuple[str, str]] | None = None, aggregate: bool = True) -> str:
    """Render ``runs`` as a Markdown or LaTeX table.

    Inputs: ``runs`` (from :func:`collect`); ``sets`` × ``metrics`` → one column per (set, metric),
    or ``columns``: an explicit list of ``(set, metric)`` pairs in display order that replaces the grid
    (different metrics per set, e.g. ``[("nq_test", "acc@20"), ("nq_test", "acc@100"),
    ("beir_average", "ndcg@10")]``; ``sets`` / ``metrics`` must then be empty or ``None``);
    ``row_key`` → row labels (see :func:`row_label`); ``fmt`` ``"markdown"`` or ``"latex"``;
    ``baselines`` (SingleLH-like, Rand1LH-like): objective names or controls ``"<key>=<value>"`` (e.g.
    ``"negative_filter=none"``: each row against the row of the same objective with that value; resolved per row
    with :func:`resolve_baseline`), :class:`RunResult` objects or ``None``; ``title`` → Markdown
    ``Table: <title>`` line / LaTeX caption; ``references``: ``True`` → BM25 / zero-shot floor rows
    from the first run that has a ``references.json``, a mapping → those references, ``False`` → none;
    ``significance=False`` → no markers (per-query files not needed); ``percent`` → ×100, 2 decimals
    (default: 4 decimals); ``aggregate`` → runs that differ only by seed form one row
    (:func:`group_seeds`; ``False``, or a ``row_key`` naming ``name`` / ``seed``: one row per run).

    Rows: floor rows first, then baseline rows (in ``baselines`` order), then the other rows in the
    order of their first run. A row of several seeds shows the mean and ``± <sample std>``
    (Markdown ``0.3210 ± 0.0012``, LaTeX ``0.3210$_{\\pm 0.0012}$``), and is tested on its per-query
    means over seeds. Best / second best per column (run rows only, on the displayed means, dense
    ranking so ties share bold / underline) → ``**x**`` / ``<u>x</u>`` or ``\\textbf{x}`` /
    ``\\underline{x}``; markers (:func:`markers`, test: two-sided paired t-test, ``p < alpha``) follow
    the mean. A column whose set has per-query values in no run (e.g. ``beir_average``, an average
    over eval sets) gets no markers — no error, and the legend is unchanged; when at least one run
    has per-query values for the set, a compared run without them is an error as usual. A row with no
    matching baseline row (while the baseline objective is in the table) gets no marker for it, and
    the notes name it. Floor rows show ``n/a`` (Markdown) / ``--`` (LaTeX) where the reference lacks a value.
    Output: the table text (Markdown: title line, pipe table with ``<set> <metric label>`` header
    cells and a notes line; LaTeX: a ``table`` environment using booktabs, consecutive columns of
    the same set grouped under one ``\\multicolumn`` with a ``\\cmidrule``, notes in the caption).
    Raises ``ValueError`` for an unknown format, no runs, no / malformed / duplicate columns, both
    ``columns`` and ``sets``/``metrics``, a run missing a requested value, an ambiguous baseline or
    two runs with the same configuration and seed; ``FileNotFoundError`` for missing per-query files.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if not runs:
        raise ValueError("no runs to tabulate")
    cols = table_columns(sets, metrics, columns)
    baselines = tuple(baselines)
    if len(baselines) != 2:
        raise ValueError(f"baselines must be two (SingleLH-like, Rand1LH-like; objective names, controls "
                         f"'<key>=<value>', runs or None), got {baselines!r}")
    per_run = not aggregate or (isinstance(row_key, str) and
                                any(p.strip() in PER_RUN_KEYS for p in row_key.split(",")))
    rows = single_rows(runs) if per_run else group_seeds(runs)
    baselines = tuple(_as_row(b, rows) for b in baselines)

    def base_rank(r: SeedGroup) -> int:  # row order: baseline rows first
        for i, b in enumerate(baselines):
            if (isinstance(b, SeedGroup) and same_row(r, b)) or (isinstance(b, str) and is_baseline_row(r, b)):
                return i
        return len(baselines)
    rows = sorted(rows, key=base_rank)  # stable

    shown = [[_number(r.value(s, m), percent) for s, m in cols] for r in rows]
    stds = [[r.std(s, m) for s, m in cols] for r in rows]
    ranks_by_col = [_ranks([row[j] for row in shown]) for j in range(len(cols))]
    marks = [["" for _ in cols] for _ in rows]
    marked = {s for s, _ in cols if any(s in r.per_query for r in rows)}  # e.g. not an average over sets
    unmatched: dict[str, list[str]] = {}
    if significance and marked:
        for i, r in enumerate(rows):
            bases = [resolve_baseline(r, rows, b) for b in baselines]
            for b, base in zip(baselines, bases):
                if base is None and isinstance(b, str) and any(is_baseline_row(x, b) for x in rows):
                    unmatched.setdefault(b, []).append(row_label(r, row_key))
            for j, (s, m) in enumerate(cols):
                if s in marked:
                    marks[i][j] = markers(r, *bases, s, m, alpha, fmt)

    bold, under = ("**{}**", "<u>{}</u>") if fmt == "markdown" else (r"\textbf{{{}}}", r"\underline{{{}}}")
    body = []
    for i, r in enumerate(rows):
        cells = []
        for j in range(len(cols)):
            rank, text, mark, std = ranks_by_col[j][i], shown[i][j], marks[i][j], stds[i][j]
            text = bold.format(text) if rank == 0 else under.format(text) if rank == 1 else text
            if std is None:
                cells.append(text + mark)
            elif fmt == "markdown":
                cells.append(f"{text}{mark} ± {_number(std, percent)}")
            else:  # one math group: markers above, the std below
                cells.append(text + (mark[:-1] if mark else "$") + rf"_{{\pm {_number(std, percent)}}}$")
        body.append((row_label(r, row_key), cells))

    refs: Mapping = {}
    if references is True:
        refs = next((r.references for r in rows if r.references), {})
    elif isinstance(references, Mapping):
        refs = references
    missing = "n/a" if fmt == "markdown" else "--"
    floor = []
    for key, label in REFERENCE_ROWS:
        if key in refs:
            floor.append((label, [_number(refs[key][s][m], percent) if m in refs[key].get(s, {}) else missing
                                  for s, m in cols]))

    esc = latex_escape if fmt == "latex" else str
    notes = []
    n_seeds = sorted({r.n for r in rows})
    seeded = n_seeds[-1] > 1
    if seeded:
        pm = "±" if fmt == "markdown" else r"$\pm$"
        fewer = [f"{row_label(r, row_key)}: {r.n}" for r in rows if r.n < n_seeds[-1]]  # rows short of seeds, named
        notes.append(f"mean {pm} sample standard deviation over {n_seeds[-1]} seeds"
                     + (esc(f" ({', '.join(fewer)})") if fewer else ""))
    if significance:
        notes.append(_legend(baselines, alpha, fmt, seeded))
    for b, labels in unmatched.items():
        notes.append(esc(f"no {b} row with the same {', '.join(_short_keys())} for: {', '.join(labels)}"))
    notes = [n for n in notes if n]
    head = row_key if isinstance(row_key, str) else "run"
    if fmt == "markdown":
        return _markdown(title, head, cols, floor, body, notes)
    return _latex(title, head, cols, floor, body, notes)


def _short_keys() -> list[str]:
    return [SHORT_NAMES.get(k, k) for k in MATCH_KEYS]


def _markdown(title, head, cols, floor, body, notes) -> str:
    esc = lambda t: str(t).replace("|", r"\|")  # noqa: E731
    lines = [f"Table: {title}", ""] if title else []
    lines.append("| " + " | ".join([esc(head)] + [f"{s} {metric_label(m)}" for s, m in cols]) + " |")
    lines.append("|:---|" + "---:|" * len(cols))
    for label, cells in floor + body:
        lines.append("| " + " | ".join([esc(label)] + cells) + " |")
    notes = ["**bold**: best, <u>underlined</u>: second best (run rows only)"] + list(notes)
    lines += ["", "; ".join(notes) + "."]
    return "\n".join(lines)


def _set_groups(cols: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """Runs of consecutive columns of the same set: ``[(set, width), …]`` in column order."""
    groups: list[tuple[str, int]] = []
    for s, _ in cols:
        if groups and groups[-1][0] == s:
            groups[-1] = (s, groups[-1][1] + 1)
        else:
            groups.append((s, 1))
    return groups


def _latex(title, head, cols, floor, body, notes) -> str:
    groups = _set_groups(cols)
    starts = [2 + sum(w for _, w in groups[:k]) for k in range(len(groups))]  # first LaTeX column of each group
    caption = ". ".join(p for p in (latex_escape(title) if title else "", *notes) if p)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{caption}.}}")
    if title:
        lines.append(rf"\label{{tab:{re.sub(r'[^A-Za-z0-9]+', '-', title).strip('-').lower()}}}")
    lines += [rf"\begin{{tabular}}{{l{'r' * len(cols)}}}", r"\toprule"]
    lines.append(" & ".join([""] + [rf"\multicolumn{{{w}}}{{c}}{{{latex_escape(s)}}}" for s, w in groups]) + r" \\")
    lines.append("".join(rf"\cmidrule(lr){{{a}-{a + w - 1}}}" for a, (_, w) in zip(starts, groups)))
    lines.append(" & ".join([latex_escape(head)] + [latex_escape(metric_label(m)) for _, m in cols]) + r" \\")
    lines.append(r"\midrule")
    for label, cells in floor:
        lines.append(" & ".join([latex_escape(label)] + cells) + r" \\")
    if floor:
        lines.append(r"\midrule")
    for label, cells in body:
        lines.append(" & ".join([latex_escape(label)] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def render_grid(header: Sequence[str], rows: Sequence[Sequence[str]], fmt: str = "markdown", *,
                title: str | None = None, align: str | None = None) -> str:
    """A plain table of text cells (no ranking, no markers), e.g. the per-trial listing of a recipe search.

    ``align``: one ``l`` / ``r`` per column (default: first column ``l``, the others ``r``). Markdown:
    ``Table: <title>`` line and a pipe table; LaTeX: a booktabs ``table`` with the title as caption
    (cells and header are escaped). Raises ``ValueError`` for an unknown format or a row of the wrong width.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or any(len(r) != len(header) for r in rows):
        raise ValueError(f"every row and the alignment need {len(header)} cells")
    if fmt == "markdown":
        esc = lambda t: str(t).replace("|", r"\|")  # noqa: E731
        lines = [f"Table: {title}", ""] if title else []
        lines.append("| " + " | ".join(esc(h) for h in header) + " |")
        lines.append("|" + "".join(":---|" if a == "l" else "---:|" for a in align))
        lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
        return "\n".join(lines)
    lines = [r"\begin{table}[t]", r"\centering"]
    if title:
        lines.append(rf"\caption{{{latex_escape(title)}.}}")
    lines += [rf"\begin{{tabular}}{{{align}}}", r"\toprule", " & ".join(latex_escape(h) for h in header) + r" \\",
              r"\midrule"]
    lines += [" & ".join(latex_escape(str(c)) for c in r) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)
