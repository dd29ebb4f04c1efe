"""Relevance judgements and runs: qrels in TREC (``qid 0 docid grade``) or BEIR TSV format, and TREC run files
(``qid Q0 docid rank score tag``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from multipos.formats.types import DataFormatError, Qrels, Run, iter_lines

__all__ = ["read_qrels", "read_run", "write_run"]

log = logging.getLogger(__name__)

def read_qrels(path: str | os.PathLike) -> Qrels:
    """Read qrels in BEIR TSV (``query-id corpus-id score``, optional header) or TREC format
    (``qid 0 docid grade``), detected per line by the number of columns.

    Grades are integers (``2`` or ``2.0``). A negative grade (TREC: −2 junk / spam, −1 pooled but not judged)
    is read as 0, judged non-relevant, as trec_eval counts it, with one warning giving the count and the first
    line. A repeated identical line is ignored (with a warning giving the count). Raises FileNotFoundError for
    a missing file; DataFormatError naming the file and line for invalid UTF-8, a wrong column count, a grade
    that is not a number or not an integer, and a pair judged twice with different grades."""
    path = Path(path)
    qrels: Qrels = {}
    repeated = 0
    negative: list[int] = []
    for n, line in iter_lines(path, "qrels file"):
        parts = line.split()
        if not parts:
            continue
        if n == 1 and parts[0] in ("query-id", "query_id", "qid"):
            continue
        if len(parts) == 3:
            qid, pid, grade = parts
        elif len(parts) == 4:
            qid, _, pid, grade = parts
        else:
            raise DataFormatError(f"{path}:{n}: expected 3 (BEIR) or 4 (TREC) columns, got {len(parts)}")
        g = _grade(grade, f"{path}:{n}")
        if g < 0:
            negative.append(n)
            g = 0
        docs = qrels.setdefault(qid, {})
        if pid in docs:
            if docs[pid] != g:
                raise DataFormatError(f"{path}:{n}: ({qid}, {pid}) judged again with grade {g} "
                                      f"(first judged {docs[pid]})")
            repeated += 1
        docs[pid] = g
    if repeated:
        log.warning("%s: ignored %d repeated (query, passage, grade) lines", path, repeated)
    if negative:
        log.warning("%s: %d judgments with a negative grade (first at line %d) read as 0, judged non-relevant "
                    "(TREC: -2 junk, -1 pooled but not judged)", path, len(negative), negative[0])
    return qrels


def _grade(text: str, where: str) -> int:
    """A relevance grade: an integer, written ``2`` or ``2.0``; DataFormatError naming ``where`` else."""
    try:
        value = float(text)
    except ValueError:
        raise DataFormatError(f"{where}: relevance grade {text!r} is not a number") from None
    if not value.is_integer():
        raise DataFormatError(f"{where}: relevance grade {text!r} is not an integer")
    return int(value)


def read_run(path: str | os.PathLike) -> Run:
    """Read a TREC run file (``qid Q0 docid rank score tag``) into {qid → {docid → score}}.

    Raises DataFormatError naming the line for invalid UTF-8, a wrong column count or a non-numeric score; a passage
    listed twice for one query keeps its first line and the rest are dropped with a warning."""
    path = Path(path)
    run: Run = {}
    repeated: list[tuple[int, str, str]] = []
    for n, line in iter_lines(path, "run file"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise DataFormatError(f"{path}:{n}: expected 6 columns (qid Q0 docid rank score tag), got {len(parts)}")
        try:
            score = float(parts[4])
        except ValueError:
            raise DataFormatError(f"{path}:{n}: score {parts[4]!r} is not a number") from None
        docs = run.setdefault(parts[0], {})
        if parts[2] in docs:
            repeated.append((n, parts[0], parts[2]))
            continue
        docs[parts[2]] = score
    if repeated:
        log.warning("%s: dropped %d repeated (query, passage) lines, keeping the first of each, e.g. line %d (%s, %s)",
                    path, len(repeated), *repeated[0])
    return run


def write_run(run: Run, path: str | os.PathLike, tag: str = "multipos") -> None:
    """Write ``run`` as a TREC run file, passages sorted by descending score. Writes atomically."""
    from multipos import atomic

    with atomic.writer(path) as f:
        for qid, docs in run.items():
            ranked = sorted(docs.items(), key=lambda kv: -kv[1])
            for rank, (pid, score) in enumerate(ranked, 1):
                f.write(f"{qid} Q0 {pid} {rank} {score:.6f} {tag}\n")
