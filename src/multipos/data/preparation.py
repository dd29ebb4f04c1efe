"""Preparing training data: what happens between reading a source and building groups, as steps in one order.

A source (:mod:`multipos.data.sources`) only reads its format into the data model: a corpus, one
:class:`~multipos.formats.types.TrainQuery` per training query with its gold and silver positives in the file's order
and the hard negatives the file gives, and each positive's grade (:class:`SourceData`). Everything else is a step of
this module, applied in the order of :data:`STEPS` to whatever a source read, so every format gets every step:

1. ``grade_weights`` (:class:`GradeWeights`) — each positive's target weight from its grade
   (``data.source.grade_weights``); first, from the labels as read, so that label noise moves a replaced positive's
   weight onto the false positive that takes its place.
2. ``negatives`` (:class:`MineNegatives`) — hard negatives: ``given`` (the file's), ``bm25`` or ``dense``
   (:func:`mine_bm25_negatives`, :func:`multipos.mining.dense_negatives.mine_with_checkpoint`); a passage judged for
   the query is never its negative (:func:`multipos.data.groups.unjudged_negatives`).
3. ``teacher_order`` (:class:`TeacherOrder`) — positives of each tier by descending teacher score
   (``data.source.ordering: teacher``, :func:`teacher_order`).
4. ``negative_filter`` (:class:`FilterNegatives`) — positive-aware filtering of the mined negatives
   (:mod:`multipos.mining.negative_filter`); after the ordering: ``reference: first`` is the teacher's best positive.
5. ``teacher_scores`` (:class:`TeacherTargets`) — a teacher's scores as soft targets, from a file
   (``data.source.teacher_scores``) or a model (``data.source.teacher_model``); after mining: a model scores each
   query's positives and hard negatives.
6. ``label_noise`` (:class:`AddLabelNoise`) — a share of the positives replaced by false positives
   (:mod:`multipos.data.label_noise`); last: the false positives take the ordered places of the positives they
   replace and are drawn from the final hard negatives.

Each step returns what it did (:class:`StepReport`: counts, and the files a run folder keeps); the data module puts
the counts of ``negative_filter``, ``teacher_scores`` and ``label_noise`` into each stage's record (``run_info.json``)
and train.py writes the files (``label_noise.json``). Every step logs one line. Mined negatives and teacher scores are
cached under ``<cache>/`` with the settings that produced them in the file name.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from multipos import atomic
from multipos.assets import cache_dir
from multipos.data.groups import TrainQuery, unjudged_negatives
from multipos.data.label_noise import LabelNoise
from multipos.formats.types import Corpus
from multipos.mining.negative_filter import NegativeFilter
from multipos.mining.teacher_model import TeacherModel
from multipos.mining.teacher_scores import TeacherScores

__all__ = ["ORDERINGS", "NEGATIVES", "STEPS", "SourceData", "PreparedData", "StepReport", "StepSettings",
           "Preparation", "GradeWeights", "MineNegatives", "TeacherOrder", "FilterNegatives", "TeacherTargets",
           "AddLabelNoise", "mine_bm25_negatives", "teacher_order"]

log = logging.getLogger(__name__)

#: Positive orders inside a tier: the file's, or a teacher's scores.
ORDERINGS = ("given", "teacher")
#: Hard-negative miners: the file's own negatives, BM25, or a dense model.
NEGATIVES = ("given", "bm25", "dense")


@dataclass
class SourceData:
    """What a source read, in the data model, before any step.

    Attributes:
        corpus: every passage the data names (and the passages the miners search).
        queries: one :class:`TrainQuery` per training query: gold and silver positives in the file's order, the
            negatives the file gives (none for a BEIR folder), every judged passage.
        grades: {query id → {passage id → grade}} of the judged passages (a BEIR qrels file's grades; a Tevatron
            line's gold positives 2, the others 1), read by ``grade_weights``.
        tag: identifies the data in the cache keys of the miners and the teacher ordering.
        where: the file or folder that error messages name.
        judged_elsewhere: () → {query id → passages judged relevant for it anywhere the source knows (every split)},
            read by label noise with ``exclude: every_split``; called only then.
    """

    corpus: Corpus
    queries: list[TrainQuery]
    grades: dict[str, dict[str, int]]
    tag: str
    where: str
    judged_elsewhere: Callable[[], dict[str, set[str]]]


@dataclass
class StepReport:
    """What one step did: ``counts`` (for the log and, where ``record_as`` names a key, the stage record in
    ``run_info.json``) and ``files`` ({file name → JSON content} the run folder keeps, e.g. ``label_noise.json``)."""

    step: str
    counts: dict
    record_as: str | None = None
    files: dict[str, dict] = field(default_factory=dict)


@dataclass
class PreparedData:
    """The training data after every step: ``corpus``, ``queries`` (in the source's order), ``grades`` (as read) and
    one :class:`StepReport` per step that ran, in :data:`STEPS` order."""

    corpus: Corpus
    queries: list[TrainQuery]
    grades: dict[str, dict[str, int]]
    reports: list[StepReport] = field(default_factory=list)

    def counts(self, step: str) -> dict | None:
        """The counts of ``step`` (a :data:`STEPS` name), or None when it did not run."""
        return next((r.counts for r in self.reports if r.step == step), None)

    def stats(self) -> dict:
        """{key → counts} of the steps a stage record names (``negative_filter``, ``teacher_scores``,
        ``label_noise``), in step order; a step with empty counts adds nothing."""
        return {r.record_as: dict(r.counts) for r in self.reports if r.record_as and r.counts}

    def files(self) -> dict[str, dict]:
        """{file name → JSON content} the steps leave for the run folder (``label_noise.json``)."""
        return {name: content for r in self.reports for name, content in r.files.items()}


def _check_grade_weights(grade_weights) -> dict[int, float] | None:
    """``data.source.grade_weights`` as {grade: weight}: the target weight of a positive of each grade, read by the
    soft-target objectives (:data:`multipos.losses.SOFT_OBJECTIVES`). Raises ValueError naming the setting for a
    grade that is not an integer or a weight that is not a number in (0, 1]."""
    if grade_weights is None:
        return None
    out = {}
    for grade, weight in dict(grade_weights).items():
        try:
            g, w = int(grade), float(weight)
        except (TypeError, ValueError):
            raise ValueError(f"data.source.grade_weights: {grade!r}: {weight!r} must map an integer grade to a "
                             "number") from None
        if not 0 < w <= 1:
            raise ValueError(f"data.source.grade_weights: grade {g} has weight {w}; weights lie in (0, 1]")
        out[g] = w
    return out


@dataclass
class StepSettings:
    """The ``data.source`` settings of the steps, the same for every format; checked when built.

    Args:
        negatives: ``given`` (the file's negatives; not offered by a format that has none), ``bm25`` (BM25
            top-``negative_depth``) or ``dense`` (``negative_model``'s top-``negative_depth``); judged passages removed.
            Cached under ``<cache>/negatives``.
        negative_depth: hard negatives mined per query.
        negative_model: checkpoint of the dense miner (and of the negative filter's scores; the data configs: the
            starting checkpoint); negative_encoder: its DualEncoder keyword arguments (pooling, normalize, lengths).
        negative_refresh_epochs: re-mine with the weights being trained every K epochs
            (:class:`multipos.training.callbacks.NegativeRefresh`), None = never.
        negative_filter: ``{share, margin, reference}`` (:class:`multipos.mining.negative_filter.NegativeFilter`),
            None = off; needs mined negatives.
        ordering: ``given`` (file order) or ``teacher``; teacher: the checkpoint ``teacher`` ordering scores with.
        teacher_pooling, teacher_normalize: the teacher's pooling and L2 when its checkpoint saved none (the data
            configs pass the model config's); teacher_prompts: ``{"query": …, "passage": …}`` (None: the teacher's).
        grade_weights: {grade: weight in (0, 1]}: each positive's target weight for the soft-target objectives, e.g.
            ``{2: 1.0, 1: 0.5}``; None = no targets.
        teacher_scores: ``{path, temperature}``: a teacher's scores of the training passages (a TREC run or JSONL,
            :class:`multipos.mining.teacher_scores.TeacherScores`); None = none.
        teacher_model: ``{path, kind: bi | cross, temperature, negatives}``: a sentence-transformers teacher that
            scores each query's positives and hard negatives once, cached
            (:class:`multipos.mining.teacher_model.TeacherModel`); targets as ``teacher_scores``.
        label_noise: ``{rate, kind, seed, exclude}``: replace that share of each query's positives by false positives
            (:class:`multipos.data.label_noise.LabelNoise`); None = the labels as published.
        allowed_negatives: the ``negatives`` values the format offers (not a config setting).

    Raises ValueError naming the ``data.source`` field: an unknown miner or ordering, dense negatives or teacher
    ordering without a checkpoint, a refresh period or depth out of range, bad grade weights, two settings that each
    give target weights, a negative filter over the file's own negatives; and what the settings' own classes raise.
    """

    negatives: str = "given"
    negative_depth: int = 100
    negative_model: str | None = None
    negative_encoder: dict | None = None
    negative_refresh_epochs: int | None = None
    negative_filter: Any = None
    ordering: str = "given"
    teacher: str | None = None
    teacher_pooling: str | None = None
    teacher_normalize: bool | None = None
    teacher_prompts: dict | None = None
    grade_weights: Any = None
    teacher_scores: Any = None
    teacher_model: Any = None
    label_noise: Any = None
    allowed_negatives: tuple[str, ...] = NEGATIVES

    def __post_init__(self):
        if self.negatives not in self.allowed_negatives:
            raise ValueError(f"unknown data.source.negatives {self.negatives!r}; allowed: "
                             f"{', '.join(self.allowed_negatives)}")
        if self.negatives == "dense" and not self.negative_model:
            raise ValueError("data.source.negatives=dense needs data.source.negative_model (a checkpoint)")
        refresh = self.negative_refresh_epochs
        if refresh is not None and (isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1):
            raise ValueError(f"data.source.negative_refresh_epochs must be null or an integer >= 1, got {refresh!r}")
        if self.negative_depth < 1:
            raise ValueError(f"data.source.negative_depth must be >= 1, got {self.negative_depth}")
        self.grade_weights = _check_grade_weights(self.grade_weights)
        self.teacher_scores = TeacherScores.from_config(self.teacher_scores)
        self.teacher_model = TeacherModel.from_config(self.teacher_model)
        given = [n for n in ("grade_weights", "teacher_scores", "teacher_model") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"data.source.{' and data.source.'.join(given)} each give target weights: set one")
        self.label_noise = LabelNoise.from_config(self.label_noise)
        if self.ordering not in ORDERINGS:
            raise ValueError(f"unknown data.source.ordering {self.ordering!r}; allowed: {', '.join(ORDERINGS)}")
        if self.ordering == "teacher" and not self.teacher:
            raise ValueError("data.source.ordering=teacher needs data.source.teacher (a checkpoint)")
        self.teacher_prompts = dict(self.teacher_prompts) if self.teacher_prompts else None
        self.negative_filter = NegativeFilter.from_config(self.negative_filter)
        if self.negative_filter and self.negatives == "given":
            raise ValueError("data.source.negative_filter filters mined negatives: set data.source.negatives to bm25 "
                             "or dense (the file's own negative_passages are kept as given)")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The ``data.source`` settings of the steps (every field but ``allowed_negatives``)."""
        return tuple(f.name for f in fields(cls) if f.name != "allowed_negatives")


def _cache_json(name: str, settings: dict, compute):
    """Load ``compute()``'s JSON result from the cache, keyed by ``settings``, or compute and store it."""
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / name / f"{key}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())["value"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
            log.warning("cache file %s is damaged (interrupted write?): rebuilding it", path)
    value = compute()
    atomic.write_json(path, {"settings": settings, "value": value}, indent=None)
    return value


def mine_bm25_negatives(corpus: Corpus, queries: dict[str, str], judged: dict[str, set[str]], depth: int,
                        source: str) -> dict[str, list[str]]:
    """BM25 hard negatives: {query id → its top-``depth`` passages minus every judged passage, best first}, for
    ``queries`` ({query id → text}) over ``corpus``; ``source`` names the data in the cache key. Cached."""

    def compute():
        from multipos.retrieval.bm25 import BM25

        log.info("mining BM25 negatives for %d queries (depth %d)", len(queries), depth)
        run = BM25(corpus).search(queries, k=depth + max((len(j) for j in judged.values()), default=0))
        return {q: unjudged_negatives(sorted(docs, key=lambda d: -docs[d]), judged.get(q, ()), depth)
                for q, docs in run.items()}

    settings = {"source": source, "n_passages": len(corpus), "queries": len(queries), "depth": depth,
                "miner": "bm25s-lucene-0.9-0.4"}
    return _cache_json("negatives", settings, compute)


#: The passage length in tokens :func:`teacher_order` scores at (the evaluation's, so the main job's frozen index and
#: the teacher's passage embeddings are one cache entry).
TEACHER_PASSAGE_MAX_LENGTH = 256


def teacher_order(queries: list[TrainQuery], query_texts: dict[str, str], corpus: Corpus, teacher: str,
                  source: str, query_max_length: int = 32, passage_max_length: int = TEACHER_PASSAGE_MAX_LENGTH, *,
                  pooling: str | None = None, normalize: bool | None = None,
                  trust_remote_code: bool = False, prompts: dict | None = None) -> None:
    """Reorder each query's gold and silver positives by descending teacher score (in place). Cached.

    ``teacher`` is a checkpoint name/path loaded as a :class:`~multipos.model.encoder.DualEncoder` with the
    checkpoint's own settings: the pooling/normalisation saved in its ``multipos_encoder.json``, else
    ``pooling`` / ``normalize`` (pass the model config's ``model.pooling`` / ``model.normalize``), else those
    of its sentence-transformers files (mean + L2 for all-MiniLM-L6-v2), else the DualEncoder defaults.
    ``prompts``: ``{"query": …, "passage": …}`` (the model config's prompts; None values = the checkpoint's own).
    ``query_texts``: {query id → text}; ``source`` names the data in the cache key.

    The cache key holds the teacher's weights and settings (:meth:`DualEncoder.fingerprint` over both
    encoders, pooling and normalisation), not only its name: a retrained checkpoint at the same path, or
    another model under the same name, is scored anew. Loading the teacher is therefore not skipped on
    a cache hit (the encoding is).
    """
    from multipos.model.encoder import DualEncoder
    from multipos.retrieval.encoding import cached_encode, encode

    prompts = dict(prompts or {})
    model = DualEncoder(teacher, pooling=pooling, normalize=normalize, query_max_length=query_max_length,
                        passage_max_length=passage_max_length, trust_remote_code=trust_remote_code,
                        query_prompt=prompts.get("query"), passage_prompt=prompts.get("passage"))

    def compute():
        # the whole corpus through the embedding cache: the same embeddings as the zero-shot reference, evaluation and
        # a frozen passage index of this checkpoint (query-side fine-tuning), so none of them encodes it again
        pids = corpus.ids
        log.info("teacher ordering: %d passages and %d queries with %s (%s pooling%s)", len(pids),
                 len(queries), teacher, model.pooling, ", L2" if model.normalize else "")
        p_emb = cached_encode(model, pids, corpus.texts(pids), cache_dir(), tag="teacher ordering", kind="passage",
                              max_length=passage_max_length)
        q_emb = encode(model, [query_texts[q.query_id] for q in queries], "query")
        row = {p: i for i, p in enumerate(pids)}
        out = {}
        for i, q in enumerate(queries):
            out[q.query_id] = {p: float(q_emb[i] @ p_emb[row[p]]) for p in (*q.gold, *q.silver)}
        return out

    settings = {"source": source, "teacher": teacher, "teacher_weights": model.fingerprint(include_query=True),
                "pooling": model.pooling, "normalize": model.normalize, "queries": len(queries),
                "lq": query_max_length, "lp": passage_max_length}
    scores = _cache_json("teacher_scores", settings, compute)
    for q in queries:
        s = scores[q.query_id]
        q.gold = sorted(q.gold, key=lambda p: -s[p])
        q.silver = sorted(q.silver, key=lambda p: -s[p])


# --------------------------------------------------------------------------------------------------------------------
# the steps: each built from the settings (None when off) and applied to what a source read
# --------------------------------------------------------------------------------------------------------------------

@dataclass
class GradeWeights:
    """Each positive's target weight from its grade (``data.source.grade_weights``: {grade: weight})."""

    weights: dict[int, float]
    name = "grade_weights"
    record_as = None

    @classmethod
    def configure(cls, settings: StepSettings) -> GradeWeights | None:
        """The step for ``settings``, or None when ``grade_weights`` is off."""
        return None if settings.grade_weights is None else cls(settings.grade_weights)

    def apply(self, data: SourceData) -> StepReport:
        """Set ``TrainQuery.weights`` of every positive → counts ``{queries, positives}``. Raises ValueError naming
        the file and the query for a positive whose grade the setting gives no weight."""
        positives = 0
        for q in data.queries:
            grades = data.grades.get(q.query_id, {})
            weights = {}
            for p in (*q.gold, *q.silver):
                if grades.get(p) not in self.weights:
                    raise ValueError(f"{data.where}: query {q.query_id!r} has a positive of grade {grades.get(p)}, "
                                     f"which data.source.grade_weights ({self.weights}) gives no weight")
                weights[p] = self.weights[grades[p]]
            q.weights = weights
            positives += len(weights)
        return StepReport(self.name, {"queries": len(data.queries), "positives": positives})


@dataclass
class MineNegatives:
    """Hard negatives: the file's (``given``), or mined with BM25 or a dense checkpoint over the corpus."""

    kind: str
    depth: int
    model: str | None = None
    encoder: dict | None = None
    name = "negatives"
    record_as = None

    @classmethod
    def configure(cls, settings: StepSettings) -> MineNegatives:
        """Always a step (``given`` keeps the source's negatives)."""
        return cls(settings.negatives, settings.negative_depth, settings.negative_model, settings.negative_encoder)

    def apply(self, data: SourceData) -> StepReport:
        """Replace each query's negatives by the mined ones (none where the miner found none) → counts ``{kind,
        depth, queries, negatives}`` (negatives: how many, summed over the queries)."""
        queries = data.queries
        if self.kind == "dense":
            from multipos.mining.dense_negatives import mine_with_checkpoint

            pools = mine_with_checkpoint(self.model, data.corpus, {q.query_id: q.query for q in queries},
                                         {q.query_id: q.judged for q in queries}, self.depth, self.encoder)
        elif self.kind == "bm25":
            pools = mine_bm25_negatives(data.corpus, {q.query_id: q.query for q in queries},
                                        {q.query_id: q.judged for q in queries}, self.depth, data.tag)
        if self.kind != "given":
            for q in queries:
                q.negatives = pools.get(q.query_id, [])
        return StepReport(self.name, {"kind": self.kind, "depth": None if self.kind == "given" else self.depth,
                                      "queries": len(queries), "negatives": sum(len(q.negatives) for q in queries)})


@dataclass
class TeacherOrder:
    """Positives of each tier by descending teacher score (``data.source.ordering: teacher``)."""

    teacher: str
    pooling: str | None = None
    normalize: bool | None = None
    prompts: dict | None = None
    name = "teacher_order"
    record_as = None

    @classmethod
    def configure(cls, settings: StepSettings) -> TeacherOrder | None:
        """The step for ``settings``, or None for ``ordering: given``."""
        if settings.ordering != "teacher":
            return None
        return cls(settings.teacher, settings.teacher_pooling, settings.teacher_normalize, settings.teacher_prompts)

    def apply(self, data: SourceData) -> StepReport:
        """Reorder in place (:func:`teacher_order`) → counts ``{queries, reordered}`` (reordered: queries whose
        order changed)."""
        before = [(list(q.gold), list(q.silver)) for q in data.queries]
        teacher_order(data.queries, {q.query_id: q.query for q in data.queries}, data.corpus, self.teacher, data.tag,
                      pooling=self.pooling, normalize=self.normalize, prompts=self.prompts)
        changed = sum(b != (q.gold, q.silver) for b, q in zip(before, data.queries))
        return StepReport(self.name, {"queries": len(data.queries), "reordered": changed})


@dataclass
class FilterNegatives:
    """Positive-aware filtering of the mined negatives (``data.source.negative_filter``), scored by the miner's
    checkpoint and settings (``data.source.negative_model`` / ``negative_encoder``)."""

    rule: NegativeFilter
    model: str | None
    encoder: dict | None = None
    name = "negative_filter"
    record_as = "negative_filter"

    @classmethod
    def configure(cls, settings: StepSettings) -> FilterNegatives | None:
        """The step for ``settings``, or None when no filter is set."""
        if not settings.negative_filter:
            return None
        return cls(settings.negative_filter, settings.negative_model, settings.negative_encoder)

    def apply(self, data: SourceData) -> StepReport:
        """Filter every query's negatives, its positives in their current order (teacher order after that step) →
        the counts of :func:`multipos.mining.negative_filter.score_and_filter`."""
        from multipos.mining.dense_negatives import load_encoder
        from multipos.mining.negative_filter import score_and_filter

        queries = data.queries
        scorer = load_encoder(self.model, self.encoder)
        pools, counts = score_and_filter(scorer, data.corpus, {q.query_id: q.query for q in queries},
                                         {q.query_id: q.negatives for q in queries},
                                         {q.query_id: [*q.gold, *q.silver] for q in queries}, self.rule, cache_dir())
        for q in queries:
            q.negatives = pools[q.query_id]
        return StepReport(self.name, counts, self.record_as)


@dataclass
class TeacherTargets:
    """A teacher's scores as soft targets: raw scores (``TrainQuery.teacher_scores``) and their softmax as target
    weights, from a file (``data.source.teacher_scores``) or a model (``data.source.teacher_model``)."""

    teacher: TeacherScores | TeacherModel
    name = "teacher_scores"
    record_as = "teacher_scores"

    @classmethod
    def configure(cls, settings: StepSettings) -> TeacherTargets | None:
        """The step for ``settings``, or None when neither teacher setting is given."""
        teacher = settings.teacher_scores if settings.teacher_scores is not None else settings.teacher_model
        return None if teacher is None else cls(teacher)

    def apply(self, data: SourceData) -> StepReport:
        """Give each query its targets → counts ``{queries, scored_queries, positives, unscored_positives}``
        (:func:`multipos.mining.teacher_scores.assign_targets`)."""
        if isinstance(self.teacher, TeacherModel):
            counts = self.teacher.apply(data.queries, data.corpus, cache_dir())
        else:
            counts = self.teacher.apply(data.queries)
        return StepReport(self.name, counts, self.record_as)


@dataclass
class AddLabelNoise:
    """A share of each query's positives replaced by false positives (``data.source.label_noise``)."""

    noise: LabelNoise
    name = "label_noise"
    record_as = "label_noise"

    @classmethod
    def configure(cls, settings: StepSettings) -> AddLabelNoise | None:
        """The step for ``settings``, or None for no noise (rate 0 or no setting)."""
        return None if settings.label_noise is None else cls(settings.label_noise)

    def apply(self, data: SourceData) -> StepReport:
        """Replace positives in place (:meth:`LabelNoise.apply`) → counts ``{queries, replaced, positives, short}``
        and ``label_noise.json``: the settings and, per query, the replaced positives and their false positives."""
        noise = self.noise
        elsewhere = data.judged_elsewhere() if noise.exclude == "every_split" else None
        counts = noise.apply(data.queries, data.corpus.ids, elsewhere)
        log.info("label noise %s (%s): %d of %d training positives replaced by false positives", noise.rate,
                 noise.kind, counts["replaced"], counts["positives"])
        record = {"rate": noise.rate, "kind": noise.kind, "seed": noise.seed, "exclude": noise.exclude,
                  "queries": noise.record}
        return StepReport(self.name, counts, self.record_as, {"label_noise.json": record})


#: The preparation steps, in the order they run (the module docstring says why this order): every source's data
#: goes through each one whose setting is on.
STEPS = (GradeWeights, MineNegatives, TeacherOrder, FilterNegatives, TeacherTargets, AddLabelNoise)


class Preparation:
    """The steps of :data:`STEPS` that ``settings`` turn on, in that order.

    Args:
        settings: the checked step settings (:class:`StepSettings`).
    """

    def __init__(self, settings: StepSettings):
        self.settings = settings
        self.steps = [step for step in (cls.configure(settings) for cls in STEPS) if step is not None]

    @property
    def names(self) -> list[str]:
        """The names of the steps that run, in order."""
        return [step.name for step in self.steps]

    def run(self, data: SourceData) -> PreparedData:
        """Apply every step to ``data`` (its queries are changed in place) → :class:`PreparedData` with one report
        per step. Raises what the steps raise (files and fields named)."""
        reports = []
        for step in self.steps:
            report = step.apply(data)
            log.info("data step %s: %s", step.name, report.counts)
            reports.append(report)
        return PreparedData(data.corpus, data.queries, data.grades, reports)
