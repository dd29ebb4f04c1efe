"""BEIR folders: ``corpus.jsonl`` ({"_id", "title", "text"}), ``queries.jsonl`` ({"_id", "text"}) and
``qrels/<split>.tsv`` (header ``query-id corpus-id score``), read with the checks that tie them together.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

from multipos.formats.trec import read_qrels
from multipos.formats.types import BeirDataset, Corpus, DataFormatError, Passage, Qrels, get_field, iter_jsonl

__all__ = ["read_corpus", "read_queries", "check_query_texts", "check_qrels_ids", "BeirDataset", "read_qrels_files",
           "load_beir"]

log = logging.getLogger(__name__)

def read_corpus(path: str | os.PathLike) -> Corpus:
    """Read a BEIR ``corpus.jsonl``.

    Raises DataFormatError naming the file and line for a bad line or a duplicate ``_id`` (and the line that
    first used it). Passages whose ``title`` and ``text`` are both empty are kept (a retrieval corpus is
    evaluated as published; such a passage encodes to the special tokens alone) with one warning giving their
    number and the first line."""
    corpus = Corpus()
    first_line: dict[str, int] = {}
    empty: list[int] = []
    for n, obj in iter_jsonl(path):
        where = f"{path}:{n}"
        pid = str(get_field(obj, "_id", where, (str, int)))
        if pid in corpus.passages:
            raise DataFormatError(f"{where}: duplicate passage id {pid!r} (first at line {first_line[pid]})")
        passage = Passage(pid, str(obj.get("title") or ""), str(get_field(obj, "text", where)))
        if not passage.full_text().strip():
            empty.append(n)
        corpus.passages[pid] = passage
        first_line[pid] = n
    if empty:
        log.warning("%s: %d passages with an empty 'text' and no 'title' (first at line %d), kept", path, len(empty),
                    empty[0])
    return corpus


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """Read a BEIR ``queries.jsonl`` into {query id → text}.

    Raises DataFormatError naming the file and line for a bad line or a duplicate ``_id`` (and the line that
    first used it). Empty texts are kept here (BEIR files hold queries no split judges); the readers of a
    split reject the judged ones with :func:`check_query_texts`."""
    queries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for n, obj in iter_jsonl(path):
        where = f"{path}:{n}"
        qid = str(get_field(obj, "_id", where, (str, int)))
        if qid in queries:
            raise DataFormatError(f"{where}: duplicate query id {qid!r} (first at line {first_line[qid]})")
        queries[qid] = get_field(obj, "text", where)
        first_line[qid] = n
    return queries


def check_query_texts(queries: dict[str, str], ids: Iterable[str], path: str | os.PathLike) -> None:
    """Raise DataFormatError if a query of ``ids`` has an empty (or blank) text in ``queries``, read from
    ``path``; the message names the file, the line of the first such query and how many there are."""
    empty = [q for q in ids if not queries[q].strip()]
    if not empty:
        return
    line = next((n for n, obj in iter_jsonl(path) if str(obj.get("_id")) == empty[0]), "?")
    raise DataFormatError(f"{path}:{line}: query {empty[0]!r} has an empty 'text' "
                          f"({len(empty)} used queries are empty, e.g. {empty[:5]})")


def check_qrels_ids(qrels: Qrels, queries: dict[str, str], corpus: Corpus, source: str) -> None:
    """Raise DataFormatError if qrels name a query or passage id absent from queries/corpus."""
    bad_q = [q for q in qrels if q not in queries]
    if bad_q:
        raise DataFormatError(f"{source}: {len(bad_q)} query ids not in queries.jsonl, e.g. {bad_q[:5]}")
    bad_p = sorted({p for docs in qrels.values() for p in docs if p not in corpus})
    if bad_p:
        raise DataFormatError(f"{source}: {len(bad_p)} passage ids not in corpus.jsonl, e.g. {bad_p[:5]}")


def read_qrels_files(folder: str | os.PathLike, files: list[str], split: str = "test") -> Qrels:
    """Read and merge qrels files (paths relative to ``folder``); a pair judged in several keeps its highest
    grade. Raises FileNotFoundError naming the missing file and the qrels files present."""
    folder = Path(folder)
    qrels: Qrels = {}
    for name in files:
        qpath = folder / name
        if not qpath.is_file():
            have = sorted(p.name for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
            raise FileNotFoundError(f"{qpath}: split {split!r} not found in {folder} (qrels files present: {have})")
        for qid, docs in read_qrels(qpath).items():
            merged = qrels.setdefault(qid, {})
            for pid, grade in docs.items():
                merged[pid] = max(grade, merged.get(pid, grade))
    return qrels


def load_beir(folder: str | os.PathLike, split: str = "test", qrels_file: str | list[str] | None = None) -> BeirDataset:
    """Load a BEIR folder: corpus, the queries judged in ``split``, and qrels.

    ``qrels_file`` (relative to the folder) overrides ``qrels/<split>.tsv``, e.g. a graded TREC file;
    a list of files is merged, a (query, passage) pair judged in several keeping its highest grade
    (e.g. human + LLM judgments of one set). Raises FileNotFoundError for a missing folder/file/split
    (listing the qrels files present), DataFormatError for an empty split (qrels without a judged query),
    unknown ids or empty query texts (naming the file and line) and for any error of the file readers.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: BEIR folder not found")
    files = [qrels_file] if isinstance(qrels_file, str) else list(qrels_file or [f"qrels/{split}.tsv"])
    qrels = read_qrels_files(folder, files, split)
    source = ", ".join(str(folder / f) for f in files)
    if not qrels:
        raise DataFormatError(f"{source}: split {split!r} is empty (no judged query)")
    corpus = read_corpus(folder / "corpus.jsonl")
    queries = read_queries(folder / "queries.jsonl")
    check_qrels_ids(qrels, queries, corpus, source)
    check_query_texts(queries, qrels, folder / "queries.jsonl")
    return BeirDataset(corpus, {q: queries[q] for q in qrels}, qrels, folder.name)
