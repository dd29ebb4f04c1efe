"""Paper-style result tables with significance markers, built from finished run directories.

Input: run directories written by :func:`multipos.train.train` (``metrics.json``,
``per_query.<eval set>.json``, ``.hydra/config.yaml``, ``.hydra/overrides.yaml`` and optionally
``references.json``), or sweep directories containing such runs at any depth.
Output: a Markdown or LaTeX table with one row per run and one column per (eval set, metric): either
the full grid ``sets`` × ``metrics`` or an explicit list of ``columns`` (different metrics per set, as
in the paper's tables, e.g. NQ Acc@20 / Acc@100 next to MS MARCO MRR@10 / R@1000 and a BEIR average).

Conventions (the paper's, with the choices made here):

* **Significance** — two-sided paired t-test over the queries of an eval set
  (:func:`paired_ttest`, ``scipy.stats.ttest_rel``), at ``alpha = 0.05`` by default. Both runs must
  have per-query values for exactly the same queries: a mismatch raises ``ValueError`` (nothing is
  silently dropped). The direction of a significant difference is the sign of the mean per-query
  difference.
* **Markers** (appended to the value, SingleLH marker first) — ``+`` / ``-``: significantly better /
  worse than SingleLH; ``♣`` / ``♦``: significantly better / worse than Rand1LH. Markdown uses the
  ASCII ``-`` for a drop (the paper prints a minus sign, U+2212); LaTeX uses one superscript per
  cell: ``$^{+}$``, ``$^{-}$``, ``$^{\\clubsuit}$``, ``$^{\\diamondsuit}$`` (e.g. ``$^{+\\diamondsuit}$``).
  A run is never compared with itself, so the SingleLH row carries only ♣/♦ and the Rand1LH row only
  +/-. A column whose eval set has per-query values in *no* run (e.g. ``beir_average``, an average
  over sets with no ``per_query.<set>.json``) carries no markers; when some run has them, every
  compared run must have them.
* **Numbers** — the values of ``metrics.json`` with 4 decimals (as in ``results.txt``); with
  ``percent=True`` ×100 with 2 decimals.
* **Best / second best** — per column, among the run rows only (the BM25 / zero-shot floor rows from
  ``references.json`` are shown above the runs, without markers, and never ranked). Ranking uses the
  *displayed* (rounded) values with dense ranking: every row showing the highest value is bold, every
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
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, Union

#: Config keys read from ``.hydra/config.yaml`` into :attr:`RunResult.config` (plain values only).
CONFIG_KEYS = ("loss.name", "data.name", "data.regime", "data.group_size", "data.max_positives",
               "data.positive_selection", "seed")
#: Short names usable in ``row_key`` (and used to label dotted keys), e.g. ``row_key="G,M"`` → ``G=8,M=4``.
KEY_ALIASES = {"objective": "loss.name", "data": "data.name", "regime": "data.regime",
               "G": "data.group_size", "M": "data.max_positives", "selection": "data.positive_selection",
               "seed": "seed"}
SHORT_NAMES = {v: k for k, v in KEY_ALIASES.items()}
#: Keys compared to pick a run's baseline when several runs share the baseline objective.
MATCH_KEYS = tuple(k for k in CONFIG_KEYS if k != "loss.name")
#: Floor rows taken from ``references.json``: (key in the file, row label).
REFERENCE_ROWS = (("bm25", "BM25"), ("zero-shot", "zero-shot"))
#: Display labels of metrics in table headers and plot axes (see :func:`metric_label`).
METRIC_NAMES = {"ndcg@10": "nDCG@10", "mrr@10": "MRR@10", "recall@100": "R@100", "recall@1000": "R@1000",
                "acc@1": "Acc@1", "acc@5": "Acc@5", "acc@20": "Acc@20", "acc@100": "Acc@100"}
DEFAULT_METRICS = ("ndcg@10", "mrr@10")
DEFAULT_BASELINES = ("singlelh", "rand1lh")
#: (improvement, drop) symbols for the first (SingleLH) and second (Rand1LH) baseline.
MARKER_SYMBOLS = {
    "markdown": (("+", "-"), ("♣", "♦")),
    "latex": (("+", "-"), (r"\clubsuit", r"\diamondsuit")),
}
FORMATS = ("markdown", "latex")


@dataclass(eq=False)
class RunResult:
    """One finished run: where it lives, what it trained, and what it scored.

    ``metrics``: ``{set: {metric: value}}`` from ``metrics.json``; ``per_query``:
    ``{set: {metric: {qid: value}}}`` from every ``per_query.<set>.json``; ``config``: the plain values
    of :data:`CONFIG_KEYS` (``None`` when absent or an unresolvable interpolation); ``references``:
    ``references.json`` (``{}`` when absent). Equality is identity.
    """

    path: Path
    name: str
    objective: str | None
    config: dict[str, object]
    metrics: dict[str, dict[str, float]]
    per_query: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)
    references: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict, repr=False)
    overrides: list[str] = field(default_factory=list)
    raw_config: dict = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        """The default row label: the objective (``loss.name``), else the directory name."""
        return self.objective or self.name

    def value(self, eval_set: str, metric: str) -> float:
        """``metrics.json[eval_set][metric]``; ``ValueError`` naming the file when absent."""
        try:
            return self.metrics[eval_set][metric]
        except KeyError:
            raise ValueError(f"{self.path / 'metrics.json'}: no {metric!r} for eval set {eval_set!r} "
                             f"(has: {_describe(self.metrics)})") from None

    def query_values(self, eval_set: str, metric: str) -> dict[str, float]:
        """Per-query ``{qid: value}`` of ``metric`` on ``eval_set``.

        Raises ``FileNotFoundError`` naming ``per_query.<eval_set>.json`` when the file is missing and
        ``ValueError`` when it lacks ``metric``.
        """
        file = self.path / f"per_query.{eval_set}.json"
        if eval_set not in self.per_query:
            raise FileNotFoundError(f"{file}: per-query file missing (needed for significance tests)")
        if metric not in self.per_query[eval_set]:
            raise ValueError(f"{file}: no per-query values for {metric!r} "
                             f"(has: {', '.join(self.per_query[eval_set]) or 'nothing'})")
        return self.per_query[eval_set][metric]

    def get(self, key: str) -> object:
        """A config value by alias (:data:`KEY_ALIASES`) or dotted key.

        Keys of :data:`CONFIG_KEYS` come from :attr:`config` and are ``None`` when the run's config
        lacks them; any other dotted key is read unresolved from the raw config (an interpolation
        comes back as its ``${...}`` text) and raises ``ValueError`` when absent.
        """
        key = KEY_ALIASES.get(key, key)
        if key in self.config:
            return self.config[key]
        node: object = self.raw_config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise ValueError(f"{self.path / '.hydra' / 'config.yaml'}: no config key {key!r}")
            node = node[part]
        return node


# ----------------------------------------------------------------------------------------------
# loading


def _describe(metrics: Mapping) -> str:
    return "; ".join(f"{s}: {', '.join(m)}" for s, m in metrics.items()) or "nothing"


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from None


def _float_map(obj: object, path: Path, what: str) -> dict[str, float]:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected an object of {what}, got {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{path}: value for {k!r} is not a number: {v!r}")
        out[str(k)] = float(v)
    return out


def _nested(obj: object, path: Path, depth: int) -> dict:
    """Validate ``{a: {b: number}}`` (depth 2) or ``{a: {b: {c: number}}}`` (depth 3)."""
    if depth == 1:
        return _float_map(obj, path, "numbers")
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return {str(k): _nested(v, path, depth - 1) for k, v in obj.items()}


def _load_config(run_dir: Path) -> tuple[dict, dict, list[str]]:
    """(interesting keys, raw unresolved config, overrides) from ``.hydra/``; empty when absent."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    cfg_path, ovr_path = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml"
    config, raw, overrides = {k: None for k in CONFIG_KEYS}, {}, []
    try:
        if cfg_path.is_file():
            cfg = OmegaConf.load(cfg_path)
            if not isinstance(cfg, DictConfig):
                raise ValueError(f"{cfg_path}: expected a mapping")
            for key in CONFIG_KEYS:  # each value on its own: never resolve the whole config
                value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
                if isinstance(value, (DictConfig, ListConfig)):
                    value = OmegaConf.to_container(value, resolve=False)
                config[key] = value
            raw = OmegaConf.to_container(cfg, resolve=False)
        if ovr_path.is_file():
            ovr = OmegaConf.load(ovr_path)
            overrides = [str(o) for o in OmegaConf.to_container(ovr)] if isinstance(ovr, ListConfig) else []
    except ValueError:
        raise
    except Exception as exc:  # yaml / omegaconf parse errors
        raise ValueError(f"{run_dir / '.hydra'}: cannot read the Hydra config ({exc})") from None
    return config, raw, overrides


