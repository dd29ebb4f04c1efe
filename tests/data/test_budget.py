"""Annotation-budget allocation (paper Table 7): m positives on a share f of the queries, fixed label total."""

from __future__ import annotations

import pytest

from multipos.data.budget import apply_budget
from multipos.data.groups import TrainQuery
from multipos.formats.beir import read_queries
from multipos.formats.trec import read_qrels
from tests.helpers import compose_cfg

CELLS = [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25)]


@pytest.fixture(scope="module")
def nfcorpus_queries(assets) -> list[TrainQuery]:
    """NFCorpus training queries with graded positives (2 = gold, 1 = silver; no mining needed here)."""
    folder = assets / "data" / "nfcorpus"
    texts = read_queries(folder / "queries.jsonl")
    qrels = read_qrels(folder / "qrels-graded" / "train.s-3.qrel")
    return [TrainQuery(q, texts[q], [d for d, g in docs.items() if g >= 2], [d for d, g in docs.items() if g == 1])
            for q, docs in qrels.items()]


def labels(queries, regime="homogeneous") -> int:
    return sum(len(q.positives(regime)) for q in queries)


@pytest.mark.assets
def test_budget_cells_hold_the_same_label_total_on_nfcorpus(nfcorpus_queries):
    totals, sizes = {}, {}
    for m, f in CELLS:
        chosen = apply_budget(nfcorpus_queries, "homogeneous", m, f, seed=0, pool_min_positives=4)
        assert all(len(q.positives("homogeneous")) == m for q in chosen)
        totals[m], sizes[m] = labels(chosen), len(chosen)
    pool = sum(1 for q in nfcorpus_queries if len(q.silver) >= 4)
    assert sizes[1] == pool
    # the same total up to rounding of f * |pool| (at most m/2 labels per cell)
    assert max(totals.values()) - min(totals.values()) <= 2, totals


@pytest.mark.assets
def test_budget_subset_is_fixed_by_its_seed(nfcorpus_queries):
    ids = lambda qs: [q.query_id for q in qs]  # noqa: E731
    a = apply_budget(nfcorpus_queries, "homogeneous", 2, 0.5, seed=0, pool_min_positives=4)
    b = apply_budget(nfcorpus_queries, "homogeneous", 2, 0.5, seed=0, pool_min_positives=4)
    c = apply_budget(nfcorpus_queries, "homogeneous", 2, 0.5, seed=1, pool_min_positives=4)
    assert ids(a) == ids(b)
    assert ids(a) != ids(c) and len(a) == len(c)
    # the first m positives of each query, in annotation order; dropped labels are still never negatives
    original = {q.query_id: q for q in nfcorpus_queries}
    for q in a:
        assert q.silver == original[q.query_id].silver[:2]
        assert q.judged == original[q.query_id].judged


@pytest.mark.parametrize("kw,match", [(dict(query_fraction=0.0), r"query_fraction must be in \(0, 1\]"),
                                      (dict(query_fraction=1.5), "query_fraction"),
                                      (dict(positives_per_query=0), "positives_per_query must be >= 1"),
                                      (dict(pool_min_positives=1, positives_per_query=2), "pool_min_positives")])
def test_bad_budget_is_rejected(kw, match):
    qs = [TrainQuery(f"q{i}", "text", [], [f"d{i}-{j}" for j in range(4)]) for i in range(4)]
    args = dict(positives_per_query=1, query_fraction=1.0, seed=0) | kw
    with pytest.raises(ValueError, match=match):
        apply_budget(qs, "homogeneous", **args)


def test_budget_config_reaches_the_data_module_and_checks_its_keys(tiny_beir, tiny_bert):
    from hydra.utils import instantiate

    cfg = compose_cfg("train", ["experiment=table7_budget", "budget=m2_f50", f"model.name_or_path={tiny_bert}",
                                f"data.source.path={tiny_beir}", "data.source.ordering=given", "paths.output_dir=x"])
    dm = instantiate(cfg.data, seed=0)
    assert dm.budget == {"positives_per_query": 2, "query_fraction": 0.5, "seed": 0, "pool_min_positives": 4}
    with pytest.raises(Exception, match="unknown keys"):
        instantiate(cfg.data, seed=0, budget={"positives": 2})
    with pytest.raises(Exception, match="query_fraction"):  # Hydra wraps the ValueError
        instantiate(cfg.data, seed=0, budget={"positives_per_query": 2, "query_fraction": 2})
