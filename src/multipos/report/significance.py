"""Significance: the paired t-test over queries, the paper's markers and the choice of baseline rows."""

from __future__ import annotations

import math
import sys
from typing import Mapping, Sequence, Union

from multipos.report.runs import CONFIG_KEYS, KEY_ALIASES, RunResult, override_map
from multipos.report.seeds import SeedGroup, same_row

#: A table row: one run, or the runs of one configuration over several seeds.
Row = Union[RunResult, SeedGroup]
#: Keys on which a row and its baseline row must agree (every config key but the objective and the seed).
MATCH_KEYS = tuple(k for k in CONFIG_KEYS if k not in ("loss.name", "objective", "seed"))
DEFAULT_BASELINES = ("singlelh", "rand1lh")
#: Relative difference up to which :func:`paired_ttest` takes two per-query values as equal: a few units in the last
#: place of a float64 (2.2e-16 each), far below any difference a metric over judged passages can make.
ROUNDING = 8 * sys.float_info.epsilon
#: (improvement, drop) symbols for the first (SingleLH) and second (Rand1LH) baseline.
MARKER_SYMBOLS = {
    "markdown": (("+", "-"), ("♣", "♦")),
    "latex": (("+", "-"), (r"\clubsuit", r"\diamondsuit")),
}
FORMATS = ("markdown", "latex")


