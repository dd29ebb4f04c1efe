"""Metrics through ranx against hand-computed values, thresholds, and the dense retrieval path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from multipos.evaluation.metrics import evaluate_run
from multipos.evaluation.sets import EvalSet
from multipos.retrieval.dense import dense_run, search


def test_metrics_match_hand_computed():
    qrels = {"a": {"d1": 2, "d2": 1}, "b": {"d3": 1}}
    run = {"a": {"d1": 0.9, "d5": 0.5, "d2": 0.1}, "b": {"d4": 1.0, "d3": 0.5}}
    m = evaluate_run(qrels, run, ["ndcg@10", "mrr@10", "recall@1"])
    ndcg_a = (2 + 1 / math.log2(4)) / (2 + 1 / math.log2(3))
    ndcg_b = (1 / math.log2(3)) / 1
    assert m["ndcg@10"] == pytest.approx((ndcg_a + ndcg_b) / 2, abs=1e-9)
    assert m["mrr@10"] == pytest.approx((1 + 0.5) / 2, abs=1e-9)
    assert m["recall@1"] == pytest.approx((0.5 + 0) / 2, abs=1e-9)


def test_relevance_threshold_for_binary_metrics():
    qrels = {"a": {"d1": 1, "d2": 3}}
    run = {"a": {"d1": 0.9, "d2": 0.5}}
    assert evaluate_run(qrels, run, ["mrr@10"], relevance_threshold=1)["mrr@10"] == 1.0
    assert evaluate_run(qrels, run, ["mrr@10"], relevance_threshold=2)["mrr@10"] == 0.5  # TREC DL style


def test_missing_query_counts_zero():
    qrels = {"a": {"d1": 1}, "b": {"d2": 1}}
    m = evaluate_run(qrels, {"a": {"d1": 1.0}}, ["recall@10"])
    assert m["recall@10"] == pytest.approx(0.5)


def test_faiss_search_is_exact_inner_product():
    rng = np.random.default_rng(0)
    p = rng.normal(size=(50, 8)).astype(np.float32)
    q = rng.normal(size=(3, 8)).astype(np.float32)
    run = search(q, p, ["x", "y", "z"], [f"p{i}" for i in range(50)], k=5)
    for r, qid in enumerate(["x", "y", "z"]):
        best = np.argsort(-(p @ q[r]))[:5]
        assert list(run[qid]) == [f"p{i}" for i in best]


def test_dense_run_on_tiny_beir(tiny_beir, tiny_bert):
    from multipos.model.encoder import DualEncoder

    data = EvalSet("tiny", str(tiny_beir), split="test").load()
    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=True)
    run = dense_run(model, data, k=10, bf16=False, progress=False)
    assert set(run) == set(data.queries) and all(len(v) == 10 for v in run.values())
    m = evaluate_run(data.qrels, run)
    assert set(m) == {"ndcg@10", "mrr@10", "recall@100", "recall@1000"}


def test_evaluation_reads_the_sets_and_retrieval_settings_once_from_the_config():
    """``Evaluation.from_node``: the validation set first in ``sets``, then the test sets; ``retrieval`` holds
    exactly the keyword arguments ``dense_run`` takes (so the final evaluation and the per-epoch dev retrieval use the
    same settings)."""
    import inspect

    from multipos.evaluation.runner import Evaluation
    from tests.helpers import compose_cfg

    cfg = compose_cfg("train", ["eval=main"])
    ev = Evaluation.from_node(cfg.eval, cfg.get("run_name"))
    assert ev.validation is not None and ev.validation.name == cfg.eval.validation.name
    assert [es.name for es in ev.sets] == [ev.validation.name] + [s.name for s in cfg.eval.test_sets.values()]
    assert set(ev.retrieval) <= set(inspect.signature(dense_run).parameters)
    assert ev.retrieval["k"] == cfg.eval.k and ev.retrieval["passage_max_length"] == cfg.eval.passage_max_length
    assert isinstance(ev.retrieval["index_options"], dict)
    assert ev.references == bool(cfg.eval.references) and ev.tag == cfg.run_name


def test_format_plain_is_the_jobs_results_table():
    from multipos.evaluation.runner import format_plain

    results = {"nfcorpus_test": {"ndcg@10": 0.31234, "recall@100": 0.25}, "hybrid_annotation.gold": {"ndcg@10": 0.5}}
    refs = {"bm25": {"nfcorpus_test": {"ndcg@10": 0.3, "recall@100": 0.2}},
            "zero-shot": {"nfcorpus_test": {"ndcg@10": 0.29}}}
    assert format_plain(results, refs).splitlines() == [
        "system       nfcorpus_test:ndcg@10 nfcorpus_test:recall@100 hybrid_annotation.gold:ndcg@10",
        "bm25                        0.3000                   0.2000                            nan",
        "zero-shot                   0.2900                      nan                            nan",
        "this run                    0.3123                   0.2500                         0.5000",
    ]
    # short names: columns are at least 14 wide; no references → only "this run"
    assert format_plain({"a": {"m": 1.0}}, {}) == "system                 a:m\nthis run            1.0000"


def _count_runs(monkeypatch) -> list[str]:
    """The evaluation runner's dense and BM25 runs, counted: a list that gets "dense" / "bm25" per call."""
    import multipos.evaluation.runner as runner

    calls = []
    dense, bm25 = runner.dense_run, runner.bm25_run
    monkeypatch.setattr(runner, "dense_run", lambda *a, **k: calls.append("dense") or dense(*a, **k))
    monkeypatch.setattr(runner, "bm25_run", lambda *a, **k: calls.append("bm25") or bm25(*a, **k))
    return calls


