"""FAISS index kinds, sharded search and the GPU guard (synthetic numpy data only)."""

from __future__ import annotations

import logging

import faiss
import numpy as np
import pytest
import torch

from multipos.retrieval.dense import build_index, default_nlist, gpu_available, search, search_index


def _clustered(n: int, dim: int, n_queries: int, seed: int = 0, clusters: int = 20):
    """Unit vectors around ``clusters`` random centres; queries are noisy copies of random passages."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    p = centres[rng.integers(0, clusters, n)] + 0.6 * rng.normal(size=(n, dim))
    p = (p / np.linalg.norm(p, axis=1, keepdims=True)).astype(np.float32)
    q = p[rng.integers(0, n, n_queries)] + 0.3 * rng.normal(size=(n_queries, dim))
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    return q, p


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _recall_at_10(approx, exact) -> float:
    return float(np.mean([len(set(list(approx[q])[:10]) & set(list(exact[q])[:10])) / 10 for q in exact]))


# ------------------------------------------------------------------------------------------ index kinds


def test_flat_is_exact_against_numpy():
    rng = np.random.default_rng(1)
    p = rng.normal(size=(400, 16)).astype(np.float32)
    q = rng.normal(size=(25, 16)).astype(np.float32)  # ≥ 20 queries: FAISS takes its BLAS path
    run = search(q, p, _ids("q", 25), _ids("p", 400), k=30)
    scores = q @ p.T
    for r in range(25):
        best = np.argsort(-scores[r])[:30]
        assert list(run[f"q{r}"]) == [f"p{i}" for i in best]
        np.testing.assert_allclose(list(run[f"q{r}"].values()), scores[r, best], rtol=1e-5, atol=1e-5)
        assert all(type(s) is float for s in run[f"q{r}"].values())


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_kinds_recall_against_flat(kind):
    q, p = _clustered(2000, 32, 60)
    qids, pids = _ids("q", 60), _ids("p", 2000)
    exact = search(q, p, qids, pids, k=100)
    approx = search(q, p, qids, pids, k=100, index_kind=kind)
    assert _recall_at_10(approx, exact) >= 0.9
    assert all(len(approx[x]) == 100 for x in qids)
    for x in qids:  # scores of an approximate index are still the exact inner products of what it returns
        s = list(approx[x].values())
        assert s == sorted(s, reverse=True)
        j = int(next(iter(approx[x]))[1:])
        assert approx[x][f"p{j}"] == pytest.approx(float(q[int(x[1:])] @ p[j]), abs=1e-5)


def test_index_parameters_are_applied():
    _, p = _clustered(1000, 16, 1)
    hnsw = build_index(p, "hnsw", hnsw_m=8, ef_construction=40, ef_search=64)
    assert isinstance(hnsw, faiss.IndexHNSWFlat) and hnsw.metric_type == faiss.METRIC_INNER_PRODUCT
    assert (hnsw.hnsw.efConstruction, hnsw.hnsw.efSearch, hnsw.ntotal) == (40, 64, 1000)
    assert hnsw.hnsw.nb_neighbors(1) == 8  # M links on the upper levels (2·M on level 0)
    ivf = build_index(p, "ivf", nlist=16, nprobe=4)
    assert isinstance(ivf, faiss.IndexIVFFlat) and ivf.metric_type == faiss.METRIC_INNER_PRODUCT
    assert (ivf.nlist, ivf.nprobe, ivf.ntotal, ivf.is_trained) == (16, 4, 1000, True)
    default = build_index(p, "ivf")
    assert default.nlist == default_nlist(1000) == 25 and default.nprobe == 25  # nprobe 32 clamped to nlist
    assert build_index(p[:5], "ivf", nlist=50).nlist == 5  # clamped to N


def test_hnsw_search_widens_the_beam_to_k():
    q, p = _clustered(2000, 16, 20, seed=4)
    index = build_index(p, "hnsw", ef_search=16)
    scores, ids = search_index(index, q, 300, query_batch_size=6)
    assert index.hnsw.efSearch == 16  # searched with efSearch = k through SearchParameters, index untouched
    assert scores.shape == ids.shape == (20, 300) and (ids >= 0).all()
    _, exact = search_index(build_index(p), q, 300)
    assert np.mean([len(set(a) & set(e)) / 300 for a, e in zip(ids.tolist(), exact.tolist())]) >= 0.9


def test_default_nlist_heuristic():
    assert default_nlist(100_000) == 1265  # 4·√N
    assert default_nlist(8_841_823) == 11894
    assert default_nlist(1000) == 25  # ≥ 39 training points per list
    assert default_nlist(1) == default_nlist(10) == 1


def test_ivf_probing_every_list_is_exact():
    q, p = _clustered(600, 16, 30, seed=3)
    exact = search(q, p, _ids("q", 30), _ids("p", 600), k=50)
    ivf = search(q, p, _ids("q", 30), _ids("p", 600), k=50, index_kind="ivf", nlist=8, nprobe=8)
    for x in exact:
        assert list(ivf[x]) == list(exact[x])
        np.testing.assert_allclose(list(ivf[x].values()), list(exact[x].values()), rtol=1e-5, atol=1e-6)


def test_ivf_trains_on_a_seeded_sample_of_a_big_corpus(monkeypatch):
    _, p = _clustered(3000, 8, 1)
    seen = []
    train = faiss.IndexIVFFlat.train
    monkeypatch.setattr(faiss.IndexIVFFlat, "train", lambda self, x: (seen.append(x.copy()), train(self, x))[1])
    build_index(p, "ivf", nlist=4)
    build_index(p, "ivf", nlist=4)
    assert seen[0].shape == (256 * 4, 8)  # not all 3000 passages
    np.testing.assert_array_equal(seen[0], seen[1])  # same sample each time
    assert {tuple(r) for r in seen[0]} <= {tuple(r) for r in p}


@pytest.mark.parametrize("call", [lambda p: build_index(p, "ivfpq"),
                                  lambda p: search(p[:2], p, ["a", "b"], _ids("p", 10), index_kind="ivfpq")])
def test_unknown_index_kind(call):
    p = np.eye(10, 4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"'ivfpq'.*eval\.index.*flat, hnsw, ivf"):
        call(p)


# -------------------------------------------------------------------------------------- sharded search


@pytest.mark.parametrize("shard_size", [1, 7, 64, 333, 500, 10_000])
@pytest.mark.parametrize("k", [5, 100, 600])
def test_sharded_flat_equals_unsharded(shard_size, k):
    rng = np.random.default_rng(shard_size + k)
    p = rng.normal(size=(500, 24)).astype(np.float32)
    q = rng.normal(size=(30, 24)).astype(np.float32)
    qids, pids = _ids("q", 30), _ids("p", 500)
    whole = search(q, p, qids, pids, k=k)
    sharded = search(q, p, qids, pids, k=k, shard_size=shard_size, query_batch_size=7)
    assert all(len(whole[x]) == min(k, 500) for x in qids)
    for x in qids:
        assert list(sharded[x]) == list(whole[x])
        np.testing.assert_allclose(list(sharded[x].values()), list(whole[x].values()), rtol=1e-6, atol=1e-6)


def test_ties_are_ordered_by_passage_row():
    rng = np.random.default_rng(7)
    p = np.tile(rng.normal(size=(10, 8)).astype(np.float32), (5, 1))  # row j ties with j ± 10, 20, ...
    q = rng.normal(size=(4, 8)).astype(np.float32)
    whole = search(q, p, _ids("q", 4), _ids("p", 50), k=50)
    for shard_size in (3, 10, 16):
        assert search(q, p, _ids("q", 4), _ids("p", 50), k=50, shard_size=shard_size) == whole
    for r in range(4):
        rows = [int(d[1:]) for d in whole[f"q{r}"]]
        best = int(np.argmax(p[:10] @ q[r]))
        assert rows[:5] == [best, best + 10, best + 20, best + 30, best + 40]


def test_sharded_search_reads_a_memmap(tmp_path):
    q, p = _clustered(1000, 16, 20, seed=5)
    mm = np.lib.format.open_memmap(tmp_path / "p.npy", mode="w+", dtype=np.float16, shape=p.shape)
    mm[:] = p
    mm.flush()
    mm = np.load(tmp_path / "p.npy", mmap_mode="r")
    expected = search(q, mm[:].astype(np.float32), _ids("q", 20), _ids("p", 1000), k=50)
    got = search(q, mm, _ids("q", 20), _ids("p", 1000), k=50, shard_size=300)
    for x in expected:
        assert list(got[x]) == list(expected[x])


def test_k_larger_than_corpus_returns_every_passage_best_first():
    rng = np.random.default_rng(2)
    p = rng.normal(size=(12, 8)).astype(np.float32)
    q = rng.normal(size=(3, 8)).astype(np.float32)
    for kw in ({}, {"shard_size": 5}, {"index_kind": "hnsw"}):
        run = search(q, p, ["a", "b", "c"], _ids("p", 12), k=1000, **kw)
        for r, x in enumerate("abc"):
            assert list(run[x]) == [f"p{i}" for i in np.argsort(-(p @ q[r]))]


def test_search_rejects_mismatched_ids():
    p = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="passage ids"):
        search(p, p, _ids("q", 4), _ids("p", 3))
    with pytest.raises(ValueError, match="k must be"):
        search(p, p, _ids("q", 4), _ids("p", 4), k=0)
    assert search(p, p[:0], _ids("q", 4), [], k=5) == {f"q{i}": {} for i in range(4)}


# ------------------------------------------------------------------------------------------- GPU guard


@pytest.fixture
def fake_gpus(monkeypatch):
    """faiss reports 2 GPUs, torch sees CUDA, and the GPU move is recorded (the CPU index stands in)."""
    moved = []

    def to_all_gpus(index, co=None, ngpu=-1):
        moved.append((type(index).__name__, index.ntotal, index.is_trained, getattr(index, "nprobe", None)))
        return index

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", to_all_gpus, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return moved


def test_auto_on_this_cpu_machine_stays_on_cpu():
    if gpu_available():
        pytest.skip("a GPU is present")
    p = np.eye(40, 8, dtype=np.float32)
    assert type(build_index(p)) is faiss.IndexFlatIP
    assert type(build_index(p, "ivf", use_gpu="auto")) is faiss.IndexIVFFlat
    for kind in ("flat", "ivf"):
        with pytest.raises(RuntimeError, match="faiss-gpu"):
            build_index(p, kind, use_gpu=True)


def test_auto_moves_flat_and_ivf_to_gpus_when_present(fake_gpus, caplog):
    assert gpu_available()
    _, p = _clustered(300, 8, 1)
    assert build_index(p, "flat").ntotal == 300
    assert build_index(p, "ivf", nlist=4, nprobe=2).ntotal == 300
    # moved while empty (the corpus is added on the GPU), the IVF index untrained (k-means on the GPU)
    assert fake_gpus == [("IndexFlatIP", 0, True, None), ("IndexIVFFlat", 0, False, 2)]
    with caplog.at_level(logging.INFO, logger="multipos.retrieval.dense"):
        assert type(build_index(p, "hnsw", hnsw_m=4, ef_construction=8)) is faiss.IndexHNSWFlat
    assert len(fake_gpus) == 2 and "no GPU HNSW" in caplog.text
    build_index(p, "flat", use_gpu=False)
    build_index(p, "flat", use_gpu=True)
    assert len(fake_gpus) == 3


def test_gpu_needs_both_faiss_gpus_and_torch_cuda(fake_gpus, monkeypatch):
    p = np.eye(10, 4, dtype=np.float32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not gpu_available()
    build_index(p)
    with pytest.raises(RuntimeError, match="faiss-gpu-cu12"):
        build_index(p, use_gpu=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    assert not gpu_available()
    monkeypatch.delattr(faiss, "get_num_gpus")
    assert not gpu_available()
    build_index(p)
    assert fake_gpus == []
    with pytest.raises(ValueError, match="use_gpu"):
        build_index(p, use_gpu="yes")
