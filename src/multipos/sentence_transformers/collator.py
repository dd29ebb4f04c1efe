"""The data collator that turns rows with a variable number of positives into multi-positive batches.

sentence-transformers' default collator tokenises a fixed set of text columns (anchor, positive, negative_1, …).
:class:`MultiPositiveDataCollator` reads rows of the multi-positive schema instead
(:mod:`multipos.sentence_transformers.data`: ``query``, ``positives``, optionally ``negatives`` and ``grades``), builds
each query's group with multipos's own rules (:class:`multipos.data.groups.GroupBuilder`: up to M positives, first-M
or random-M, and up to G − M hard negatives, none of them a positive of the query), tokenises the queries and the
flattened passages, and describes the blocks in the batch's ``label``
(:class:`multipos.sentence_transformers.layout.GroupLayout`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
from transformers import TrainerCallback

from multipos.data.groups import SELECTIONS, GroupBuilder
from multipos.losses import SINGLE_POSITIVE, check_name
from multipos.sentence_transformers.data import QUERY, check_row, grade_weight
from multipos.sentence_transformers.layout import GroupLayout

__all__ = ["MultiPositiveDataCollator", "EpochCallback"]

#: Stand-in for "no limit" on M and G (GroupBuilder takes numbers).
_UNLIMITED = 1 << 30


@dataclass
class MultiPositiveDataCollator(SentenceTransformerDataCollator):
    """Collates multi-positive rows for :class:`~multipos.sentence_transformers.MultiPositiveLoss` and
    :class:`~multipos.sentence_transformers.CachedMultiPositiveLoss` (pass it as the trainer's ``data_collator``).

    Args:
        preprocess_fn: the model's ``preprocess`` (as sentence-transformers' own collator).
        max_positives: M, the most positives a query trains on (``data.max_positives``); None = all of them (at most
            G − 1 with a ``group_size``).
        group_size: G, positives plus hard negatives per query (``data.group_size``): a query with P positives
            gets up to G − P hard negatives; None = all of its negatives. Must exceed ``max_positives``.
        positive_selection: ``first`` (the first M in utility order) or ``random`` (M drawn per query and epoch)
            (``data.positive_selection``).
        negative_selection: ``first`` (the first G − P) or ``random`` (drawn per query and epoch)
            (``data.negative_selection``).
        objective: the loss's objective name; ``singlelh`` / ``rand1lh`` keep one positive, the first / a random one
            (:data:`multipos.losses.SINGLE_POSITIVE`, as multipos's training stages do), None = a multi-positive one.
        pin_first: keep the first positive when drawing random-M (the gold positive of a heterogeneous group).
        grade_weights: {grade: target weight} for the soft-target objectives (``data.source.grade_weights``, e.g.
            ``{2: 1.0, 1: 0.5}``); None = each grade is its positive's weight.
        query_max_length, passage_max_length: truncation lengths in tokens (``model.query_max_length`` /
            ``passage_max_length``); None = the model's ``max_seq_length``.
        seed: base seed of the random selections.
        prompts, router_mapping: as sentence-transformers' collator, by column: the ``query`` column's prompt and
            route for queries, the ``positives`` column's for every passage (a different ``negatives`` prompt or route
            is refused).

    Random selections are seeded by (seed, epoch, query id) like :meth:`multipos.data.groups.GroupBuilder.rng` (the
    query id is the ``query_id`` column's, else the query text), so a run is reproducible whatever the batch order.
    The epoch comes from :meth:`epoch_callback` (pass it in the trainer's ``callbacks``; exact after a resume and with
    DataLoader workers); without it the n-th time a query is collated counts as its epoch n, in this process.

    Output: ``query_*`` and ``passages_*`` tokenizer features ([B, Lq], [N, Lp]) and ``label`` (the packed
    :class:`~multipos.sentence_transformers.layout.GroupLayout`).

    Raises:
        ValueError: bad settings (naming the argument); at collation, a row without a positive, a grade that is not a
            number or not in ``grade_weights``, or ``positives`` and ``grades`` of different lengths (naming the
            column and the query; :func:`multipos.sentence_transformers.check_dataset` names the row index).
    """

    max_positives: int | None = None
    group_size: int | None = None
    positive_selection: str = "first"
    negative_selection: str = "random"
    objective: str | None = None
    pin_first: bool = False
    grade_weights: dict | None = None
    query_max_length: int | None = None
    passage_max_length: int | None = None
    seed: int = 0
    epoch: int | None = None
    _draws: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("positive_selection", "negative_selection"):
            if getattr(self, name) not in SELECTIONS:
                raise ValueError(f"{name} must be one of {SELECTIONS}, got {getattr(self, name)!r}")
        if self.max_positives is not None and self.max_positives < 1:
            raise ValueError(f"max_positives (M) must be >= 1 or None, got {self.max_positives}")
        if self.group_size is not None and self.group_size <= (self.max_positives or 1):
            raise ValueError(f"group_size (G={self.group_size}) must exceed max_positives (M={self.max_positives or 1})"
                             ": a group needs room for at least one hard negative")
        if self.objective is not None:
            check_name(self.objective)
        group_size = self.group_size or _UNLIMITED
        self._builder = GroupBuilder(group_size, self.max_positives or group_size - 1,
                                     self.positive_selection, SINGLE_POSITIVE.get(self.objective),
                                     self.negative_selection, self.pin_first, self.seed)

    def set_epoch(self, epoch: int) -> None:
        """Draw the random selections of ``epoch`` from now on (:class:`EpochCallback` calls this)."""
        self.epoch = int(epoch)

    def epoch_callback(self) -> "EpochCallback":
        """A ``transformers.TrainerCallback`` that tells this collator the trainer's epoch before each epoch."""
        return EpochCallback(self)

    def _epoch_of(self, key: str) -> int:
        if self.epoch is not None:
            return self.epoch
        draw = self._draws.get(key, 0)
        self._draws[key] = draw + 1
        return draw

    def group(self, row: dict[str, Any], where: str = "row") -> tuple[list[str], int, set[str], list[float]]:
        """One row → (passage texts of its group: the selected positives then hard negatives, how many are positives,
        every positive text of the row (never a negative of it, anywhere in the batch), the positives' weights).

        The same draws as :meth:`multipos.data.groups.GroupBuilder.build` on the row's ids and epoch, except that a row
        with fewer hard negatives than G − P keeps the ones it has. Raises ValueError for a bad row (class docstring).
        """
        check_row(row, where)
        positives, negatives = list(row["positives"]), list(row.get("negatives") or [])
        grades = row.get("grades")
        weights = ([grade_weight(g, self.grade_weights, f"{where}, column 'grades'") for g in grades]
                   if grades is not None else [math.nan] * len(positives))
        key = str(row.get("query_id") or row[QUERY])
        rng = self._builder.rng(key, self._epoch_of(key))
        chosen = self._builder.select_positives(list(range(len(positives))), rng)
        judged = set(positives)
        need = self._builder.group_size - len(chosen)
        pool = [n for n in dict.fromkeys(negatives) if n not in judged]
        if self.negative_selection == "random" and len(pool) > need:
            hard = rng.sample(pool, need)
        else:
            hard = pool[:need]
        return [positives[c] for c in chosen] + hard, len(chosen), judged, [weights[c] for c in chosen]

    def _prompt_and_task(self, batch: dict, column: str, other: str | None = None) -> tuple[str | None, str | None]:
        prompts, routes = self._resolve_prompts(batch), self._resolve_router_mapping(batch)
        prompt = self._get_prompt_for_column(prompts, column) if prompts else None
        task = self._get_task_for_column(column, 0, routes)
        if other is not None:
            other_prompt = self._get_prompt_for_column(prompts, other) if prompts else None
            if other_prompt is not None and other_prompt != prompt:
                raise ValueError(f"prompts: the {other!r} column's prompt {other_prompt!r} differs from the "
                                 f"{column!r} column's {prompt!r}; every passage is tokenised with one prompt")
            other_task = self._get_task_for_column(other, 0, routes)
            if other_task is not None and other_task != task:
                raise ValueError(f"router_mapping: the {other!r} column's route {other_task!r} differs from the "
                                 f"{column!r} column's {task!r}; every passage is routed alike")
        return prompt, task

    def _tokenize(self, texts: list[str], prompt: str | None, task: str | None, max_length: int | None) -> dict:
        kwargs = {"prompt": prompt, "task": task}
        if max_length is not None:
            kwargs["max_length"] = max_length
        return self.preprocess_fn(texts, **kwargs)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """Rows → the batch of the class docstring (``query_*``, ``passages_*``, ``label``)."""
        if not features:
            return {}
        batch: dict[str, Any] = {}
        if "dataset_name" in features[0]:
            batch["dataset_name"] = features[0]["dataset_name"]
        texts, n_pos, n_neg, weights, judged = [], [], [], [], []
        for i, row in enumerate(features):
            group, p, positives, w = self.group(row, f"row {i} of the batch (query {str(row.get(QUERY))[:60]!r})")
            texts += group
            n_pos.append(p)
            n_neg.append(len(group) - p)
            weights += w + [0.0] * (len(group) - p)
            judged.append(positives)
        where: dict[str, list[int]] = {}
        for j, text in enumerate(texts):
            where.setdefault(text, []).append(j)
        ignored, start = [], 0
        for i, positives in enumerate(judged):  # query i's positives elsewhere in the batch: not its negatives
            own = range(start, start + n_pos[i])
            ignored += [(i, j) for text in positives for j in where.get(text, ()) if j not in own]
            start += n_pos[i] + n_neg[i]
        layout = GroupLayout(torch.tensor(n_pos), torch.tensor(n_neg), torch.tensor(weights, dtype=torch.float32),
                             torch.tensor(sorted(ignored), dtype=torch.long).reshape(-1, 2))
        sides = (("query", [row[QUERY] for row in features], self._prompt_and_task(batch, QUERY),
                  self.query_max_length),
                 ("passages", texts, self._prompt_and_task(batch, "positives", "negatives"), self.passage_max_length))
        for name, inputs, (prompt, task), max_length in sides:
            for key, value in self._tokenize(inputs, prompt, task, max_length).items():
                batch[f"{name}_{key}"] = value
            if task is not None:
                batch[f"{name}_task"] = task
        batch["label"] = layout.pack()
        return batch


class EpochCallback(TrainerCallback):
    """Tells a :class:`MultiPositiveDataCollator` the epoch the trainer is about to run (``on_epoch_begin``; the
    trainer's ``state.epoch`` then holds the epochs completed, also after a resume from a checkpoint)."""

    def __init__(self, collator: MultiPositiveDataCollator):
        self.collator = collator

    def on_epoch_begin(self, args, state, control, **kwargs):
        """Set the collator's epoch to the number of epochs completed so far."""
        self.collator.set_epoch(math.floor((state.epoch or 0.0) + 1e-6))
