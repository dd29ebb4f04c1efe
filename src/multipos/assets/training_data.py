"""The paper's multi-positive training data (Sec. 4.1-4.2), built from published files: assets ``msmarco-multipos`` and
``nq-multipos``.

The paper's own annotated set (``Wanglanhuajiaofen/MSMARCO-annotation``, read in the paper's fork with
``datasets.load_from_disk(...)["train"]``) is announced but not published (the fork's README: "datasets coming
soon"), so it is not used. Both folders are rebuilt instead from what the paper's data follow:

- Zhang et al. (2025, "Utility-Focused LLM Annotation for Retrieval and RAG", EMNLP'25), hub repository
  ``hengranZhang/Utility_focused_annotation``: the LLM's utility labels of each training query's candidate
  passages. Records of their code (``utility-annotation-code/process.ipynb``): ``query_id``, ``passages_ids`` (the
  candidates, in group order), ``relevance_score`` / ``utility_score`` (0/1 lists aligned with ``passages_ids``)
  and, in the ranking variant, ``ranking_score`` (indices) and ``ranked_passage_ids`` (utility order). Their training
  code also reads labels as ``query_id<TAB>pid,pid,...`` lines; both are read (:func:`read_annotations`).
- Tevatron's training groups (``Tevatron/msmarco-passage``, ``Tevatron/wikipedia-nq``): the query text, the human
  positives (``positive_passages``) and BM25 hard negatives (``negative_passages``), with passage texts.

Which files of a repository are read is a list of glob patterns per asset (:data:`ANNOTATION_PATTERNS`,
:data:`GROUP_PATTERNS`): the files of the first pattern that matches any are used. Joined by query id:

- LLM positives: the candidates with ``utility_score`` 1 (``relevance_score`` where a record has no utility
  scores), in ``ranked_passage_ids`` order where the record has one (ranked positives first, then the others), else
  in ``passages_ids`` order; their texts from the group's passages, else from ``corpus`` (MS MARCO: the
  ``msmarco-passage`` asset's ``corpus.jsonl``, only where it is already built), else the positive is dropped and
  counted.
- ``homogeneous.jsonl``: each query with at least one LLM positive; ``positive_passages`` = the LLM positives.
- ``heterogeneous.jsonl``: each annotated query with a human positive; ``positive_passages`` = the human
  positive(s) in Tevatron's order, then the LLM positives that are not human ones. ``data.source.gold_positives: 1``
  reads the first as gold; a query's further human positives (NQ has several) follow it and are read as silver.
- ``negative_passages`` (both): the group's negatives minus every LLM and human positive of the query.
- ``prepared.json``: the sources (repository, revision asked, commit, each file and its sha256), the counts per file
  and the queries dropped by reason, beside the paper's own figures.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from multipos.formats.tevatron import parse_passages
from multipos.formats.types import DataFormatError, get_field, iter_jsonl

__all__ = ["ZHANG_REPO", "PAPER_DATASET", "ANNOTATION_PATTERNS", "GROUP_PATTERNS", "training_data_assets",
           "read_annotations", "build_training_data", "REVISIONS_ENV", "hub_revision", "iter_records"]

log = logging.getLogger(__name__)

ZHANG_REPO = "hengranZhang/Utility_focused_annotation"
#: The repository is announced as a hub dataset; one README version links it as a model repository: both are tried.
ZHANG_REPO_TYPES = ("dataset", "model")
PAPER_DATASET = ("Wanglanhuajiaofen/MSMARCO-annotation (the paper's own annotated set, loaded in its fork with "
                 "datasets.load_from_disk(...)['train']) is announced but not published ('datasets coming soon'): not "
                 "used; these files are rebuilt from Zhang et al.'s published annotations and Tevatron's groups")
#: ``python -m multipos.assets fetch ... --revision REPO=REV`` sets it; also read by builds started by train.py.
REVISIONS_ENV = "MULTIPOS_HUB_REVISIONS"

_LABEL_EXTENSIONS = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".tsv", ".tsv.gz")
#: Annotation files of each asset, by preference (guessed: the repository's file names are not documented).
ANNOTATION_PATTERNS = {
    "msmarco-multipos": tuple(f"*marco*{ext}" for ext in _LABEL_EXTENSIONS),
    "nq-multipos": tuple(f"*nq*{ext}" for ext in _LABEL_EXTENSIONS),
}
#: Tevatron's training files (its train split), by preference.
GROUP_PATTERNS = ("*train*.jsonl.gz", "*train*.jsonl", "*train*.parquet")
_SCORE_FIELDS = ("utility_score", "relevance_score")


def training_data_assets() -> tuple:
    """The registry entries of ``msmarco-multipos`` and ``nq-multipos`` (built by :func:`build_training_data`)."""
    from multipos.assets.registry import Asset

    def entry(name: str, groups_repo: str, corpus: dict | None, paper: dict, what: str) -> Asset:
        return Asset(
            name=name, kind="data", builder="multipos_training_data", sources=(),
            description=(f"{what} multi-positive training data (homogeneous.jsonl, heterogeneous.jsonl; Sec. 4.1-4.2): "
                         f"Zhang et al.'s LLM utility labels ({ZHANG_REPO}) joined with {groups_repo}'s groups"),
            options={"annotations": {"repo": ZHANG_REPO, "repo_types": ZHANG_REPO_TYPES, "revision": "main",
                                     "patterns": ANNOTATION_PATTERNS[name],
                                     "licence": "see the repository's card (Zhang et al., EMNLP 2025)"},
                     "groups": {"repo": groups_repo, "repo_types": ("dataset",), "revision": "main",
                                "patterns": GROUP_PATTERNS, "licence": "see the repository's card (Tevatron)"},
                     "corpus": corpus, "paper": paper})

    return (
        entry("msmarco-multipos", "Tevatron/msmarco-passage", {"asset": "msmarco-passage", "file": "corpus.jsonl"},
              {"section": "4.2", "llm_positives_per_query": 6.5, "queries": 400_000,
               "note": "about 6.5 LLM positives per query; about 400k training queries"}, "MS MARCO passage"),
        entry("nq-multipos", "Tevatron/wikipedia-nq", None,
              {"section": "4.2", "llm_positives_per_query": 5.5, "queries": None,
               "note": "about 5.5 LLM positives per query; the number of queries is not stated"}, "Natural Questions"),
    )


# --- reading -------------------------------------------------------------------------------------------------------


def _text_stream(path: Path) -> io.TextIOBase:
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")


def _first_char(path: Path) -> str:
    with _text_stream(path) as f:
        while True:
            c = f.read(1)
            if not c or not c.isspace():
                return c


def iter_records(path: Path, name: str | None = None) -> Iterator[tuple[str, dict]]:
    """(where, object) of each record of a JSONL file, a JSON list (``.json`` starting with ``[``) or a parquet file,
    ``.gz`` allowed, read as a stream (a JSON list is read whole); where = ``<path>:<line>`` (``record <i>``, ``row
    <i>``). DataFormatError names the file and line of bad JSON, invalid UTF-8 or a record that is not an object."""
    path = Path(path)
    name = name or path.name
    if name.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                n += 1
                yield f"{path} row {n}", row
        return
    if name.lower().endswith((".json", ".json.gz")) and _first_char(path) == "[":
        with _text_stream(path) as f:
            try:
                data = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataFormatError(f"{path}: not valid JSON ({e})") from None
        for i, obj in enumerate(data, 1):
            if not isinstance(obj, dict):
                raise DataFormatError(f"{path} record {i}: expected a JSON object, got {type(obj).__name__}")
            yield f"{path} record {i}", obj
        return
    with _text_stream(path) as f:
        n = 0
        try:
            for n, line in enumerate(f, 1):  # noqa: B007 (n names the line of a decoding error below)
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFormatError(f"{path}:{n}: malformed JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise DataFormatError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
                yield f"{path}:{n}", obj
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
            raise DataFormatError(f"{path}:{n + 1}: cannot be read ({type(e).__name__}: {e})") from None


def _id(value, where: str, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(f"{where}: {what} must be a string or an integer, got {value!r}")
    return str(value)


def _id_list(obj: dict, key: str, where: str) -> list[str]:
    value = obj[key]
    if not isinstance(value, list):
        raise DataFormatError(f"{where}: field {key!r} must be a list, got {type(value).__name__}")
    return [_id(v, where, f"field {key!r}[{i}]") for i, v in enumerate(value)]


@dataclass
class _Labels:
    """One query's LLM labels, merged over the files that carry it: the positives of each kind (candidate order) and
    the utility ranking (restricted to those positives), with the place each was read."""

    utility: tuple[str, ...] | None = None
    relevance: tuple[str, ...] | None = None
    listed: tuple[str, ...] | None = None  # query_id<TAB>pid,pid lines: positives in the file's order
    ranked: tuple[str, ...] | None = None
    where: dict[str, str] = field(default_factory=dict)

    def set(self, kind: str, value: tuple[str, ...], where: str, qid: str) -> None:
        old = getattr(self, kind)
        if old is not None and old != value:
            raise DataFormatError(f"{where}: query {qid!r}: its {kind} labels differ from those read at "
                                  f"{self.where[kind]}; two annotation files label the query: narrow the file "
                                  "patterns (multipos.assets.training_data.ANNOTATION_PATTERNS)")
        setattr(self, kind, value)
        self.where.setdefault(kind, where)

    def positives(self) -> list[str]:
        """The LLM positives in utility order: utility labels, else listed ones, else relevance labels; ranked ones
        first in ranking order, then the rest in their own order."""
        base = next(v for v in (self.utility, self.listed, self.relevance) if v is not None)
        if not self.ranked:
            return list(base)
        members = set(base)
        ranked = [p for p in dict.fromkeys(self.ranked) if p in members]
        seen = set(ranked)
        return ranked + [p for p in base if p not in seen]


def _record_labels(obj: dict, where: str) -> tuple[str, dict[str, tuple[str, ...]]]:
    """(query id, {kind: positives}) of one Zhang-style record; DataFormatError names ``where`` and the field."""
    if "query_id" not in obj:
        raise DataFormatError(f"{where}: missing field 'query_id'")
    qid = _id(obj["query_id"], where, "field 'query_id'")
    if "passages_ids" not in obj:
        raise DataFormatError(f"{where}: query {qid!r}: missing field 'passages_ids' (the candidates the scores label)")
    ids = _id_list(obj, "passages_ids", where)
    kinds: dict[str, tuple[str, ...]] = {}
    for key in _SCORE_FIELDS:
        scores = obj.get(key)
        if scores is None:
            continue
        if not isinstance(scores, list):
            raise DataFormatError(f"{where}: query {qid!r}: field {key!r} must be a list, got {type(scores).__name__}")
        if len(scores) != len(ids):
            raise DataFormatError(f"{where}: query {qid!r}: field {key!r} has {len(scores)} scores for "
                                  f"{len(ids)} passages_ids")
        for i, s in enumerate(scores):
            if isinstance(s, bool) or s not in (0, 1):
                raise DataFormatError(f"{where}: query {qid!r}: field {key!r}[{i}] is {s!r}, not 0 or 1")
        kinds[key.split("_")[0]] = tuple(dict.fromkeys(p for p, s in zip(ids, scores) if s == 1))
    if not kinds:
        raise DataFormatError(f"{where}: query {qid!r}: no field 'utility_score' or 'relevance_score' (the LLM's 0/1 "
                              "labels of passages_ids)")
    if obj.get("ranked_passage_ids") is not None:
        members = set().union(*kinds.values())
        kinds["ranked"] = tuple(p for p in _id_list(obj, "ranked_passage_ids", where) if p in members)
    return qid, kinds


def _listed_labels(path: Path) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(where, query id, positives) of a labels file: ``qid<TAB>pid,pid,...`` (Zhang et al.'s training code), a TREC
    qrels file (``qid Q0 pid grade``) or a BEIR one (``qid pid grade``, header allowed); grade >= 1 is positive."""
    found: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    with _text_stream(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\r\n").split("\t") if "\t" in line else line.split()
            if not parts or not "".join(parts).strip():
                continue
            where = f"{path}:{n}"
            if len(parts) == 2:
                qid, pids = parts[0].strip(), [p.strip() for p in parts[1].split(",") if p.strip()]
            elif len(parts) in (3, 4):
                qid, pid, grade = parts[0], parts[-2], parts[-1]
                try:
                    grade = int(grade)
                except ValueError:
                    if n == 1 and not grade.lstrip("-").replace(".", "").isdigit():
                        continue  # a header: query-id corpus-id score
                    raise DataFormatError(f"{where}: the grade {grade!r} is not an integer (a labels file holds 0/1 "
                                          "or graded judgments, not scores)") from None
                pids = [pid] if grade >= 1 else []
            else:
                raise DataFormatError(f"{where}: expected 'query_id<TAB>pid,pid,...' or qrels lines ('qid Q0 pid "
                                      f"grade' / 'qid pid grade'), got {len(parts)} fields")
            if not qid:
                raise DataFormatError(f"{where}: empty query id")
            first.setdefault(qid, where)
            found.setdefault(qid, []).extend(pids)
    for qid, pids in found.items():
        yield first[qid], qid, tuple(dict.fromkeys(pids))


@dataclass
class Annotations:
    """Each annotated query's LLM positives in utility order, and how they were read."""

    positives: dict[str, tuple[str, ...]]
    records: int
    kinds: dict[str, int]


def read_annotations(paths: list[Path]) -> Annotations:
    """Read Zhang et al.'s label files (records as :func:`iter_records` reads them, or ``.tsv`` label lines) into each
    query's LLM positives. A query labelled by several files has their labels merged (utility labels from one, a
    ranking from another); two files that give the same query different labels of one kind stop.

    Raises:
        DataFormatError: a malformed record (file, line and field: a missing ``query_id`` or ``passages_ids``, score
            lists whose length differs from ``passages_ids``, a score other than 0/1, no score field at all), or two
            files that disagree.
    """
    labels: dict[str, _Labels] = {}
    records = 0
    for path in paths:
        if path.name.lower().endswith((".tsv", ".tsv.gz")):
            rows = ((where, qid, {"listed": pids}) for where, qid, pids in _listed_labels(path))
        else:
            rows = ((where, *_record_labels(obj, where)) for where, obj in iter_records(path))
        for where, qid, kinds in rows:
            records += 1
            entry = labels.setdefault(qid, _Labels())
            for kind, value in kinds.items():
                entry.set(kind, value, where, qid)
    kinds = {k: sum(1 for e in labels.values() if getattr(e, k) is not None)
             for k in ("utility", "relevance", "listed", "ranked")}
    return Annotations({qid: tuple(e.positives()) for qid, e in labels.items()}, records, kinds)


@dataclass
class _Group:
    qid: str
    query: str
    positives: list[dict]
    negatives: list[dict]


def _iter_groups(paths: list[Path]) -> Iterator[_Group]:
    """Tevatron's training groups, streamed, passages as {"docid", "title", "text"} (empty ones kept: the builder drops
    them); DataFormatError names the file, line and field of a malformed group."""
    for path in paths:
        for where, obj in iter_records(path):
            qid = str(get_field(obj, "query_id", where, (str, int)))
            query = get_field(obj, "query", where)
            pos, neg = ([{"docid": p.id, "title": p.title, "text": p.text}
                         for p in parse_passages(obj, key, where, allow_empty=True)]
                        for key in ("positive_passages", "negative_passages"))
            yield _Group(qid, query, pos, neg)


def _corpus_texts(path: Path, wanted: set[str]) -> dict[str, dict]:
    """The passages of a BEIR ``corpus.jsonl`` whose ids are in ``wanted``, read as a stream."""
    found = {}
    for n, obj in iter_jsonl(path):
        pid = str(get_field(obj, "_id", f"{path}:{n}", (str, int)))
        if pid in wanted:
            found[pid] = {"docid": pid, "title": str(obj.get("title") or ""), "text": str(obj.get("text") or "")}
            if len(found) == len(wanted):
                break
    return found


def _local_corpus(corpus: dict | None, out: Path) -> Path | None:
    """The corpus file of ``corpus`` (``{"asset", "file"}``) where that asset is already built: beside the folder being
    built, in the assets folder or the build cache. Never built here."""
    if not corpus:
        return None
    from multipos.assets import AssetNotFoundError, resolve_dataset

    beside = out.parent / corpus["asset"]
    folder = beside if beside.is_dir() else None
    if folder is None:
        try:
            folder = resolve_dataset(corpus["asset"], download=False)
        except AssetNotFoundError:
            return None
    path = folder / corpus["file"]
    return path if path.is_file() else None


# --- building ------------------------------------------------------------------------------------------------------


def hub_revision(repo: str, default: str) -> str:
    """The revision to read ``repo`` at: ``$MULTIPOS_HUB_REVISIONS`` (``REPO=REV,REPO=REV``) names it, else
    ``default`` (the registry's)."""
    for item in os.environ.get(REVISIONS_ENV, "").split(","):
        name, sep, rev = item.strip().partition("=")
        if sep and name.strip() == repo and rev.strip():
            return rev.strip()
    return default


def _fetch(role: str, spec: dict, asset: str, cache: Path) -> tuple[list[Path], dict]:
    """Download the files of ``spec`` (repository, types, revision, patterns): their paths and the source record."""
    from multipos.assets import hub

    repo = hub.resolve_repo(spec["repo"], hub_revision(spec["repo"], spec.get("revision", "main")),
                            tuple(spec.get("repo_types", ("dataset",))))
    names = hub.match_files(repo, spec["patterns"], f"{asset} {role}")
    paths, files = [], []
    for name in names:
        path, sha = hub.download(repo, name, cache)
        paths.append(path)
        files.append({"path": name, "sha256": sha, "size": path.stat().st_size})
    record = {"role": role, "repo": repo.repo_id, "repo_type": repo.repo_type, "endpoint": repo.endpoint,
              "revision": repo.revision, "commit": repo.commit, "patterns": list(spec["patterns"]), "files": files,
              "licence": spec.get("licence")}
    return paths, record


class _Tally:
    """Counts of one output file."""

    def __init__(self):
        self.queries = self.positives = self.llm = self.human = self.negatives = 0
        self.drops: dict[str, int] = {}

    def drop(self, reason: str, n: int = 1) -> None:
        if n:
            self.drops[reason] = self.drops.get(reason, 0) + n

    def keep(self, human: int, llm: int, negatives: int) -> None:
        self.queries += 1
        self.positives += human + llm
        self.human, self.llm, self.negatives = self.human + human, self.llm + llm, self.negatives + negatives

    def summary(self, file: str, rule: str) -> dict:
        def mean(x: int) -> float:
            return round(x / self.queries, 3) if self.queries else 0.0

        return {"file": file, "rule": rule, "queries": self.queries, "positives": self.positives,
                "positives_per_query": mean(self.positives), "human_positives_per_query": mean(self.human),
                "llm_positives_per_query": mean(self.llm), "hard_negatives_per_query": mean(self.negatives),
                "dropped": dict(sorted(self.drops.items()))}


def _has_text(passage: dict) -> bool:
    return bool(passage["text"].strip() or passage["title"].strip())


def _line(group: _Group, positives: list[dict], negatives: list[dict]) -> str:
    return json.dumps({"query_id": group.qid, "query": group.query, "positive_passages": positives,
                       "negative_passages": negatives}, ensure_ascii=False) + "\n"


def build_training_data(asset, files: dict[str, Path], out: Path, *, annotations: dict, groups: dict,
                        corpus: dict | None = None, paper: dict | None = None, cache: str | None = None) -> None:
    """Builder of ``msmarco-multipos`` / ``nq-multipos`` (:data:`multipos.assets.build.BUILDERS`): download the
    annotation and group files from the hub (:mod:`multipos.assets.hub`) into ``cache`` (default
    ``<MULTIPOS_CACHE>/downloads``), join them and write ``homogeneous.jsonl``, ``heterogeneous.jsonl`` and
    ``prepared.json`` into ``out`` (the rules: module docstring).

    Raises:
        AssetDownloadError: a repository, revision or matching file is missing, a download failed, or a file differs
            from the one first received (both hashes).
        DataFormatError: a malformed annotation record or group (file, line and field).
    """
    from multipos.assets import cache_dir

    cache_path = Path(cache) if cache else cache_dir() / "downloads"
    ann_paths, ann_source = _fetch("annotations", annotations, asset.name, cache_path)
    group_paths, group_source = _fetch("groups", groups, asset.name, cache_path)
    labels = read_annotations(ann_paths)
    log.info("%s: LLM labels of %d queries (%d records, %s)", asset.name, len(labels.positives), labels.records,
             ", ".join(f"{k} {v}" for k, v in labels.kinds.items() if v))

    corpus_path = _local_corpus(corpus, out)
    extra: dict[str, dict] = {}
    if corpus_path is not None:  # first pass: the LLM positives no group carries, looked up in the corpus
        wanted = set()
        for g in _iter_groups(group_paths):
            have = {p["docid"] for p in (*g.positives, *g.negatives) if _has_text(p)}
            wanted.update(p for p in labels.positives.get(g.qid, ()) if p not in have)
        if wanted:
            extra = _corpus_texts(corpus_path, wanted)
            log.info("%s: %d of %d LLM positives outside their groups found in %s", asset.name, len(extra),
                     len(wanted), corpus_path)

    homo, hetero = _Tally(), _Tally()
    seen: set[str] = set()
    duplicates = several_human = llm_also_human = human_only = 0
    without_text: list[str] = []  # the first few LLM positives dropped for want of a text
    n_without_text = 0
    with open(out / "homogeneous.jsonl", "w", encoding="utf-8") as f_homo, \
            open(out / "heterogeneous.jsonl", "w", encoding="utf-8") as f_hetero:
        for g in _iter_groups(group_paths):
            if g.qid in seen:
                duplicates += 1
                continue
            seen.add(g.qid)
            if g.qid not in labels.positives or not g.query.strip():
                reason = "no_annotation_record" if g.qid not in labels.positives else "empty_query"
                homo.drop(reason)
                hetero.drop(reason)
                continue
            llm_ids = labels.positives[g.qid]
            texts = {p["docid"]: p for p in (*g.negatives, *g.positives) if _has_text(p)}  # in both: the positive's
            llm = []
            for pid in llm_ids:
                passage = texts.get(pid) or extra.get(pid)
                if passage is not None and _has_text(passage):
                    llm.append(passage)
                else:
                    n_without_text += 1
                    without_text = without_text if len(without_text) >= 10 else [*without_text, pid]
            human = [p for p in g.positives if _has_text(p)]
            human_ids = {p["docid"] for p in g.positives}
            judged = set(llm_ids) | human_ids
            negatives = [p for p in g.negatives if p["docid"] not in judged and _has_text(p)]
            if not llm_ids:
                homo.drop("no_llm_positive")
            elif not llm:
                homo.drop("positive_text_not_found")
            else:
                homo.keep(0, len(llm), len(negatives))
                f_homo.write(_line(g, llm, negatives))
            if not human:
                hetero.drop("no_human_positive")
                continue
            silver = [p for p in llm if p["docid"] not in human_ids]
            llm_also_human += len(llm) - len(silver)
            several_human += len(human) > 1
            human_only += not silver
            hetero.keep(len(human), len(silver), len(negatives))
            f_hetero.write(_line(g, [*human, *silver], negatives))
    no_group = sum(1 for q in labels.positives if q not in seen)
    homo.drop("no_tevatron_group", no_group)
    hetero.drop("no_tevatron_group", no_group)
    if not homo.queries:
        raise DataFormatError(f"{asset.name}: no query of the annotation files ({', '.join(map(str, ann_paths))}) has "
                              f"an LLM positive in the groups of {groups['repo']}: drops {homo.drops}")

    regimes = {
        "homogeneous": homo.summary("homogeneous.jsonl", "LLM positives only, in utility order (data.source."
                                    "gold_positives: 0; regime=homogeneous)"),
        "heterogeneous": {**hetero.summary("heterogeneous.jsonl", "the human positive(s) first, then the LLM "
                                           "positives that are not human ones (data.source.gold_positives: 1; "
                                           "regime=heterogeneous)"),
                          "queries_with_several_human_positives": several_human,
                          "several_human_positives": "all are listed first, in Tevatron's order; gold_positives 1 "
                                                     "reads the first as gold and the others as silver",
                          "llm_positives_that_are_human": llm_also_human,
                          "queries_without_llm_positive_beyond_the_human": human_only},
    }
    paper = paper or {}
    built = regimes["homogeneous"]
    prepared = {
        "asset": asset.name,
        "paper_dataset": PAPER_DATASET,
        "sources": [ann_source, group_source,
                    {"role": "corpus", "asset": (corpus or {}).get("asset"),
                     "path": str(corpus_path) if corpus_path else None,
                     "used_for": "texts of LLM positives no group carries", "found": len(extra)}],
        "annotations": {"queries": len(labels.positives), "records": labels.records,
                        "queries_with": labels.kinds},
        "regimes": regimes,
        "llm_positives_without_text": {"count": n_without_text, "examples": without_text},
        "duplicate_groups_skipped": duplicates,
        "paper": {**paper, "compare": {
            "llm_positives_per_query": {"built": built["llm_positives_per_query"],
                                        "paper": paper.get("llm_positives_per_query")},
            "queries": {"built": built["queries"], "paper": paper.get("queries")}}},
    }
    from multipos import atomic

    atomic.write_json(out / "prepared.json", prepared)
    for r in regimes.values():
        log.info("%s/%s: %d queries, %.2f positives per query (%.2f LLM; paper: %s), %.1f hard negatives; dropped %s",
                 asset.name, r["file"], r["queries"], r["positives_per_query"], r["llm_positives_per_query"],
                 paper.get("llm_positives_per_query", "-"), r["hard_negatives_per_query"], r["dropped"] or "none")
    if n_without_text:
        log.warning("%s: %d LLM positives have no text in their group%s and were dropped, e.g. %s", asset.name,
                    n_without_text, " or the corpus" if corpus_path else
                    (f" (build {corpus['asset']} first to look them up in its corpus)" if corpus else ""),
                    without_text[:5])
