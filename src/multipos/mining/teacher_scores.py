"""Soft targets from a teacher's scores, read from a file: a TREC run or a JSONL file, one query a line.

Formats (detected by the file name: ``.jsonl`` is JSONL, anything else a TREC run):

* TREC run: ``qid Q0 docid rank score tag`` (any reranker's output, e.g. a cross-encoder over the training groups);
* JSONL with ``{"query_id": ..., "scores": {docid: score, ...}}``, or Tevatron lines (``query_id``,
  ``positive_passages`` / ``negative_passages``) whose passages carry a ``score`` (FlagEmbedding's distillation data
  in that schema).

:class:`TeacherScores` gives each training query its raw scores (``TrainQuery.teacher_scores``, the targets of
``margin_mse``, in the units of the student's scores, i.e. dot product / τ) and, as target weights
(``TrainQuery.weights``, for ``kl``, ``jointlh_weighted``, ``summarglh_weighted``), their softmax over the query's
scored passages at the teacher temperature (:func:`multipos.losses.soft_targets`). Bad input names file, line and field.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multipos.formats.trec import read_run
from multipos.formats.types import DataFormatError, TrainQuery, iter_jsonl

__all__ = ["TeacherScores", "assign_targets", "read_teacher_scores"]

log = logging.getLogger(__name__)


def _score(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataFormatError(f"{where}: score {value!r} is not a finite number")
    return float(value)


def read_teacher_scores(path: str | Path) -> dict[str, dict[str, float]]:
    """{query id → {passage id → teacher score}} from a TREC run or a JSONL file (module docstring).

    Raises FileNotFoundError for a missing file; DataFormatError naming file, line and field for a bad line, a
    score that is not a finite number, or a query given on two lines.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: teacher score file (data.source.teacher_scores.path) not found")
    if path.suffix != ".jsonl":
        return read_run(path)
    out: dict[str, dict[str, float]] = {}
    first: dict[str, int] = {}
    for n, obj in iter_jsonl(path):
        where = f"{path}:{n}"
        if not isinstance(obj.get("query_id"), (str, int)):
            raise DataFormatError(f"{where}: missing field 'query_id'")
        qid = str(obj["query_id"])
        if qid in first:
            raise DataFormatError(f"{where}: query {qid!r} given again (first at line {first[qid]})")
        first[qid] = n
        scores: dict[str, float] = {}
        if "scores" in obj:
            if not isinstance(obj["scores"], dict):
                raise DataFormatError(f"{where}: field 'scores' must be an object {{docid: score}}")
            scores = {str(p): _score(s, f"{where}: scores[{p!r}]") for p, s in obj["scores"].items()}
        else:
            for key in ("positive_passages", "negative_passages"):
                for i, passage in enumerate(obj.get(key) or []):
                    at = f"{where}: {key}[{i}]"
                    if not isinstance(passage, dict) or "docid" not in passage:
                        raise DataFormatError(f"{at}: a passage object with 'docid' and 'score' expected")
                    if "score" not in passage:
                        raise DataFormatError(f"{at}: missing field 'score'")
                    scores[str(passage["docid"])] = _score(passage["score"], f"{at}.score")
            if not scores:
                raise DataFormatError(f"{where}: no field 'scores' and no scored passages")
        out[qid] = scores
    return out


@dataclass
class TeacherScores:
    """``data.source.teacher_scores``: ``{path, temperature}`` (temperature τ_t > 0 of the target softmax).

    Raises ValueError naming the field for a temperature ≤ 0.
    """

    path: str
    temperature: float = 1.0

    def __post_init__(self):
        if not float(self.temperature) > 0:
            raise ValueError(f"data.source.teacher_scores.temperature must be > 0, got {self.temperature}")

    @classmethod
    def from_config(cls, setting) -> TeacherScores | None:
        return None if not setting else cls(**dict(setting))

    def apply(self, queries: Sequence[TrainQuery]) -> dict:
        """Give each query its teacher scores and target weights from the file (:func:`assign_targets`)."""
        return assign_targets(queries, read_teacher_scores(self.path), self.temperature, self.path)


def assign_targets(queries: Sequence[TrainQuery], table: dict[str, dict[str, float]], temperature: float,
                   source: str = "teacher") -> dict:
    """Give each query its raw teacher scores (``TrainQuery.teacher_scores``) and their softmax at ``temperature``
    over the query's scored passages as target weights (``TrainQuery.weights``; a positive without a score gets
    weight 0, with a warning giving the count) → counts ``{queries, scored_queries, positives, unscored_positives}``."""
    scored = unscored = positives = 0
    for q in queries:
        scores = table.get(q.query_id)
        pos = [*q.gold, *q.silver]
        positives += len(pos)
        if not scores:
            unscored += len(pos)
            continue
        scored += 1
        unscored += sum(p not in scores for p in pos)
        top = max(scores.values())
        exp = {p: math.exp((s - top) / temperature) for p, s in scores.items()}
        total = sum(exp.values())
        q.teacher_scores = dict(scores)
        q.weights = {p: e / total for p, e in exp.items()}
    if unscored:
        log.warning("%s: %d of %d training positives have no teacher score (target weight 0)", source, unscored,
                    positives)
    return {"queries": len(queries), "scored_queries": scored, "positives": positives,
            "unscored_positives": unscored}
