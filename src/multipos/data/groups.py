"""Training groups: which passages a query trains on, and who is positive or negative for whom.

This module is the single place where the paper's group-composition rules live (Sec. 4):

* positive regimes: ``homogeneous`` (silver/LLM positives only), ``heterogeneous`` (one gold/human
  positive first, then silver), ``gold`` (gold only; curriculum stage 2) and ``all`` (gold then silver);
* ``M`` positives per group, chosen ``first`` (annotation order) or ``random`` (uniform, re-drawn each
  epoch; the gold positive of a heterogeneous group stays first);
* single-positive objectives: ``first`` (SingleLH) or ``random`` (Rand1LH, one uniform draw per query
  and epoch), the group then has 1 positive and G − 1 hard negatives;
* hard negatives fill the group to size ``G``; a judged positive of a query is never its negative, and
  in-batch columns that are positives of query i (whatever group they came from) are masked out of
  query i's negatives.

All randomness is seeded by (seed, epoch, query id), so a run is reproducible and independent of
batch order and of the number of workers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

from multipos.formats.types import REGIME_RULES as REGIME_RULES  # the data model lives in formats/types.py
from multipos.formats.types import REGIMES as REGIMES
from multipos.formats.types import TrainQuery as TrainQuery
from multipos.formats.types import unjudged_negatives as unjudged_negatives

SELECTIONS = ("first", "random")


@dataclass
class Group:
    """One query's training group: ``passage_ids[:n_positives]`` are its positives (len = G)."""

    query_id: str
    query: str
    passage_ids: list[str]
    n_positives: int
    judged: set[str]
    weights: dict[str, float] | None = None  # target weight per passage id (soft-target objectives), else None
    teacher_scores: dict[str, float] | None = None  # a teacher's raw score per passage id (margin_mse), else None


class GroupBuilder:
    """Builds fixed-size training groups (paper Sec. 4, "group construction").

    Args:
        group_size: G ≥ 2, passages per query (positives + hard negatives).
        max_positives: M, 1 ≤ M < G, so every group holds at least one hard negative; a query with fewer
            positives uses all of them and more hard negatives.
        positive_selection: ``first`` (first-M in order) or ``random`` (random-M, re-drawn each epoch).
        single_positive: ``None`` (multi-positive objectives), ``"first"`` (SingleLH) or
            ``"random"`` (Rand1LH).
        negative_selection: ``first`` (top-ranked hard negatives) or ``random`` (sampled per epoch
            from the mined list).
        pin_first: keep the first positive (the gold one of a heterogeneous group) when sampling.
        seed: base seed.

    Raises:
        ValueError: G < 2, M < 1, M ≥ G, or unknown selection names (naming the config field).
    """

    def __init__(
        self,
        group_size: int,
        max_positives: int,
        positive_selection: str = "first",
        single_positive: str | None = None,
        negative_selection: str = "random",
        pin_first: bool = False,
        seed: int = 0,
    ):
        if group_size < 2:
            raise ValueError(f"data.group_size (G) must be >= 2 (one positive + one negative), got {group_size}")
        if max_positives < 1:
            raise ValueError(f"data.max_positives (M) must be >= 1, got {max_positives}")
        if max_positives >= group_size:
            raise ValueError(f"data.max_positives (M={max_positives}) must be < data.group_size (G={group_size}): "
                             "a group needs at least one hard negative")
        for name, value in (("positive_selection", positive_selection), ("negative_selection", negative_selection)):
            if value not in SELECTIONS:
                raise ValueError(f"data.{name} must be one of {SELECTIONS}, got {value!r}")
        if single_positive not in (None, *SELECTIONS):
            raise ValueError(f"single_positive must be None, 'first' or 'random', got {single_positive!r}")
        self.group_size = group_size
        self.max_positives = max_positives
        self.positive_selection = positive_selection
        self.single_positive = single_positive
        self.negative_selection = negative_selection
        self.pin_first = pin_first
        self.seed = seed

    def rng(self, query_id: str, epoch: int) -> random.Random:
        """Deterministic RNG for one query in one epoch."""
        return random.Random(f"{self.seed}:{epoch}:{query_id}")

    def select_positives(self, positives: Sequence[str], rng: random.Random) -> list[str]:
        """The positives that enter the group: 1 for single-positive objectives, else up to M."""
        if not positives:
            raise ValueError("cannot build a group for a query without positives")
        if self.single_positive == "first":
            return [positives[0]]
        if self.single_positive == "random":
            return [rng.choice(list(positives))]
        m = min(self.max_positives, len(positives))
        if self.positive_selection == "first" or m == len(positives):
            return list(positives[:m])
        head = [positives[0]] if self.pin_first else []
        rest = list(positives[len(head):])
        return head + rng.sample(rest, m - len(head))

    def negatives_needed(self, positives: Sequence[str]) -> int:
        """Hard negatives the group of a query with these positives needs: G − (positives it takes)."""
        taken = 1 if self.single_positive else min(self.max_positives, len(positives))
        return self.group_size - taken

    def build(self, query: TrainQuery, positives: Sequence[str], epoch: int, fallback_ids: Sequence[str] = ()) -> Group:
        """Build the group of ``query`` for ``epoch``.

        ``fallback_ids`` (e.g. the corpus) tops up negatives when the mined list is too short.
        Raises ValueError if fewer than G − n_pos non-positive passages can be found.
        """
        rng = self.rng(query.query_id, epoch)
        chosen = self.select_positives(positives, rng)
        need = self.group_size - len(chosen)
        pool = [n for n in dict.fromkeys(query.negatives) if n not in query.judged]
        if self.negative_selection == "random" and len(pool) > need:
            negatives = rng.sample(pool, need)
        else:
            negatives = pool[:need]
        if len(negatives) < need and fallback_ids:
            taken = set(negatives)
            for _ in range(8 * need):  # rejection sampling: O(G) per query, not O(corpus)
                if len(negatives) == need:
                    break
                p = fallback_ids[rng.randrange(len(fallback_ids))]
                if p not in query.judged and p not in taken:
                    negatives.append(p)
                    taken.add(p)
            if len(negatives) < need:  # small or mostly-judged corpus: scan it
                candidates = [p for p in dict.fromkeys(fallback_ids) if p not in query.judged and p not in taken]
                negatives += rng.sample(candidates, min(need - len(negatives), len(candidates)))
        if len(negatives) < need:
            raise ValueError(
                f"query {query.query_id!r}: only {len(negatives)} negatives available, group size G="
                f"{self.group_size} needs {need}"
            )
        return Group(query.query_id, query.query, chosen + negatives, len(chosen), query.judged,
                     query.weights or None, query.teacher_scores or None)


