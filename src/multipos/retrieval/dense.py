"""Retrieval runs: dense (FAISS over encoded passages) and BM25.

Index kinds (config key ``eval.index``): ``flat`` (exact, the default), ``hnsw`` and ``ivf`` (approximate,
for large corpora). Corpora too big for one index (21M × 768 float32 = 64 GB) are searched in shards
(``search(..., shard_size=...)``) from a memory-mapped embedding cache
(:func:`multipos.retrieval.encoding.cached_encode`); shards written by several processes:
:mod:`multipos.retrieval.shards`. Encoding itself: :mod:`multipos.retrieval.encoding`.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from multipos.formats.types import BeirDataset, Run
from multipos.retrieval.topk import merge_topk

log = logging.getLogger(__name__)

#: FAISS index kinds accepted by :func:`build_index` / :func:`search` (``eval.index``).
INDEX_KINDS = ("flat", "hnsw", "ivf")
#: Rows copied to contiguous float32 and added to an index at a time (bounds the extra memory of a
#: memmap or non-float32 input to 256k × H × 4 bytes: 768 MB at H = 768).
ADD_CHUNK = 1 << 18
_GPU_HINT = ("install a CUDA build of faiss (pip install faiss-gpu-cu12, i.e. multipos[gpu]; or conda install "
             "-c pytorch faiss-gpu) and a CUDA torch, or pass use_gpu='auto'/False")


def gpu_available() -> bool:
    """True when faiss was built with GPU support and sees a GPU *and* ``torch.cuda.is_available()``."""
    import faiss

    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    if get_num_gpus is None:
        return False
    try:
        n = int(get_num_gpus())
    except RuntimeError:  # pragma: no cover - broken CUDA driver
        return False
    return n > 0 and torch.cuda.is_available()


def _want_gpu(kind: str, use_gpu) -> bool:
    """Resolve ``use_gpu`` ("auto" | True | False) for an index ``kind``; see :func:`build_index`."""
    if not (isinstance(use_gpu, bool) or use_gpu == "auto"):
        raise ValueError(f"use_gpu must be 'auto', True or False; got {use_gpu!r}")
    if use_gpu is False:
        return False
    available = gpu_available()
    if use_gpu is True and not available:
        raise RuntimeError(f"use_gpu=True but faiss has no usable GPU (faiss GPU count 0, no faiss GPU support, "
                           f"or torch.cuda.is_available() is False): {_GPU_HINT}")
    if kind == "hnsw":
        if available:
            (log.warning if use_gpu is True else log.info)("faiss has no GPU HNSW index: the hnsw index stays on CPU")
        return False
    return available


def _to_gpu(index):
    """``index`` (an empty CPU flat / IVF index) cloned onto all visible GPUs. Called by
    :func:`build_index` only when :func:`_want_gpu` says so (never for hnsw).

    Multiple GPUs hold replicas (each GPU the whole index, queries split between them): shard the corpus
    with ``search(..., shard_size=...)`` when it does not fit on one GPU.
    """
    import faiss

    log.info("moving the FAISS index to %d GPU(s)", faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index)


def default_nlist(n: int) -> int:
    """IVF list count for ``n`` passages: round(4·√n), at most n // 39 (FAISS warns below 39 training
    points per centroid), clamped to [1, n]. 100k → 1265, 8.84M (MS MARCO) → 11894, 21M (DPR Wikipedia) → 18337."""
    return max(1, min(round(4 * math.sqrt(n)), n // 39, n))


def _add(index, passage_emb: np.ndarray) -> None:
    """Add rows to ``index`` ADD_CHUNK at a time, each as contiguous float32 (memmaps are read lazily)."""
    for start in range(0, len(passage_emb), ADD_CHUNK):
        index.add(np.ascontiguousarray(passage_emb[start : start + ADD_CHUNK], dtype=np.float32))


def build_index(passage_emb: np.ndarray, kind: str = "flat", *, hnsw_m: int = 32, ef_construction: int = 200,
                ef_search: int = 128, nlist: int | None = None, nprobe: int = 32, use_gpu="auto"):
    """FAISS inner-product index over ``passage_emb`` [N, H] (any float dtype, array or memmap; rows are
    copied to float32 ADD_CHUNK at a time). Scores are raw inner products (cosine for normalised embeddings).

    Kinds (config key ``eval.index``):

    * ``flat``: IndexFlatIP, exact. Memory N·H·4 bytes.
    * ``hnsw``: IndexHNSWFlat (inner product), ``hnsw_m`` links per node, ``ef_construction`` build beam,
      ``ef_search`` search beam. FAISS does *not* widen the beam to k: a plain ``index.search`` returns at
      most ~ef_search useful hits (and -1 ids beyond); :func:`search_index` / :func:`search` search with
      max(ef_search, k). Memory ≈ N·(H·4 + hnsw_m·8) bytes. Always on CPU (FAISS has no GPU HNSW).
    * ``ivf``: IndexIVFFlat with an IndexFlatIP coarse quantizer (inner product), ``nlist`` k-means lists
      (None → :func:`default_nlist`; clamped to [1, N]) trained on at most 256·nlist passages drawn with a
      fixed seed (all of them for small corpora), searching ``nprobe`` lists (clamped to nlist).

    ``use_gpu``: ``"auto"`` moves flat/ivf indexes to all GPUs when :func:`gpu_available`; ``True`` requires
    a GPU (RuntimeError with an install hint otherwise); ``False`` stays on CPU. GPU search needs k ≤ 2048.

    Raises ValueError for an unknown kind, a non-2-D array, an empty corpus for ``ivf`` or a bad ``use_gpu``.
    """
    import faiss

    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown FAISS index kind {kind!r} (config key eval.index); "
                         f"allowed: {', '.join(INDEX_KINDS)}")
    if passage_emb.ndim != 2:
        raise ValueError(f"passage_emb must be 2-D [N, H]; got shape {passage_emb.shape}")
    n, dim = passage_emb.shape
    gpu = _want_gpu(kind, use_gpu)
    start = time.perf_counter()
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
        if gpu:
            index = _to_gpu(index)
        _add(index, passage_emb)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        _add(index, passage_emb)
    else:
        if n == 0:
            raise ValueError("an ivf index needs at least one passage to train on")
        lists = default_nlist(n) if nlist is None else min(max(1, int(nlist)), n)
        if nlist is not None and lists != nlist:
            log.warning("ivf: nlist=%d clamped to %d for %d passages", nlist, lists, n)
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        index.nprobe = max(1, min(int(nprobe), lists))  # copied by the GPU cloner
        if gpu:
            index = _to_gpu(index)  # untrained: k-means then runs on the GPU
        n_train = min(n, 256 * lists)
        if n_train < n:
            rows = np.sort(np.random.default_rng(0).choice(n, size=n_train, replace=False))
            train = np.ascontiguousarray(passage_emb[rows], dtype=np.float32)
        else:
            train = np.ascontiguousarray(passage_emb, dtype=np.float32)
        index.train(train)
        del train
        _add(index, passage_emb)
    log.info("built %s FAISS index over %d × %d passages%s in %.1fs", kind, n, dim, " on GPU" if gpu else "",
             time.perf_counter() - start)
    return index


def search_index(index, query_emb: np.ndarray, k: int, query_batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Search a :func:`build_index` index → (scores float32 [Q, k], row ids int64 [Q, k]), best first per
    row; missing hits have id -1. Queries go ``query_batch_size`` at a time; an HNSW index is searched with
    efSearch = max(its efSearch, k) (FAISS would otherwise return at most ~efSearch good hits)."""
    import faiss

    queries = np.ascontiguousarray(query_emb, dtype=np.float32)
    params = None
    if hasattr(index, "hnsw"):
        params = faiss.SearchParametersHNSW(efSearch=max(index.hnsw.efSearch, k))
    parts = [index.search(queries[q : q + query_batch_size], k, params=params)
             for q in range(0, len(queries), query_batch_size)]
    if not parts:
        return np.empty((0, k), dtype=np.float32), np.empty((0, k), dtype=np.int64)
    return np.concatenate([d for d, _ in parts]), np.concatenate([i for _, i in parts])