def test_reference_rows_are_computed_once_per_process_for_the_same_model_and_sets(tiny_beir, tiny_bert, tmp_path,
                                                                                monkeypatch):
    import multipos.evaluation.runner as runner
    from multipos.evaluation.runner import Evaluation
    from multipos.model.encoder import DualEncoder

    monkeypatch.setattr(runner, "_REFERENCE_MEMO", {})
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))  # nothing stored by other tests
    calls = _count_runs(monkeypatch)
    ev = Evaluation(validation=None, test_sets=[EvalSet("tiny", str(tiny_beir), split="test")],
                    retrieval=dict(k=10, batch_size=8, bf16=False, passage_max_length=32, index="flat",
                                   index_options={}))
    model = DualEncoder(str(tiny_bert))
    first = ev.reference_rows(model, out=tmp_path / "a")
    assert calls == ["dense", "bm25"]
    again = ev.reference_rows(DualEncoder(str(tiny_bert)), out=tmp_path / "b")  # same weights, another run folder
    assert calls == ["dense", "bm25"] and again == first
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    again["bm25"]["tiny"]["ndcg@10"] = -1.0  # callers get their own copy
    assert ev.reference_rows(model)["bm25"]["tiny"]["ndcg@10"] == first["bm25"]["tiny"]["ndcg@10"]
    other = DualEncoder(str(tiny_bert))
    import torch

    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01)
    ev.reference_rows(other, out=tmp_path / "c")  # other weights: computed again
    assert calls == ["dense", "bm25", "dense", "bm25"]
    ev.tag = "other-run"
    ev.reference_rows(model, out=tmp_path / "d")  # another run tag (written into the TREC runs): computed again
    assert calls[-2:] == ["dense", "bm25"] and len(calls) == 6


def test_reference_rows_stored_in_the_cache_serve_another_process_until_a_set_file_changes(tiny_beir, tiny_bert,
                                                                                           tmp_path, monkeypatch):
    import shutil

    import multipos.evaluation.runner as runner
    from multipos.evaluation.runner import Evaluation
    from multipos.model.encoder import DualEncoder

    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "set"
    shutil.copytree(tiny_beir, folder)
    calls = _count_runs(monkeypatch)
    ev = Evaluation(validation=None, test_sets=[EvalSet("tiny", str(folder), split="test")],
                    retrieval=dict(k=10, batch_size=8, bf16=False, passage_max_length=32, index="flat",
                                   index_options={}))
    monkeypatch.setattr(runner, "_REFERENCE_MEMO", {})
    first = ev.reference_rows(DualEncoder(str(tiny_bert)), out=tmp_path / "a")
    assert calls == ["dense", "bm25"]
    assert not list((tmp_path / "cache" / "references").glob("*.tmp"))  # renamed into place, nothing left over
    monkeypatch.setattr(runner, "_REFERENCE_MEMO", {})  # another process: only the cache on disk
    again = ev.reference_rows(DualEncoder(str(tiny_bert)), out=tmp_path / "b")
    assert calls == ["dense", "bm25"] and again == first
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    qrels = next(folder.rglob("test.tsv"))
    qrels.write_text(qrels.read_text() + "\n")  # an edited set file: its rows are computed again
    monkeypatch.setattr(runner, "_REFERENCE_MEMO", {})
    ev.reference_rows(DualEncoder(str(tiny_bert)), out=tmp_path / "c")
    assert calls == ["dense", "bm25", "dense", "bm25"]


