"""Independent check of :func:`multipos.evaluation.metrics.evaluate_run` (ranx) on a real run.

A BM25 run (``multipos.retrieval.bm25.BM25``, top-1000) over NFCorpus test (3,633 passages, 323 judged queries,
grades 1 and 2; shared assets, skipped without them) is scored three ways and compared per query and
on the means to 1e-6:

* ``evaluate_run`` (ranx, the code under test);
* a plain-Python implementation written here (no ranx): nDCG@10 with linear gain = grade and
  ``log2(rank + 1)`` discount, ideal DCG from all judged grades > 0 (trec_eval ``ndcg_cut``);
  MRR@10 = 1 / rank of the first passage with grade >= threshold in the top 10, else 0;
  Recall@k = relevant (grade >= threshold) passages in the top k / all relevant passages;
* ``pytrec_eval`` (trec_eval 9 bindings, package ``pytrec-eval-terrier``) when importable:
  ``ndcg_cut_10``, ``recall_100``, ``recall_1000`` with ``relevance_level`` = threshold, and
  ``recip_rank`` on the run cut to its top 10 (trec_eval's ``recip_rank`` has no cutoff).

Thresholds: 1 (NFCorpus, every judged passage relevant) and 2 (TREC DL style, built on the same
NFCorpus run: grade 2 is the only relevant grade for the binary metrics; nDCG keeps the grades).

Ties: BM25 scores tie (duplicate passages, equal term statistics), and the three implementations
order ties differently (ranx: ``np.argsort`` of the negated scores, quicksort, i.e. unspecified;
trec_eval: docno descending; the code here: docno ascending). The compared run is therefore
*untied* first: every query's passages are ordered by (BM25 score descending, passage id ascending)
and given the strictly decreasing scores ``n, n-1, …, 1`` (n = passages retrieved). This keeps the
BM25 ranking (with a documented tie-break), removes every tie exactly (integers are exact floats, no
epsilon arithmetic), and all three implementations then see the same ranking.

Averaging (what the means are over): ``evaluate_run`` averages nDCG over the queries with a judged
grade > 0 and each binary metric over the queries with at least one passage of grade >= threshold.
trec_eval averages over every query of run ∩ qrels, scoring 0 for a query without relevant
passages; at threshold 2 that gives a different (lower) mean, which the pytrec_eval test pins down.
"""

from __future__ import annotations

import math

import pytest

from multipos.evaluation.metrics import evaluate_run
from multipos.evaluation.sets import EvalSet

METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "recall@1000")
BINARY = tuple(m for m in METRICS if not m.startswith("ndcg"))
TOL = 1e-6


# ---------------------------------------------------------------------------------------------- fixtures


def ranking(docs: dict[str, float]) -> list[str]:
    """Passage ids by score descending, ties by passage id ascending."""
    return [d for d, _ in sorted(docs.items(), key=lambda item: (-item[1], item[0]))]


