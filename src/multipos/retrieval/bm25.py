"""BM25 lexical retrieval (via the ``bm25s`` library): the zero-shot baseline and the hard-negative miner."""

from __future__ import annotations

import sys

import numpy as np

from multipos.formats.types import BeirDataset, Corpus, Run


def import_bm25s():
    """Import ``bm25s`` without JAX; returns the module.

    bm25s imports JAX and runs ``jax.lax.top_k`` when it is imported, if JAX is installed (bm25s 0.3.16,
    ``selection.py``), though multipos asks it for numpy top-k selection (``backend_selection="numpy"``). On a GPU
    machine that first JAX call preallocated 75 % of the GPU's memory in the importing process (H100, 2026-11-25: every
    BM25 reference or negative miner left the training in that process, and every parallel run, out of CUDA memory),
    and JAX's threads then made every DataLoader worker fork a deadlock risk (H200, 2026-11-26: "os.fork() is
    incompatible with multithreaded code, and JAX is multithreaded"). So JAX is hidden while bm25s is imported (bm25s
    then takes it as not installed) and can be imported again afterwards; a process that imported JAX itself keeps
    it.
    """
    if "bm25s" in sys.modules or "jax" in sys.modules:
        import bm25s

        return bm25s
    hidden = ("jax", "jax.lax")
    sys.modules.update(dict.fromkeys(hidden))  # None: ``import jax`` raises ImportError, which bm25s catches
    try:
        import bm25s
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return bm25s


class BM25:
    """BM25 (Lucene variant, k1=0.9, b=0.4 as in Anserini/BEIR) over a corpus, English stemming and stop words.

    Args: corpus: passages indexed as ``title text``; k1, b: BM25 parameters; progress: bm25s's progress bars
    (tokenising, indexing, retrieving), None = only when stderr is a terminal.
    """

    def __init__(self, corpus: Corpus, k1: float = 0.9, b: float = 0.4, progress: bool | None = None):
        bm25s = import_bm25s()
        try:
            import Stemmer

            self._stemmer = Stemmer.Stemmer("english")
        except ImportError:  # pragma: no cover - PyStemmer is a dependency
            self._stemmer = None
        self.progress = sys.stderr.isatty() if progress is None else bool(progress)
        self.ids = corpus.ids
        self._bm25s = bm25s
        self._index = bm25s.BM25(k1=k1, b=b, method="lucene")
        tokens = bm25s.tokenize(corpus.texts(), stopwords="en", stemmer=self._stemmer, show_progress=self.progress)
        self._index.index(tokens, show_progress=self.progress)

    def search(self, queries: dict[str, str], k: int = 1000) -> Run:
        """Top-``k`` passages per query: {query id → {passage id → BM25 score}} (fewer if the corpus is smaller)."""
        if not queries:
            return {}
        qids = list(queries)
        k = min(k, len(self.ids))
        tokens = self._bm25s.tokenize([queries[q] for q in qids], stopwords="en", stemmer=self._stemmer,
                                        show_progress=self.progress)
        # backend "numpy", never bm25s's "auto": with JAX installed (common on GPU machines) "auto" runs top-k in JAX,
        # whose first use preallocates 75 % of the GPU's memory in this process (seen on an H100: training then ran
        # out of CUDA memory, and parallel runs failed with "no supported devices found for platform CUDA")
        idx, scores = self._index.retrieve(tokens, k=k, show_progress=self.progress, n_threads=1,
                                           backend_selection="numpy")
        run: Run = {}
        for row, qid in enumerate(qids):
            keep = scores[row] > 0  # bm25s pads with zero-score hits when fewer terms match
            run[qid] = {self.ids[int(i)]: float(s)
                        for i, s in zip(np.asarray(idx[row])[keep], np.asarray(scores[row])[keep])}
        return run


_BM25_CACHE: dict[str, Run] = {}


def bm25_run(data: BeirDataset, k: int = 1000) -> Run:
    """BM25 top-``k`` run over ``data``'s corpus (bm25s, Lucene BM25 k1=0.9 b=0.4), memoised per process."""
    key = f"{data.name}|{len(data.corpus)}|{len(data.queries)}|{k}"
    if key not in _BM25_CACHE:
        _BM25_CACHE[key] = BM25(data.corpus).search(data.queries, k=k)
    return _BM25_CACHE[key]
