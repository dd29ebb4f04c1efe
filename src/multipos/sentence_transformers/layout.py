"""The flattened batch layout that carries several positives per query from the data collator to the losses.

sentence-transformers' trainer hands a loss the tokenised columns and one ``label`` tensor. A multi-positive batch of
B queries is tokenised as two inputs::

    query     [B, Lq]   one row per query
    passages  [N, Lp]   N = Σ_i (P_i + H_i): query i's block is its P_i positives (utility order) then its H_i hard
                        negatives, blocks in query order

and the ``label`` tensor describes the blocks (:class:`GroupLayout`): the per-query counts P_i and H_i, each passage's
target weight for its own query, and the (query, passage) pairs that are neither positive nor negative — a copy, in
another query's block, of one of query i's positives (the same passage text). From it :meth:`GroupLayout.masks`
rebuilds exactly the ``positive_mask`` / ``negative_mask`` that :func:`multipos.data.groups.group_masks` builds for
multipos's own training batches (paper Sec. 4, "group construction": every in-batch passage is a negative of query i
except query i's positives, wherever they occur) and the target matrix of
:func:`multipos.data.groups.group_targets`, the inputs of :func:`multipos.losses.compute`.

The label is one float32 vector so that the trainer moves it to the device like any label::

    [B, N, K, P_1 … P_B, H_1 … H_B, w_1 … w_N, i_1, j_1, …, i_K, j_K]

K ignored pairs (i_k, j_k); w_j is passage j's weight for its own query (0 for a hard negative, NaN when the data
have no grades). Its size is O(B + N + K), not O(B · N): a GradCache batch of 4,096 queries carries a few hundred KB.
Counts and column indices are exact in float32 up to 2^24 (16.7M passages a batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GroupLayout"]

_HEADER = 3


@dataclass
class GroupLayout:
    """Where each query's positives and hard negatives sit among a batch's N passages (module docstring).

    Attributes:
        positives: int64 [B], P_i, positives of query i (≥ 1 in a valid batch).
        negatives: int64 [B], H_i, hard negatives of query i.
        weights: float32 [N], each passage's target weight for its own query (0 for hard negatives; NaN where the data
            carry no grades).
        ignored: int64 [K, 2], (query i, passage column j) pairs that are neither positive nor negative for query i.
    """

    positives: Tensor
    negatives: Tensor
    weights: Tensor
    ignored: Tensor

    @property
    def n_queries(self) -> int:
        """B."""
        return int(self.positives.shape[0])

    @property
    def n_passages(self) -> int:
        """N = Σ_i (P_i + H_i)."""
        return int(self.weights.shape[0])

    def pack(self) -> Tensor:
        """The layout as the float32 label vector of the module docstring, [3 + 2B + N + 2K]."""
        header = torch.tensor([self.n_queries, self.n_passages, self.ignored.shape[0]], dtype=torch.float32)
        parts = [header, self.positives.float(), self.negatives.float(), self.weights.float(),
                 self.ignored.float().flatten()]
        return torch.cat(parts)

    @classmethod
    def unpack(cls, label: Tensor | None, n_queries: int, n_passages: int, check: bool = True) -> "GroupLayout":
        """Read a label vector written by :meth:`pack` for a batch of ``n_queries`` (B, rows of the query embeddings)
        and ``n_passages`` (N, rows of the passage embeddings). The sizes come from the batch and the vector's length;
        ``check`` also compares them with the vector's header, which reads three values back to the host (a device
        sync on an accelerator: the losses check their first batch only).

        Raises ValueError when the label is missing or is not such a vector for this batch (the dataset was not
        collated by :class:`multipos.sentence_transformers.MultiPositiveDataCollator`).
        """
        hint = ("the multi-positive losses need batches from multipos.sentence_transformers.MultiPositiveDataCollator "
                "(pass data_collator=MultiPositiveDataCollator(model.preprocess, ...) to the trainer)")
        b, n = n_queries, n_passages
        size = 0 if label is None or label.dim() != 1 else label.numel()
        rest = size - _HEADER - 2 * b - n
        if size < _HEADER or rest < 0 or rest % 2:
            raise ValueError(f"no multi-positive layout of {b} queries and {n} passages in the batch's label: {hint}")
        k = rest // 2
        if check:
            header = tuple(int(v) for v in label[:_HEADER].tolist())
            if header != (b, n, k):
                raise ValueError(f"the batch's label describes {header[0]} queries and {header[1]} passages, the batch "
                                 f"holds {b} queries and {n} passages: {hint}")
        at = _HEADER
        positives, negatives = label[at: at + b].long(), label[at + b: at + 2 * b].long()
        at += 2 * b
        weights = label[at: at + n].float()
        ignored = label[at + n:].long().reshape(k, 2)
        return cls(positives, negatives, weights, ignored)

    def to(self, device) -> "GroupLayout":
        """The same layout with its tensors on ``device``."""
        return GroupLayout(self.positives.to(device), self.negatives.to(device), self.weights.to(device),
                           self.ignored.to(device))

    def columns(self) -> tuple[Tensor, Tensor]:
        """``(owner, position)``, int64 [N] each: the query whose block holds each passage column, and the column's
        place in that block (positives first: position < P_owner)."""
        device = self.weights.device
        sizes = self.positives + self.negatives
        offsets = torch.cumsum(sizes, 0) - sizes  # [B]: first column of each block
        owner = torch.repeat_interleave(torch.arange(self.n_queries, device=device), sizes,
                                        output_size=self.n_passages)
        return owner, torch.arange(self.n_passages, device=device) - offsets[owner]

    def positive_columns(self) -> Tensor:
        """bool [N]: whether each passage column is a positive of its own query."""
        owner, position = self.columns()
        return position < self.positives[owner]

    def masks(self, rows: slice | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(positive_mask, negative_mask, target)`` of queries ``rows`` (default all) over the N passage columns,
        on the layout's device: bool, bool and float32 [R, N].

        Query i's positives are the first P_i columns of its block; its negatives are every other column except the
        ignored pairs (the masks of :func:`multipos.data.groups.group_masks`); ``target[i, j]`` is w_j in query i's
        own block and 0 elsewhere (the weights of :func:`multipos.data.groups.group_targets`; the other columns a
        soft-target objective reads are masked out by the pool, so their value does not matter).
        """
        b, n = self.n_queries, self.n_passages
        start, stop, _ = (rows or slice(None)).indices(b)
        device = self.weights.device
        owner, position = self.columns()
        own = owner[None, :] == torch.arange(start, stop, device=device)[:, None]  # [R, N]
        positive_mask = own & (position < self.positives[owner])[None, :]
        # the ignored pairs of rows outside [start, stop) land in a spare last row that is dropped: no host sync
        negative_mask = torch.cat([~positive_mask, positive_mask.new_ones(1, n)])
        r = self.ignored[:, 0] - start
        r = torch.where((r >= 0) & (r < stop - start), r, torch.full_like(r, stop - start))
        negative_mask[r, self.ignored[:, 1]] = False
        negative_mask = negative_mask[: stop - start]
        target = torch.where(own, self.weights[None, :], torch.zeros((), device=device))
        return positive_mask, negative_mask, target
