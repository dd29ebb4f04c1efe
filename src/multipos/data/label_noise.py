"""Controlled label noise: a known share of each training query's positives replaced by false positives.

The paper (Sec. 4.2-4.3) finds JointLH and SumMargLH sensitive to the quality of positives and LSEPair robust, but
more positives (M) also changes the positive-negative ratio. Replacing a fraction ρ of every query's positives by
passages known not to be relevant changes quality alone. Two kinds of false positive:

* ``bm25``: drawn from the query's own mined hard negatives (top BM25 passages that no judgment names), the kind of
  error an LLM judge makes on a plausible passage;
* ``random``: drawn from the corpus passages not judged for the query.

A false positive must be false: with ``exclude: every_split`` (the label-noise study's setting) it is never a passage
that any qrels file of the dataset folder judges relevant (grade > 0) for the query or for a query of the same text
in another split (:func:`judged_in_every_split`; NFCorpus's ``qrels-graded/*.s-4.qrel`` add about 28.8k
topic-level train links that BEIR's training qrels leave out); for a Tevatron file, the one split it has, never a
positive of a line with the same query text (:func:`judged_by_text`). ``exclude: query`` (the default: what a
setting without the field computed, runs made before 2026-12-02) keeps only the query's own training judgments out.

For each query with n positives, round(ρ·n) positives are chosen uniformly (seeded by the setting's seed and the
query id) and each is replaced, in its place in the query's order, by a false positive; the false positives leave
the query's negatives and join its judged passages (never its negatives), and the replaced true positives stay
judged (never negatives). What was replaced is recorded per query (:attr:`LabelNoise.record`), so a run can be
audited (``label_noise.json`` in the run folder).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from multipos.data.groups import TrainQuery

__all__ = ["KINDS", "EXCLUDES", "LabelNoise", "judged_by_text", "judged_in_every_split"]

KINDS = ("bm25", "random")
EXCLUDES = ("every_split", "query")


def _text_key(text: str) -> str:
    return " ".join(text.lower().split())


def judged_in_every_split(folder, texts: dict[str, str]) -> dict[str, set[str]]:
    """{query id → passages judged relevant (grade > 0) for it, or for any query of the same text (case and spacing
    ignored), by any qrels file of ``folder`` (``qrels/*.tsv``, ``qrels-graded/*``)}, for the ids of ``texts``
    ({query id → text}; a qrels query without text counts under its own id). Raises as
    :func:`multipos.formats.trec.read_qrels` (file and line)."""
    from pathlib import Path

    from multipos.formats.trec import read_qrels

    folder = Path(folder)
    by_text: dict[str, set[str]] = {}
    for path in sorted([*folder.glob("qrels/*.tsv"), *folder.glob("qrels-graded/*")]):
        if not path.is_file():
            continue
        for qid, docs in read_qrels(path).items():
            key = _text_key(texts[qid]) if qid in texts else f"id:{qid}"
            by_text.setdefault(key, set()).update(d for d, g in docs.items() if g > 0)
    return {qid: by_text.get(_text_key(t), set()) | by_text.get(f"id:{qid}", set()) for qid, t in texts.items()}


def judged_by_text(queries: Sequence[TrainQuery]) -> dict[str, set[str]]:
    """{query id → the positives of every query of ``queries`` with the same text (case and spacing ignored), its
    own included}: what ``exclude: every_split`` keeps out for a source that is its one split (a Tevatron file)."""
    by_text: dict[str, set[str]] = {}
    for q in queries:
        by_text.setdefault(_text_key(q.query), set()).update((*q.gold, *q.silver))
    return {q.query_id: set(by_text[_text_key(q.query)]) for q in queries}


@dataclass
class LabelNoise:
    """``data.source.label_noise``: ``{rate: ρ in [0, 1], kind: bm25 | random, seed: int,
    exclude: every_split | query}`` (module docstring).

    Raises ValueError naming the field for a rate outside [0, 1], an unknown kind or an unknown exclude.
    """

    rate: float
    kind: str = "bm25"
    seed: int = 0
    exclude: str = "query"
    record: dict[str, dict[str, list[str]]] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if not 0 <= float(self.rate) <= 1:
            raise ValueError(f"data.source.label_noise.rate must lie in [0, 1], got {self.rate}")
        if self.kind not in KINDS:
            raise ValueError(f"data.source.label_noise.kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.exclude not in EXCLUDES:
            raise ValueError(f"data.source.label_noise.exclude {self.exclude!r}; allowed: {', '.join(EXCLUDES)}")
        self.rate = float(self.rate)

    @classmethod
    def from_config(cls, setting) -> LabelNoise | None:
        """None for a missing setting or rate 0 (no noise: the data as published)."""
        if not setting or not float(dict(setting).get("rate", 0)):
            return None
        return cls(**{k: v for k, v in dict(setting).items() if k in ("rate", "kind", "seed", "exclude")})

    def apply(self, queries: Sequence[TrainQuery], corpus_ids: Sequence[str],
              judged_elsewhere: dict[str, set[str]] | None = None) -> dict:
        """Replace positives in place (module docstring) → counts ``{queries, replaced, positives, short}``
        (``short``: queries whose pool of false positives was too small for every replacement).
        ``judged_elsewhere``: {query id → passages that must not become its false positives} besides its own
        judged passages (:func:`judged_in_every_split`; read only with ``exclude: every_split``)."""
        replaced_total = positives_total = short = 0
        elsewhere = judged_elsewhere if self.exclude == "every_split" else None
        for q in queries:
            positives = [*q.gold, *q.silver]
            positives_total += len(positives)
            k = round(self.rate * len(positives))
            if not k:
                continue
            rng = random.Random(int(hashlib.sha1(f"{self.seed}|{q.query_id}".encode()).hexdigest()[:12], 16))
            chosen = sorted(rng.sample(range(len(positives)), k))
            banned = set(q.judged) | (elsewhere.get(q.query_id, set()) if elsewhere else set())
            if self.kind == "bm25":
                pool = [n for n in dict.fromkeys(q.negatives) if n not in banned]
                false = rng.sample(pool, min(k, len(pool)))
            else:
                false = []
                for _ in range(50 * k):
                    if len(false) == k:
                        break
                    p = corpus_ids[rng.randrange(len(corpus_ids))]
                    if p not in banned and p not in false:
                        false.append(p)
            if len(false) < k:
                short += 1
                chosen = chosen[: len(false)]
            swap = dict(zip((positives[i] for i in chosen), false))
            q.gold = [swap.get(p, p) for p in q.gold]
            q.silver = [swap.get(p, p) for p in q.silver]
            q.negatives = [n for n in q.negatives if n not in set(false)]
            q.judged = set(q.judged) | set(false)
            q.weights = {swap.get(p, p): w for p, w in q.weights.items()}
            self.record[q.query_id] = {"replaced": list(swap), "false_positives": list(swap.values())}
            replaced_total += len(swap)
        return {"queries": len(queries), "replaced": replaced_total, "positives": positives_total, "short": short}
