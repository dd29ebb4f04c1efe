"""Training-data sources: each reads one file format into the data model, and only that.

* :class:`BeirGradedSource` — a BEIR folder with graded training qrels (NFCorpus: grade 2 = gold, grade 1 = silver);
* :class:`TevatronSource` — the paper's training data in the Tevatron JSONL schema, a file (or one of an asset
  folder: ``msmarco-multipos/heterogeneous.jsonl``) or an HF ``datasets`` dataset; the first ``gold_positives``
  positives of each line are gold.

A source's :meth:`Source.read` gives a :class:`multipos.data.preparation.SourceData` (corpus, one
:class:`~multipos.formats.types.TrainQuery` per query with its positives in the file's order, each positive's grade);
hard-negative mining, negative filtering, teacher ordering, teacher scores, grade weights and label noise are the
steps of :mod:`multipos.data.preparation`, which :meth:`Source.prepare` applies in their one declared order
(:data:`multipos.data.preparation.STEPS`) whatever the format. A source takes the steps' settings
(:class:`multipos.data.preparation.StepSettings`) next to its own, as ``data.source`` holds them side by side.
"""

from __future__ import annotations

import logging
from pathlib import Path

from multipos.assets import AssetNotFoundError, is_local_path, resolve_dataset
from multipos.data.groups import TrainQuery
from multipos.data.label_noise import judged_by_text, judged_in_every_split
from multipos.data.preparation import Preparation, PreparedData, SourceData, StepSettings
from multipos.formats.beir import check_qrels_ids, check_query_texts, read_corpus, read_queries
from multipos.formats.tevatron import TEVATRON_SCHEMA, load_tevatron_hf, read_tevatron
from multipos.formats.trec import read_qrels
from multipos.formats.types import REGIME_RULES, Corpus, DataFormatError, regimes_without_positives

log = logging.getLogger(__name__)

#: The grades a Tevatron line gives its positives: gold (the first ``gold_positives``) and silver (the rest).
TEVATRON_GRADES = {"gold": 2, "silver": 1}


class Source:
    """A training-data source: :meth:`read` reads the format (subclasses), :meth:`prepare` applies the steps.

    Args:
        steps: the ``data.source`` settings of the preparation steps (:class:`StepSettings`: ``negatives``,
            ``negative_depth``, ``ordering``, ``teacher``, ``grade_weights``, ``teacher_scores``, ``label_noise``, …).

    Raises ValueError naming the ``data.source`` field for a setting that is neither the format's nor a step's, and
    what :class:`StepSettings` raises.
    """

    #: the ``negatives`` values the format offers, the first its default
    NEGATIVES: tuple[str, ...] = ("given", "bm25", "dense")

    def __init__(self, **steps):
        unknown = sorted(set(steps) - set(StepSettings.names()))
        if unknown:
            raise ValueError(f"data.source.{unknown[0]}: not a setting of {type(self).__name__} (its own: "
                             f"{', '.join(self.reading_settings())}; the steps': {', '.join(StepSettings.names())})")
        steps.setdefault("negatives", self.NEGATIVES[0])
        self.steps = StepSettings(**steps, allowed_negatives=self.NEGATIVES)
        self.preparation = Preparation(self.steps)

    @classmethod
    def reading_settings(cls) -> list[str]:
        """The format's own settings (the constructor's named arguments)."""
        import inspect

        return [n for n, p in inspect.signature(cls.__init__).parameters.items()
                if n != "self" and p.kind is p.POSITIONAL_OR_KEYWORD]

    def read(self) -> SourceData:
        """The format read into the data model, before any step. Subclasses implement it."""
        raise NotImplementedError

    def prepare(self) -> PreparedData:
        """Read, then apply the preparation steps in their order → the training data with each step's report."""
        return self.preparation.run(self.read())

    def load(self) -> tuple[Corpus, list[TrainQuery]]:
        """(corpus, training queries) after every step (:meth:`prepare` without the reports)."""
        prepared = self.prepare()
        return prepared.corpus, prepared.queries

    # the settings a dense refresh of the hard negatives reads (multipos.training.callbacks.NegativeRefresh)
    @property
    def negative_depth(self) -> int:
        """``data.source.negative_depth``: hard negatives mined per query."""
        return self.steps.negative_depth

    @property
    def negative_refresh_epochs(self) -> int | None:
        """``data.source.negative_refresh_epochs``: re-mine every K epochs, None = never."""
        return self.steps.negative_refresh_epochs

    @property
    def negative_filter(self):
        """``data.source.negative_filter`` (:class:`multipos.mining.negative_filter.NegativeFilter`), or None."""
        return self.steps.negative_filter