def untie(run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The same rankings (tie-break: passage id ascending) with unique scores n, n-1, …, 1."""
    out = {}
    for qid, docs in run.items():
        ranked = ranking(docs)
        out[qid] = {d: float(len(ranked) - i) for i, d in enumerate(ranked)}
    return out


@pytest.fixture(scope="module")
def nfcorpus_bm25(assets):
    """(qrels, raw BM25 run, untied run) on NFCorpus test."""
    from multipos.retrieval.bm25 import BM25

    data = EvalSet("nfcorpus_test", "nfcorpus", split="test").load()
    raw = BM25(data.corpus).search(data.queries, k=1000)
    return data.qrels, raw, untie(raw)


# ---------------------------------------------------------------------------------------------- independent metrics


def ndcg_at(ranked: list[str], grades: dict[str, int], k: int = 10) -> float:
    dcg = sum(grades.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]) if grades.get(d, 0) > 0)
    ideal = sorted((g for g in grades.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mrr_at(ranked: list[str], grades: dict[str, int], threshold: int, k: int = 10) -> float:
    for i, d in enumerate(ranked[:k]):
        if grades.get(d, 0) >= threshold:
            return 1.0 / (i + 1)
    return 0.0


def recall_at(ranked: list[str], grades: dict[str, int], threshold: int, k: int) -> float:
    relevant = {d for d, g in grades.items() if g >= threshold}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def independent(qrels, run, threshold: int) -> dict[str, dict[str, float]]:
    """{metric: {qid: value}} over the queries each metric is defined on (see the module docstring)."""
    out: dict[str, dict[str, float]] = {m: {} for m in METRICS}
    for qid, grades in qrels.items():
        ranked = ranking(run.get(qid, {}))
        if any(g > 0 for g in grades.values()):
            out["ndcg@10"][qid] = ndcg_at(ranked, grades)
        if any(g >= threshold for g in grades.values()):
            out["mrr@10"][qid] = mrr_at(ranked, grades, threshold)
            for m in BINARY:
                if m.startswith("recall@"):
                    out[m][qid] = recall_at(ranked, grades, threshold, int(m.split("@")[1]))
    return out


def mean(values: dict[str, float]) -> float:
    return math.fsum(values.values()) / len(values)


def assert_close_per_query(got: dict[str, float], want: dict[str, float], what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: query sets differ ({len(got)} vs {len(want)})"
    bad = {q: (got[q], want[q]) for q in want if abs(got[q] - want[q]) > TOL}
    assert not bad, f"{what}: {len(bad)} queries differ, e.g. {list(bad.items())[:5]}"


# ---------------------------------------------------------------------------------------------- tests


def test_untie_keeps_the_bm25_ranking(nfcorpus_bm25):
    qrels, raw, run = nfcorpus_bm25
    assert run.keys() == raw.keys() == qrels.keys()
    for qid, docs in run.items():
        scores = [docs[d] for d in ranking(docs)]
        assert ranking(docs) == ranking(raw[qid])
        assert len(set(scores)) == len(scores) and scores == sorted(scores, reverse=True)
    # the raw run really has ties, i.e. untying matters (otherwise this check would be vacuous)
    assert any(len(set(v.values())) < len(v) for v in raw.values())


@pytest.mark.parametrize("threshold", [1, 2])
def test_evaluate_run_matches_plain_python(nfcorpus_bm25, threshold):
    qrels, _, run = nfcorpus_bm25
    means, per_query = evaluate_run(qrels, run, METRICS, relevance_threshold=threshold, per_query=True)
    want = independent(qrels, run, threshold)
    n_rel = sum(any(g >= threshold for g in grades.values()) for grades in qrels.values())
    assert len(want["ndcg@10"]) == len(qrels) == 323
    assert len(want["mrr@10"]) == n_rel == (323 if threshold == 1 else 119)
    for m in METRICS:
        assert_close_per_query(per_query[m], want[m], f"{m} (threshold {threshold})")
        assert means[m] == pytest.approx(mean(want[m]), abs=TOL), m
    # nDCG uses the grades whatever the threshold
    if threshold == 2:
        assert means["ndcg@10"] == pytest.approx(evaluate_run(qrels, run, ["ndcg@10"])["ndcg@10"], abs=1e-12)
    # sanity: BM25 on NFCorpus is in the usual range (BEIR reports nDCG@10 ≈ 0.32–0.33)
    assert 0.25 < means["ndcg@10"] < 0.40


@pytest.mark.parametrize("threshold", [1, 2])
def test_evaluate_run_matches_trec_eval(nfcorpus_bm25, threshold):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels, _, run = nfcorpus_bm25
    means, per_query = evaluate_run(qrels, run, METRICS, relevance_threshold=threshold, per_query=True)
    ours = independent(qrels, run, threshold)

    measures = {"ndcg_cut_10", "recall_10", "recall_100", "recall_1000"}
    trec = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=threshold).evaluate(run)
    top10 = {q: {d: docs[d] for d in ranking(docs)[:10]} for q, docs in run.items()}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}, relevance_level=threshold).evaluate(top10)
    assert trec.keys() == rr.keys() == qrels.keys()  # every query retrieved something
    names = {"ndcg@10": "ndcg_cut_10", "recall@10": "recall_10", "recall@100": "recall_100",
             "recall@1000": "recall_1000"}
    trec_pq = {m: {q: trec[q][t] for q in trec} for m, t in names.items()}
    trec_pq["mrr@10"] = {q: rr[q]["recip_rank"] for q in rr}

    for m in METRICS:
        on = per_query[m].keys()  # the queries evaluate_run scores this metric on
        restricted = {q: trec_pq[m][q] for q in on}
        assert_close_per_query(per_query[m], restricted, f"{m} vs trec_eval (threshold {threshold})")
        assert_close_per_query(ours[m], restricted, f"{m}: plain Python vs trec_eval (threshold {threshold})")
        assert means[m] == pytest.approx(mean(restricted), abs=TOL), m
        # the averaging conventions: trec_eval scores a query without relevant passages as 0 and
        # averages over all 323 queries; evaluate_run leaves such queries out of the binary metrics
        left_out = trec_pq[m].keys() - on
        assert all(trec_pq[m][q] == 0.0 for q in left_out)
        if threshold == 1 or m == "ndcg@10":
            assert not left_out
        else:
            assert len(left_out) == 323 - 119
            assert mean(trec_pq[m]) == pytest.approx(means[m] * 119 / 323, abs=TOL)


@pytest.mark.parametrize("threshold", [1, 2])
def test_acc_at_k_matches_trec_eval_success(nfcorpus_bm25, threshold):
    """acc@k (ranx hit_rate) equals trec_eval's success@k on the queries with a relevant passage."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels, _, run = nfcorpus_bm25
    names = ["acc@1", "acc@5", "acc@10"]
    means, per_query = evaluate_run(qrels, run, names, relevance_threshold=threshold, per_query=True)
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"success"}, relevance_level=threshold).evaluate(run)
    for m in names:
        on = per_query[m].keys()
        want = {q: trec[q][f"success_{m.split('@')[1]}"] for q in on}
        assert_close_per_query(per_query[m], want, f"{m} vs trec_eval success (threshold {threshold})")
        assert means[m] == pytest.approx(mean(want), abs=TOL)
    assert 0 < means["acc@1"] < means["acc@10"] <= 1
