"""Word-embedding gradients without a fresh dense matrix every step (CPU training).

The backward of a dense ``nn.Embedding`` builds a new zero matrix of the vocabulary's size and adds the rows the
batch looked up into it: for all-MiniLM-L6-v2 a 30,522 × 384 float32 matrix (47 MB) every step, although a
query-side batch of 16 short queries touches about 100 rows. On the 2-core CPU, filling that freshly allocated
matrix (page faults included) took 16.8 ms of a 150 ms query-side step (one thread, B=16, G=16, packed;
``torch.profiler``, 2026-11-26).

:class:`RowSparseEmbeddingGrads` makes the embedding produce a sparse (row-list) gradient instead and writes it
into one dense buffer kept across steps, zeroing only the rows the previous step wrote. ``param.grad`` is then the
same dense matrix as before: the same values in the same summation order (rows added in input order, as the dense
backward does), so clipping, AdamW and every gradient statistic see exactly what they saw, at the cost of the
touched rows instead of the whole vocabulary. Applied to the trained encoders of a CPU training run in one process
(:meth:`multipos.training.module.RetrieverModule.on_fit_start`); DDP and accelerators keep the dense backward.
"""

from __future__ import annotations

import torch
from torch import nn


class RowSparseEmbeddingGrads:
    """The input embeddings of ``encoders`` (Hugging Face models, ``get_input_embeddings()``) with row-sparse
    backward and one persistent dense gradient buffer each; :meth:`remove` restores the dense backward.

    Exactness: for an embedding looked up once per backward the gradient is bit-identical to the dense backward
    (tests/training/test_embedding_gradients.py). Several backward passes into one gradient (GradCache chunks) or
    ``zero_grad(set_to_none=False)``: autograd adds the later sparse gradients into the dense buffer in place, row
    by row (the dense backward adds whole matrices), so the sum is the same up to float rounding (about 1e-6
    relative); the buffer is then zeroed whole at the next step (the rows it holds are no longer known).
    An encoder whose input embeddings do not train (LoRA, a frozen passage encoder) is left as it is; one encoder
    object given twice is handled once.

    Raises:
        TypeError: an encoder whose input embeddings are not an ``nn.Embedding`` without ``max_norm``.
    """

    def __init__(self, encoders: list[nn.Module]):
        self._slots: list[_Slot] = []
        seen: set[int] = set()
        for encoder in encoders:
            embedding = encoder.get_input_embeddings()
            if id(embedding) in seen or not embedding.weight.requires_grad:
                continue
            if not isinstance(embedding, nn.Embedding) or embedding.max_norm is not None:
                raise TypeError(f"row-sparse embedding gradients need an nn.Embedding without max_norm; "
                                f"got {type(embedding).__name__}")
            seen.add(id(embedding))
            self._slots.append(_Slot(embedding))

    def __len__(self) -> int:
        return len(self._slots)

    def remove(self) -> None:
        """Back to the dense backward: hooks removed, ``sparse`` reset, buffers released (a gradient that is one
        of them stays the parameter's ``.grad``)."""
        for slot in self._slots:
            slot.remove()
        self._slots = []


class _Slot:
    """One embedding: its hook, its buffer [V, H] and the rows the buffer may hold non-zero (None = unknown)."""

    def __init__(self, embedding: nn.Embedding):
        self.embedding, self.was_sparse = embedding, embedding.sparse
        self.buffer: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        embedding.sparse = True
        self.handle = embedding.weight.register_post_accumulate_grad_hook(self._densify)

    def _densify(self, weight: torch.Tensor) -> None:
        grad = weight.grad
        if not grad.is_sparse:  # a later backward added into the buffer in place: its rows are unknown
            self.rows = None
            return
        if self.buffer is None or self.buffer.device != weight.device:
            self.buffer = torch.zeros_like(weight, memory_format=torch.contiguous_format)
        elif self.rows is None:
            self.buffer.zero_()
        else:
            self.buffer.index_fill_(0, self.rows, 0.0)
        rows = grad._indices()[0]  # uncoalesced: every looked-up position, in input order
        self.buffer.index_add_(0, rows, grad._values())
        self.rows = rows.unique()
        weight.grad = self.buffer

    def remove(self) -> None:
        """Back to the dense embedding backward: the hook removed, the embedding's ``sparse`` flag restored, the kept
        buffer released."""
        self.handle.remove()
        self.embedding.sparse = self.was_sparse
        self.buffer, self.rows = None, None
