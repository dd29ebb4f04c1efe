"""The three LLM stages of utility annotation (paper Sec. 4.2, after Zhang et al. 2025) and how answers are read.

* relevance: each pooled (query, passage) pair graded 0-3 (:data:`GRADE`), the TREC / UMBRELA scale;
* pseudo-answer: an answer to the query written from its relevant passages only;
* utility: each relevant passage graded 0-3 for how much the answer rests on it; positives are the relevant
  passages of utility at least ``utility_threshold``, in descending order of utility (ties: relevance, then pool
  rank), the order first-M selection relies on.

A prompt is a file of ``conf/annotate/prompts/`` (``version``, ``system``, ``user`` with ``{query}``-style fields,
``retry``: the reminder added when an answer has the wrong form). An answer that does not parse is asked again, with
the reminder, at most ``max_format_retries`` times (each retry is its own cached call), then recorded as malformed:
never counted as a label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from multipos.annotate.judges import Judge

__all__ = ["GRADE", "Prompt", "Answer", "ask", "parse_grade", "parse_text"]

GRADE = re.compile(r"final\s*score\s*[:=]?\s*\**\s*([0-3])\b", re.IGNORECASE)


@dataclass(frozen=True)
class Prompt:
    """One prompt file: ``version`` (part of every cache key: a changed prompt is asked anew), ``system``, ``user``,
    ``retry``. Raises ValueError naming the file and the missing field."""

    version: str
    system: str
    user: str
    retry: str

    @classmethod
    def load(cls, path: str | Path) -> Prompt:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        missing = [k for k in ("version", "system", "user", "retry") if not data.get(k)]
        if missing:
            raise ValueError(f"{path}: prompt file lacks {', '.join(missing)}")
        return cls(str(data["version"]), data["system"], data["user"], data["retry"])

    def messages(self, **fields) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user.format(**fields)}]


@dataclass(frozen=True)
class Answer:
    """A parsed answer (``value`` None when malformed after every retry) and the raw texts received."""

    value: object
    raw: tuple[str, ...]


def parse_grade(text: str) -> int | None:
    """The 0-3 grade of an answer: ``Final score: N`` anywhere, else an answer that is just one digit 0-3."""
    m = GRADE.search(text or "")
    if m:
        return int(m.group(1))
    bare = (text or "").strip().strip(".*")
    return int(bare) if bare in ("0", "1", "2", "3") else None


def parse_text(text: str) -> str | None:
    """A free-text answer: its stripped text, None when empty."""
    text = (text or "").strip()
    return text or None


def ask(judge: Judge, prompt: Prompt, parse, max_format_retries: int = 2, **fields) -> Answer:
    """Ask ``judge`` with ``prompt`` filled with ``fields``; re-ask with the reminder while the answer does not parse
    (at most ``max_format_retries`` times). Every call goes through the judge's cache."""
    messages = prompt.messages(**fields)
    raw = []
    for attempt in range(max_format_retries + 1):
        version = prompt.version if attempt == 0 else f"{prompt.version}#retry{attempt}"
        text = judge.ask(messages, version).text
        raw.append(text)
        value = parse(text)
        if value is not None:
            return Answer(value, tuple(raw))
        messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": prompt.retry}]
    return Answer(None, tuple(raw))
