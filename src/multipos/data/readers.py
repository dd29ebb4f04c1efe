"""Readers and writers for the retrieval file formats multipos uses.

* BEIR folder: ``corpus.jsonl`` ({"_id", "title", "text"}), ``queries.jsonl`` ({"_id", "text"}),
  ``qrels/<split>.tsv`` (header ``query-id corpus-id score``).
* TREC qrels (``qid 0 docid grade``) and TREC runs (``qid Q0 docid rank score tag``).
* Tevatron training JSONL (``query_id``, ``query``, ``positive_passages`` / ``negative_passages``
  as lists of {"docid", "title", "text"}), the schema of the paper's released data, from a file or
  from a Hugging Face ``datasets`` dataset.

Every error names the file and line (1-based) or the field at fault.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

Qrels = dict[str, dict[str, int]]  # query id → {passage id → grade}
Run = dict[str, dict[str, float]]  # query id → {passage id → score}

log = logging.getLogger(__name__)


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
        return list(self.passages)

    def texts(self, ids: Iterable[str] | None = None) -> list[str]:
        return [self.passages[i].full_text() for i in (self.ids if ids is None else ids)]


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


def _field(obj: dict, name: str, where: str, types=(str,)):
    if name not in obj:
        raise DataFormatError(f"{where}: missing field {name!r}")
    value = obj[name]
    if not isinstance(value, types):
        raise DataFormatError(f"{where}: field {name!r} must be {types[0].__name__}, got {type(value).__name__}")
    return value


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
        pid = str(_field(obj, "_id", where, (str, int)))
        if pid in corpus.passages:
            raise DataFormatError(f"{where}: duplicate passage id {pid!r} (first at line {first_line[pid]})")
        passage = Passage(pid, str(obj.get("title") or ""), str(_field(obj, "text", where)))
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
        qid = str(_field(obj, "_id", where, (str, int)))
        if qid in queries:
            raise DataFormatError(f"{where}: duplicate query id {qid!r} (first at line {first_line[qid]})")
        queries[qid] = _field(obj, "text", where)
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
                raise DataFormatError(f"{path}:{n}: ({qid}, {pid}) judged again with grade {g} (first judged {docs[pid]})")
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


def check_qrels_ids(qrels: Qrels, queries: dict[str, str], corpus: Corpus, source: str) -> None:
    """Raise DataFormatError if qrels name a query or passage id absent from queries/corpus."""
    bad_q = [q for q in qrels if q not in queries]
    if bad_q:
        raise DataFormatError(f"{source}: {len(bad_q)} query ids not in queries.jsonl, e.g. {bad_q[:5]}")
    bad_p = sorted({p for docs in qrels.values() for p in docs if p not in corpus})
    if bad_p:
        raise DataFormatError(f"{source}: {len(bad_p)} passage ids not in corpus.jsonl, e.g. {bad_p[:5]}")


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


@dataclass
class BeirDataset:
    """A BEIR folder loaded for one split (qrels restricted to that split)."""

    corpus: Corpus
    queries: dict[str, str]
    qrels: Qrels
    name: str = ""


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


@dataclass
class TevatronExample:
    """One Tevatron training line: the query and its ordered positives and (hard) negatives."""

    query_id: str
    query: str
    positives: list[Passage]
    negatives: list[Passage]
    where: str = field(default="", compare=False, repr=False)  # "<file>:<line>" or "<name>[<split>] row <i>"


def _passages(obj: dict, key: str, where: str) -> list[Passage]:
    items = obj.get(key) or []  # HF datasets turn a missing list into None
    if not isinstance(items, list):
        raise DataFormatError(f"{where}: field {key!r} must be a list")
    out = []
    for k, p in enumerate(items):
        at = f"{where}: {key}[{k}]"
        if not isinstance(p, dict):
            raise DataFormatError(f"{at} must be an object with docid/title/text")
        pid = str(_field(p, "docid", at, (str, int)))
        passage = Passage(pid, str(p.get("title") or ""), str(_field(p, "text", at)))
        if not passage.full_text().strip():
            raise DataFormatError(f"{at}: passage {pid!r} has an empty 'text' and no 'title'")
        out.append(passage)
    return out


def parse_tevatron(obj: dict, where: str) -> TevatronExample:
    """Validate one Tevatron record; raise DataFormatError naming ``where`` and the field: a missing or
    mistyped field, an empty ``query``, a missing or empty ``positive_passages`` list (a training line
    exists to carry positives), or a passage without text. ``negative_passages`` may be absent."""
    qid = str(_field(obj, "query_id", where, (str, int)))
    query = _field(obj, "query", where)
    if not query.strip():
        raise DataFormatError(f"{where}: query {qid!r} has an empty 'query' text")
    if obj.get("positive_passages") is None:  # absent (JSONL) or null (HF datasets without the column)
        raise DataFormatError(f"{where}: query {qid!r}: missing field 'positive_passages'")
    pos = _passages(obj, "positive_passages", where)
    if not pos:
        raise DataFormatError(f"{where}: query {qid!r} has an empty 'positive_passages' list")
    return TevatronExample(qid, query, pos, _passages(obj, "negative_passages", where), where)


def read_tevatron(path: str | os.PathLike) -> list[TevatronExample]:
    """Read a Tevatron training JSONL file (one query per line)."""
    return [parse_tevatron(obj, f"{path}:{n}") for n, obj in iter_jsonl(path)]


def load_tevatron_hf(name: str, split: str = "train", **kwargs) -> list[TevatronExample]:
    """Load a Tevatron-schema dataset with Hugging Face ``datasets`` (hub id or local path).

    A folder written by ``Dataset.save_to_disk`` is loaded with ``load_from_disk``. Needs the
    ``datasets`` package; raises ImportError with the install hint otherwise.
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading HF datasets needs `pip install datasets` (extra: multipos[datasets])") from None
    local = Path(name)
    if local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(name)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name, split=split, **kwargs)
    return [parse_tevatron(dict(row), f"{name}[{split}] row {i}") for i, row in enumerate(ds)]
