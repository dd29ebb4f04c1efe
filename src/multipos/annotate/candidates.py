"""Candidate pooling: the top passages of several retrievers per query, merged (stage 1 of the pipeline).

Retrievers (``candidates.retrievers`` in ``conf/annotate.yaml``), each with its own depth:
``{kind: bm25, depth}`` (multipos.retrieval.bm25), ``{kind: dense, model, depth}`` (a DualEncoder checkpoint, e.g. the
starting model; FAISS flat search) and ``{kind: run, path, depth}`` (a TREC run file of any other system). The pool of
a query is the union of their lists, interleaved rank by rank in retriever order (so that each retriever's best
passages come first), without repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from multipos.formats.types import BeirDataset, Corpus

__all__ = ["KINDS", "pool_candidates"]

KINDS = ("bm25", "dense", "run")


def _ranked(run: dict[str, float], depth: int) -> list[str]:
    return [p for p, _ in sorted(run.items(), key=lambda kv: -kv[1])][:depth]


def pool_candidates(corpus: Corpus, queries: dict[str, str], retrievers: Sequence[dict],
                    cache: Path | None = None) -> dict[str, list[str]]:
    """{query id → pooled passage ids} (module docstring).

    Raises ValueError naming ``candidates.retrievers[i]`` for an unknown kind, a depth < 1 or a missing field.
    """
    lists: list[dict[str, list[str]]] = []
    for i, spec in enumerate(retrievers):
        spec = dict(spec)
        where = f"candidates.retrievers[{i}]"
        kind, depth = spec.get("kind"), int(spec.get("depth", 20))
        if kind not in KINDS:
            raise ValueError(f"{where}.kind {kind!r}; allowed: {', '.join(KINDS)}")
        if depth < 1:
            raise ValueError(f"{where}.depth must be >= 1, got {depth}")
        if kind == "bm25":
            from multipos.retrieval.bm25 import BM25

            run = BM25(corpus).search(queries, k=depth)
        elif kind == "dense":
            if not spec.get("model"):
                raise ValueError(f"{where}: a dense retriever needs 'model' (a checkpoint)")
            from multipos.model.encoder import DualEncoder
            from multipos.retrieval.dense import dense_run

            model = DualEncoder(str(spec["model"]))
            run = dense_run(model, BeirDataset(corpus, queries, {}, "annotate"), k=depth, cache=cache,
                            progress=False)
        else:
            if not spec.get("path"):
                raise ValueError(f"{where}: a run retriever needs 'path' (a TREC run file)")
            from multipos.formats.trec import read_run

            run = read_run(spec["path"])
        lists.append({q: [p for p in _ranked(run.get(q, {}), depth) if p in corpus.passages] for q in queries})
    pooled = {}
    for q in queries:
        seen: dict[str, None] = {}
        for rank in range(max((len(ranked[q]) for ranked in lists), default=0)):
            for ranked in lists:
                if rank < len(ranked[q]):
                    seen.setdefault(ranked[q][rank])
        pooled[q] = list(seen)
    return pooled