def negative_shortfall(builder: GroupBuilder, items: Sequence[tuple[TrainQuery, Sequence[str]]],
                       corpus_ids: Sequence[str]) -> dict[str, int]:
    """{query id → hard negatives missing} for the queries whose mined list cannot fill their group.

    ``items`` are (query, positives under the regime) pairs. :meth:`GroupBuilder.build` fills the missing
    places with random corpus passages (random, not hard, negatives), so the caller logs this count.

    Raises:
        ValueError: a query whose group cannot be filled even from the whole corpus (fewer unjudged
            passages than G − positives), naming the query and ``data.group_size``.
    """
    corpus = set(corpus_ids)
    short: dict[str, int] = {}
    for q, positives in items:
        need = builder.negatives_needed(positives)
        mined = sum(1 for n in dict.fromkeys(q.negatives) if n not in q.judged)
        if mined >= need:
            continue
        unjudged = len(corpus) - len(q.judged & corpus)
        if unjudged < need:
            raise ValueError(f"query {q.query_id!r}: data.group_size (G={builder.group_size}) needs {need} negatives "
                             f"but the corpus has only {unjudged} passages not judged for it; lower data.group_size")
        short[q.query_id] = need - mined
    return short


def group_masks(groups: Sequence[Group], columns: Sequence[str] | None = None,
                offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive and negative masks of ``groups``' queries over the score-matrix ``columns`` (passage ids).

    ``columns`` defaults to the groups' passages concatenated (one process). In data-parallel training
    they are the passages of the global batch, every rank's groups concatenated in rank order, and this
    rank's groups start at column ``offset`` (:mod:`multipos.training.distributed`); the default is that layout
    with one rank.

    Returns ``positive_mask``, ``negative_mask``: bool [B, len(columns)]. Query i's positives are the first
    ``n_positives`` columns of its own group; its negatives are every other column (own hard negatives
    and in-batch passages) except passages judged relevant to query i, which are ignored — even when
    they arrived through another query's (or another rank's) group (false-negative masking by passage id).

    Raises ValueError when ``columns[offset:]`` does not start with the groups' passages.
    """
    own_columns = [pid for g in groups for pid in g.passage_ids]
    columns = own_columns if columns is None else list(columns)
    if columns[offset: offset + len(own_columns)] != own_columns:
        raise ValueError(f"group_masks: columns[{offset}:{offset + len(own_columns)}] are not the groups' passages")
    where: dict[str, list[int]] = {}
    for j, pid in enumerate(columns):
        where.setdefault(pid, []).append(j)
    present = set(where)
    positive_mask = torch.zeros(len(groups), len(columns), dtype=torch.bool)
    negative_mask = torch.ones(len(groups), len(columns), dtype=torch.bool)
    rows, cols, start = [], [], offset
    for i, g in enumerate(groups):
        positive_mask[i, start : start + g.n_positives] = True
        for pid in (set(g.judged) | set(g.passage_ids[: g.n_positives])) & present:
            rows += [i] * len(where[pid])
            cols += where[pid]
        start += len(g.passage_ids)
    negative_mask[rows, cols] = False
    return positive_mask, negative_mask


def group_targets(groups: Sequence[Group], columns: Sequence[str] | None = None, kind: str = "weights") -> torch.Tensor:
    """Target matrix float32 [B, len(columns)] of the soft-target objectives: query i's value for the passage in
    column j, ``kind`` = ``weights`` (:attr:`Group.weights`, 0 where a passage has none) or ``scores``
    (:attr:`Group.teacher_scores`, NaN where the teacher scored none: ``margin_mse`` forms no pair with it).
    ``columns`` as in :func:`group_masks` (default: the groups' passages concatenated).

    Raises ValueError naming the query when a group carries no targets of that kind (the data has no target settings).
    """
    columns = [pid for g in groups for pid in g.passage_ids] if columns is None else list(columns)
    fill = float("nan") if kind == "scores" else 0.0
    target = torch.full((len(groups), len(columns)), fill, dtype=torch.float32)
    for i, g in enumerate(groups):
        values = g.teacher_scores if kind == "scores" else g.weights
        if values is None:
            need = "data.source.teacher_scores" if kind == "scores" else \
                "data.source.grade_weights (e.g. {2: 1.0, 1: 0.5}) or data.source.teacher_scores"
            raise ValueError(f"query {g.query_id!r} has no target {kind}: a soft-target objective needs {need}")
        for j, pid in enumerate(columns):
            if pid in values:
                target[i, j] = values[pid]
    return target


