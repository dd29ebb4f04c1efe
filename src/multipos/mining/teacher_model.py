"""Soft targets from a teacher model, scored once over the training groups and cached.

``data.source.teacher_model: {path, kind: bi | cross, temperature, negatives}``: a sentence-transformers folder,
either a bi-encoder (``SentenceTransformer``: query and passage embeddings, the model's own similarity) or a
cross-encoder (``CrossEncoder``: one score per query-passage pair). It scores each training query's positives and its
first ``negatives`` mined hard negatives once; the scores are cached in ``<cache>/teacher_model/`` under a key of the
model's files, its kind and the scored pairs, so a second run reads them back. The scores then become targets as a
teacher score file's do (:func:`multipos.mining.teacher_scores.assign_targets`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multipos import atomic
from multipos.formats.types import Corpus, TrainQuery
from multipos.mining.teacher_scores import assign_targets

__all__ = ["KINDS", "TeacherModel"]

log = logging.getLogger(__name__)
KINDS = ("bi", "cross")


def _folder_digest(folder: Path) -> str:
    """sha1 over the folder's file names, sizes and modification times (a retrained model at the same path is new)."""
    h = hashlib.sha1()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(folder)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


@dataclass
class TeacherModel:
    """``data.source.teacher_model``: ``{path, kind, temperature, negatives, batch_size}``.

    Raises ValueError naming the field for an unknown kind, a temperature ≤ 0 or negatives < 0; FileNotFoundError
    when ``path`` is not a folder.
    """

    path: str
    kind: str = "cross"
    temperature: float = 1.0
    negatives: int = 16
    batch_size: int = 32

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"data.source.teacher_model.kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        if not float(self.temperature) > 0:
            raise ValueError(f"data.source.teacher_model.temperature must be > 0, got {self.temperature}")
        if int(self.negatives) < 0:
            raise ValueError(f"data.source.teacher_model.negatives must be >= 0, got {self.negatives}")
        if not Path(self.path).expanduser().is_dir():
            raise FileNotFoundError(f"data.source.teacher_model.path: {self.path} is not a model folder")

    @classmethod
    def from_config(cls, setting) -> TeacherModel | None:
        return None if not setting else cls(**dict(setting))

    def pairs(self, queries: Sequence[TrainQuery]) -> dict[str, list[str]]:
        """{query id → passages to score}: its positives, then its first ``negatives`` mined hard negatives."""
        return {q.query_id: list(dict.fromkeys([*q.gold, *q.silver, *q.negatives[: self.negatives]]))
                for q in queries}

    def score(self, queries: Sequence[TrainQuery], corpus: Corpus, cache: Path) -> dict[str, dict[str, float]]:
        """{query id → {passage id → teacher score}}, from the cache when these pairs were scored before."""
        folder = Path(self.path).expanduser()
        pairs = self.pairs(queries)
        key = hashlib.sha1(json.dumps([_folder_digest(folder), self.kind, sorted(pairs.items())]).encode()).hexdigest()
        path = cache / "teacher_model" / f"{key[:20]}.json"
        if path.is_file():
            return json.loads(path.read_text())
        text = {q.query_id: q.query for q in queries}
        n = sum(len(v) for v in pairs.values())
        log.info("teacher model %s (%s-encoder): scoring %d pairs of %d queries", folder, self.kind, n, len(pairs))
        if self.kind == "cross":
            from sentence_transformers import CrossEncoder

            model = CrossEncoder(str(folder), device="cpu")
            flat = [(qid, pid) for qid, pids in pairs.items() for pid in pids]
            values = model.predict([(text[q], corpus.texts([p])[0]) for q, p in flat], batch_size=self.batch_size,
                                   show_progress_bar=False)
            table: dict[str, dict[str, float]] = {}
            for (qid, pid), v in zip(flat, values):
                table.setdefault(qid, {})[pid] = float(v)
        else:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(folder), device="cpu")
            ids = sorted({pid for pids in pairs.values() for pid in pids})
            p_emb = model.encode(corpus.texts(ids), batch_size=self.batch_size, convert_to_tensor=True)
            q_ids = list(pairs)
            q_emb = model.encode([text[q] for q in q_ids], batch_size=self.batch_size, convert_to_tensor=True)
            row = {p: i for i, p in enumerate(ids)}
            sims = model.similarity(q_emb, p_emb)
            table = {q: {p: float(sims[i, row[p]]) for p in pairs[q]} for i, q in enumerate(q_ids)}
        atomic.write_json(path, table)
        return table

    def apply(self, queries: Sequence[TrainQuery], corpus: Corpus, cache: Path) -> dict:
        """Score (or read back) and give each query its targets (:func:`assign_targets`)."""
        return assign_targets(queries, self.score(queries, corpus, cache), self.temperature, self.path)
