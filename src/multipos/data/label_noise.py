"""Controlled label noise: a known share of each training query's positives replaced by false positives.

The paper (Sec. 4.2-4.3) finds JointLH and SumMargLH sensitive to the quality of positives and LSEPair robust, but
more positives (M) also changes the positive-negative ratio. Replacing a fraction ρ of every query's positives by
passages known not to be relevant changes quality alone. Two kinds of false positive:

* ``bm25``: drawn from the query's own mined hard negatives (top BM25 passages that no judgment names), the kind of
  error an LLM judge makes on a plausible passage;
* ``random``: drawn from the corpus passages not judged for the query.

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

__all__ = ["KINDS", "LabelNoise"]

KINDS = ("bm25", "random")


@dataclass
class LabelNoise:
    """``data.source.label_noise``: ``{rate: ρ in [0, 1], kind: bm25 | random, seed: int}``.

    Raises ValueError naming the field for a rate outside [0, 1] or an unknown kind.
    """

    rate: float
    kind: str = "bm25"
    seed: int = 0
    record: dict[str, dict[str, list[str]]] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if not 0 <= float(self.rate) <= 1:
            raise ValueError(f"data.source.label_noise.rate must lie in [0, 1], got {self.rate}")
        if self.kind not in KINDS:
            raise ValueError(f"data.source.label_noise.kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        self.rate = float(self.rate)

    @classmethod
    def from_config(cls, setting) -> LabelNoise | None:
        """None for a missing setting or rate 0 (no noise: the data as published)."""
        if not setting or not float(dict(setting).get("rate", 0)):
            return None
        return cls(**{k: v for k, v in dict(setting).items() if k in ("rate", "kind", "seed")})

    def apply(self, queries: Sequence[TrainQuery], corpus_ids: Sequence[str]) -> dict:
        """Replace positives in place (module docstring) → counts ``{queries, replaced, positives, short}``
        (``short``: queries whose pool of false positives was too small for every replacement)."""
        replaced_total = positives_total = short = 0
        for q in queries:
            positives = [*q.gold, *q.silver]
            positives_total += len(positives)
            k = round(self.rate * len(positives))
            if not k:
                continue
            rng = random.Random(int(hashlib.sha1(f"{self.seed}|{q.query_id}".encode()).hexdigest()[:12], 16))
            chosen = sorted(rng.sample(range(len(positives)), k))
            if self.kind == "bm25":
                pool = [n for n in dict.fromkeys(q.negatives) if n not in q.judged]
                false = rng.sample(pool, min(k, len(pool)))
            else:
                false = []
                for _ in range(50 * k):
                    if len(false) == k:
                        break
                    p = corpus_ids[rng.randrange(len(corpus_ids))]
                    if p not in q.judged and p not in false:
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
