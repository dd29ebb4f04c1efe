"""LightningDataModule: training groups → tokenised batches with positive/negative masks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from multipos.groups import REGIMES, Group, GroupBuilder, TrainQuery, group_masks

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One training batch (B queries, G passages each).

    query: tokenizer output, tensors [B, Lq]; passages: tokenizer output, [B·G, Lp];
    positive_mask / negative_mask: bool [B, B·G] (see :func:`multipos.groups.group_masks`).
    """

    query: dict[str, torch.Tensor]
    passages: dict[str, torch.Tensor]
    positive_mask: torch.Tensor
    negative_mask: torch.Tensor
    query_ids: list[str]

    def to(self, device) -> "Batch":
        mv = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
        return Batch(mv(self.query), mv(self.passages), self.positive_mask.to(device), self.negative_mask.to(device), self.query_ids)


class GroupDataset(Dataset):
    """Map-style dataset of training groups; ``set_epoch`` re-draws random choices (Rand1LH, random-M)."""

    def __init__(self, queries: list[TrainQuery], regime: str, builder: GroupBuilder, fallback_ids: list[str]):
        self.items = [(q, q.positives(regime)) for q in queries]
        self.items = [(q, pos) for q, pos in self.items if pos]
        self.builder, self.fallback_ids, self.epoch = builder, fallback_ids, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Group:
        q, pos = self.items[i]
        return self.builder.build(q, pos, self.epoch, self.fallback_ids)


class MultiPosDataModule(L.LightningDataModule):
    """Training data for multi-positive contrastive learning.

    Args:
        source: object with ``load() -> (Corpus, list[TrainQuery])`` (see :mod:`multipos.sources`).
        name: label used in run names.
        tokenizer: HF checkpoint name/path whose tokenizer is used (normally ``${model.name_or_path}``).
        regime: ``homogeneous`` | ``heterogeneous`` | ``gold`` | ``all`` | ``curriculum`` (the last
            is run by :mod:`multipos.train` as a homogeneous stage then a gold SingleLH stage).
        group_size: G; max_positives: M; positive_selection: ``first`` | ``random``;
        negative_selection: ``first`` | ``random`` (hard negatives per epoch).
        batch_size: queries per batch (B); query_max_length, passage_max_length: tokens.
        curriculum: {silver_epochs, gold_epochs} for ``regime=curriculum``.
        seed: seed for group construction and shuffling; num_workers: DataLoader workers.

    Raises:
        ValueError: unknown regime, impossible G/M, or no training query left under the regime.
    """

    def __init__(self, source, tokenizer: str, name: str = "", regime: str = "heterogeneous", group_size: int = 8,
                 max_positives: int = 4, positive_selection: str = "first", negative_selection: str = "random",
                 batch_size: int = 16, query_max_length: int = 32, passage_max_length: int = 128,
                 curriculum: dict | None = None, seed: int = 0, num_workers: int = 0):
        super().__init__()
        if regime not in (*REGIMES, "curriculum"):
            raise ValueError(f"unknown data.regime {regime!r}; allowed: {', '.join((*REGIMES, 'curriculum'))}")
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        self.source, self.tokenizer_name, self.regime, self.name = source, tokenizer, regime, name
        self.stage_regime = "homogeneous" if regime == "curriculum" else regime
        self.curriculum = dict(curriculum or {"silver_epochs": 1, "gold_epochs": 1})
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.query_max_length, self.passage_max_length = query_max_length, passage_max_length
        self.single_positive: str | None = None
        self.builder_args = dict(group_size=group_size, max_positives=max_positives,
                                 positive_selection=positive_selection, negative_selection=negative_selection)
        GroupBuilder(**self.builder_args)  # validate G/M and selection names now, not at the first batch
        self.corpus = None
        self.queries: list[TrainQuery] = []
        self._tokenizer = None
        self.dataset: GroupDataset | None = None

    def set_stage(self, regime: str, single_positive: str | None) -> None:
        """Select the positive regime and the single-positive rule (from the objective) for the next fit."""
        self.stage_regime, self.single_positive = regime, single_positive
        self.dataset = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from multipos.assets import resolve_model

            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.tokenizer_name))
        return self._tokenizer

    def setup(self, stage: str | None = None) -> None:
        if self.corpus is None:
            self.corpus, self.queries = self.source.load()
        if self.dataset is None:
            builder = GroupBuilder(**self.builder_args, single_positive=self.single_positive,
                                   pin_first=self.stage_regime == "heterogeneous", seed=self.seed)
            self.dataset = GroupDataset(self.queries, self.stage_regime, builder, self.corpus.ids)
            if len(self.dataset) == 0:
                raise ValueError(f"no training query has a positive under data.regime={self.stage_regime!r}")
            log.info("regime %s: %d of %d training queries", self.stage_regime, len(self.dataset), len(self.queries))

    def collate(self, groups: list[Group]) -> Batch:
        """Tokenise a list of groups and build the [B, B·G] masks."""
        positive_mask, negative_mask = group_masks(groups)
        q = self.tokenizer([g.query for g in groups], padding=True, truncation=True,
                           max_length=self.query_max_length, return_tensors="pt")
        texts = [self.corpus[p].full_text() for g in groups for p in g.passage_ids]
        p = self.tokenizer(texts, padding=True, truncation=True, max_length=self.passage_max_length, return_tensors="pt")
        return Batch(dict(q), dict(p), positive_mask, negative_mask, [g.query_id for g in groups])

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, Batch) else super().transfer_batch_to_device(batch, device, dataloader_idx)

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        self.dataset.set_epoch(epoch)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True, drop_last=len(self.dataset) >= self.batch_size,
                          collate_fn=self.collate, num_workers=self.num_workers, generator=generator)