def _raw_ranx(qrels, run, metrics):
    from ranx import Qrels as RQrels
    from ranx import Run as RRun
    from ranx import evaluate

    return evaluate(RQrels(qrels), RRun(run), list(metrics), make_comparable=True)


def test_fixed_width_ids_give_ranx_s_metrics_on_the_raw_ids_ties_included():
    from multipos.evaluation.metrics import ID_WIDTH, fixed_width_ids

    rng = np.random.default_rng(0)
    # ids of several lengths, the longest ID_WIDTH characters: ranx compiles its functions once per id width, and that
    # width is the one `make install` compiles (raw ids 6 wide cost this test 48 s of numba on a fresh checkout)
    ids = [f"doc-{i}-".ljust(ID_WIDTH - i % 4, "x") if i % 3 else f"{i}" for i in range(60)]
    assert max(map(len, ids)) == ID_WIDTH and len(set(map(len, ids))) > 3
    qrels = {f"q{j}": {ids[i]: int(rng.integers(1, 3)) for i in rng.choice(60, 4, replace=False)} for j in range(25)}
    run = {f"q{j}": {ids[i]: float(rng.integers(0, 4)) for i in rng.choice(60, 30, replace=False)}  # many tied scores
           for j in range(25)}
    q, r = fixed_width_ids(qrels, run)
    assert {len(d) for docs in [*q.values(), *r.values()] for d in docs} == {10}
    assert [list(v.values()) for v in r.values()] == [list(v.values()) for v in run.values()]  # order kept
    metrics = ("ndcg@10", "mrr@10", "recall@20", "precision@5")
    assert _raw_ranx(q, r, metrics) == _raw_ranx(qrels, run, metrics)


def test_sets_with_other_id_lengths_compile_nothing_new_in_ranx():
    """ranx compiles its functions once per id width; the fixed-width codes give every set the same one."""
    import ranx.data_structures.common as common

    def signatures():
        return sum(len(f.signatures) for f in vars(common).values() if hasattr(f, "signatures"))

    for width in (3, 12, 7):
        qrels = {"q1": {"d".ljust(width, "x"): 1}, "q2": {"e".ljust(width, "y"): 2}}
        run = {"q1": {"d".ljust(width, "x"): 0.5, "z".ljust(width, "z"): 0.9}, "q2": {"e".ljust(width, "y"): 0.1}}
        evaluate_run(qrels, run, ("ndcg@10", "recall@100"))
        if width == 3:
            compiled = signatures()
    assert signatures() == compiled


def test_compile_metrics_leaves_nothing_for_an_evaluation_to_compile():
    """make install runs compile_metrics so the first evaluation of a checkout loads numba's cache: every ranx
    function an evaluation of graded qrels with per-query values needs has its signature compiled by then."""
    import sys

    from multipos.evaluation.metrics import compile_metrics

    def signatures():
        return sum(len(f.signatures) for name, mod in list(sys.modules.items()) if name.startswith("ranx.")
                   for f in vars(mod).values() if hasattr(f, "signatures"))

    assert compile_metrics() >= 0
    compiled = signatures()
    assert compiled > 0
    rng = np.random.default_rng(1)
    qrels = {f"Q-{j}": {f"MED-{i}": int(rng.integers(1, 3)) for i in rng.choice(500, 6, replace=False)}
             for j in range(30)}
    run = {q: {f"MED-{i}": float(rng.random()) for i in rng.choice(500, 100, replace=False)} for q in qrels}
    evaluate_run(qrels, run, per_query=True, relevance_threshold=2)
    assert signatures() == compiled