class BeirGradedSource(Source):
    """Training queries from a BEIR folder with graded training qrels.

    Args:
        path: BEIR folder or dataset name (e.g. ``nfcorpus``; resolved via MULTIPOS_ASSETS).
        qrels_file: graded qrels (TREC or BEIR TSV) relative to the folder, e.g. ``qrels-graded/train.s-3.qrel``;
            else a path (absolute, or relative to the working directory: ``annotations/<name>/qrels/relevance.tsv``
            written by ``python annotate.py``).
        gold_grade: grade of gold (human) positives; silver_grade: grade of silver positives.
        max_queries: keep only the first N queries (smoke tests); None = all.
        steps: the preparation steps' settings (:class:`multipos.data.preparation.StepSettings`); ``negatives``:
            ``bm25`` (the default) or ``dense`` (a BEIR folder gives no negatives of its own). Label noise with
            ``exclude: every_split`` keeps out what any qrels file of the folder judges relevant
            (:func:`multipos.data.label_noise.judged_in_every_split`).

    Queries whose judgments are all below ``silver_grade`` have no positive: they are kept (their judged
    passages are still never negatives elsewhere), counted and logged here, and skipped by the data module.

    Raises: FileNotFoundError for a missing qrels file (listing those present); DataFormatError for file
    errors (file and line), qrels naming unknown ids, qrels without any query, or a judged query with empty
    text; ValueError for bad step settings (naming the field, :class:`StepSettings`).
    """

    NEGATIVES = ("bm25", "dense")

    def __init__(self, path: str, qrels_file: str, gold_grade: int = 2, silver_grade: int = 1,
                 max_queries: int | None = None, **steps):
        super().__init__(**steps)
        self.path, self.qrels_file = path, qrels_file
        self.gold_grade, self.silver_grade = gold_grade, silver_grade
        self.max_queries = max_queries

    def read(self) -> SourceData:
        """Read the folder → corpus, one :class:`TrainQuery` per query of the qrels file (gold and silver positives in
        the file's order, no negatives; a query without a positive is kept and skipped by the data module), the
        qrels grades. Raises as the class says."""
        folder = resolve_dataset(self.path)
        corpus = read_corpus(folder / "corpus.jsonl")
        texts = read_queries(folder / "queries.jsonl")
        qpath = folder / self.qrels_file
        if not qpath.is_file() and Path(self.qrels_file).is_file():  # labels made elsewhere (python annotate.py)
            qpath = Path(self.qrels_file)
        if not qpath.is_file():
            have = sorted(p.name for p in qpath.parent.glob("*") if p.is_file()) if qpath.parent.is_dir() else []
            raise FileNotFoundError(f"{qpath}: training qrels (data.source.qrels_file) not found in {folder}; "
                                    f"files in {qpath.parent.name}/: {have}")
        qrels = read_qrels(qpath)
        if not qrels:
            raise DataFormatError(f"{qpath}: no training query (the qrels file is empty)")
        check_qrels_ids(qrels, texts, corpus, str(qpath))
        if self.max_queries is not None:
            qrels = dict(list(qrels.items())[: self.max_queries])
        check_query_texts(texts, qrels, folder / "queries.jsonl")
        queries = []
        for qid, docs in qrels.items():
            gold = [d for d, g in docs.items() if g >= self.gold_grade]
            silver = [d for d, g in docs.items() if self.silver_grade <= g < self.gold_grade]
            queries.append(TrainQuery(qid, texts[qid], gold, silver, judged=set(docs)))
        unjudged = [q.query_id for q in queries if not q.gold and not q.silver]
        if unjudged:
            log.warning("%s: %d of %d training queries have no judgment with grade >= %d (no positive): "
                        "they will be skipped, e.g. %s", qpath, len(unjudged), len(queries), self.silver_grade,
                        unjudged[:5])
        return SourceData(corpus, queries, {qid: dict(docs) for qid, docs in qrels.items()},
                          tag=f"{folder.resolve()}|{self.qrels_file}", where=str(qpath),
                          judged_elsewhere=lambda: judged_in_every_split(folder, texts))


