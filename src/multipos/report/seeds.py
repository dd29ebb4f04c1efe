"""Seed aggregation: runs that differ only by ``seed`` form one table row (:class:`SeedGroup`).

A row's value is the mean over its seeds (the value itself for one seed), shown with the sample standard
deviation (``ddof=1``) when there are two seeds or more. Its per-query values, used by the significance
tests, are the per-query means over its seeds: every seed must have values for the same queries.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from multipos.report.runs import RunResult

#: Top-level keys of a run folder's config that do not make two runs without ``spec.json`` different rows: the seed,
#: and the keys that only name or place a run (where it writes, how the study renders it). Runs with ``spec.json``
#: are grouped by their spec (:func:`comparable_config`).
SEED_FREE_KEYS = ("seed", "paths", "hydra", "report", "experiment_name")


def sort_seeds(seeds: Iterable) -> list:
    """Seeds in order: numbers numerically, then anything else by its ``repr``."""
    def key(s):
        number = isinstance(s, (int, float)) and not isinstance(s, bool)
        return (0, s, "") if number else (1, 0, repr(s))
    return sorted(seeds, key=key)


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


def comparable_config(run: RunResult) -> dict[str, object]:
    """What tells the run's row: its spec (``spec.json``) without the seed, flattened to dotted keys, with
    ``init_from`` as the config writes it (``.../seed=${seed}/model``: each seed starts from its own seed's model)
    and, for an evaluation (no stages), the objective that trained the model it evaluates (Table 3's rows); for a run
    without a spec, its raw (unresolved) config without :data:`SEED_FREE_KEYS`."""
    if run.spec is not None:
        spec = {k: v for k, v in copy.deepcopy(run.spec).items() if k != "seed"}
        if run.raw_config.get("init_from") is not None:
            spec["init_from"] = run.raw_config["init_from"]
        if not spec.get("stages"):
            spec["evaluated_objective"] = run.objective
        return _flat(spec)
    return _flat({k: v for k, v in run.raw_config.items() if k not in SEED_FREE_KEYS})


def config_difference(a: RunResult, b: RunResult) -> list[str]:
    """Dotted keys whose values differ between ``a`` and ``b`` (:func:`comparable_config`)."""
    fa, fb = comparable_config(a), comparable_config(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, ...) != fb.get(k, ...))


def _group_key(run: RunResult) -> str:
    if not run.raw_config and run.spec is None:  # nothing tells which runs are seeds of one another
        return "path:" + str(run.path.resolve())
    return json.dumps(comparable_config(run), sort_keys=True, default=str)


@dataclass(eq=False)
class SeedGroup:
    """One table row: the runs of one configuration, one per seed (:func:`group_seeds`).

    Offers the interface of :class:`RunResult` that tables and significance tests use (``path``,
    ``name``, ``objective``, ``label``, ``config``, ``references``, ``value``, ``query_values``,
    ``get``), with values averaged over :attr:`runs`, plus :meth:`std` and :attr:`seeds`. ``path`` /
    ``name`` / ``raw_config`` / ``overrides`` are those of the first run; ``config["seed"]`` is the
    seed for one run, else the sorted tuple of seeds. Equality is identity.
    """

    runs: list[RunResult]
    _pq: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if not self.runs:
            raise ValueError("a seed group needs at least one run")

    @property
    def first(self) -> RunResult:
        return self.runs[0]

    path = property(lambda self: self.first.path)
    name = property(lambda self: self.first.name)
    objective = property(lambda self: self.first.objective)
    label = property(lambda self: self.first.label)
    raw_config = property(lambda self: self.first.raw_config)
    overrides = property(lambda self: self.first.overrides)

    @property
    def seeds(self) -> list:
        """The seeds of :attr:`runs` (``config["seed"]``), in run order."""
        return [r.config.get("seed") for r in self.runs]

    @property
    def n(self) -> int:
        """Number of seeds (runs)."""
        return len(self.runs)

    @property
    def config(self) -> dict[str, object]:
        cfg = dict(self.first.config)
        if self.n > 1:
            cfg["seed"] = tuple(sort_seeds(self.seeds))
        return cfg

    @property
    def references(self) -> dict:
        return next((r.references for r in self.runs if r.references), {})

    @property
    def per_query(self) -> dict[str, dict]:
        """Sets with per-query values in at least one run (``{set: {}}``: for membership tests only)."""
        return {s: {} for r in self.runs for s in r.per_query}

    def describe(self) -> str:
        """The first run's path, plus how many more seeds the row has."""
        return str(self.path) + (f" (+{self.n - 1} more seed{'s' * (self.n > 2)})" if self.n > 1 else "")

    def values(self, eval_set: str, metric: str) -> list[float]:
        """``metrics.json[eval_set][metric]`` of every run (``ValueError`` naming a run lacking it)."""
        return [r.value(eval_set, metric) for r in self.runs]

    def value(self, eval_set: str, metric: str) -> float:
        """Mean over seeds of ``metrics.json[eval_set][metric]`` (the run's own value for one seed)."""
        vals = self.values(eval_set, metric)
        return vals[0] if len(vals) == 1 else math.fsum(vals) / len(vals)

    def std(self, eval_set: str, metric: str) -> float | None:
        """Sample standard deviation (``ddof=1``) over seeds; ``None`` for a single seed."""
        vals = self.values(eval_set, metric)
        return statistics.stdev(vals) if len(vals) > 1 else None

    def query_values(self, eval_set: str, metric: str) -> dict[str, float]:
        """Per-query means over seeds ``{qid: mean}`` (the run's own values for one seed).

        Raises what :meth:`RunResult.query_values` raises for a run lacking them, and ``ValueError``
        naming two runs whose per-query files cover different queries.
        """
        key = (eval_set, metric)
        if key not in self._pq:
            per_run = [r.query_values(eval_set, metric) for r in self.runs]
            if len(per_run) == 1:
                self._pq[key] = per_run[0]
            else:
                for r, q in zip(self.runs[1:], per_run[1:]):
                    if q.keys() != per_run[0].keys():
                        raise ValueError(
                            f"{eval_set}/{metric}: seeds of one row cover different queries: {self.first.path} has "
                            f"{len(per_run[0])}, {r.path} has {len(q)} ({len(q.keys() & per_run[0].keys())} in common)")
                self._pq[key] = {qid: math.fsum(q[qid] for q in per_run) / len(per_run) for qid in per_run[0]}
        return self._pq[key]

    def get(self, key: str) -> object:
        """:meth:`RunResult.get` of the first run; ``seed`` → :attr:`config`'s seed (a tuple for several)."""
        if key == "seed":
            return self.config["seed"]
        return self.first.get(key)


def group_seeds(runs: Iterable[RunResult]) -> list[SeedGroup]:
    """Group ``runs`` that differ only by seed into :class:`SeedGroup` rows, in order of first appearance.

    Two runs are seeds of one row when their specs (``spec.json``) agree on everything but the seed, or, for runs
    without one, their raw (unresolved) ``.hydra/config.yaml`` agree on every key except :data:`SEED_FREE_KEYS`; a
    run with neither is its own row. Raises ``ValueError``
    naming both directories when two runs of one row have the same seed (a duplicate run).
    """
    groups: dict[str, list[RunResult]] = {}
    for r in runs:
        groups.setdefault(_group_key(r), []).append(r)
    out = []
    for members in groups.values():
        seen: dict[str, RunResult] = {}
        for r in members:
            seed = repr(r.config.get("seed"))
            if seed in seen:
                raise ValueError(f"{seen[seed].path} and {r.path} have the same configuration and seed ({seed}): "
                                 "pass only one of them (or show one row per run)")
            seen[seed] = r
        out.append(SeedGroup(members))
    return out


def single_rows(runs: Sequence[RunResult]) -> list[SeedGroup]:
    """One :class:`SeedGroup` per run (no aggregation)."""
    return [SeedGroup([r]) for r in runs]


def members(row: RunResult | SeedGroup) -> list[RunResult]:
    """The runs behind a row: ``row.runs`` for a :class:`SeedGroup`, ``[row]`` for a run."""
    return list(row.runs) if isinstance(row, SeedGroup) else [row]


def same_row(a: RunResult | SeedGroup, b: RunResult | SeedGroup) -> bool:
    """Whether ``a`` and ``b`` share a run (same object or same resolved directory)."""
    if a is b:
        return True
    pa = {Path(r.path).resolve() for r in members(a)}
    return any(Path(r.path).resolve() in pa for r in members(b))
