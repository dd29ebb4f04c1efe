"""Length buckets: a training batch encoded in a few length-sorted parts, each padded only to its own longest text.

A padded batch costs the encoder B × L_max tokens; NFCorpus queries average 7 tokens and a batch of 64 pads to about
19, so 2.6 times the real tokens go through every layer. Sorted by length and cut into k parts, the batch costs
Σ_parts |part| × L_max(part) (1.35 times the real tokens for k = 4 at B = 64). The embeddings are the same function
of each text (attention masks hide padding; pooling reads only attended positions), so the loss and its gradients
equal the padded batch's up to floating-point summation order — as a change of thread count would. Measured on the
2-core AMD EPYC (2026-11-26, all-MiniLM-L6-v2 forward + backward, fp32): 1.3–1.5x at B = 64, 1.65x at B = 128, none
at B = 32 and a loss below (parts of fewer than 16 texts run below the matrix kernels' efficient size), hence
:data:`MIN_ROWS`; a whole query-side step over every corpus passage at B = 64: 1.34–1.41x (bench/bench_query_side.py).
On an accelerator one padded batch is cheaper than several kernel launches: buckets apply on the CPU only. Config: ``length_buckets`` (conf/train.yaml; a speed setting that names no run, like ``threads``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

#: Fewest texts in one part: smaller parts cost more than the padding they save (measured, see the module docstring).
MIN_ROWS = 16


def check_length_buckets(buckets) -> int:
    """``buckets`` (config ``length_buckets``; None = 1) as an int; raises ValueError unless a whole number >= 1."""
    if buckets is None:
        return 1
    if isinstance(buckets, bool) or not isinstance(buckets, (int, float)) or int(buckets) != buckets or buckets < 1:
        raise ValueError(f"length_buckets: a whole number >= 1, got {buckets!r}")
    return int(buckets)


def bucket_count(buckets: int, rows: int, device: torch.device) -> int:
    """Parts to encode ``rows`` texts in: at most ``buckets``, each of at least :data:`MIN_ROWS` texts, and 1 off the
    CPU. Raises ValueError for ``buckets`` below 1 (:func:`check_length_buckets`)."""
    buckets = check_length_buckets(buckets)
    if device.type != "cpu":
        return 1
    return max(1, min(int(buckets), rows // MIN_ROWS))


def embed_in_length_buckets(embed: Callable[[dict[str, Tensor]], Tensor], tokens: dict[str, Tensor],
                            buckets: int) -> Tensor:
    """``embed(tokens)`` [B, H] computed on up to ``buckets`` length-sorted parts of the batch (:func:`bucket_count`).

    ``tokens``: tokenizer output, ``input_ids`` and ``attention_mask`` [B, L] (other keys of the same shape are cut
    alike), padded on the right. A batch padded otherwise is encoded whole: on the left, cutting columns would move
    every text's absolute positions (a decoder embedder's last-token pooling pads there). Rows come back in the input
    order; autograd flows through every part.
    """
    mask = tokens["attention_mask"]
    parts = bucket_count(buckets, mask.shape[0], mask.device)
    if parts == 1 or not bool(mask[:, 0].all()):
        return embed(tokens)
    lengths = mask.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    out = []
    for rows in order.chunk(parts):
        width = int(lengths[rows].max())
        out.append(embed({k: v[rows, :width] for k, v in tokens.items()}))
    return torch.cat(out)[torch.argsort(order)]
