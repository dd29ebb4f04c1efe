"""Retrieval metrics with ranx: nDCG@10, MRR@10, Recall@100, Recall@1000, Acc@k.

Graded metrics (nDCG) use the qrels grades as gains (trec_eval's linear gain, as BEIR reports);
binary metrics (MRR, Recall) count a passage relevant when its grade ≥ the set's
``relevance_threshold`` (1 for NFCorpus, 2 for TREC DL, as TREC does). ``acc@k`` is top-k accuracy against
the qrels (ranx ``hit_rate@k``, trec_eval ``success_k``).

Averages: each metric is averaged over the queries that have at least one relevant passage for it
(grade > 0 for nDCG, grade ≥ threshold for binary metrics); a judged query missing from the run
scores 0. trec_eval instead averages binary metrics over every judged query, counting queries
without a passage at the threshold as 0 — the two agree whenever every judged query has one
(checked against pytrec_eval in ``tests/test_metrics_independent.py``).
"""

from __future__ import annotations

import logging

from multipos.formats.types import Qrels, Run

log = logging.getLogger(__name__)

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@100", "recall@1000")
GRADED = ("ndcg", "ndcg_burges", "dcg")


def _binary(qrels: Qrels, threshold: int) -> Qrels:
    out = {q: {d: 1 for d, g in docs.items() if g >= threshold} for q, docs in qrels.items()}
    return {q: docs for q, docs in out.items() if docs}


def _ranx_name(metric: str) -> str:
    """``acc@k`` (top-k accuracy against qrels, as in DPR tables) is ranx's ``hit_rate@k``."""
    return "hit_rate" + metric[3:] if metric.startswith("acc@") else metric


#: Digits of the passage-id codes handed to ranx (:func:`fixed_width_ids`): up to 10^10 distinct ids.
ID_WIDTH = 10


def fixed_width_ids(qrels: Qrels, run: Run) -> tuple[Qrels, Run]:
    """The same qrels and run with every passage id replaced by a code of :data:`ID_WIDTH` digits (one code per
    distinct id, shared by both; insertion order kept).

    ranx stores passage ids as numpy strings as wide as the longest id, and numba compiles its conversion and
    metric functions once per width: every set with another id length (NFCorpus's ``MED-10``, TREC DL's
    ``7067032``) paid a new JIT, 12-19 s on the 2-core CPU (2026-11-26). With one width ranx compiles once per
    machine (its numba cache). ranx matches ids by hash and orders ties by position, never by the id's text, so
    the metrics are unchanged (tests/evaluation/test_evaluation.py).
    """
    codes: dict[str, str] = {}

    def code(pid: str) -> str:
        c = codes.get(pid)
        if c is None:
            c = codes[pid] = str(len(codes)).zfill(ID_WIDTH)
        return c

    return ({qid: {code(d): g for d, g in docs.items()} for qid, docs in qrels.items()},
            {qid: {code(d): s for d, s in docs.items()} for qid, docs in run.items()})


def evaluate_run(qrels: Qrels, run: Run, metrics=DEFAULT_METRICS, relevance_threshold: int = 1,
                 per_query: bool = False):
    """Score ``run`` against ``qrels`` with ranx.

    Queries judged but absent from the run count as 0; run queries without judgments are dropped
    (logged). Returns {metric: mean}, and with ``per_query`` also {metric: {qid: value}}.
    """
    from ranx import Qrels as RQrels
    from ranx import Run as RRun
    from ranx import evaluate

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
        if not q:
            raise ValueError(f"no query has a passage with grade >= {relevance_threshold if kind == 'binary' else 1} "
                             f"in these qrels: cannot compute {names}")
        r = {qid: (run.get(qid) or {}) for qid in q}
        # ranx needs at least one hit per query; an empty result scores 0 on every metric.
        r = {qid: (docs if docs else {"__none__": 0.0}) for qid, docs in r.items()}
        q, r = fixed_width_ids(q, r)
        rq, rr = RQrels(q), RRun(r)
        ranx_names = [_ranx_name(m) for m in names]
        scores = evaluate(rq, rr, ranx_names, make_comparable=True)
        if len(names) == 1:
            scores = {ranx_names[0]: scores}
        results.update({m: float(scores[rn]) for m, rn in zip(names, ranx_names)})
        if per_query:
            for m, rn in zip(names, ranx_names):
                per_q[m] = {qid: float(v) for qid, v in rr.scores[rn].items()}
    ordered = {m: results[m] for m in metrics}
    return (ordered, per_q) if per_query else ordered


def compile_metrics(metrics=DEFAULT_METRICS) -> float:
    """Compile ranx's numba functions for :func:`evaluate_run` (graded and binary ``metrics``, per-query values)
    into numba's on-disk cache (``NUMBA_CACHE_DIR``; the Makefile sets ``.cache/numba``) on a tiny synthetic run →
    the seconds it took.

    ranx builds its qrels and runs and computes every metric with numba functions cached per argument type, and
    :func:`fixed_width_ids` gives every set the same types, so one call leaves nothing for a later process to
    compile: its first evaluation loads the cache (about 3 s on the 2-core CPU) instead of compiling (about 30 s,
    2026-11-26). ``make install`` runs it (``python -m multipos.evaluation.metrics``) on the core pip leaves idle
    while it installs the rest of the stack; it needs only ranx and its dependencies, not torch."""
    import time

    began = time.perf_counter()
    qrels = {f"q{i}": {f"p{i}-{j}": 1 + j % 2 for j in range(3)} for i in range(4)}
    run = {qid: {**{d: 1.0 / (1 + j) for j, d in enumerate(docs)}, f"x{qid}": 0.5} for qid, docs in qrels.items()}
    evaluate_run(qrels, run, metrics, per_query=True)
    return time.perf_counter() - began


if __name__ == "__main__":  # python -m multipos.evaluation.metrics: compile ranx's functions (make install)
    print(f"ranx metrics compiled into numba's cache in {compile_metrics():.0f} s")
