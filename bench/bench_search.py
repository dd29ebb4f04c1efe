"""FAISS search benchmark on synthetic embeddings. Run with ``make bench`` (after ``bench_speed.py``).

Measures, and appends to ``bench/results/search.jsonl`` (one JSON line per run, with machine info):
* index build time and top-1000 search time of 1,000 queries over 100k × 384 float32 unit vectors for
  the ``flat`` (exact), ``hnsw`` and ``ivf`` kinds of :func:`multipos.retrieval.dense.build_index` at their
  default parameters (search time = :func:`multipos.retrieval.dense.search_index` only, which searches HNSW with
  efSearch = max(128, k) = 1000 here);
* end-to-end :func:`multipos.retrieval.dense.search` time (build + search + merge + the {qid → {pid → score}}
  run) for ``flat`` in one index and in shards of 25k passages, and whether both runs are identical;
* recall@10 and recall@k of hnsw / ivf against flat (fraction of flat's top-k they return);
* the same passages written as memory-mapped shards (:func:`multipos.retrieval.shards.save_shards`, float32 and float16)
  and searched shard by shard (:func:`multipos.retrieval.shards.search_shards`): time, and whether the float32 run is
  identical to the single-index run (ids and scores), recall@k and the largest score change of float16.

The embeddings are clustered like real ones (uniform random 384-d vectors have no neighbourhood
structure, which would make the approximate indexes look far worse than on a corpus): 1,000 Gaussian
centres, passages = centre + noise, L2-normalised; queries = noisy copies of random passages.
Options: ``--n --dim --queries --k --shard-size --seed``; ``--quick`` (the default without CUDA) = 20k passages,
200 queries, k = 100, shards of 5k.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from common import append_result, machine_info

OUT = Path(__file__).resolve().parent / "results" / "search.jsonl"


def clustered(n: int, dim: int, n_queries: int, seed: int, clusters: int = 1000):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    p = centres[rng.integers(0, clusters, n)]
    p += 0.8 * rng.standard_normal((n, dim), dtype=np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    q = p[rng.integers(0, n, n_queries)] + 0.4 * rng.standard_normal((n_queries, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return np.ascontiguousarray(q), np.ascontiguousarray(p)


def recall(approx: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean fraction of each row's exact top-``k`` ids found in the approximate top-``k``."""
    return float(np.mean([len(set(a[:k].tolist()) & set(e[:k].tolist())) / k for a, e in zip(approx, exact)]))


def store_search(q, p, qids, pids, whole, args, res) -> None:
    """Shard folders (float32 and float16) searched shard by shard, against the single-index run ``whole``."""
    from multipos.retrieval.shards import ShardedEmbeddings, save_shards, search_shards

    num_shards = -(-args.n // args.shard_size)
    res["store_shards"] = num_shards
    for dtype in ("float32", "float16"):
        with tempfile.TemporaryDirectory(prefix="multipos-bench-shards-") as folder:
            start = time.perf_counter()
            save_shards(p, pids, folder, num_shards, dtype=dtype)
            res[f"store_{dtype}_write_s"] = round(time.perf_counter() - start, 2)
            start = time.perf_counter()
            run = search_shards(q, ShardedEmbeddings.open(folder), qids, k=args.k)
            res[f"store_{dtype}_search_s"] = round(time.perf_counter() - start, 2)
        if dtype == "float32":
            res["store_float32_identical"] = all(list(run[x].items()) == list(whole[x].items()) for x in qids)
        else:
            res[f"store_float16_recall@{args.k}"] = round(float(np.mean(
                [len(set(run[x]) & set(whole[x])) / len(whole[x]) for x in qids])), 4)
            res["store_float16_max_abs_score_diff"] = float(max(
                abs(run[x][d] - s) for x in qids for d, s in whole[x].items() if d in run[x]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action=argparse.BooleanOptionalAction, default=None,
                    help="20k passages, 200 queries, k=100 (default: quick without CUDA)")
    ap.add_argument("--n", type=int, default=None, help="passages (default 100,000; quick 20,000)")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=None, help="default 1,000; quick 200")
    ap.add_argument("--k", type=int, default=None, help="default 1,000; quick 100")
    ap.add_argument("--shard-size", type=int, default=None, help="default 25,000; quick 5,000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch

    quick = not torch.cuda.is_available() if args.quick is None else args.quick
    for name, full, small in (("n", 100_000, 20_000), ("queries", 1000, 200), ("k", 1000, 100),
                              ("shard_size", 25_000, 5_000)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)

    import faiss

    from multipos.retrieval.dense import build_index, default_nlist, gpu_available, search, search_index

    res = {**machine_info(), "bench": "search", "size": "quick" if quick else "full",
           "faiss": faiss.__version__, "faiss_threads": faiss.omp_get_max_threads(), "numpy": np.__version__,
           "gpu": gpu_available(), "n": args.n, "dim": args.dim, "queries": args.queries, "k": args.k,
           "data": "clustered-1000-unit", "hnsw_m": 32, "ef_construction": 200, "ef_search": max(128, args.k),
           "ivf_nlist": default_nlist(args.n), "ivf_nprobe": 32, "shard_size": args.shard_size}
    q, p = clustered(args.n, args.dim, args.queries, args.seed)
    ids = {}
    for kind in ("flat", "hnsw", "ivf"):
        start = time.perf_counter()
        index = build_index(p, kind)
        res[f"{kind}_build_s"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        _, ids[kind] = search_index(index, q, args.k)
        res[f"{kind}_search_s"] = round(time.perf_counter() - start, 2)
        del index
        print(kind, res[f"{kind}_build_s"], res[f"{kind}_search_s"], flush=True)
    for kind in ("hnsw", "ivf"):
        res[f"{kind}_recall@10"] = round(recall(ids[kind], ids["flat"], 10), 4)
        res[f"{kind}_recall@{args.k}"] = round(recall(ids[kind], ids["flat"], args.k), 4)

    qids, pids = [f"q{i}" for i in range(args.queries)], [f"p{i}" for i in range(args.n)]
    start = time.perf_counter()
    whole = search(q, p, qids, pids, k=args.k)
    res["flat_run_s"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    sharded = search(q, p, qids, pids, k=args.k, shard_size=args.shard_size)
    res["flat_sharded_run_s"] = round(time.perf_counter() - start, 2)
    res["flat_sharded_identical"] = all(list(sharded[x]) == list(whole[x]) for x in qids)
    res["flat_sharded_max_abs_score_diff"] = max(abs(sharded[x].get(d, float("inf")) - s)
                                                 for x in qids for d, s in whole[x].items())
    store_search(q, p, qids, pids, whole, args, res)

    append_result(OUT, res)


if __name__ == "__main__":
    main()
