"""The data model shared by the readers (:mod:`multipos.formats`), mining, training data, retrieval and evaluation:
passages, corpora, qrels, runs, a loaded BEIR-style dataset and a training query with its positives and hard negatives
(:class:`TrainQuery`, the positive regimes, the hard-negative exclusion rule), plus the line readers the readers are
built on. It imports nothing else of
multipos, so every layer can use it.

Every error names the file and line (1-based) or the field at fault (:class:`DataFormatError`).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["Qrels", "Run", "DataFormatError", "Passage", "Corpus", "BeirDataset", "iter_lines", "iter_jsonl",
           "get_field", "REGIMES", "REGIME_RULES", "REGIME_TIERS", "regimes_without_positives", "TrainQuery",
           "unjudged_negatives"]

Qrels = dict[str, dict[str, int]]  # query id → {passage id → grade}


Run = dict[str, dict[str, float]]  # query id → {passage id → score}


class DataFormatError(ValueError):
    """Malformed input file; the message names the file, line and field."""


@dataclass
class Passage:
    """One corpus passage (title may be empty)."""

    id: str
    title: str
    text: str

    def full_text(self, sep: str = " ") -> str:
        """Title and text joined as the encoders see them."""
        return f"{self.title}{sep}{self.text}" if self.title else self.text


@dataclass
class Corpus:
    """Ordered passage collection with id lookup."""

    passages: dict[str, Passage] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.passages)

    def __contains__(self, pid: str) -> bool:
        return pid in self.passages

    def __getitem__(self, pid: str) -> Passage:
        return self.passages[pid]

    @property
    def ids(self) -> list[str]:
        """Passage ids in corpus order (the order of the corpus file)."""
        return list(self.passages)

    def texts(self, ids: Iterable[str] | None = None) -> list[str]:
        """Passage texts (title and text, :meth:`Passage.full_text`) of ``ids`` (default: every passage, in corpus
        order). Raises ``KeyError`` for an id not in the corpus."""
        return [self.passages[i].full_text() for i in (self.ids if ids is None else ids)]


@dataclass
class BeirDataset:
    """A BEIR folder loaded for one split (qrels restricted to that split): what retrieval and evaluation run on
    (read by :func:`multipos.formats.beir.load_beir`)."""

    corpus: Corpus
    queries: dict[str, str]
    qrels: Qrels
    name: str = ""


def iter_lines(path: str | os.PathLike, what: str = "file") -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for every line of a UTF-8 text file (1-based, newline kept).

    Raises FileNotFoundError naming ``what`` and the path, DataFormatError naming the file, the line and
    the byte offset (in the file) of the first byte that is not valid UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {what} not found")
    offset = 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{path}:{n}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset "
                                      f"{offset + e.start} of the file, column {e.start + 1} of the line)") from None
            offset += len(raw)
            yield n, line


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line.

    Raises FileNotFoundError for a missing file and DataFormatError naming the file and line for invalid
    UTF-8, bad JSON (a last line cut mid-object is reported as a truncated file) or a non-object line."""
    for n, line in iter_lines(path, "file"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            hint = "; the line has no newline at its end: truncated file?" if not line.endswith("\n") else ""
            raise DataFormatError(f"{path}:{n}: malformed JSON ({e.msg} at column {e.colno}){hint}") from None
        if not isinstance(obj, dict):
            raise DataFormatError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        yield n, obj


def get_field(obj: dict, name: str, where: str, types=(str,)):
    """``obj[name]``, checked: DataFormatError naming ``where`` and the field when it is missing or not of ``types``."""
    if name not in obj:
        raise DataFormatError(f"{where}: missing field {name!r}")
    value = obj[name]
    if not isinstance(value, types):
        raise DataFormatError(f"{where}: field {name!r} must be {types[0].__name__}, got {type(value).__name__}")
    return value


REGIMES = ("homogeneous", "heterogeneous", "gold", "all")
#: Each regime in plain words (logs and errors).
REGIME_RULES = {
    "homogeneous": "homogeneous keeps silver positives only (gold ones are not used)",
    "heterogeneous": "heterogeneous keeps the first gold positive, then the silver ones (queries without gold are "
                     "skipped; other gold positives are not used)",
    "gold": "gold keeps gold positives only",
    "all": "all keeps every positive, gold first",
}
#: The tiers of positives each regime trains on: it keeps no query when the data hold none of them.
REGIME_TIERS = {"homogeneous": ("silver",), "heterogeneous": ("gold",), "gold": ("gold",), "all": ("gold", "silver")}


def regimes_without_positives(regimes, gold: int | None, silver: int | None) -> list[str]:
    """The regimes among ``regimes`` that keep no positive when the training data hold ``gold`` gold and ``silver``
    silver positive labels (None: not known, taken as some): e.g. ``homogeneous`` on data whose every positive is
    gold (:data:`REGIME_TIERS`)."""
    have = {"gold": gold is None or gold > 0, "silver": silver is None or silver > 0}
    return [r for r in dict.fromkeys(regimes) if r in REGIME_TIERS and not any(have[t] for t in REGIME_TIERS[r])]


@dataclass
class TrainQuery:
    """A training query with its graded positives and mined hard negatives (passage ids).

    Attributes:
        query_id, query: id and text.
        gold: gold (human, grade 2) positives in order (annotation order or teacher score).
        silver: silver (LLM-like, grade 1) positives in order.
        negatives: hard negatives, best-ranked first (judged passages already removed).
        judged: every passage known to be relevant to the query (any grade): never a negative.
        weights: target weight of each passage that has one (e.g. a positive's grade weight,
            ``data.source.grade_weights``), read by the soft-target objectives
            (:data:`multipos.losses.SOFT_OBJECTIVES`).
        teacher_scores: a teacher's raw score of each passage it scored (``margin_mse``'s targets,
            :mod:`multipos.mining.teacher_scores`).
    """

    query_id: str
    query: str
    gold: list[str] = field(default_factory=list)
    silver: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)
    judged: set[str] = field(default_factory=set)
    weights: dict[str, float] = field(default_factory=dict)
    teacher_scores: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        self.judged = set(self.judged) | set(self.gold) | set(self.silver)

    def positives(self, regime: str) -> list[str]:
        """Ordered positives of this query under ``regime`` (empty if the regime excludes it).

        Raises ValueError for an unknown regime.
        """
        if regime == "homogeneous":
            return list(self.silver)
        if regime == "heterogeneous":
            return [self.gold[0], *self.silver] if self.gold else []
        if regime == "gold":
            return list(self.gold)
        if regime == "all":
            return [*self.gold, *self.silver]
        raise ValueError(f"unknown positive regime {regime!r} (regime=<name>, conf/regime); allowed: "
                         f"{', '.join(REGIMES)}")


def unjudged_negatives(ranked: Iterable[str], judged: Iterable[str], depth: int) -> list[str]:
    """The first ``depth`` passages of ``ranked`` (best first) that are not in ``judged``: the one exclusion rule
    of every hard-negative miner (BM25 and dense).

    ``judged`` is every passage with a judgment for the query, whatever its grade: positives, and also passages
    judged non-relevant (grade 0, and the negative TREC grades the readers keep as judged non-relevant). Grade-0
    passages are left out too, so that "judged" means the same thing here as in the in-batch false-negative mask
    (:func:`group_masks`), where every judged passage of a query is ignored; on the training
    qrels used here it changes nothing (NFCorpus's graded train qrels hold grades 1 and 2 only, Tevatron files
    have no grade-0 judgments).
    """
    judged = set(judged)
    return list(itertools.islice((p for p in ranked if p not in judged), depth))
