"""BM25 (multipos.retrieval.bm25) ranks on the CPU with numpy: never bm25s's JAX backend."""

from __future__ import annotations

from multipos.types import Corpus, Passage
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


def test_bm25s_is_imported_with_jax_kept_on_the_cpu(tmp_path):
    """bm25s calls ``jax.lax.top_k`` at import time when JAX is installed; on a GPU machine that first JAX call took
    75 % of the H100's memory in the process (2026-11-25: 73 suite failures and every parallel study run out of CUDA
    memory). A stand-in ``jax`` records the ``JAX_PLATFORMS`` it was imported under: it must be ``cpu``, and a value
    the user set must be kept."""
    import json
    import os
    import subprocess
    import sys

    fake = tmp_path / "fake" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, os, sys\n"
        "json.dump({'JAX_PLATFORMS': os.environ.get('JAX_PLATFORMS')}, open(os.environ['SEEN_AT'], 'w'))\n")
    (fake / "lax.py").write_text("def top_k(x, k):\n    return x[:k], list(range(k))\n")
    script = ("from multipos.retrieval.bm25 import BM25\n"
              "from multipos.types import Corpus, Passage\n"
              "BM25(Corpus({'a': Passage('a', '', 'statin heart')}), progress=False)\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    for preset, expected in ((None, "cpu"), ("cuda", "cuda")):
        seen = tmp_path / f"seen-{preset}.json"
        run_env = dict(env, SEEN_AT=str(seen), PYTHONPATH=os.pathsep.join([str(fake.parent), env.get("PYTHONPATH", "")]))
        if preset:
            run_env["JAX_PLATFORMS"] = preset
        done = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(seen.read_text()) == {"JAX_PLATFORMS": expected}
