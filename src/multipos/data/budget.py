"""The annotation budget (paper Sec. 5, Table 7): a fixed number of positive labels spent as m labels on a
fraction f of the training queries. One place for its settings (``data.budget``), their checks and the allocation."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from multipos.data.groups import TrainQuery

#: The keys of ``data.budget``.
BUDGET_KEYS = ("positives_per_query", "query_fraction", "seed", "pool_min_positives")


@dataclass(frozen=True)
class AnnotationBudget:
    """``data.budget``: ``positives_per_query`` (m ≥ 1) labels on a ``query_fraction`` (f in (0, 1]) of the pool,
    drawn with ``seed``; the pool is every query with at least ``pool_min_positives`` positives (default m; a study
    comparing several m gives all its cells the largest, so they draw from one pool and m · f · |pool| is the same
    label total up to rounding).

    Raises ValueError (naming the ``data.budget`` field) at construction for m < 1, f outside (0, 1] or
    ``pool_min_positives`` < m.
    """

    positives_per_query: int = 1
    query_fraction: float = 1.0
    seed: int = 0
    pool_min_positives: int | None = None

    def __post_init__(self):
        if self.positives_per_query < 1:
            raise ValueError(f"data.budget.positives_per_query must be >= 1, got {self.positives_per_query}")
        if not 0.0 < self.query_fraction <= 1.0:
            raise ValueError(f"data.budget.query_fraction must be in (0, 1], got {self.query_fraction}")
        if self.pool_min_positives is not None and self.pool_min_positives < self.positives_per_query:
            raise ValueError(f"data.budget.pool_min_positives ({self.pool_min_positives}) must be >= "
                             f"positives_per_query ({self.positives_per_query})")

    @classmethod
    def from_config(cls, node: Mapping) -> "AnnotationBudget":
        """From the ``data.budget`` mapping. Raises ValueError naming unknown keys, and as the class."""
        unknown = set(node) - set(BUDGET_KEYS)
        if unknown:
            raise ValueError(f"data.budget: unknown keys {sorted(unknown)} (allowed: {', '.join(BUDGET_KEYS)})")
        pool = node.get("pool_min_positives")
        return cls(int(node.get("positives_per_query", 1)), float(node.get("query_fraction", 1.0)),
                   int(node.get("seed", 0)), None if pool is None else int(pool))

    def apply(self, queries: list[TrainQuery], regime: str) -> list[TrainQuery]:
        """round(f · |pool|) queries of the pool drawn with ``random.Random(seed)`` (the same subset for the same
        seed), sorted by query id, each keeping its first m positives under ``regime`` (annotation order). Returns
        new :class:`~multipos.data.groups.TrainQuery` objects; judged passages are unchanged (a dropped label is still
        never used as a negative). Raises ValueError when the pool is empty."""
        need = self.positives_per_query if self.pool_min_positives is None else self.pool_min_positives
        pool = [q for q in queries if len(q.positives(regime)) >= need]
        if not pool:
            raise ValueError(f"data.budget: no training query has >= {need} positives under regime {regime!r}")
        chosen = random.Random(self.seed).sample(pool, max(1, round(self.query_fraction * len(pool))))
        chosen.sort(key=lambda q: q.query_id)
        out = []
        for q in chosen:
            keep = set(q.positives(regime)[: self.positives_per_query])
            out.append(TrainQuery(q.query_id, q.query, [p for p in q.gold if p in keep],
                                  [p for p in q.silver if p in keep], list(q.negatives), set(q.judged)))
        return out


def apply_budget(queries: list[TrainQuery], regime: str, positives_per_query: int, query_fraction: float,
                 seed: int = 0, pool_min_positives: int | None = None) -> list[TrainQuery]:
    """:meth:`AnnotationBudget.apply` with the settings as arguments (raises as the class and the method)."""
    return AnnotationBudget(int(positives_per_query), float(query_fraction), int(seed),
                            None if pool_min_positives is None else int(pool_min_positives)).apply(queries, regime)
