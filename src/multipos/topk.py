"""Exact top-k over a corpus split into contiguous shards: tie-complete per-shard FAISS search and a merge whose
result does not depend on the split (used by :func:`multipos.retrieval.search` and :mod:`multipos.shards`).

Order: score descending, then corpus row ascending — a total order, so the global top-k under it is unique.
FAISS chooses arbitrarily among passages tied at its k-th score (and differently for different index
contents), so each flat shard is searched until it is *tie-complete* (:func:`shard_topk`): every passage
scoring at least the shard's k-th score is among its candidates. Any passage of the global top-k is then a
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


def shard_topk(index, queries: np.ndarray, k: int, size: int, query_batch_size: int = 4096):
    """Tie-complete top-``k`` of one exact (flat) index over ``size`` rows → (scores [Q, k'], local rows [Q, k']).

    FAISS picks arbitrarily among passages tied at its k-th score. Searching k + 1 tells whether a tie
    straddles the cut; while one does for some query, the search is repeated with k doubled, until every
    query's last hit scores below its k-th (or the shard is exhausted). Every passage scoring at least the
    k-th score is then present, which makes :func:`merge_topk` over shards exact.
    """
    from multipos.retrieval import search_index

    want = min(k, size)
    depth = min(want + 1, size)
    while True:
        d, i = search_index(index, queries, depth, query_batch_size)
        if depth >= size or want == 0 or not np.any(d[:, -1] >= d[:, want - 1]):
            return d, i
        depth = min(2 * depth, size)


def index_topk(emb: np.ndarray, queries: np.ndarray, k: int, index_kind: str = "flat", query_batch_size: int = 4096,
               **index_kw) -> tuple[np.ndarray, np.ndarray]:
    """Index ``emb`` [n, dim] (:func:`multipos.retrieval.build_index`) and search ``queries`` [Q, dim] float32 →
    (scores [Q, k'], rows of ``emb`` [Q, k']). ``flat``: tie-complete (:func:`shard_topk`); ``hnsw`` / ``ivf``:
    the index's own approximate top-k. An empty ``emb`` gives k' = 0."""
    from multipos.retrieval import build_index, search_index

    if len(emb) == 0:
        return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
    index = build_index(emb, index_kind, **index_kw)
    if index_kind == "flat":
        return shard_topk(index, queries, k, len(emb), query_batch_size)
    return search_index(index, queries, min(k, len(emb)), query_batch_size)
