"""Sharded corpus encoding (memory-mapped shards + manifest, several gloo processes) and exact top-k merged
across shards: equal, ids and scores, to the single-index dense retrieval path, ties included."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from multipos.retrieval.shards import (
    MANIFEST,
    ShardedEmbeddings,
    distributed_search,
    encode_shards,
    save_shards,
    search_shards,
    shard_bounds,
    shards_for_memory,
)
from multipos.retrieval.topk import merge_topk


def _exact_run(q: np.ndarray, p: np.ndarray, qids, pids, k: int) -> dict:
    """Brute force: top-k by score descending, then corpus row ascending (integer scores are exact)."""
    run = {}
    for qid, row in zip(qids, q.astype(np.int64) @ p.astype(np.int64).T):
        order = np.lexsort((np.arange(len(row)), -row))[:k]
        run[qid] = {pids[j]: float(row[j]) for j in order}
    return run


@pytest.fixture(autouse=True)
def _one_thread():
    """Every encoding here on one thread, like the gloo workers: a matrix product summed over another number of
    threads differs in its last bits, and these tests compare scores bit for bit."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _same(a: dict, b: dict) -> None:
    """Same queries, same passage ids in the same order, bit-identical scores."""
    assert list(a) == list(b)
    for q in a:
        assert list(a[q].items()) == list(b[q].items()), q


def test_shard_bounds_contiguous_and_balanced():
    bounds = shard_bounds(10, 4)
    assert bounds == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert shard_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]
    with pytest.raises(ValueError, match="num_shards"):
        shard_bounds(5, 0)


def test_shards_for_memory():
    assert shards_for_memory(8_841_823, 768, 16e9) == 2
    assert shards_for_memory(21_015_324, 768, 16e9) == 5
    assert shards_for_memory(21_015_324, 768, 80e9, bytes_per_value=2) == 1


def test_merge_orders_by_score_then_row():
    scores = [np.array([[3.0, 1.0]], np.float32), np.array([[3.0, 2.0, 0.0]], np.float32)]
    rows = [np.array([[7, 2]]), np.array([[4, 9, -1]])]
    d, i = merge_topk(scores, rows, 3)
    assert i.tolist() == [[4, 7, 9]] and d.tolist() == [[3.0, 3.0, 2.0]]


@pytest.mark.parametrize("n_queries", [5, 25])  # FAISS scores < 20 queries one by one, ≥ 20 with BLAS
def test_exact_topk_with_ties_is_the_same_for_every_sharding(tmp_path, n_queries):
    """Small-integer embeddings with many duplicate passages: scores are exact integers, so hundreds of
    passages tie at the k-th score; every sharding and the single index give the brute-force top-k."""
    from multipos.retrieval.dense import search

    rng = np.random.default_rng(0)
    p = rng.integers(-1, 3, (12, 8))[rng.integers(0, 12, 300)].astype(np.float32)  # 12 distinct rows
    q = rng.integers(-1, 3, (n_queries, 8)).astype(np.float32)
    pids, qids = [f"p{j}" for j in range(len(p))], [f"q{j}" for j in range(len(q))]
    k = 40
    expected = _exact_run(q, p, qids, pids, k)
    _same(search(q, p, qids, pids, k=k), expected)
    _same(search(q, p, qids, pids, k=k, shard_size=37), expected)
    for num_shards in (1, 3, 7):
        save_shards(p, pids, tmp_path / str(num_shards), num_shards)
        _same(search_shards(q, ShardedEmbeddings.open(tmp_path / str(num_shards)), qids, k=k), expected)


@pytest.fixture(scope="module")
def tiny_setup(tiny_bert, tiny_beir):
    from multipos.evaluation.sets import EvalSet
    from multipos.model.encoder import DualEncoder

    model = DualEncoder(str(tiny_bert), pooling="mean", normalize=False, passage_max_length=64)
    data = EvalSet("tiny", str(tiny_beir), split="test").load()
    return model, data


def _dense_reference(model, data, k):
    """The single-process path: cached-encode the corpus in one piece, one FAISS index (batch size 1 so that
    every passage is encoded alone and its embedding does not depend on its batch)."""
    from multipos.retrieval.dense import dense_run

    return dense_run(model, data, k=k, batch_size=1, bf16=False, cache=None, progress=False, device=None)


def test_sharded_encoding_equals_dense_run(tiny_setup, tmp_path):
    from multipos.retrieval.encoding import encode

    model, data = tiny_setup
    pids = data.corpus.ids
    texts = data.corpus.texts(pids)
    folder = tmp_path / "shards"
    for rank in range(2):  # two "ranks" by hand (no process group): shards 0, 2 / 1, 3
        encode_shards(model, pids, texts, folder, num_shards=4, rank=rank, world_size=2, batch_size=1, bf16=False)
    store = ShardedEmbeddings.open(folder)
    assert [(s["start"], s["stop"]) for s in store.shards] == shard_bounds(len(pids), 4)
    assert store.meta["model"] == model.fingerprint() and store.dtype == "float32"
    assert all(isinstance(store.embeddings(i), np.memmap) for i in range(4))
    assert not list(folder.glob("*.tmp-*")), "temporary files left behind"
    qids = list(data.queries)
    q_emb = encode(model, [data.queries[q] for q in qids], "query", batch_size=1, bf16=False, progress=False,
                   device=None)  # where the shards were encoded: exact equality holds on one device
    k = 15
    _same(search_shards(q_emb, store, qids, k=k), _dense_reference(model, data, k))

    half = tmp_path / "fp16"
    encode_shards(model, pids, texts, half, num_shards=3, dtype="float16", batch_size=1, bf16=False)
    fp16 = search_shards(q_emb, ShardedEmbeddings.open(half), qids, k=k)
    assert fp16.keys() == data.queries.keys() and all(len(v) == k for v in fp16.values())
    assert np.load(half / "shard-00000.npy", mmap_mode="r").dtype == np.float16