def asset_file(path: str) -> Path | None:
    """``<asset>/<file>`` (``msmarco-multipos/heterogeneous.jsonl``): the file in the folder of registered asset
    ``<asset>`` (:func:`multipos.assets.resolve_dataset`: the assets folder, the cache, else built from its public
    sources where a network exists); None for a path whose first component names no registered asset.

    Raises:
        AssetNotFoundError: the asset cannot be had, or its folder lacks the file; one paragraph naming the asset, the
            fetch command, the file and its schema (train.py prints it and stops).
    """
    from multipos.assets.registry import REGISTRY

    head, _, rest = str(path).partition("/")
    if not rest or head not in REGISTRY:
        return None
    what = (f"data.source.path={path}: the training file {rest} of asset {head!r} (Tevatron JSONL: {TEVATRON_SCHEMA}) "
            f"is not available")
    command = f"python -m multipos.assets fetch {head}"
    fix = (f"Build it where a network exists with `{command}` (docs/assets.md), or point data.source.path at a file "
           "of that schema.")
    try:
        folder = resolve_dataset(head)
    except AssetNotFoundError as e:
        fix = fix if command not in str(e) else "Or point data.source.path at a file of that schema (docs/assets.md)."
        raise AssetNotFoundError(f"{what}: {e} {fix}") from None
    if not (folder / rest).is_file():
        have = sorted(p.name for p in folder.iterdir())
        raise AssetNotFoundError(f"{what}: {folder} holds {have}. {fix}")
    return folder / rest


