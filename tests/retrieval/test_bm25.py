"""BM25 (multipos.retrieval.bm25) ranks on the CPU with numpy: never bm25s's JAX backend."""

from __future__ import annotations

from multipos.formats.types import Corpus, Passage
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


def test_bm25s_is_imported_without_jax(tmp_path):
    """bm25s imports JAX and calls ``jax.lax.top_k`` at import time when JAX is installed; on a GPU machine that first
    JAX call took 75 % of the H100's memory in the process (2026-11-25: 73 suite failures and every parallel study run
    out of CUDA memory), and JAX's threads made each DataLoader worker's fork a deadlock risk (H200, 2026-11-26). With
    a stand-in ``jax`` installed: BM25 works, bm25s takes JAX as absent, JAX is not imported, and the process can
    still import it afterwards; a process that imported JAX first keeps it."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "fake" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import json, os\njson.dump('imported', open(os.environ['SEEN_AT'], 'a'))\n")
    (fake / "lax.py").write_text("def top_k(x, k):\n    return x[:k], list(range(k))\n")
    script = ("import sys\n"
              "if sys.argv[1] == 'first': import jax\n"
              "from multipos.retrieval.bm25 import BM25\n"
              "from multipos.formats.types import Corpus, Passage\n"
              "bm25 = BM25(Corpus({'a': Passage('a', '', 'statin heart')}), progress=False)\n"
              "import bm25s.selection\n"
              "print(bm25s.selection.JAX_IS_AVAILABLE, 'jax' in sys.modules)\n"
              "import jax\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    for jax_first, expected in (("no", "False False"), ("first", "True True")):
        seen = tmp_path / f"seen-{jax_first}.json"
        done = subprocess.run([sys.executable, "-c", script, jax_first], env=dict(env, SEEN_AT=str(seen)),
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == expected.split()  # (bm25s uses JAX, JAX imported) after building the index
        assert seen.read_text().count("imported") == 1  # by the script's own import of jax, first or last