def _worker(rank: int, world: int, init: str, bert: str, beir: str, out: str, k: int) -> None:
    """One gloo rank: encode its shards of the tiny corpus, search its shards, rank 0 writes the merged run."""
    import torch
    import torch.distributed as dist

    from multipos.evaluation.sets import EvalSet
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import encode

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = DualEncoder(bert, pooling="mean", normalize=False, passage_max_length=64)
        data = EvalSet("tiny", beir, split="test").load()
        pids = data.corpus.ids
        encode_shards(model, pids, data.corpus.texts(pids), Path(out) / "shards", num_shards=5, batch_size=1,
                      bf16=False)
        qids = list(data.queries)
        # device=None: where the shards were encoded (the CPU); "auto" would move the model to a GPU where there is
        # one, and GPU fp32 scores differ from the CPU reference in the 7th digit (H100, 2026-11-25)
        q_emb = encode(model, [data.queries[q] for q in qids], "query", batch_size=1, bf16=False, progress=False,
                       device=None)
        run = distributed_search(q_emb, ShardedEmbeddings.open(Path(out) / "shards"), qids, k=k)
        assert (run is None) == (rank != 0)
        if rank == 0:
            (Path(out) / "run.json").write_text(json.dumps(run))
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_five_shards_equal_dense_run(tiny_setup, tiny_bert, tiny_beir, tmp_path):
    import torch.multiprocessing as mp

    model, data = tiny_setup
    k = 15
    # forkserver: the stack is imported once (in the server), not once per rank as with spawn
    mp.get_context("forkserver").set_forkserver_preload(["torch", "transformers", "faiss", "multipos.model.encoder"])
    mp.start_processes(_worker, args=(2, f"file://{tmp_path / 'rendezvous'}", str(tiny_bert), str(tiny_beir),
                                      str(tmp_path), k), nprocs=2, start_method="forkserver")
    manifest = json.loads((tmp_path / "shards" / MANIFEST).read_text())
    assert len(manifest["shards"]) == 5 and manifest["count"] == len(data.corpus)
    run = json.loads((tmp_path / "run.json").read_text())
    _same(run, _dense_reference(model, data, k))


def test_bad_folders_raise_clear_errors(tmp_path):
    p = np.eye(6, 4, dtype=np.float32)
    with pytest.raises(FileNotFoundError, match="no shard manifest"):
        ShardedEmbeddings.open(tmp_path)
    with pytest.raises(ValueError, match="duplicate passage ids"):
        save_shards(p, ["a"] * 6, tmp_path / "dup", 2)
    folder = tmp_path / "ok"
    save_shards(p, list("abcdef"), folder, 2)
    store = ShardedEmbeddings.open(folder)
    with pytest.raises(ValueError, match="do not match the corpus dim 4"):
        search_shards(np.ones((1, 3), np.float32), store, ["q"], k=2)
    (folder / "shard-00001.npy").unlink()
    with pytest.raises(FileNotFoundError, match="shard 1 .* is missing"):
        search_shards(np.ones((1, 4), np.float32), store, ["q"], k=2)
    meta = json.loads((folder / MANIFEST).read_text())
    meta["shards"][1]["start"] = 4
    (folder / MANIFEST).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"shards\[1\] covers rows 4–6"):
        ShardedEmbeddings.open(folder)


def test_failed_shard_write_leaves_nothing(tmp_path, monkeypatch):
    from multipos.retrieval import shards

    def boom(out):
        raise RuntimeError("encoder failed")

    with pytest.raises(RuntimeError, match="encoder failed"):
        shards._write_npy(tmp_path / "shard-00000.npy", (3, 2), "float32", boom)
    assert list(tmp_path.iterdir()) == []


def test_shard_job_writes_the_dense_run_and_reuses_its_shards(tiny_bert, tiny_beir, tmp_path, caplog):
    import logging

    from multipos.evaluation.sets import EvalSet
    from multipos.formats.trec import read_run
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.dense import dense_run
    from multipos.shard_job import main

    args = ["--model", str(tiny_bert), "--data", str(tiny_beir), "--split", "test", "--out", str(tmp_path),
            "--num-shards", "3", "--k", "10", "--batch-size", "1", "--no-bf16"]
    path = main(args)
    run = read_run(path)
    data = EvalSet("tiny", str(tiny_beir), split="test").load()
    expected = dense_run(DualEncoder(str(tiny_bert)), data, k=10, batch_size=1, bf16=False, cache=None, progress=False)
    assert list(run) == list(expected)
    for q in run:
        assert list(run[q]) == list(expected[q])
        assert np.allclose(list(run[q].values()), list(expected[q].values()), rtol=1e-5)
    stamp = (tmp_path / "shard-00000.npy").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="multipos.shard_job"):
        main(args)
    assert "reusing the shards" in caplog.text
    assert (tmp_path / "shard-00000.npy").stat().st_mtime_ns == stamp