def paired_ttest(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float]:
    """Two-sided paired t-test of ``a`` vs ``b`` (``{qid: value}``): ``scipy.stats.ttest_rel``.

    Returns ``(t, p)``; ``t > 0`` means ``a`` is higher on average. Both must cover exactly the same
    queries — otherwise ``ValueError`` stating how many queries each side has, how many they share and
    examples of the differences (no query is silently dropped). At least 2 queries are required, and
    no value may be NaN. A pair whose difference is no larger than float64 rounding (:data:`ROUNDING`
    relative to the larger value) counts as equal: a mean over seeds of identical values can differ from the value
    by one unit in the last place (``math.fsum([0.1] * 3) / 3 == 0.10000000000000002``), and a t-test of such
    differences alone gives an arbitrary p (seen: p = 0.024 for three seeds identical to the zero-shot run). When
    every pair is equal (identical runs) the result is ``(0.0, 1.0)`` instead of scipy's NaN.
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
    same = np.abs(x - y) <= ROUNDING * np.maximum(np.abs(x), np.abs(y))
    if same.all():
        return 0.0, 1.0
    res = ttest_rel(np.where(same, y, x), y)
    return float(res.statistic), float(res.pvalue)


def _where(row: Row) -> str:
    return row.describe() if isinstance(row, SeedGroup) else str(row.path)


def _significance(run: Row, base: Row, eval_set: str, metric: str) -> tuple[float, float]:
    """(mean per-query difference run − base, two-sided p-value), on per-query means over seeds for a group."""
    a, b = run.query_values(eval_set, metric), base.query_values(eval_set, metric)
    try:
        _, p = paired_ttest(a, b)
    except ValueError as exc:
        raise ValueError(f"{eval_set}/{metric}: {_where(run)} vs {_where(base)}: {exc}") from None
    diff = math.fsum(a[q] - b[q] for q in a) / len(a)
    return diff, p


def marker_symbols(run: Row, singlelh_run: Row | None, rand1lh_run: Row | None,
                   eval_set: str, metric: str, alpha: float = 0.05, fmt: str = "markdown") -> list[str]:
    """The marker symbols of :func:`markers` as a list (e.g. ``["+", "♦"]``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    out = []
    for base, (up, down) in zip((singlelh_run, rand1lh_run), MARKER_SYMBOLS[fmt]):
        if base is None or same_row(run, base):
            continue
        diff, p = _significance(run, base, eval_set, metric)
        if p < alpha and diff != 0:
            out.append(up if diff > 0 else down)
    return out


def markers(run: Row, singlelh_run: Row | None, rand1lh_run: Row | None, set: str,
            metric: str, alpha: float = 0.05, fmt: str = "markdown") -> str:
    """Significance markers of ``run`` on ``set``/``metric`` against the two baselines.

    Test: :func:`paired_ttest` (two-sided, paired over queries) on the per-query values, significant
    when ``p < alpha``; direction = sign of the mean per-query difference. Rows of several seeds
    (:class:`SeedGroup`) are compared on their per-query means over seeds. Markdown: ``+`` / ``-``
    (better / worse than ``singlelh_run``) then ``♣`` / ``♦`` (better / worse than ``rand1lh_run``),
    e.g. ``"+♦"``; LaTeX: the same in one superscript, e.g. ``"$^{+\\diamondsuit}$"``. ``""`` when
    nothing is significant. A baseline that is ``None`` or ``run`` itself gives no marker.
    Raises ``FileNotFoundError`` / ``ValueError`` for missing per-query data or differing query sets.
    """
    symbols = marker_symbols(run, singlelh_run, rand1lh_run, set, metric, alpha, fmt)
    if not symbols:
        return ""
    return "".join(symbols) if fmt == "markdown" else "$^{" + "".join(symbols) + "}$"


def is_control(baseline: object) -> bool:
    """True for a control baseline ``"<key>=<value>"`` (e.g. ``"negative_filter=none"``), False for an objective
    name, a row or None."""
    return isinstance(baseline, str) and "=" in baseline


def _first(row: Row) -> RunResult:
    return row.first if isinstance(row, SeedGroup) else row


def is_baseline_row(row: Row, baseline: str | Row | None) -> bool:
    """Whether ``row`` is a row of ``baseline``: its objective for an objective name, its ``key`` value for a
    control ``"<key>=<value>"`` (read by :meth:`RunResult.get`: config key, alias or sweep override)."""
    if baseline is None or isinstance(baseline, (RunResult, SeedGroup)):
        return baseline is not None and same_row(row, baseline)
    if is_control(baseline):
        key, _, value = baseline.partition("=")
        try:
            return str(_first(row).get(key)) == value
        except ValueError:
            return False
    return row.objective == baseline


def resolve_baseline(run: Row, runs: Sequence[Row], baseline: str | Row | None) -> Row | None:
    """The row that ``run`` is compared with for the baseline ``baseline``.

    ``None`` → ``None``; a :class:`RunResult` / :class:`SeedGroup` → itself; an objective name →
    ``run`` itself when it has that objective (no marker), else the row of ``runs`` with that objective
    that agrees with ``run`` on every :data:`MATCH_KEYS` value (all config keys but the objective and
    the seed); among several such rows, the one with the same seed(s) as ``run``. A control
    ``"<key>=<value>"`` (e.g. ``"negative_filter=none"``: each filter against no filter) → ``run`` itself when
    its ``key`` has that value, else the row with that value, the same objective and the same
    :data:`MATCH_KEYS` values but the control's own (``data.positive_selection=first``: each random-M row against
    the first-M row of its objective and M). Among several such rows: the one with the same seed(s), then the one
    whose sweep overrides (``.hydra/overrides.yaml``) are the same but for the objective, the seed and the control
    key (the same cell of the study, e.g. the same noise rate). ``None`` when no row matches. Raises ``ValueError``
    listing the candidates when several match equally well — pass the baseline run explicitly then.
    """
    if baseline is None or isinstance(baseline, (RunResult, SeedGroup)):
        return baseline
    if is_baseline_row(run, baseline):
        return run
    cfg = run.config
    control = KEY_ALIASES.get(baseline.split("=", 1)[0], baseline.split("=", 1)[0]) if is_control(baseline) else None
    match = [k for k in MATCH_KEYS if k != control]  # the control's own key is what differs
    candidates = [r for r in runs if is_baseline_row(r, baseline)
                  and (not is_control(baseline) or r.objective == run.objective)
                  and all(r.config.get(k) == cfg.get(k) for k in match)]
    if len(candidates) > 1:
        candidates = [r for r in candidates if r.config.get("seed") == cfg.get("seed")] or candidates
    if len(candidates) > 1:  # the same sweep cell but for the objective (and the control key): e.g. the same noise
        drop = {"loss", "seed", *([baseline.split("=", 1)[0]] if is_control(baseline) else [])}
        cell = {k: v for k, v in override_map(run.overrides).items() if k not in drop}
        candidates = [r for r in candidates
                      if {k: v for k, v in override_map(r.overrides).items() if k not in drop} == cell] or candidates
    if len(candidates) > 1:
        raise ValueError(f"ambiguous {baseline} baseline for {_where(run)}: "
                         f"{', '.join(_where(r) for r in candidates)} match equally on "
                         f"{', '.join(MATCH_KEYS)} and seed; pass the baseline run explicitly")
    return candidates[0] if candidates else None
