"""A score-threshold judge: relevance graded from a bi-encoder's score, the baseline an LLM judge has to beat.

Not a language model: :class:`ScoreThresholdJudge` embeds the query and the passage with a DualEncoder checkpoint
(e.g. the starting model, all-MiniLM-L6-v2) and grades the pair by its score s(q, p) (cosine for a normalising
model) against ascending thresholds t_1 ≤ t_2 ≤ t_3: grade = #{i : s ≥ t_i} ∈ {0, 1, 2, 3}. It answers the relevance
stage only (no pseudo-answer or utility), in one batch, and is never malformed. ``python -m
multipos.annotate.agreement`` measures its agreement with human grades and calibrates a single threshold (the one of
highest Cohen's κ on training queries); ``judge.thresholds`` takes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from multipos.annotate.judges import JudgeStats

__all__ = ["ScoreThresholdJudge", "grades_from_scores"]


def grades_from_scores(scores: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """Grades [n] int: how many of the ascending ``thresholds`` each score [n] reaches (s ≥ t counts).
    Raises ValueError when the thresholds are empty, more than 3, or not ascending."""
    t = [float(x) for x in thresholds]
    if not 1 <= len(t) <= 3 or any(b < a for a, b in zip(t, t[1:])):
        raise ValueError(f"judge.thresholds must be 1 to 3 ascending scores (grades 1..3), got {list(thresholds)}")
    return (np.asarray(scores, dtype=np.float64)[:, None] >= np.asarray(t)[None, :]).sum(axis=1)


class ScoreThresholdJudge:
    """Grades (query, passage) pairs by a DualEncoder's score (module docstring).

    Args: model: a DualEncoder checkpoint (folder or name resolved like every model setting); thresholds: 1-3
    ascending scores, the lowest score of grade 1, 2, 3 (one threshold: grades 0 or 1); cache: folder of the corpus
    embedding cache (:func:`multipos.retrieval.encoding.cached_encode`), None to encode every time.
    """

    backend = "score_threshold"

    def __init__(self, model: str, thresholds: Sequence[float], cache: Path | None = None):
        grades_from_scores(np.zeros(1), thresholds)  # validates
        self.model, self.thresholds, self.cache = str(model), [float(t) for t in thresholds], cache
        self.stats = JudgeStats()

    def grade(self, pairs: Sequence[tuple[str, str]], queries: dict[str, str], passages: dict[str, str]
              ) -> list[int]:
        """Grades of ``pairs`` [(query id, passage id)], texts from ``queries`` / ``passages`` (id → text)."""
        from multipos.model.encoder import DualEncoder
        from multipos.retrieval.encoding import cached_encode, encode

        start = time.perf_counter()
        encoder = DualEncoder(self.model)
        pids = sorted({p for _, p in pairs})
        qids = sorted({q for q, _ in pairs})
        p_emb = cached_encode(encoder, pids, [passages[p] for p in pids], self.cache, tag="judged passages",
                              kind="passage", progress=False)
        q_emb = encode(encoder, [queries[q] for q in qids], kind="query", progress=False)
        prow, qrow = {p: i for i, p in enumerate(pids)}, {q: i for i, q in enumerate(qids)}
        scores = np.einsum("nh,nh->n", q_emb[[qrow[q] for q, _ in pairs]], p_emb[[prow[p] for _, p in pairs]])
        self.stats.calls += len(pairs)
        self.stats.seconds += time.perf_counter() - start
        return [int(g) for g in grades_from_scores(scores, self.thresholds)]
