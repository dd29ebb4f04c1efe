"""Multi-positive training data as a ``datasets.Dataset`` for sentence-transformers: the schema, its checks, the
conversion of multipos's data sources, and hard-negative mining that keeps every positive of a query out.

The schema (one row per query; read by :class:`multipos.sentence_transformers.MultiPositiveDataCollator`):

=============  ================================  ===========================================================
``query``      string                            the query text
``positives``  list of strings, ≥ 1              its positive passages' texts, best first (utility order)
``negatives``  list of strings (optional)        hard negatives, best-ranked first; a positive here is dropped
``grades``     list of numbers (optional)        one per positive: its grade (e.g. 2 = gold, 1 = silver), the
                                                 soft-target objectives' weight (or mapped by ``grade_weights``)
``query_id``   string (optional)                 seeds the query's random selections (else the query text)
=============  ================================  ===========================================================
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Iterable

__all__ = ["QUERY", "POSITIVES", "NEGATIVES", "GRADES", "check_row", "check_dataset", "grade_weight", "to_dataset",
           "to_rows", "mine_negatives"]

log = logging.getLogger(__name__)

QUERY, POSITIVES, NEGATIVES, GRADES, QUERY_ID = "query", "positives", "negatives", "grades", "query_id"


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_row(row: dict, where: str = "row") -> None:
    """Raise ValueError naming ``where`` (e.g. ``row 17``) and the column when ``row`` breaks the schema (module
    docstring): a missing or empty ``query``; no ``positives`` (missing, empty) or one that is not a non-empty string;
    ``negatives`` that is not a list of strings; ``grades`` that are not finite numbers or not one per positive."""
    query = row.get(QUERY)
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"{where}, column {QUERY!r}: expected a non-empty string, got {query!r}")
    positives = row.get(POSITIVES)
    if positives is None or isinstance(positives, str) or len(positives) == 0:
        raise ValueError(f"{where}, column {POSITIVES!r}: no positive (a non-empty list of passage texts is needed), "
                         f"got {positives!r}")
    for k, p in enumerate(positives):
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"{where}, column {POSITIVES!r}: item {k} is not a non-empty string: {p!r}")
    negatives = row.get(NEGATIVES)
    if negatives is not None:
        if isinstance(negatives, str) or not all(isinstance(n, str) for n in negatives):
            raise ValueError(f"{where}, column {NEGATIVES!r}: expected a list of passage texts, got {negatives!r}")
    grades = row.get(GRADES)
    if grades is not None:
        if isinstance(grades, str) or not hasattr(grades, "__len__"):
            raise ValueError(f"{where}, column {GRADES!r}: expected a list of numbers, got {grades!r}")
        bad = [k for k, g in enumerate(grades) if not _is_number(g)]
        if bad:
            raise ValueError(f"{where}, column {GRADES!r}: item {bad[0]} ({grades[bad[0]]!r}) is not a number")
        if len(grades) != len(positives):
            raise ValueError(f"{where}, column {GRADES!r}: {len(grades)} grades for {len(positives)} positives "
                             "(one grade per positive, in the same order)")


def grade_weight(grade: float, grade_weights: dict | None, where: str = "grades") -> float:
    """A positive's target weight: ``grade_weights[grade]`` (``data.source.grade_weights``), or the grade itself when
    ``grade_weights`` is None. Raises ValueError naming ``where`` for a grade the mapping gives no weight."""
    if grade_weights is None:
        return float(grade)
    if grade not in grade_weights:
        raise ValueError(f"{where}: grade {grade!r} has no weight in grade_weights ({grade_weights})")
    return float(grade_weights[grade])


def check_dataset(dataset, grade_weights: dict | None = None):
    """Check every row of ``dataset`` (a ``datasets.Dataset`` or a list of row dicts) against the schema → the
    dataset, unchanged. Raises ValueError naming the first bad row's index and column (:func:`check_row`; with
    ``grade_weights``, also a grade it gives no weight)."""
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        missing = [c for c in (QUERY, POSITIVES) if c not in columns]
        if missing:
            raise ValueError(f"the dataset lacks column(s) {missing} (columns: {columns}); the multi-positive schema "
                             f"is {QUERY!r}, {POSITIVES!r} and optionally {NEGATIVES!r}, {GRADES!r}, {QUERY_ID!r}")
    for i, row in enumerate(dataset):
        check_row(row, f"row {i}")
        if grade_weights is not None and row.get(GRADES) is not None:
            for g in row[GRADES]:
                grade_weight(g, grade_weights, f"row {i}, column {GRADES!r}")
    return dataset


def _features():
    from datasets import Features, Sequence, Value

    return Features({QUERY: Value("string"), POSITIVES: Sequence(Value("string")),
                     NEGATIVES: Sequence(Value("string")), GRADES: Sequence(Value("float64")),
                     QUERY_ID: Value("string")})


def _source(source, qrels_file: str | None, max_queries: int | None, source_args: dict):
    """The multipos data source :func:`to_dataset` reads (its ``source`` argument, or one built from a path)."""
    from multipos.data.sources import BeirGradedSource, Source, TevatronSource

    if isinstance(source, Source):
        if qrels_file is not None or max_queries is not None or source_args:
            raise ValueError("to_dataset: pass qrels_file, max_queries and other settings to the source itself, not "
                             "next to it")
        return source
    if qrels_file is not None:
        settings = {"ordering": "given", **source_args}
        return BeirGradedSource(str(source), qrels_file, max_queries=max_queries, **settings)
    return TevatronSource(str(source), max_queries=max_queries, **source_args)


def to_dataset(source, qrels_file: str | None = None, *, regime: str = "all", max_queries: int | None = None,
               **source_args):
    """multipos training data → a ``datasets.Dataset`` of the multi-positive schema (module docstring).

    Args:
        source: a :class:`multipos.data.sources.BeirGradedSource` or :class:`~multipos.data.sources.TevatronSource`
            (loaded as it is configured), or a path: with ``qrels_file`` a BEIR folder or dataset name (read by
            ``BeirGradedSource(source, qrels_file, ordering="given", **source_args)``: positives in the qrels file's
            order, BM25 hard negatives), else a Tevatron JSONL file, saved dataset folder or hub id
            (``TevatronSource(source, **source_args)``: the file's positive order and ``negative_passages``).
        qrels_file: graded training qrels relative to the BEIR folder, e.g. ``qrels-graded/train.s-3.qrel``.
        regime: which positives each row keeps (:meth:`multipos.data.groups.TrainQuery.positives`): ``all`` (gold then
            silver, default), ``gold``, ``homogeneous`` (silver only) or ``heterogeneous``. Queries left without a
            positive are skipped (their number is logged), as multipos's data module skips them.
        max_queries: keep the first N training queries (a path ``source`` only).
        source_args: further settings of the source built from a path (``negative_depth``, ``ordering="teacher"``
            with ``teacher=...``, ``gold_positives`` for Tevatron, ...).

    Rows: ``query``, ``positives`` and ``negatives`` as passage texts (title and text, as multipos's encoders read
    them: :meth:`multipos.formats.types.Passage.full_text`), ``grades`` (a BEIR source: each positive's qrels grade;
    Tevatron: 2 for the gold positives, the first ``gold_positives``, and 1 for the rest) and ``query_id``.

    Raises: what the source's ``load`` raises (missing files, malformed lines naming the file and line), ValueError for
    an unknown regime or when no query keeps a positive.
    """
    prepared = _source(source, qrels_file, max_queries, source_args).prepare()
    return to_rows(prepared.corpus, prepared.queries, regime, prepared.grades)


def to_rows(corpus, queries, regime: str = "all", qrels: dict | None = None):
    """A loaded source's ``(corpus, TrainQuery list)`` (``BeirGradedSource.load()``, ``TevatronSource.load()``) → the
    ``datasets.Dataset`` of :func:`to_dataset` (rows as it says). ``qrels`` ({query id: {passage id: grade}}) gives
    each positive its grade; a positive it does not grade (or every one, ``qrels=None``) gets 2 if gold, 1 if silver.
    Raises ValueError for an unknown regime or when no query keeps a positive."""
    from datasets import Dataset

    rows = {QUERY: [], POSITIVES: [], NEGATIVES: [], GRADES: [], QUERY_ID: []}
    skipped = 0
    for q in queries:
        ids = q.positives(regime)
        if not ids:
            skipped += 1
            continue
        gold = set(q.gold)
        judged = (qrels or {}).get(q.query_id, {})  # (a false positive of data.source.label_noise has no grade)
        grades = [judged.get(p, 2 if p in gold else 1) for p in ids]
        rows[QUERY].append(q.query)
        rows[POSITIVES].append([corpus[p].full_text() for p in ids])
        rows[NEGATIVES].append([corpus[n].full_text() for n in q.negatives])
        rows[GRADES].append([float(g) for g in grades])
        rows[QUERY_ID].append(q.query_id)
    if skipped:
        log.warning("to_dataset: %d of %d queries have no positive under regime %r and are left out", skipped,
                    len(queries), regime)
    if not rows[QUERY]:
        raise ValueError(f"to_dataset: no query keeps a positive under regime {regime!r}")
    return check_dataset(Dataset.from_dict(rows, features=_features()))


def mine_negatives(dataset, model, num_negatives: int = 8, corpus: Iterable[str] | None = None, append: bool = False,
                   **mine_args):
    """Hard negatives for every row of ``dataset`` (the multi-positive schema) from
    ``sentence_transformers.util.mine_hard_negatives``, with no positive of the row among them.

    The rows are split into (query, positive) pairs, one per positive, which ``mine_hard_negatives`` reads as one query
    with several positives (it groups pairs by query text and never returns any of them); then every mined passage
    that is one of the row's positives (by text) is removed once more, so that no positive becomes a negative whatever
    the miner's settings.

    Args:
        dataset: a ``datasets.Dataset`` of the schema (:func:`check_dataset`).
        model: the ``SentenceTransformer`` that embeds queries (``encode_query``) and passages (``encode_document``).
        num_negatives: hard negatives mined per query (``mine_hard_negatives``' ``num_negatives``).
        corpus: passage texts to mine from, besides the dataset's own positives and negatives; None = those alone.
        append: keep the row's ``negatives`` and add the mined ones after them (default: the mined ones replace them).
        mine_args: further ``mine_hard_negatives`` settings (``range_min``, ``relative_margin``, ``sampling_strategy``,
            ``batch_size``, ``use_faiss``, ...); ``verbose`` defaults to False.

    Returns the dataset with the new ``negatives`` column (best-ranked first), other columns as they are. A row for
    which nothing was mined keeps its negatives (``append``) or gets none.

    Raises: ValueError for a row that breaks the schema (:func:`check_dataset`) and whatever ``mine_hard_negatives``
    raises for its settings.
    """
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    check_dataset(dataset)
    queries, positives = list(dataset[QUERY]), list(dataset[POSITIVES])
    old = list(dataset[NEGATIVES]) if NEGATIVES in dataset.column_names else [[] for _ in queries]
    pairs = Dataset.from_dict({"anchor": [q for q, ps in zip(queries, positives) for _ in ps],
                               "positive": [p for ps in positives for p in ps]})
    pool = list(dict.fromkeys([*(corpus or []), *(n for ns in old for n in (ns or []))]))
    mined = mine_hard_negatives(pairs, model, anchor_column_name="anchor", positive_column_name="positive",
                                corpus=pool, num_negatives=num_negatives, output_format="labeled-list",
                                **{"verbose": False, **mine_args})
    found: dict[str, list[str]] = {}
    for query, docs, labels in zip(mined["anchor"], mined["positive"], mined["labels"]):
        found.setdefault(query, [d for d, label in zip(docs, labels) if label == 0])
    new, removed = [], 0
    for query, ps, ns in zip(queries, positives, old):
        judged = set(ps)
        candidates = [*((ns or []) if append else []), *found.get(query, [])]
        kept = [n for n in dict.fromkeys(candidates) if n not in judged]
        removed += sum(1 for n in found.get(query, []) if n in judged)
        new.append(kept)
    if removed:
        log.info("mine_negatives: %d mined passages were positives of their query and were dropped", removed)
    if NEGATIVES in dataset.column_names:
        dataset = dataset.remove_columns(NEGATIVES)
    return dataset.add_column(NEGATIVES, new, feature=_features()[NEGATIVES])