class TevatronSource(Source):
    """Training queries in the Tevatron JSONL schema (paper's released MS MARCO / NQ data).

    Args:
        path: a ``.jsonl`` file, ``<asset>/<file>`` of a registered asset (``msmarco-multipos/heterogeneous.jsonl``:
            :func:`asset_file`, built by ``python -m multipos.assets fetch <asset>`` where missing), a folder saved by
            ``datasets``, or an HF hub dataset id.
        split: split for HF datasets.
        gold_positives: how many leading ``positive_passages`` are gold (human): 1 for the
            heterogeneous files (human positive first), 0 for homogeneous (LLM positives only).
        max_queries: keep only the first N lines.
        negative_corpus: a BEIR ``corpus.jsonl`` the miners search (the full collection, e.g. MS MARCO's 8.8M
            passages), the training file's passages added to it; None = the training file's passages only.
        steps: the preparation steps' settings (:class:`multipos.data.preparation.StepSettings`), as for a BEIR
            folder: ``negatives`` ``given`` (each line's ``negative_passages``, the default), ``bm25`` or ``dense``
            (mined over the corpus, the query's positives excluded); teacher ordering, teacher scores, label noise and
            grade weights too. Grades: a line's gold positives have grade 2, the others 1
            (:data:`TEVATRON_GRADES`: ``grade_weights: {2: 1.0, 1: 0.5}``). Label noise with ``exclude: every_split``
            keeps out the positives of every line of the same query text (the file is the one split it has).

    Raises: DataFormatError for a bad line (file and line, see :func:`multipos.formats.tevatron.parse_tevatron`), a
    query id on two lines (naming both) or no line at all; FileNotFoundError for a filesystem ``path`` that does not
    exist (no hub lookup); AssetNotFoundError for an asset file that cannot be had (:func:`asset_file`); ValueError for
    bad step settings (naming the field, :class:`StepSettings`). A passage id given with two different texts keeps
    its first text (the negative corpus's first); their number is logged as a warning.
    """

    NEGATIVES = ("given", "bm25", "dense")

    def __init__(self, path: str, split: str = "train", gold_positives: int = 0, max_queries: int | None = None,
                 negative_corpus: str | None = None, **steps):
        super().__init__(**steps)
        self.path, self.split, self.gold_positives, self.max_queries = path, split, gold_positives, max_queries
        self.negative_corpus = negative_corpus

    def read(self) -> SourceData:
        """Read the file or dataset → corpus of every passage it names, plus ``negative_corpus``; one
        :class:`TrainQuery` per line, its first ``gold_positives`` positives gold and the rest silver, in the file's
        order, with the line's negatives; the grades (:data:`TEVATRON_GRADES`). Raises as the class says."""
        p = Path(self.path).expanduser()
        if not p.exists() and not is_local_path(self.path):
            p = asset_file(self.path) or p
        if p.is_file():
            examples = read_tevatron(p)
        elif not p.exists() and is_local_path(self.path):
            raise FileNotFoundError(f"data.source.path: {self.path} does not exist (a Tevatron .jsonl file, a folder "
                                    "saved by datasets, or a Hugging Face hub dataset id)")
        else:
            examples = load_tevatron_hf(str(p) if p.exists() else self.path, self.split)
        if self.max_queries is not None:
            examples = examples[: self.max_queries]
        corpus = read_corpus(Path(self.negative_corpus).expanduser()) if self.negative_corpus else Corpus()
        queries, seen, conflicts = [], {}, []
        for ex in examples:
            if ex.query_id in seen:
                raise DataFormatError(f"{ex.where}: duplicate query_id {ex.query_id!r} (first at {seen[ex.query_id]})")
            seen[ex.query_id] = ex.where
            for passage in (*ex.positives, *ex.negatives):
                kept = corpus.passages.setdefault(passage.id, passage)
                if kept.full_text() != passage.full_text():
                    conflicts.append((passage.id, ex.where))
            pos = [x.id for x in ex.positives]
            g = self.gold_positives
            queries.append(TrainQuery(ex.query_id, ex.query, pos[:g], pos[g:], [x.id for x in ex.negatives]))
        if conflicts:
            log.warning("%s: %d passages repeat a docid with another text; the first text is kept, e.g. %r at %s",
                        self.path, len(conflicts), *conflicts[0])
        if not queries:
            raise DataFormatError(f"{self.path}: no training queries")
        grades = {q.query_id: {**dict.fromkeys(q.silver, TEVATRON_GRADES["silver"]),
                               **dict.fromkeys(q.gold, TEVATRON_GRADES["gold"])} for q in queries}
        return SourceData(corpus, queries, grades, tag=f"{self.path}|{self.split}|{self.negative_corpus}|{len(corpus)}",
                          where=str(self.path), judged_elsewhere=lambda: judged_by_text(queries))


def check_regime_keeps_positives(source, stages, where: str = "data.source") -> None:
    """Stop before anything runs when the stage plan's regime cannot keep a positive of ``source``'s data, as far as
    its settings tell without reading it: a Tevatron file with ``gold_positives: 0`` (every positive silver) under a
    regime of gold positives, or BEIR qrels whose ``gold_grade`` is not above ``silver_grade`` (no silver tier)
    under ``homogeneous``.

    Args:
        source: the ``data.source`` config node (``_target_`` and settings).
        stages: the ``stages`` node (conf/regime): each stage's ``regime``.
        where: what the message names first (the command or file).

    Raises:
        ValueError: naming the regime, the setting that empties it and the fix.
    """
    target = str(source.get("_target_", ""))
    regimes = [stage.get("regime") for stage in (stages or {}).values()]
    gold = silver = None
    if target.endswith("TevatronSource") and not source.get("gold_positives"):
        gold, fix = 0, ("regime=homogeneous (or all), or data.source.gold_positives=1 where each line's first positive "
                        "is the human one")
    elif target.endswith("BeirGradedSource") and int(source.get("gold_grade", 2)) <= int(source.get("silver_grade", 1)):
        silver, fix = 0, ("regime=all or heterogeneous, or a data.source.gold_grade above data.source.silver_grade "
                          "(graded qrels)")
    empty = regimes_without_positives(regimes, gold, silver)
    if empty:
        every = "silver" if gold == 0 else "gold"
        raise ValueError(f"{where}: regime {empty[0]} keeps no training query: every positive of data.source is "
                         f"{every} ({REGIME_RULES[empty[0]]}). Use {fix}.")

