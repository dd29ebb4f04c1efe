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


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line; raise :class:`DataFormatError` on bad JSON."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{path}:{n}: malformed JSON ({e.msg} at column {e.colno})") from None
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
    """Read a BEIR ``corpus.jsonl``. Raises DataFormatError on bad lines or duplicate ``_id``."""
    corpus = Corpus()
    for n, obj in iter_jsonl(path):
        where = f"{path}:{n}"
        pid = str(_field(obj, "_id", where, (str, int)))
        if pid in corpus.passages:
            raise DataFormatError(f"{where}: duplicate passage id {pid!r}")
        corpus.passages[pid] = Passage(pid, str(obj.get("title") or ""), str(_field(obj, "text", where)))
    return corpus


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """Read a BEIR ``queries.jsonl`` into {query id → text}. Raises DataFormatError on bad lines."""
    queries: dict[str, str] = {}
    for n, obj in iter_jsonl(path):
        where = f"{path}:{n}"
        qid = str(_field(obj, "_id", where, (str, int)))
        if qid in queries:
            raise DataFormatError(f"{where}: duplicate query id {qid!r}")
        queries[qid] = _field(obj, "text", where)
    return queries


def read_qrels(path: str | os.PathLike) -> Qrels:
    """Read qrels in BEIR TSV (``query-id corpus-id score``, optional header) or TREC format
    (``qid 0 docid grade``), detected per line by the number of columns. Grades are ints.

    A repeated identical line is ignored (with a warning giving the count); a pair judged twice with
    different grades raises DataFormatError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: qrels file not found")
    qrels: Qrels = {}
    repeated = 0
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
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
            try:
                g = int(float(grade))
            except ValueError:
                raise DataFormatError(f"{path}:{n}: relevance grade {grade!r} is not a number") from None
            docs = qrels.setdefault(qid, {})
            if pid in docs:
                if docs[pid] != g:
                    raise DataFormatError(f"{path}:{n}: ({qid}, {pid}) judged again with grade {g} (first judged {docs[pid]})")
                repeated += 1
            docs[pid] = g
    if repeated:
        log.warning("%s: ignored %d repeated (query, passage, grade) lines", path, repeated)
    return qrels


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

    Raises DataFormatError naming the line for a wrong column count or a non-numeric score; a passage
    listed twice for one query keeps its first line and the rest are dropped with a warning."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run file not found")
    run: Run = {}
    repeated: list[tuple[int, str, str]] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
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
    (listing the qrels files present), DataFormatError for unknown ids or empty query texts.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: BEIR folder not found")
    files = [qrels_file] if isinstance(qrels_file, str) else list(qrels_file or [f"qrels/{split}.tsv"])
    qrels = read_qrels_files(folder, files, split)
    corpus = read_corpus(folder / "corpus.jsonl")
    queries = read_queries(folder / "queries.jsonl")
    check_qrels_ids(qrels, queries, corpus, ", ".join(str(folder / f) for f in files))
    empty = [q for q in qrels if not queries[q].strip()]
    if empty:
        raise DataFormatError(f"{folder / 'queries.jsonl'}: {len(empty)} judged queries have empty text, e.g. {empty[:5]}")
    return BeirDataset(corpus, {q: queries[q] for q in qrels}, qrels, folder.name)


@dataclass
class TevatronExample:
    """One Tevatron training line: the query and its ordered positives and (hard) negatives."""

    query_id: str
    query: str
    positives: list[Passage]
    negatives: list[Passage]


def _passages(obj: dict, key: str, where: str) -> list[Passage]:
    items = obj.get(key) or []  # HF datasets turn a missing list into None
    if not isinstance(items, list):
        raise DataFormatError(f"{where}: field {key!r} must be a list")
    out = []
    for k, p in enumerate(items):
        if not isinstance(p, dict):
            raise DataFormatError(f"{where}: {key}[{k}] must be an object with docid/title/text")
        pid = str(_field(p, "docid", f"{where}: {key}[{k}]", (str, int)))
        out.append(Passage(pid, str(p.get("title") or ""), str(_field(p, "text", f"{where}: {key}[{k}]"))))
    return out


def parse_tevatron(obj: dict, where: str) -> TevatronExample:
    """Validate one Tevatron record; raise DataFormatError naming ``where`` and the field."""
    qid = str(_field(obj, "query_id", where, (str, int)))
    query = _field(obj, "query", where)
    pos = _passages(obj, "positive_passages", where)
    if not pos:
        raise DataFormatError(f"{where}: query {qid!r} has no positive_passages")
    return TevatronExample(qid, query, pos, _passages(obj, "negative_passages", where))


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
