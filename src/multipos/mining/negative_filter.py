"""Positive-aware hard-negative filtering: mined negatives that score too close to the query's positives are likely
unlabelled positives (false negatives), the noise multi-positive training is about, so they are dropped.

NV-Retriever (Moreira et al. 2024, "NV-Retriever: Improving text embedding models with effective hard-negative
mining", Sec. 3.2, "TopK-PercPos") keeps a mined negative n of query q only when s(q, n) < share · s(q, p), p the
query's positive; ``share`` 0.95 was its best setting. With several positives the reference is the **lowest**
positive score (the most permissive positive sets the bar: nothing that scores like a known positive stays a
negative) or the **first** positive's (the annotation order's best). A ``margin`` drops negatives within an absolute
distance of the reference instead (``TopK-MarginPos``): s(q, n) > s(q, p) − margin. With both set, a negative is
dropped when either rule drops it. Scores are the model's similarity (dot product of its embeddings; cosine when it
L2-normalises), without temperature.

Used by the sources after BM25 or dense mining (scored by the starting checkpoint, ``data.source.negative_model``)
and by the ANCE-style refresh (scored by the weights being trained, with the embeddings that mined the pools:
:func:`multipos.mining.dense_negatives.mine_dense_negatives`); the counts go to the log and to
``run_info.json`` (the stage records' ``negative_filter``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from multipos.config_mapping import dataclass_fields_only

__all__ = ["NegativeFilter", "filter_negatives", "score_and_filter", "log_counts"]

log = logging.getLogger(__name__)

REFERENCES = ("lowest", "first")


@dataclass(frozen=True)
class NegativeFilter:
    """``data.source.negative_filter``: ``share`` in (0, 1] (drop s_n > share · s_ref), ``margin`` ≥ 0 (drop
    s_n > s_ref − margin), ``reference`` ``lowest`` | ``first`` positive. Raises ValueError naming the field when
    neither rule is set or a value is out of range."""

    share: float | None = None
    margin: float | None = None
    reference: str = "lowest"

    def __post_init__(self):
        if self.share is None and self.margin is None:
            raise ValueError("data.source.negative_filter needs share (e.g. 0.95) or margin (e.g. 0.05)")
        if self.share is not None and not 0.0 < float(self.share) <= 1.0:
            raise ValueError(f"data.source.negative_filter.share must be in (0, 1], got {self.share}")
        if self.margin is not None and float(self.margin) < 0.0:
            raise ValueError(f"data.source.negative_filter.margin must be >= 0, got {self.margin}")
        if self.reference not in REFERENCES:
            raise ValueError(f"data.source.negative_filter.reference={self.reference!r}; "
                             f"allowed: {', '.join(REFERENCES)}")

    @classmethod
    def from_config(cls, node) -> "NegativeFilter | None":
        """From a ``data.source.negative_filter`` mapping; None (or empty) = no filtering. Raises ValueError naming
        an unknown field."""
        node = dataclass_fields_only(cls, node, "data.source.negative_filter")
        return None if node is None else cls(**node)

    def ceiling(self, positive_scores: np.ndarray) -> float:
        """The highest score a negative may have: from the reference positive score (``positive_scores`` in the
        positives' order, [P] with P ≥ 1), the stricter of the two rules."""
        ref = float(positive_scores.min() if self.reference == "lowest" else positive_scores[0])
        bounds = []
        if self.share is not None:
            bounds.append(float(self.share) * ref)
        if self.margin is not None:
            bounds.append(ref - float(self.margin))
        return min(bounds)

    def describe(self) -> dict:
        """The filter's settings as written to ``run_info.json`` (``share``, ``margin``, ``reference``)."""
        return {"share": self.share, "margin": self.margin, "reference": self.reference}


def filter_negatives(pools: dict[str, list[str]], positives: dict[str, list[str]], q_emb: np.ndarray,
                     query_row: dict[str, int], p_emb: np.ndarray, passage_row: dict[str, int],
                     rule: NegativeFilter) -> tuple[dict[str, list[str]], dict]:
    """Drop from each query's pool the negatives that score above ``rule.ceiling`` of its positives.

    Args: pools {query id → negative ids, best first}; positives {query id → positive ids, in order}; q_emb [Q, H]
    and p_emb [N, H] embeddings with ``query_row`` / ``passage_row`` mapping ids to rows (float arrays; scores are
    their dot products). A query without positives (or absent from ``positives``) keeps its pool.

    Returns (the filtered pools, order kept; counts ``{"checked", "dropped", "queries_with_drops"}``).
    """
    out, checked, dropped, touched = {}, 0, 0, 0
    for qid, pool in pools.items():
        pos = [passage_row[p] for p in positives.get(qid, ()) if p in passage_row]
        if not pool or not pos or qid not in query_row:
            out[qid] = list(pool)
            continue
        q = q_emb[query_row[qid]].astype(np.float32)
        ceiling = rule.ceiling(p_emb[pos].astype(np.float32) @ q)
        rows = [passage_row[n] for n in pool]
        scores = p_emb[rows].astype(np.float32) @ q
        kept = [n for n, s in zip(pool, scores) if s <= ceiling]
        checked += len(pool)
        dropped += len(pool) - len(kept)
        touched += len(kept) < len(pool)
        out[qid] = kept
    return out, {"checked": checked, "dropped": dropped, "queries_with_drops": touched}


def score_and_filter(model, corpus, queries: dict[str, str], pools: dict[str, list[str]],
                     positives: dict[str, list[str]], rule: NegativeFilter, embedding_cache=None, what: str = "mined",
                     **encode_options) -> tuple[dict[str, list[str]], dict]:
    """:func:`filter_negatives` with scores of ``model`` (a :class:`multipos.model.encoder.DualEncoder`): the corpus
    through
    the embedding cache (``embedding_cache``; None = not cached), the queries encoded here. ``encode_options`` go
    to :func:`multipos.retrieval.encoding.encode` (e.g. ``device=None`` during training). Logs the counts."""
    from multipos.retrieval.encoding import cached_encode, encode

    ids = corpus.ids
    p_emb = np.asarray(cached_encode(model, ids, corpus.texts(ids), embedding_cache, "negative filter", kind="passage",
                                     **encode_options), dtype=np.float32)
    qids = [q for q in pools if q in queries]
    q_emb = np.asarray(encode(model, [queries[q] for q in qids], "query", **encode_options), dtype=np.float32)
    kept, counts = filter_negatives(pools, positives, q_emb, {q: i for i, q in enumerate(qids)}, p_emb,
                                    {p: i for i, p in enumerate(ids)}, rule)
    log_counts(rule, counts, what)
    return kept, {**rule.describe(), **counts}


def log_counts(rule: NegativeFilter, counts: dict, what: str) -> None:
    """Log what :func:`filter_negatives` dropped (``what``: which negatives, e.g. ``mined``)."""
    log.info("positive-aware filter (%s): dropped %d of %d %s negatives (%d queries affected)",
             ", ".join(f"{k}={v}" for k, v in rule.describe().items() if v is not None), counts["dropped"],
             counts["checked"], what, counts["queries_with_drops"])
