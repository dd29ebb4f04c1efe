"""Collation: B training groups → one :class:`Batch` (tokenised queries and passages, the [B, B·G] masks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multipos.data.groups import Group, group_masks
from multipos.data.passage_tokens import PassageTokens
from multipos.model.encoder import ENCODER_INPUTS
from multipos.model.transfer import pinned, to_device


@dataclass
class Batch:
    """One training batch (B queries, G passages each).

    query: tokenizer output (:data:`multipos.model.encoder.ENCODER_INPUTS`), tensors [B, Lq]; passages: the same,
    [B·G, Lp], or None when the passages are looked up in a frozen passage index instead of encoded (query-side
    fine-tuning, :mod:`multipos.training.passage_index`);
    positive_mask / negative_mask: bool [B, B·G] (see :func:`multipos.data.groups.group_masks`);
    query_ids: [B]; passage_ids: [B·G], the id of each column; groups: the B groups (judged passages per query,
    for the masks over a global batch in data-parallel training, :mod:`multipos.training.distributed`, and for every
    corpus passage a candidate, :mod:`multipos.training.corpus_candidates`), or None where the training stage needs
    neither (:attr:`multipos.data.datamodule.StageInputs.batch_groups`).
    """

    query: dict[str, torch.Tensor]
    passages: dict[str, torch.Tensor] | None
    positive_mask: torch.Tensor
    negative_mask: torch.Tensor
    query_ids: list[str]
    passage_ids: list[str] = None
    groups: list[Group] | None = None

    def _map(self, fn) -> "Batch":
        """The same batch with ``fn`` applied to each token tensor and both masks (ids and groups as they are)."""
        tokens = lambda d: None if d is None else {k: fn(v) for k, v in d.items()}  # noqa: E731
        return Batch(tokens(self.query), tokens(self.passages), fn(self.positive_mask), fn(self.negative_mask),
                     self.query_ids, self.passage_ids, self.groups)

    def pin_memory(self) -> "Batch":
        """The same batch with its token tensors and masks in page-locked host memory: what a ``DataLoader`` with
        ``pin_memory=True`` calls, in its pin-memory thread, on each batch it receives from a worker (so the main
        process's :meth:`to` then copies them without pinning them itself: ``Tensor.pin_memory`` returns a pinned
        tensor as it is). Each copy is made by that thread alone (:func:`multipos.model.transfer.pinned`). Raises
        RuntimeError where no accelerator is available (PyTorch's pinned allocator)."""
        return self._map(pinned)

    def to(self, device) -> "Batch":
        """The same batch with its token tensors and masks on ``device`` (ids and groups stay Python objects); what
        Lightning calls to move a batch (:meth:`multipos.data.datamodule.MultiPosDataModule.transfer_batch_to_device`).
        To a CUDA device the copies are pinned and non-blocking (:func:`multipos.model.transfer.to_device`): the host
        does not wait for the previous step's kernels."""
        return self._map(lambda t: to_device(t, device))


@dataclass
class GroupCollator:
    """Groups → :class:`Batch`: queries tokenised to [B, Lq] (``query_prompt`` first, at most ``query_max_length``
    tokens), the B·G passages to [B·G, Lp] unless ``tokenize_passages`` is False (query-side fine-tuning looks them
    up by id), and the [B, B·G] positive / negative masks (:func:`multipos.data.groups.group_masks`). With
    ``passage_tokens`` the passages' token ids come from that store (tokenised once; the same tensors).
    ``keep_groups=False``: the batch leaves its groups behind (``Batch.groups`` None). A DataLoader worker sends every
    object a batch holds to the main process, and the main process rebuilds it: the groups of a B=64 × G=8 NFCorpus
    batch (their judged passages, about 40 ids a query) took the main process's time to receive the batch from 1.35 to
    1.9 ms (``bench/bench_batch_receive.py``, 2-core AMD EPYC, 2026-11-27). Only the
    inputs the encoders read are kept (:data:`multipos.model.encoder.ENCODER_INPUTS`): each tensor a batch carries costs
    the main process about 0.2 ms to receive from a DataLoader worker (2-core EPYC, 2026-11-26) and a copy to the GPU.

    A plain picklable object: the collate function DataLoader workers receive when they are spawned rather than
    forked (``forkserver`` is Python 3.14's default on Linux; Hydra's joblib launcher runs each job in such a
    process)."""

    tokenizer: object
    corpus: object
    query_prompt: str = ""
    passage_prompt: str = ""
    query_max_length: int = 32
    passage_max_length: int = 128
    tokenize_passages: bool = True
    passage_tokens: PassageTokens | None = None
    keep_groups: bool = True

    def __call__(self, groups: list[Group]) -> Batch:
        positive_mask, negative_mask = group_masks(groups)
        q = self.tokenizer([self.query_prompt + g.query for g in groups], padding=True, truncation=True,
                           max_length=self.query_max_length, return_tensors="pt")
        p = None
        if self.tokenize_passages and self.passage_tokens is not None:
            p = self.passage_tokens.batch([p for g in groups for p in g.passage_ids])
        elif self.tokenize_passages:
            texts = [self.passage_prompt + self.corpus[p].full_text() for g in groups for p in g.passage_ids]
            p = self.tokenizer(texts, padding=True, truncation=True, max_length=self.passage_max_length,
                               return_tensors="pt")
        inputs = lambda t: None if t is None else {k: t[k] for k in ENCODER_INPUTS}  # noqa: E731
        return Batch(inputs(q), inputs(p), positive_mask, negative_mask, [g.query_id for g in groups],
                     [p for g in groups for p in g.passage_ids], list(groups) if self.keep_groups else None)
