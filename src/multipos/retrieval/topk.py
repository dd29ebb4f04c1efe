"""Exact top-k over a corpus split into contiguous shards: the merge whose result does not depend on the split
(used by :func:`multipos.retrieval.dense.search` and :mod:`multipos.retrieval.shards`; the tie-complete per-shard
FAISS search is :func:`multipos.retrieval.dense.shard_topk`).

Order: score descending, then corpus row ascending — a total order, so the global top-k under it is unique.
FAISS chooses arbitrarily among passages tied at its k-th score (and differently for different index
contents), so each flat shard is searched until it is *tie-complete* (:func:`multipos.retrieval.dense.shard_topk`):
every passage scoring at least the shard's k-th score is among its candidates. Any passage of the global top-k is then a
candidate of its shard (at most k − 1 passages of that shard precede it), and :func:`merge_topk` of all
candidates is exact.
"""

from __future__ import annotations

import numpy as np


def merge_topk(scores: list[np.ndarray], rows: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge candidate sets [Q, k_i] (float32 scores, int64 corpus rows; row −1 = no hit) → the best ``k`` per
    query, [Q, k], ordered by score descending, then corpus row ascending (a total order: the result does not
    depend on how candidates were split). Missing hits come last with row −1 and score −inf."""
    d = np.concatenate([np.where(r < 0, -np.inf, s).astype(np.float32) for s, r in zip(scores, rows)], axis=1)
    i = np.concatenate(rows, axis=1).astype(np.int64)
    order = np.lexsort((np.where(i < 0, np.iinfo(np.int64).max, i), -d), axis=-1)[:, :k]
    return np.take_along_axis(d, order, axis=1), np.take_along_axis(i, order, axis=1)
