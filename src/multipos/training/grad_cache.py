"""GradCache: contrastive training with a large batch in the memory of a small one.

Gao, Zhang, Han, Callan (2021), "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup",
Sec. 3.2. The loss L(f(x_1), …, f(x_n)) depends on the parameters θ only through the embeddings f(x_j), so

    ∂L/∂θ = Σ_j (∂L/∂f(x_j)) · ∂f(x_j)/∂θ

is computed in three passes:

1. *graph-less forward*: every embedding, chunk by chunk under ``torch.no_grad`` (no activations kept), the
   random-number state recorded before each chunk;
2. *representation gradient*: the loss on detached copies of the embeddings (leaf tensors) and its gradient
   ``g_j = ∂L/∂f(x_j)`` with respect to them — the objectives see only scores and masks, so every objective of
   :mod:`multipos.losses` works unchanged, and with data-parallel training the all-gather of the cached passage
   embeddings (:mod:`multipos.training.distributed`) is part of this pass;
3. *chunked re-forward and backward*: each chunk encoded again with its random-number state restored (the same
   dropout masks as in pass 1), then ``backward(Σ_j ⟨f(x_j), g_j⟩)``, whose parameter gradient is that chunk's
   share of ∂L/∂θ. Gradients accumulate over chunks; only the last chunk's backward synchronises data-parallel
   gradients (the others run under ``no_sync``).

Peak activation memory is one chunk's forward instead of the whole batch's; the cost is one extra graph-less
forward pass. The parameter gradient equals that of one forward/backward over the whole batch with the same
dropout masks (tests/training/test_grad_cache.py).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import get_device_states, set_device_states

__all__ = ["ChunkRNG", "chunks", "cached_embeddings", "grad_cache_step"]

#: Tokenizer output: tensors [n, L] (``input_ids``, ``attention_mask``).
Tokens = dict[str, Tensor]
#: An encoder side: tokens [n, L] → embeddings [n, H] (``DualEncoder.encode_queries`` / ``encode_passages``).
Encoder = Callable[[Tokens], Tensor]


@dataclass
class ChunkRNG:
    """The CPU random-number state and that of each accelerator device the inputs live on."""

    cpu: Tensor
    devices: list[int]
    device_states: list[Tensor]

    @classmethod
    def capture(cls, tensors: Sequence[Tensor]) -> "ChunkRNG":
        """Record the state now (before a chunk's forward); ``tensors`` name the devices that matter."""
        devices, states = get_device_states(*tensors)
        return cls(torch.get_rng_state(), list(devices), list(states))

    @contextmanager
    def restored(self) -> Iterator[None]:
        """Run the block from the recorded state; the global state after the block is what it was before it
        (``torch.random.fork_rng``), so a re-forward draws no number from the training run's stream."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            set_device_states(self.devices, self.device_states)
            yield


def chunks(tokens: Tokens, chunk_size: int) -> list[Tokens]:
    """Split tokenizer output (tensors [N, L]) into row chunks of at most ``chunk_size``.

    Raises ValueError for ``chunk_size`` < 1 (``module.grad_cache_chunk_size``).
    """
    if chunk_size < 1:
        raise ValueError(f"module.grad_cache_chunk_size must be >= 1 (or null for no GradCache), got {chunk_size}")
    n = next(iter(tokens.values())).shape[0]
    return [{k: v[i: i + chunk_size] for k, v in tokens.items()} for i in range(0, n, chunk_size)]


def cached_embeddings(encode: Encoder, tokens: Tokens, chunk_size: int) -> tuple[Tensor, list[ChunkRNG]]:
    """Pass 1: embeddings [N, H] of all rows without an autograd graph, and the RNG state before each chunk."""
    out, states = [], []
    with torch.no_grad():
        for part in chunks(tokens, chunk_size):
            states.append(ChunkRNG.capture(list(part.values())))
            out.append(encode(part))
    return torch.cat(out), states


def grad_cache_step(parts: Sequence[tuple[Encoder, Tokens]], loss_fn: Callable[..., tuple[Tensor, object]],
                    chunk_size: int, backward: Callable[[Tensor], None] | None = None,
                    no_sync: Callable[[], object] = nullcontext) -> tuple[Tensor, object]:
    """One GradCache forward/backward (module docstring); parameter gradients are accumulated into ``.grad``.

    Args:
        parts: (encoder, tokens) per input side, e.g. ``[(encode_queries, query tokens [B, Lq]),
            (encode_passages, passage tokens [B·G, Lp])]``; each encoder maps tokens to embeddings [n, H].
        loss_fn: called with one embedding leaf tensor per part ([B, H], [B·G, H]) → (scalar loss, aux): the loss
            whose parameter gradient is wanted (including any scaling for data-parallel averaging), and anything
            the caller wants back (e.g. scores and masks). In training it is
            :meth:`multipos.training.module.RetrieverModule.scores_loss` of the passage side's scores, the same
            scores-to-loss step as without GradCache.
        chunk_size: rows per re-forward chunk (``module.grad_cache_chunk_size``).
        backward: runs the backward of a chunk's surrogate (default ``Tensor.backward``; in Lightning
            ``LightningModule.manual_backward``, which applies precision scaling and DDP's gradient sync).
        no_sync: context manager factory under which every chunk's backward but the last runs (DDP's
            ``no_sync`` / Lightning's ``strategy.block_backward_sync``), so gradients are synchronised once.

    Returns:
        (loss detached, aux from ``loss_fn``).

    Raises:
        ValueError: ``chunk_size`` < 1.
    """
    backward = backward or Tensor.backward
    cached = [(encode, tokens, *cached_embeddings(encode, tokens, chunk_size)) for encode, tokens in parts]
    leaves = [emb.detach().requires_grad_() for _, _, emb, _ in cached]
    with torch.enable_grad():
        loss, aux = loss_fn(*leaves)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    jobs = []
    for (encode, tokens, _, states), leaf, grad in zip(cached, leaves, grads):
        grad = torch.zeros_like(leaf) if grad is None else grad
        start = 0
        for part, state in zip(chunks(tokens, chunk_size), states):
            n = next(iter(part.values())).shape[0]
            jobs.append((encode, part, state, grad[start: start + n]))
            start += n
    for k, (encode, part, state, grad) in enumerate(jobs):
        with (nullcontext() if k == len(jobs) - 1 else no_sync()):
            with state.restored():
                emb = encode(part)
            backward((emb.float() * grad.float()).sum())
    return loss.detach(), aux