def shard_topk(index, queries: np.ndarray, k: int, size: int, query_batch_size: int = 4096):
    """Tie-complete top-``k`` of one exact (flat) index over ``size`` rows → (scores [Q, k'], local rows [Q, k']).

    FAISS picks arbitrarily among passages tied at its k-th score. Searching k + 1 tells whether a tie
    straddles the cut; while one does for some query, the search is repeated with k doubled, until every
    query's last hit scores below its k-th (or the shard is exhausted). Every passage scoring at least the
    k-th score is then present, which makes :func:`multipos.retrieval.topk.merge_topk` over shards exact.
    """
    want = min(k, size)
    depth = min(want + 1, size)
    while True:
        d, i = search_index(index, queries, depth, query_batch_size)
        if depth >= size or want == 0 or not np.any(d[:, -1] >= d[:, want - 1]):
            return d, i
        depth = min(2 * depth, size)


def index_topk(emb: np.ndarray, queries: np.ndarray, k: int, index_kind: str = "flat", query_batch_size: int = 4096,
               **index_kw) -> tuple[np.ndarray, np.ndarray]:
    """Index ``emb`` [n, dim] (:func:`build_index`) and search ``queries`` [Q, dim] float32 →
    (scores [Q, k'], rows of ``emb`` [Q, k']). ``flat``: tie-complete (:func:`shard_topk`); ``hnsw`` / ``ivf``:
    the index's own approximate top-k. An empty ``emb`` gives k' = 0."""
    if len(emb) == 0:
        return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
    index = build_index(emb, index_kind, **index_kw)
    if index_kind == "flat":
        return shard_topk(index, queries, k, len(emb), query_batch_size)
    return search_index(index, queries, min(k, len(emb)), query_batch_size)


