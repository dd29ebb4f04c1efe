"""Evaluation sets and metrics (ranx): nDCG@10, MRR@10, Recall@100, Recall@1000.

Graded metrics (nDCG) use the qrels grades as gains (trec_eval's linear gain, as BEIR reports);
binary metrics (MRR, Recall) count a passage relevant when its grade ≥ the set's
``relevance_threshold`` (1 for NFCorpus, 2 for TREC DL, as TREC does).

Averages: each metric is averaged over the queries that have at least one relevant passage for it
(grade > 0 for nDCG, grade ≥ threshold for binary metrics); a judged query missing from the run
scores 0. trec_eval instead averages binary metrics over every judged query, counting queries
without a passage at the threshold as 0 — the two agree whenever every judged query has one
(checked against pytrec_eval in ``tests/test_metrics_independent.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from multipos.assets import resolve_dataset
from multipos.readers import BeirDataset, Qrels, Run, load_beir

log = logging.getLogger(__name__)

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@100", "recall@1000")
GRADED = ("ndcg", "ndcg_burges", "dcg")


@dataclass
class EvalSet:
    """A BEIR-layout evaluation set.

    Args:
        name: key in ``metrics.json`` and run-file name.
        path: BEIR folder or dataset name (resolved by :func:`multipos.assets.resolve_dataset`).
        split: qrels split (``qrels/<split>.tsv``).
        qrels_file: optional qrels path relative to the folder, overriding the split file.
        relevance_threshold: minimum grade counted relevant by binary metrics.
        metrics: ranx metric names.
        max_queries: evaluate only the first N judged queries (smoke tests); None = all.
        max_passages: shrink the corpus to the kept queries' judged passages plus the first
            passages in corpus order up to this many (smoke tests); None = whole corpus.
    """

    name: str
    path: str
    split: str = "test"
    qrels_file: str | None = None
    relevance_threshold: int = 1
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    max_queries: int | None = None
    max_passages: int | None = None

    def load(self) -> BeirDataset:
        """The set's corpus, queries and qrels; read from disk once per process and shared after."""
        key = (str(resolve_dataset(self.path).resolve()), self.split, self.qrels_file, self.max_queries, self.max_passages)
        if key not in _LOADED:
            _LOADED[key] = self._read()
        return replace(_LOADED[key], name=self.name)

    def _read(self) -> BeirDataset:
        data = load_beir(resolve_dataset(self.path), self.split, self.qrels_file)
        if self.max_queries is not None:
            keep = list(data.qrels)[: self.max_queries]
            data.qrels = {q: data.qrels[q] for q in keep}
            data.queries = {q: data.queries[q] for q in keep}
        if self.max_passages is not None:
            judged = {d for docs in data.qrels.values() for d in docs}
            keep_ids = list(dict.fromkeys([*(d for d in data.corpus.ids if d in judged), *data.corpus.ids[: self.max_passages]]))
            data.corpus.passages = {d: data.corpus.passages[d] for d in keep_ids[: max(self.max_passages, len(judged))]}
        return data


_LOADED: dict[tuple, BeirDataset] = {}


def _binary(qrels: Qrels, threshold: int) -> Qrels:
    out = {q: {d: 1 for d, g in docs.items() if g >= threshold} for q, docs in qrels.items()}
    return {q: docs for q, docs in out.items() if docs}


def evaluate_run(qrels: Qrels, run: Run, metrics=DEFAULT_METRICS, relevance_threshold: int = 1,
                 per_query: bool = False):
    """Score ``run`` against ``qrels`` with ranx.

    Queries judged but absent from the run count as 0; run queries without judgments are dropped
    (logged). Returns {metric: mean}, and with ``per_query`` also {metric: {qid: value}}.
    """
    from ranx import Qrels as RQrels, Run as RRun, evaluate

    extra = [q for q in run if q not in qrels]
    if extra:
        log.warning("dropping %d run queries without qrels, e.g. %s", len(extra), extra[:3])
    results, per_q = {}, {}
    groups = {"graded": [m for m in metrics if m.split("@")[0] in GRADED],
              "binary": [m for m in metrics if m.split("@")[0] not in GRADED]}
    for kind, names in groups.items():
        if not names:
            continue
        q = qrels if kind == "graded" else _binary(qrels, relevance_threshold)
        q = {qid: {d: g for d, g in docs.items() if g > 0} for qid, docs in q.items()}
        q = {qid: docs for qid, docs in q.items() if docs}
        r = {qid: (run.get(qid) or {}) for qid in q}
        # ranx needs at least one hit per query; an empty result scores 0 on every metric.
        r = {qid: (docs if docs else {"__none__": 0.0}) for qid, docs in r.items()}
        rq, rr = RQrels(q), RRun(r)
        scores = evaluate(rq, rr, names, make_comparable=True)
        if len(names) == 1:
            scores = {names[0]: scores}
        results.update({k: float(v) for k, v in scores.items()})
        if per_query:
            for name in names:
                per_q[name] = {qid: float(v) for qid, v in rr.scores[name].items()}
    ordered = {m: results[m] for m in metrics}
    return (ordered, per_q) if per_query else ordered


def write_metrics(path: Path, metrics: dict) -> None:
    """Write ``metrics.json`` atomically (a crash never leaves a half-written file)."""
    import json
    import os

    path = Path(path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=False))
    os.replace(tmp, path)


def dense_run(model, data: BeirDataset, k: int = 1000, batch_size: int = 64, bf16: bool = True,
              passage_max_length: int | None = None, cache: Path | None = None, index: str = "flat",
              progress: bool = True) -> Run:
    """Encode ``data``'s corpus and queries with ``model`` (a DualEncoder) and retrieve top-``k`` with FAISS.

    Corpus embeddings are cached under ``cache`` keyed by (weights, corpus, max length, pooling);
    ``cache=None`` always re-encodes.
    """
    from multipos.retrieval import cached_encode, encode, search

    pids = data.corpus.ids
    kw = dict(kind="passage", max_length=passage_max_length, batch_size=batch_size, bf16=bf16, progress=progress)
    p_emb = cached_encode(model, pids, data.corpus.texts(pids), cache, tag=data.name or "corpus", **kw)
    qids = list(data.queries)
    q_emb = encode(model, [data.queries[q] for q in qids], kind="query", batch_size=batch_size, bf16=bf16, progress=False)
    return search(q_emb, p_emb, qids, pids, k=k, index_kind=index)


_BM25_CACHE: dict[str, Run] = {}


def bm25_run(data: BeirDataset, k: int = 1000) -> Run:
    """BM25 top-``k`` run over ``data``'s corpus (bm25s, Lucene BM25 k1=0.9 b=0.4), memoised per process."""
    from multipos.bm25 import BM25

    key = f"{data.name}|{len(data.corpus)}|{len(data.queries)}|{k}"
    if key not in _BM25_CACHE:
        _BM25_CACHE[key] = BM25(data.corpus).search(data.queries, k=k)
    return _BM25_CACHE[key]
