"""The annotation run: pool candidates, run the enabled stages through a judge, write training data.

Outputs, in ``out`` (each file written atomically once its stage is done; a re-run reads every answer back from the
call cache, so a run killed at any point and started again asks no question twice and writes the same files):

* ``train.jsonl`` — Tevatron JSONL that ``train.py`` reads as it is (``data=msmarco_homo data.source.path=...``):
  per query with at least one positive, ``positive_passages`` in descending order of utility (relevance when the
  utility stage is off) and ``negative_passages``: pooled passages graded 0, in pool order (mined hard negatives);
* ``qrels/relevance.tsv`` and ``qrels/utility.tsv`` — the grades (BEIR TSV, ``query-id corpus-id score``);
* ``malformed.jsonl`` — every answer that did not parse after its retries, with the raw texts (no label);
* ``summary.json`` — per stage: items, calls, cache hits, tokens, seconds, malformed; and the totals.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from multipos import atomic
from multipos.annotate.judges import Judge
from multipos.annotate.score_judge import ScoreThresholdJudge
from multipos.annotate.stages import Answer, Prompt, ask, parse_grade, parse_text
from multipos.formats.types import Corpus

__all__ = ["Annotator", "StageSettings"]

log = logging.getLogger(__name__)


@dataclass
class StageSettings:
    """Which stages run and their thresholds: ``relevance`` (always on: the positives come from it),
    ``pseudo_answer`` and ``utility`` (off: positives ordered by relevance, an UMBRELA-style judge);
    ``relevance_threshold`` (grade counted relevant, default 2), ``utility_threshold`` (default 1),
    ``max_passages_in_answer`` (relevant passages given to the pseudo-answer), ``negatives`` (hard negatives per line).
    """

    pseudo_answer: bool = True
    utility: bool = True
    relevance_threshold: int = 2
    utility_threshold: int = 1
    max_passages_in_answer: int = 5
    negatives: int = 30


class Annotator:
    """Runs the pipeline (module docstring) with ``judge``, ``prompts`` ({stage: :class:`Prompt`}), ``concurrency``
    requests at a time and ``max_format_retries`` re-asks of a malformed answer.

    A :class:`~multipos.annotate.score_judge.ScoreThresholdJudge` grades relevance from scores, in one batch, and
    asks no prompt; it cannot write a pseudo-answer, so with it ``settings.pseudo_answer`` and ``settings.utility``
    must be off (ValueError naming ``stages.pseudo_answer`` / ``stages.utility`` otherwise)."""

    def __init__(self, judge: Judge | ScoreThresholdJudge, prompts: dict[str, Prompt],
                 settings: StageSettings | None = None, concurrency: int = 4, max_format_retries: int = 2,
                 progress: bool = True):
        self.judge, self.prompts = judge, prompts
        self.settings = settings or StageSettings()
        if isinstance(judge, ScoreThresholdJudge) and (self.settings.pseudo_answer or self.settings.utility):
            raise ValueError("judge.backend=score_threshold grades relevance only: set stages.pseudo_answer=false "
                             "stages.utility=false")
        self.concurrency, self.max_format_retries, self.progress = concurrency, max_format_retries, progress
        self.summary: dict = {"stages": {}}
        self.malformed: list[dict] = []

    def _stage(self, name: str, items: Sequence, fn: Callable) -> list:
        """``fn`` over ``items`` with at most ``concurrency`` at a time, in order, with a progress bar and counts."""
        from tqdm.auto import tqdm

        before = self.judge.stats.as_dict()
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            results = list(tqdm(pool.map(fn, items), total=len(items), desc=name, disable=not self.progress,
                                leave=False))
        after = self.judge.stats.as_dict()
        counts = {k: after[k] - before[k] for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")}
        bad = sum(1 for r in results if r.value is None)
        self.summary["stages"][name] = {"items": len(items), **counts, "malformed": bad,
                                        "seconds": round(time.perf_counter() - start, 3)}
        log.info("%s: %d items, %d calls, %d cache hits, %d malformed", name, len(items), counts["calls"],
                 counts["cache_hits"], bad)
        return results

    def _scored(self, name: str, pairs: Sequence[tuple[str, str]], queries: dict[str, str],
                text: dict[str, str]) -> list[Answer]:
        """The relevance grades of a score-threshold judge, counted like a stage (calls = pairs scored)."""
        start = time.perf_counter()
        grades = self.judge.grade(pairs, queries, text) if pairs else []
        self.summary["stages"][name] = {"items": len(pairs), "calls": len(pairs), "cache_hits": 0, "prompt_tokens": 0,
                                        "completion_tokens": 0, "malformed": 0,
                                        "seconds": round(time.perf_counter() - start, 3)}
        log.info("%s: %d pairs graded by score thresholds %s", name, len(pairs), self.judge.thresholds)
        return [Answer(g, ()) for g in grades]

    def _record(self, stage: str, qid: str, pid: str | None, answer) -> None:
        if answer.value is None:
            self.malformed.append({"stage": stage, "query_id": qid, "passage_id": pid, "raw": list(answer.raw)})

    def run(self, corpus: Corpus, queries: dict[str, str], pools: dict[str, list[str]], out: str | Path) -> dict:
        """Annotate ``queries`` over their ``pools`` and write the outputs into ``out`` → the summary dict."""
        out = Path(out)
        s, retries = self.settings, self.max_format_retries
        start = time.perf_counter()
        pairs = [(q, p) for q in queries for p in pools.get(q, [])]
        text = {p: corpus.texts([p])[0] for p in {p for _, p in pairs}}

        def relevance(pair):
            q, p = pair
            return ask(self.judge, self.prompts["relevance"], parse_grade, retries, query=queries[q], passage=text[p])

        if isinstance(self.judge, ScoreThresholdJudge):
            rel_answers = self._scored("relevance", pairs, queries, text)
        else:
            rel_answers = self._stage("relevance", pairs, relevance)
        grades: dict[str, dict[str, int]] = {q: {} for q in queries}
        for (q, p), a in zip(pairs, rel_answers):
            self._record("relevance", q, p, a)
            if a.value is not None:
                grades[q][p] = a.value
        relevant = {q: [p for p in pools.get(q, []) if grades[q].get(p, -1) >= s.relevance_threshold] for q in queries}

        answers: dict[str, str] = {}
        if s.pseudo_answer or s.utility:
            asked = [q for q in queries if relevant[q]]

            def pseudo(q):
                shown = relevant[q][: s.max_passages_in_answer]
                block = "\n".join(f"[{i + 1}] {text[p]}" for i, p in enumerate(shown))
                return ask(self.judge, self.prompts["pseudo_answer"], parse_text, retries, query=queries[q],
                           passages=block)

            for q, a in zip(asked, self._stage("pseudo_answer", asked, pseudo)):
                self._record("pseudo_answer", q, None, a)
                if a.value is not None:
                    answers[q] = a.value

        utility: dict[str, dict[str, int]] = {q: {} for q in queries}
        if s.utility:
            upairs = [(q, p) for q in queries if q in answers for p in relevant[q]]

            def useful(pair):
                q, p = pair
                return ask(self.judge, self.prompts["utility"], parse_grade, retries, query=queries[q],
                           answer=answers[q], passage=text[p])

            for (q, p), a in zip(upairs, self._stage("utility", upairs, useful)):
                self._record("utility", q, p, a)
                if a.value is not None:
                    utility[q][p] = a.value

        lines, rank = [], {q: {p: i for i, p in enumerate(pools.get(q, []))} for q in queries}
        for q in queries:
            if s.utility:
                positives = [p for p in relevant[q] if utility[q].get(p, -1) >= s.utility_threshold]
                positives.sort(key=lambda p: (-utility[q][p], -grades[q][p], rank[q][p]))
            else:
                positives = sorted(relevant[q], key=lambda p: (-grades[q][p], rank[q][p]))
            if not positives:
                continue
            negatives = [p for p in pools.get(q, []) if grades[q].get(p) == 0][: s.negatives]
            passage = lambda p: {"docid": p, "title": corpus.passages[p].title, "text": corpus.passages[p].text}  # noqa: E731
            lines.append({"query_id": q, "query": queries[q], "positive_passages": [passage(p) for p in positives],
                          "negative_passages": [passage(p) for p in negatives]})
        with atomic.writer(out / "train.jsonl") as f:
            f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        for name, table in (("relevance", grades), ("utility", utility)):
            with atomic.writer(out / "qrels" / f"{name}.tsv") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                f.writelines(f"{q}\t{p}\t{g}\n" for q in queries for p, g in table[q].items())
        with atomic.writer(out / "malformed.jsonl") as f:
            f.writelines(json.dumps(m, ensure_ascii=False) + "\n" for m in self.malformed)
        self.summary.update({"queries": len(queries), "pairs": len(pairs), "training_queries": len(lines),
                             "positives": sum(len(x["positive_passages"]) for x in lines),
                             "malformed": len(self.malformed), "judge": {"backend": self.judge.backend,
                                                                         "model": self.judge.model},
                             "totals": self.judge.stats.as_dict(), "seconds": round(time.perf_counter() - start, 3)})
        atomic.write_json(out / "summary.json", self.summary)
        return self.summary