def _objective(config: Mapping, overrides: Sequence[str]) -> str | None:
    if config.get("loss.name"):
        return str(config["loss.name"])
    for o in overrides:  # fall back to a `loss=<name>` / `loss.name=<name>` override
        m = re.fullmatch(r"\+{0,2}loss(?:\.name)?=(\S+)", o.strip())
        if m:
            return m.group(1)
    return None


def load_run(run_dir: str | Path, sets: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
             require_per_query: bool = True) -> RunResult:
    """Load one run directory into a :class:`RunResult`.

    Inputs: ``run_dir`` (must contain ``metrics.json``); optional ``sets`` / ``metrics`` to validate
    up front. Reads every ``per_query.<set>.json`` present, ``references.json`` if present and the
    :data:`CONFIG_KEYS` of ``.hydra/config.yaml`` (values read one by one, the config is never resolved
    as a whole, so interpolations such as ``${model.name_or_path}`` are harmless).

    Raises ``FileNotFoundError`` naming the path when ``run_dir`` or its ``metrics.json`` is missing,
    or (``require_per_query``) when ``per_query.<set>.json`` is missing for a requested set;
    ``ValueError`` naming the file for malformed JSON/YAML or a requested set/metric absent from
    ``metrics.json`` (or from the per-query file).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{metrics_path}: not found — {run_dir} is not a finished run directory")
    values = _nested(_read_json(metrics_path), metrics_path, 2)
    per_query = {}
    for file in sorted(run_dir.glob("per_query.*.json")):
        per_query[file.name[len("per_query."):-len(".json")]] = _nested(_read_json(file), file, 2)
    refs_path = run_dir / "references.json"
    refs = _nested(_read_json(refs_path), refs_path, 3) if refs_path.is_file() else {}
    config, raw, overrides = _load_config(run_dir)
    run = RunResult(path=run_dir, name=run_dir.name, objective=_objective(config, overrides), config=config,
                    metrics=values, per_query=per_query, references=refs, overrides=overrides, raw_config=raw)
    metrics = list(metrics or ())
    for s in sets or ():
        if s not in values:
            raise ValueError(f"{metrics_path}: no eval set {s!r} (has: {', '.join(values) or 'nothing'})")
        if require_per_query and s not in per_query:
            raise FileNotFoundError(f"{run_dir / f'per_query.{s}.json'}: per-query file missing "
                                    "(needed for significance tests)")
        for m in metrics:
            run.value(s, m)
            if require_per_query:
                run.query_values(s, m)
    return run


def collect(paths: Iterable[str | Path], sets: Iterable[str] | None = None, metrics: Iterable[str] | None = None,
            require_per_query: bool = True) -> list[RunResult]:
    """Load every run under ``paths`` (run directories or sweep directories, searched recursively).

    A path containing ``metrics.json`` is a run; any other directory is searched at any depth for
    directories containing ``metrics.json`` (sorted by path). Runs reached twice are loaded once.
    ``sets`` / ``metrics`` / ``require_per_query`` are passed to :func:`load_run`.
    Returns the runs in the order of ``paths``. Raises ``FileNotFoundError`` naming a path that does
    not exist or holds no run at all.
    """
    sets, metrics = (list(sets) if sets else None), (list(metrics) if metrics else None)
    runs, seen = [], set()
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such run or sweep directory")
        if (p / "metrics.json").is_file():
            dirs = [p]
        else:
            dirs = sorted({f.parent for f in p.rglob("metrics.json") if f.is_file()})
            if not dirs:
                raise FileNotFoundError(f"{p}: no metrics.json found (not a run directory, and no runs below it)")
        for d in dirs:
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                runs.append(load_run(d, sets, metrics, require_per_query))
    return runs


# ----------------------------------------------------------------------------------------------
# significance


def paired_ttest(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float]:
    """Two-sided paired t-test of ``a`` vs ``b`` (``{qid: value}``): ``scipy.stats.ttest_rel``.

    Returns ``(t, p)``; ``t > 0`` means ``a`` is higher on average. Both must cover exactly the same
    queries — otherwise ``ValueError`` stating how many queries each side has, how many they share and
    examples of the differences (no query is silently dropped). At least 2 queries are required, and
    no value may be NaN. When every difference is exactly 0 (identical runs) the result is
    ``(0.0, 1.0)`` instead of scipy's NaN.
    """
    import numpy as np
    from scipy.stats import ttest_rel

    if a.keys() != b.keys():
        only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
        raise ValueError(
            f"paired t-test needs the same queries on both sides: {len(a)} vs {len(b)} queries, "
            f"{len(a.keys() & b.keys())} in common, {len(only_a)} only in the first (e.g. {only_a[:3]}), "
            f"{len(only_b)} only in the second (e.g. {only_b[:3]})")
    if len(a) < 2:
        raise ValueError(f"paired t-test needs at least 2 queries, got {len(a)}")
    qids = sorted(a)
    x = np.array([a[q] for q in qids], dtype=float)
    y = np.array([b[q] for q in qids], dtype=float)
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("paired t-test: per-query values contain NaN")
    if np.array_equal(x, y):
        return 0.0, 1.0
    res = ttest_rel(x, y)
    return float(res.statistic), float(res.pvalue)


def _same_run(a: RunResult, b: RunResult) -> bool:
    return a is b or a.path.resolve() == b.path.resolve()


def _significance(run: RunResult, base: RunResult, eval_set: str, metric: str) -> tuple[float, float]:
    """(mean per-query difference run − base, two-sided p-value)."""
    a, b = run.query_values(eval_set, metric), base.query_values(eval_set, metric)
    try:
        _, p = paired_ttest(a, b)
    except ValueError as exc:
        raise ValueError(f"{eval_set}/{metric}: {run.path} vs {base.path}: {exc}") from None
    diff = math.fsum(a[q] - b[q] for q in a) / len(a)
    return diff, p


def marker_symbols(run: RunResult, singlelh_run: RunResult | None, rand1lh_run: RunResult | None,
                   eval_set: str, metric: str, alpha: float = 0.05, fmt: str = "markdown") -> list[str]:
    """The marker symbols of :func:`markers` as a list (e.g. ``["+", "♦"]``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    out = []
    for base, (up, down) in zip((singlelh_run, rand1lh_run), MARKER_SYMBOLS[fmt]):
        if base is None or _same_run(run, base):
            continue
        diff, p = _significance(run, base, eval_set, metric)
        if p < alpha and diff != 0:
            out.append(up if diff > 0 else down)
    return out


def markers(run: RunResult, singlelh_run: RunResult | None, rand1lh_run: RunResult | None, set: str,
            metric: str, alpha: float = 0.05, fmt: str = "markdown") -> str:
    """Significance markers of ``run`` on ``set``/``metric`` against the two baselines.

    Test: :func:`paired_ttest` (two-sided, paired over queries) on the per-query values, significant
    when ``p < alpha``; direction = sign of the mean per-query difference. Markdown: ``+`` / ``-``
    (better / worse than ``singlelh_run``) then ``♣`` / ``♦`` (better / worse than ``rand1lh_run``),
    e.g. ``"+♦"``; LaTeX: the same in one superscript, e.g. ``"$^{+\\diamondsuit}$"``. ``""`` when
    nothing is significant. A baseline that is ``None`` or ``run`` itself gives no marker.
    Raises ``FileNotFoundError`` / ``ValueError`` for missing per-query data or differing query sets.
    """
    symbols = marker_symbols(run, singlelh_run, rand1lh_run, set, metric, alpha, fmt)
    if not symbols:
        return ""
    return "".join(symbols) if fmt == "markdown" else "$^{" + "".join(symbols) + "}$"


def resolve_baseline(run: RunResult, runs: Sequence[RunResult], baseline: str | RunResult | None) -> RunResult | None:
    """The run that ``run`` is compared with for the baseline objective ``baseline``.

    ``None`` → ``None``; a :class:`RunResult` → itself; an objective name → ``run`` itself when it has
    that objective (no marker), else the run of ``runs`` with that objective sharing the most
    :data:`MATCH_KEYS` values with ``run`` (``None`` when there is no such run). Raises ``ValueError``
    listing the candidates when several match equally well — pass the baseline run explicitly then.
    """
    if baseline is None or isinstance(baseline, RunResult):
        return baseline
    if run.objective == baseline:
        return run
    candidates = [r for r in runs if r.objective == baseline]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    scores = [sum(r.config.get(k) == run.config.get(k) for k in MATCH_KEYS) for r in candidates]
    best = [r for r, s in zip(candidates, scores) if s == max(scores)]
    if len(best) > 1:
        raise ValueError(f"ambiguous {baseline} baseline for {run.path}: {', '.join(str(r.path) for r in best)} "
                         f"match equally on {', '.join(MATCH_KEYS)}; pass the baseline run explicitly")
    return best[0]


# ----------------------------------------------------------------------------------------------
# tables

RowKey = Union[str, Callable[[RunResult], str]]


def row_label(run: RunResult, row_key: RowKey = "objective") -> str:
    """A run's row label. ``"objective"`` → the objective (else the directory name); ``"name"`` → the
    directory name; a comma-separated list of keys → ``"<short>=<value>"`` parts joined by ``,``,
    where a key is an alias of :data:`KEY_ALIASES` (``G``, ``M``, ``selection``, ``seed``, …) or a
    dotted config key (``data.group_size`` is shown as ``G``), and ``objective`` / ``name`` parts are
    shown bare; e.g. ``"G,M"`` → ``"G=8,M=4"``. A callable is called with the run."""
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


def _table_columns(sets: Sequence[str] | None, metrics: Sequence[str] | None,
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


def _latex_escape(text: str) -> str:
    repl = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(repl.get(ch, ch) for ch in text)


def _baseline_name(b: str | RunResult | None) -> str | None:
    return b.label if isinstance(b, RunResult) else b


def _legend(baselines: Sequence, alpha: float, fmt: str) -> str:
    parts = []
    for b, (up, down) in zip(baselines, MARKER_SYMBOLS[fmt]):
        name = _baseline_name(b)
        if name is None:
            continue
        if fmt == "latex":
            up, down, name = f"$^{{{up}}}$", f"$^{{{down}}}$", _latex_escape(name)
        parts.append(f"{up}/{down}: significantly better/worse than {name}")
    if not parts:
        return ""
    p = f"$p < {alpha:g}$" if fmt == "latex" else f"p < {alpha:g}"
    return "; ".join(parts) + f" (two-sided paired t-test over queries, {p})"


def render_table(runs: Sequence[RunResult], sets: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                 row_key: RowKey = "objective", fmt: str = "markdown",
                 baselines: Sequence[str | RunResult | None] = DEFAULT_BASELINES, *,
                 title: str | None = None, alpha: float = 0.05, references: bool | Mapping = True,
                 significance: bool = True, percent: bool = False,
                 columns: Sequence[tuple[str, str]] | None = None) -> str:
    """Render ``runs`` as a Markdown or LaTeX table.

    Inputs: ``runs`` (from :func:`collect`); ``sets`` × ``metrics`` → one column per (set, metric),
    or ``columns``: an explicit list of ``(set, metric)`` pairs in display order that replaces the grid
    (different metrics per set, e.g. ``[("nq_test", "acc@20"), ("nq_test", "acc@100"),
    ("beir_average", "ndcg@10")]``; ``sets`` / ``metrics`` must then be empty or ``None``);
    ``row_key`` → row labels (see :func:`row_label`); ``fmt`` ``"markdown"`` or ``"latex"``;
    ``baselines`` (SingleLH-like, Rand1LH-like): objective names (resolved per run with
    :func:`resolve_baseline`), :class:`RunResult` objects or ``None``; ``title`` → Markdown
    ``Table: <title>`` line / LaTeX caption; ``references``: ``True`` → BM25 / zero-shot floor rows
    from the first run that has a ``references.json``, a mapping → those references, ``False`` → none;
    ``significance=False`` → no markers (per-query files not needed); ``percent`` → ×100, 2 decimals
    (default: 4 decimals).

    Rows: floor rows first, then baseline runs (in ``baselines`` order), then the other runs in the
    given order. Best / second best per column (run rows only, on the displayed values, dense ranking
    so ties share bold / underline) → ``**x**`` / ``<u>x</u>`` or ``\\textbf{x}`` / ``\\underline{x}``;
    markers (:func:`markers`, test: two-sided paired t-test, ``p < alpha``) follow the value.
    A column whose set has per-query values in no run (e.g. ``beir_average``, an average over eval
    sets) gets no markers — no error, and the legend is unchanged; when at least one run has per-query
    values for the set, a compared run without them is an error as usual. Floor rows show ``n/a``
    (Markdown) / ``--`` (LaTeX) where the reference lacks a value.
    Output: the table text (Markdown: title line, pipe table with ``<set> <metric label>`` header
    cells and a legend line; LaTeX: a ``table`` environment using booktabs, consecutive columns of
    the same set grouped under one ``\\multicolumn`` with a ``\\cmidrule``). Raises ``ValueError``
    for an unknown format, no runs, no / malformed / duplicate columns, both ``columns`` and
    ``sets``/``metrics``, a run missing a requested value, or an ambiguous baseline;
    ``FileNotFoundError`` for missing per-query files.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if not runs:
        raise ValueError("no runs to tabulate")
    cols = _table_columns(sets, metrics, columns)
    baselines = tuple(baselines)
    if len(baselines) != 2:
        raise ValueError(f"baselines must be (SingleLH-like, Rand1LH-like), got {baselines!r}")

    # row order: baseline runs first
    def base_rank(r: RunResult) -> int:
        for i, b in enumerate(baselines):
            if (isinstance(b, RunResult) and _same_run(r, b)) or (isinstance(b, str) and r.objective == b):
                return i
        return len(baselines)
    runs = sorted(runs, key=base_rank)  # stable

    values = [[r.value(s, m) for s, m in cols] for r in runs]
    shown = [[_number(v, percent) for v in row] for row in values]
    ranks_by_col = [_ranks([row[j] for row in shown]) for j in range(len(cols))]
    marks = [["" for _ in cols] for _ in runs]
    marked = {s for s, _ in cols if any(s in r.per_query for r in runs)}  # e.g. not an average over sets
    if significance and marked:
        for i, r in enumerate(runs):
            b1, b2 = (resolve_baseline(r, runs, b) for b in baselines)
            for j, (s, m) in enumerate(cols):
                if s in marked:
                    marks[i][j] = markers(r, b1, b2, s, m, alpha, fmt)

    bold, under = ("**{}**", "<u>{}</u>") if fmt == "markdown" else (r"\textbf{{{}}}", r"\underline{{{}}}")
    body = []
    for i, r in enumerate(runs):
        cells = []
        for j in range(len(cols)):
            rank, text = ranks_by_col[j][i], shown[i][j]
            text = bold.format(text) if rank == 0 else under.format(text) if rank == 1 else text
            cells.append(text + marks[i][j])
        body.append((row_label(r, row_key), cells))

    refs: Mapping = {}
    if references is True:
        refs = next((r.references for r in runs if r.references), {})
    elif isinstance(references, Mapping):
        refs = references
    missing = "n/a" if fmt == "markdown" else "--"
    floor = []
    for key, label in REFERENCE_ROWS:
        if key in refs:
            floor.append((label, [_number(refs[key][s][m], percent) if m in refs[key].get(s, {}) else missing
                                  for s, m in cols]))

    head = row_key if isinstance(row_key, str) else "run"
    legend = _legend(baselines, alpha, fmt) if significance else ""
    if fmt == "markdown":
        return _markdown(title, head, cols, floor, body, legend)
    return _latex(title, head, cols, floor, body, legend)


def _markdown(title, head, cols, floor, body, legend) -> str:
    esc = lambda t: str(t).replace("|", r"\|")  # noqa: E731
    lines = [f"Table: {title}", ""] if title else []
    lines.append("| " + " | ".join([esc(head)] + [f"{s} {metric_label(m)}" for s, m in cols]) + " |")
    lines.append("|:---|" + "---:|" * len(cols))
    for label, cells in floor + body:
        lines.append("| " + " | ".join([esc(label)] + cells) + " |")
    notes = ["**bold**: best, <u>underlined</u>: second best (run rows only)"] + ([legend] if legend else [])
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


def _latex(title, head, cols, floor, body, legend) -> str:
    groups = _set_groups(cols)
    starts = [2 + sum(w for _, w in groups[:k]) for k in range(len(groups))]  # first LaTeX column of each group
    caption = ". ".join(p for p in (_latex_escape(title) if title else "", legend) if p)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{caption}.}}")
    if title:
        lines.append(rf"\label{{tab:{re.sub(r'[^A-Za-z0-9]+', '-', title).strip('-').lower()}}}")
    lines += [rf"\begin{{tabular}}{{l{'r' * len(cols)}}}", r"\toprule"]
    lines.append(" & ".join([""] + [rf"\multicolumn{{{w}}}{{c}}{{{_latex_escape(s)}}}" for s, w in groups]) + r" \\")
    lines.append("".join(rf"\cmidrule(lr){{{a}-{a + w - 1}}}" for a, (_, w) in zip(starts, groups)))
    lines.append(" & ".join([_latex_escape(head)] + [_latex_escape(metric_label(m)) for _, m in cols]) + r" \\")
    lines.append(r"\midrule")
    for label, cells in floor:
        lines.append(" & ".join([_latex_escape(label)] + cells) + r" \\")
    if floor:
        lines.append(r"\midrule")
    for label, cells in body:
        lines.append(" & ".join([_latex_escape(label)] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# positive–negative ratio ablation plot

#: Metrics plotted by default (one subplot row each).
PLOT_METRICS = ("mrr@10", "ndcg@10")
#: Config keys that must agree between runs averaged into one point (seeds may differ).
AVERAGE_KEYS = ("data.name", "data.regime", "data.positive_selection")


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


def ratio_ablation_points(runs: Sequence[RunResult], eval_set: str, metrics: Sequence[str] = PLOT_METRICS
                          ) -> dict[str, dict[int, dict[str, list[tuple[int, float, int]]]]]:
    """The data of :func:`plot_ratio_ablation`: ``{metric: {G: {objective: [(M, mean, n_runs), …]}}}``.

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
        G, M = _int_key(run, "G"), _int_key(run, "M")
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
                raise ValueError(f"runs with objective={obj}, G={G}, M={M} differ in {key} ({', '.join(sorted(values))}): "
                                 f"{', '.join(str(r.path) for r in members)}; plot them separately")
    objectives = list(dict.fromkeys(r.objective for r in runs))
    out: dict[str, dict[int, dict[str, list[tuple[int, float, int]]]]] = {}
    for m in metrics:
        per_g: dict[int, dict[str, list[tuple[int, float, int]]]] = {}
        for G in sorted({g for _, g, _ in groups}):
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
                ax.set_title(f"G={G}")
            if i == len(metrics) - 1:
                ax.set_xlabel("M (positives per group)")
            if j == 0:
                ax.set_ylabel(metric_label(m))
    fig.suptitle(f"Positive–negative ratio ablation ({eval_set})")
    fig.legend([handles[o] for o in objectives if o in handles], [o for o in objectives if o in handles],
               loc="outside right center")
    return fig


def _wandb_image(fig):
    """The figure as a ``wandb.Image`` (an indirection so tests can stub it).

    The figure is rendered to PNG and handed over as a PIL image: ``wandb.Image(fig)`` itself goes
    through ``wandb.util.ensure_matplotlib_figure``, which reads ``matplotlib.pyplot`` without
    importing it and fails (``AttributeError``) when pyplot was never imported, as here.
    """
    import io

    import wandb
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    buf.seek(0)
    return wandb.Image(Image.open(buf))


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
        wandb_run.log({f"ratio_ablation/{eval_set}": _wandb_image(fig)})
    return out


# ----------------------------------------------------------------------------------------------
# command line


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
    ``--plot-ratio`` the table (``--table``) is optional.
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
            cols = _table_columns(None, None, args.columns)
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
                                        percent=args.percent, columns=cols) for f in fmts) if table else ""
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


if __name__ == "__main__":
    main(sys.argv[1:])