def search(query_emb: np.ndarray, passage_emb: np.ndarray, query_ids: list[str], passage_ids: list[str],
           k: int = 1000, index_kind: str = "flat", shard_size: int | None = None, query_batch_size: int = 4096,
           **index_kw) -> Run:
    """Top-``k`` passages per query by inner product: {query id → {passage id → score}}, best first.

    ``query_emb`` [Q, H], ``passage_emb`` [N, H] (array or memmap, any float dtype); ``query_ids`` /
    ``passage_ids`` name their rows. Scores are Python floats; ``k > N`` returns all N passages (fewer
    when an approximate index finds fewer). ``index_kind`` and ``**index_kw`` (``hnsw_m``, ``nprobe``,
    ``use_gpu``, ...) go to :func:`build_index`.

    ``shard_size`` (passages per shard; None = one index): builds one index per contiguous shard, in
    turn, searches it and merges its top-k into the running global top-k, so peak memory is one shard's
    index (+ Q·k·12 bytes of results). Exact for ``flat`` (equal to the unsharded run, ties at the k-th
    score included: :func:`shard_topk`); for hnsw/ivf every shard is its own approximate
    index. Queries are searched ``query_batch_size`` at a time (:func:`search_index`; HNSW with efSearch ≥ k).
    Equal scores are ordered by passage row (:func:`multipos.retrieval.topk.merge_topk`). Shards written to disk by
    several processes: :mod:`multipos.retrieval.shards`. Raises ValueError on mismatched ids/rows or k < 1.
    """
    if len(query_ids) != len(query_emb) or len(passage_ids) != len(passage_emb):
        raise ValueError(f"{len(query_ids)} query ids for {len(query_emb)} query rows, "
                         f"{len(passage_ids)} passage ids for {len(passage_emb)} passage rows")
    if k < 1:
        raise ValueError(f"k must be ≥ 1; got {k}")
    if index_kind not in INDEX_KINDS:  # fail before any work
        raise ValueError(f"unknown FAISS index kind {index_kind!r} (config key eval.index); "
                         f"allowed: {', '.join(INDEX_KINDS)}")
    n = len(passage_ids)
    if n == 0 or len(query_ids) == 0:
        return {qid: {} for qid in query_ids}
    queries = np.ascontiguousarray(query_emb, dtype=np.float32)
    size = n if shard_size is None else int(shard_size)
    if size < 1:
        raise ValueError(f"shard_size must be ≥ 1; got {shard_size}")
    k_all = min(k, n)
    scores = np.empty((len(queries), 0), dtype=np.float32)
    ids = np.empty((len(queries), 0), dtype=np.int64)
    n_shards = math.ceil(n / size)
    bar = tqdm(range(0, n, size), desc="FAISS search over shards", unit="shard", disable=None if n_shards > 1 else True)
    for s, lo in enumerate(bar):  # progress bar on a terminal, for sharded (large) corpora
        hi = min(lo + size, n)
        if n_shards > 1:
            log.info("FAISS shard %d/%d: passages %d–%d", s + 1, n_shards, lo, hi)
        d, i = index_topk(passage_emb[lo:hi], queries, k, index_kind, query_batch_size, **index_kw)
        # best first; equal scores by corpus row, also at the k-th score (flat shards are tie-complete)
        scores, ids = merge_topk([scores, d], [ids, np.where(i >= 0, i + lo, -1)], k_all)
    scores, ids = scores.tolist(), ids.tolist()
    return {qid: {passage_ids[j]: s for j, s in zip(ids[r], scores[r]) if j >= 0} for r, qid in enumerate(query_ids)}


def dense_run(model, data: BeirDataset, k: int = 1000, batch_size: int = 64, bf16: bool | None = None,
              passage_max_length: int | None = None, cache: Path | None = None, index: str = "flat",
              index_options: dict | None = None, progress: bool = True, device="auto") -> Run:
    """Encode ``data``'s corpus and queries with ``model`` (a DualEncoder) and retrieve top-``k`` with FAISS.

    Corpus embeddings are cached under ``cache`` keyed by (weights, corpus, max length, pooling);
    ``cache=None`` always re-encodes. ``index`` / ``index_options`` go to :func:`multipos.retrieval.dense.search`
    (``eval.index``, ``eval.faiss``: HNSW/IVF parameters, GPU use, corpus shards). ``bf16`` / ``device``: as in
    :func:`multipos.retrieval.encoding.encode` (None = bf16 where native; ``"auto"`` = the GPU when there is one).
    """
    from multipos.retrieval.encoding import cached_encode, encode

    pids = data.corpus.ids
    kw = dict(kind="passage", max_length=passage_max_length, batch_size=batch_size, bf16=bf16, progress=progress,
              device=device)
    p_emb = cached_encode(model, pids, data.corpus.texts(pids), cache, tag=data.name or "corpus", **kw)
    qids = list(data.queries)
    q_emb = encode(model, [data.queries[q] for q in qids], kind="query", batch_size=batch_size, bf16=bf16,
                   progress=False, device=device)
    return search(q_emb, p_emb, qids, pids, k=k, index_kind=index, **(index_options or {}))
