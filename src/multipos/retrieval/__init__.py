"""Encoding and search: query / passage encoding with the embedding cache, dense runs with FAISS, BM25 runs (bm25s),
the exact top-k merge across index shards, and sharded corpus encoding on disk (one process per GPU).

* :mod:`~multipos.retrieval.encoding` — ``encode``, ``cached_encode`` (length-sorted, on the trainer's device);
* :mod:`~multipos.retrieval.dense` — ``dense_run``, ``build_index`` (flat / HNSW / IVF);
* :mod:`~multipos.retrieval.bm25` — ``bm25_run``;
* :mod:`~multipos.retrieval.topk` — ``merge_topk``;
* :mod:`~multipos.retrieval.shards` — on-disk corpus shards (the job that runs them: ``python -m multipos.shard_job``).
"""
