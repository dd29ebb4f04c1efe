"""BM25 (multipos.retrieval.bm25) ranks on the CPU with numpy: never bm25s's JAX backend."""

from __future__ import annotations

from multipos.data.types import Corpus, Passage
from multipos.retrieval.bm25 import BM25


def test_search_runs_bm25s_top_k_in_numpy_not_jax(monkeypatch):
    """With JAX installed, bm25s's default backend ("auto") runs top-k in JAX, which preallocates 75 % of the GPU's
    memory in the calling process: on an H100 (2026-11-25) the BM25 reference left training out of CUDA memory and
    parallel runs failed with "no supported devices found for platform CUDA"."""
    corpus = Corpus({p: Passage(p, "", t) for p, t in
                     {"a": "statin lowers cholesterol", "b": "bone calcium diet", "c": "heart artery statin"}.items()})
    bm25 = BM25(corpus, progress=False)
    seen = {}
    real = bm25._index.retrieve
    monkeypatch.setattr(bm25._index, "retrieve", lambda *a, **k: (seen.update(k), real(*a, **k))[1])
    run = bm25.search({"q": "statin heart"}, k=2)
    assert seen["backend_selection"] == "numpy"
    assert list(run["q"]) == ["c", "a"]
