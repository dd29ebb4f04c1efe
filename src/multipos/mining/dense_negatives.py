"""Dense hard negatives: mined with a dual encoder and FAISS, cached, and refreshed during training (ANCE).

* :func:`mine_dense_negatives` — each query's top passages under a dense model minus every judged passage
  (the rule of the BM25 miner: :func:`multipos.data.groups.unjudged_negatives`), cached by the model's weights
  and the corpus.
* :func:`mine_with_checkpoint` — the same with a checkpoint loaded by name (``data.source.negatives: dense``,
  by default the starting checkpoint ``${model.name_or_path}``).
* :class:`multipos.training.callbacks.NegativeRefresh` — re-mines with the weights being trained every
  ``data.source.negative_refresh_epochs`` epochs and hands the new pools to the data module, as ANCE does (Xiong et
  al., 2021, "Approximate Nearest Neighbor Negative Contrastive Learning for Dense Text Retrieval", ICLR); ANCE
  refreshes asynchronously every few thousand steps from a separate inference job, here the refresh is synchronous,
  at epoch ends.

Resume: the pools in use are part of the callback's checkpoint state (corpus row indices, int32), so a run
resumed from any checkpoint, mid-epoch included, trains on the pools the uninterrupted run had, whether or not
the cache still holds them (the weights that mined them are not in a later checkpoint, so they could not be
recomputed from it).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
import zipfile
from typing import Iterable

import numpy as np

from multipos import atomic
from multipos.assets import cache_dir
from multipos.formats.types import Corpus, unjudged_negatives

log = logging.getLogger(__name__)

#: Queries searched at a time; each chunk asks FAISS for the largest depth + |judged| of its queries.
QUERY_CHUNK = 4096


def query_digest(query_ids: list[str], queries: dict[str, str], judged: dict[str, set[str]]) -> str:
    """16 hex digits of sha1 over each query's id, text and sorted judged passages, in ``query_ids`` order."""
    h = hashlib.sha1()
    for q in query_ids:
        h.update(json.dumps([q, queries[q], sorted(judged.get(q, ()))]).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def pools_to_rows(pools: dict[str, list[str]], query_ids: list[str], corpus_ids: list[str]) -> np.ndarray:
    """Negative pools → int32 corpus rows [len(query_ids), longest pool], best first, padded with -1.

    Raises KeyError naming a pooled passage id that is not in ``corpus_ids``."""
    row = {p: i for i, p in enumerate(corpus_ids)}
    width = max((len(pools.get(q, ())) for q in query_ids), default=0)
    out = np.full((len(query_ids), width), -1, dtype=np.int32)
    for r, q in enumerate(query_ids):
        pool = pools.get(q, ())
        try:
            out[r, : len(pool)] = [row[p] for p in pool]
        except KeyError as e:
            raise KeyError(f"negative pool of query {q!r} names passage {e.args[0]!r}, which is not in the "
                           "corpus") from None
    return out


def pools_from_rows(query_ids: Iterable[str], rows: np.ndarray, corpus_ids: list[str]) -> dict[str, list[str]]:
    """Inverse of :func:`pools_to_rows`: {query id → passage ids} (the -1 padding dropped)."""
    return {q: [corpus_ids[j] for j in r if j >= 0] for q, r in zip(query_ids, np.asarray(rows).tolist())}


def _load_cached(path, query_ids: list[str], corpus_ids: list[str]) -> dict[str, list[str]] | None:
    """The pools in cache file ``path``, or None when it is missing, damaged or for other queries."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            cached_ids, rows = f["query_ids"].tolist(), f["rows"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        log.warning("dense negative cache %s unreadable (%s): mining again", path, e)
        return None
    if cached_ids != query_ids or (rows.size and rows.max() >= len(corpus_ids)):
        log.warning("dense negative cache %s holds other queries or rows: mining again", path)
        return None
    log.info("dense negatives: cache hit %s", path)
    return pools_from_rows(query_ids, rows, corpus_ids)


def mine_dense_negatives(model, corpus: Corpus, queries: dict[str, str], judged: dict[str, set[str]], depth: int, *,
                         batch_size: int = 64, bf16: bool | None = None, device="auto", index: str = "flat",
                         index_options: dict | None = None, embedding_cache=None, cache: bool = True,
                         progress: bool = True, negative_filter=None, positives: dict[str, list[str]] | None = None,
                         filter_counts: dict | None = None) -> dict[str, list[str]]:
    """Dense hard negatives: for each query, its ``depth`` best-scoring passages under ``model`` (inner product of
    :func:`multipos.retrieval.encoding.encode` embeddings, FAISS ``index`` over the whole corpus) that are not judged
    for it (any grade, 0 included: :func:`multipos.data.groups.unjudged_negatives`).

    Args:
        model: a :class:`~multipos.model.encoder.DualEncoder` (its query and passage encoders, pooling, normalisation
        and
            max lengths are used; left in the mode it was in).
        corpus: the passages searched ([N] passages, encoded with ``model.passage_max_length`` tokens).
        queries: {query id → text}; judged: {query id → judged passage ids}, excluded from its negatives.
        depth: negatives kept per query (≥ 1); fewer only when the corpus runs out of unjudged passages.
        batch_size, bf16 (None = where native), device: encoding, see :func:`multipos.retrieval.encoding.encode`
            (``device=None`` encodes where the model is: the refresh during training).
        index, index_options: :func:`multipos.retrieval.dense.build_index` kind and options (``flat`` = exact top-k).
        embedding_cache: folder for :func:`multipos.retrieval.encoding.cached_encode` (None = passages not cached).
        cache: keep the pools in ``<cache>/negatives/dense-<key>.npz`` (written atomically), keyed by the weights
            (:meth:`DualEncoder.fingerprint` of both encoders, pooling and normalisation), the corpus
            (:func:`multipos.retrieval.encoding.corpus_digest` of ids and texts), the queries with their judged
            passages, depth, max lengths, precision and index: a second call with the same inputs encodes nothing.
        negative_filter, positives: a :class:`multipos.mining.negative_filter.NegativeFilter` applied to the mined
            pools with the embeddings this call computed ({query id → positive ids, in order}); filtered pools are
            not cached. filter_counts: a dict that receives the filter's settings and counts.

    Returns {query id → passage ids, best first}, in ``queries`` order. Cost: one encoding pass over the corpus
    and the queries plus one FAISS search (docs/hard-negatives.md). Raises ValueError for depth < 1.
    """
    from multipos.retrieval.dense import build_index, search_index
    from multipos.retrieval.encoding import cached_encode, corpus_digest, encode, native_bf16

    if depth < 1:
        raise ValueError(f"data.source.negative_depth must be >= 1, got {depth}")
    qids, ids = list(queries), corpus.ids
    texts = corpus.texts()
    bf16 = native_bf16() if bf16 is None else bool(bf16)
    settings = {"miner": "dense", "weights": model.fingerprint(include_query=True), "corpus": corpus_digest(ids, texts),
                "queries": query_digest(qids, queries, judged), "depth": depth, "lq": model.query_max_length,
                "lp": model.passage_max_length, "precision": "bf16" if bf16 else "fp32", "index": index,
                "index_options": dict(index_options or {})}
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "negatives" / f"dense-{key}.npz"
    cache = cache and negative_filter is None
    if cache and (hit := _load_cached(path, qids, ids)) is not None:
        return hit
    pools: dict[str, list[str]] = {q: [] for q in qids}
    if ids and qids:
        start = time.perf_counter()
        enc = dict(batch_size=batch_size, bf16=bf16, progress=progress, device=device)
        p_emb = cached_encode(model, ids, texts, embedding_cache, "dense negatives", kind="passage", **enc)
        q_emb = encode(model, [queries[q] for q in qids], "query", **enc)
        encoded = time.perf_counter()
        faiss_index = build_index(p_emb, index, **dict(index_options or {}))
        need = [min(len(ids), depth + len(judged.get(q, ()))) for q in qids]
        order = sorted(range(len(qids)), key=need.__getitem__)
        for lo in range(0, len(order), QUERY_CHUNK):
            chunk = order[lo : lo + QUERY_CHUNK]
            _, hits = search_index(faiss_index, q_emb[chunk], max(need[r] for r in chunk))
            for r, row in zip(chunk, hits.tolist()):
                pools[qids[r]] = unjudged_negatives((ids[j] for j in row if j >= 0), judged.get(qids[r], ()), depth)
        if negative_filter is not None:  # scored by the embeddings in hand: no second encoding
            from multipos.mining.negative_filter import filter_negatives, log_counts

            pools, counts = filter_negatives(pools, positives or {}, np.asarray(q_emb, dtype=np.float32),
                                             {q: i for i, q in enumerate(qids)}, np.asarray(p_emb, dtype=np.float32),
                                             {p: i for i, p in enumerate(ids)}, negative_filter)
            log_counts(negative_filter, counts, "dense-mined")
            if filter_counts is not None:
                filter_counts.update({**negative_filter.describe(), **counts})
        done = time.perf_counter()
        log.info("dense negatives: %d passages and %d queries encoded in %.1f s (%.1f passages/s), %s search %.1f s",
                 len(ids), len(qids), encoded - start, len(ids) / max(encoded - start, 1e-9), index, done - encoded)
    if cache:
        with atomic.writer(path, "wb") as f:
            np.savez(f, query_ids=np.array(qids, dtype=str), rows=pools_to_rows(pools, qids, ids),
                     settings=np.array(json.dumps(settings)))
    return pools


def load_encoder(name_or_path: str, encoder: dict | None = None):
    """The miner's :class:`~multipos.model.encoder.DualEncoder`: ``name_or_path`` with the keyword arguments ``encoder``
    (``data.source.negative_encoder``). Raises ValueError naming ``data.source.negative_encoder`` for a keyword
    DualEncoder does not take."""
    from multipos.model.encoder import DualEncoder

    encoder = dict(encoder or {})
    allowed = set(inspect.signature(DualEncoder).parameters) - {"name_or_path"}
    unknown = sorted(set(encoder) - allowed)
    if unknown:
        raise ValueError(f"data.source.negative_encoder: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return DualEncoder(name_or_path, **encoder)


def mine_with_checkpoint(name_or_path: str, corpus: Corpus, queries: dict[str, str], judged: dict[str, set[str]],
                         depth: int, encoder: dict | None = None) -> dict[str, list[str]]:
    """:func:`mine_dense_negatives` with the checkpoint ``name_or_path`` loaded as a DualEncoder with the keyword
    arguments ``encoder`` (``data.source.negative_encoder``: pooling, normalize, max lengths; a checkpoint's saved
    settings win, as for the trained model). Passage embeddings go to the embedding cache, which the zero-shot
    reference evaluation shares when its max length and precision match.

    Raises ValueError naming ``data.source.negative_encoder`` for a keyword DualEncoder does not take.
    """
    model = load_encoder(name_or_path, encoder)
    log.info("mining dense negatives with %s (%s pooling%s), depth %d", name_or_path, model.pooling,
             ", L2" if model.normalize else "", depth)
    pools = mine_dense_negatives(model, corpus, queries, judged, depth, embedding_cache=cache_dir())
    del model
    return pools
