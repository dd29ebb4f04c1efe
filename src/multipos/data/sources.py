"""Training-data sources: turn files on disk into a corpus and a list of :class:`TrainQuery`.

* :class:`BeirGradedSource` — a BEIR folder with graded training qrels (NFCorpus: grade 2 = gold,
  grade 1 = silver), hard negatives mined with BM25 or a dense model and cached on disk.
* :class:`TevatronSource` — the paper's training data in the Tevatron JSONL schema, a file (or one of an asset
  folder: ``msmarco-multipos/heterogeneous.jsonl``) or an HF ``datasets`` dataset; the first ``gold_positives``
  positives of each line are gold; hard negatives are the file's or mined with a dense model.

Hard negatives (``negatives``): ``bm25`` (BEIR) or ``given`` (Tevatron) as published, or ``dense``: the top
passages of a dense model, by default the starting checkpoint (:mod:`multipos.mining.dense_negatives`), optionally
refreshed with the weights being trained every ``negative_refresh_epochs`` epochs (ANCE). Every miner applies one
rule, :func:`multipos.data.groups.unjudged_negatives`: a passage judged for the query, with any grade (0 included), is
never its negative.

Positive order inside a tier is ``given`` (file order) or ``teacher`` (descending score of a
teacher dual encoder, by default the starting checkpoint — the paper's annotations are ordered by
utility, Sec. 4). Orders and mined negatives are cached under ``<cache>/`` with the settings that
produced them in the file name.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from multipos import atomic
from multipos.assets import AssetNotFoundError, cache_dir, is_local_path, resolve_dataset
from multipos.data.groups import TrainQuery, unjudged_negatives
from multipos.data.label_noise import LabelNoise, judged_in_every_split
from multipos.formats.beir import check_qrels_ids, check_query_texts, read_corpus, read_queries
from multipos.formats.tevatron import TEVATRON_SCHEMA, load_tevatron_hf, read_tevatron
from multipos.formats.trec import read_qrels
from multipos.formats.types import REGIME_RULES, Corpus, DataFormatError, regimes_without_positives
from multipos.mining.negative_filter import NegativeFilter
from multipos.mining.teacher_model import TeacherModel
from multipos.mining.teacher_scores import TeacherScores

log = logging.getLogger(__name__)
ORDERINGS = ("given", "teacher")


def _check_negative_options(negatives: str, allowed: tuple[str, ...], model: str | None, refresh: int | None,
                            depth: int) -> None:
    """Validate a source's hard-negative settings; ValueError naming the ``data.source`` field."""
    if negatives not in allowed:
        raise ValueError(f"unknown data.source.negatives {negatives!r}; allowed: {', '.join(allowed)}")
    if negatives == "dense" and not model:
        raise ValueError("data.source.negatives=dense needs data.source.negative_model (a checkpoint)")
    if refresh is not None and (isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1):
        raise ValueError(f"data.source.negative_refresh_epochs must be null or an integer >= 1, got {refresh!r}")
    if depth < 1:
        raise ValueError(f"data.source.negative_depth must be >= 1, got {depth}")


def _dense_pools(model: str, encoder: dict | None, corpus: Corpus, queries: list[TrainQuery],
                 depth: int) -> dict[str, list[str]]:
    from multipos.mining.dense_negatives import mine_with_checkpoint

    return mine_with_checkpoint(model, corpus, {q.query_id: q.query for q in queries},
                                {q.query_id: q.judged for q in queries}, depth, encoder)


def _filter_pools(rule, model: str, encoder: dict | None, corpus: Corpus, queries: list[TrainQuery]) -> dict:
    """Apply the positive-aware filter (:mod:`multipos.mining.negative_filter`) to every query's mined negatives with
    the scores of ``model`` (the miner's checkpoint and settings: ``data.source.negative_model`` /
    ``negative_encoder``); positives in their current order (teacher order when the source orders them).
    Returns the counts for ``run_info.json``."""
    from multipos.mining.dense_negatives import load_encoder
    from multipos.mining.negative_filter import score_and_filter

    scorer = load_encoder(model, encoder)
    pools, counts = score_and_filter(scorer, corpus, {q.query_id: q.query for q in queries},
                                     {q.query_id: q.negatives for q in queries},
                                     {q.query_id: [*q.gold, *q.silver] for q in queries}, rule, cache_dir())
    for q in queries:
        q.negatives = pools[q.query_id]
    return counts


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
    """BM25 hard negatives: top-``depth`` passages per query minus every judged passage. Cached."""

    def compute():
        from multipos.retrieval.bm25 import BM25

        log.info("mining BM25 negatives for %d queries (depth %d)", len(queries), depth)
        run = BM25(corpus).search(queries, k=depth + max((len(j) for j in judged.values()), default=0))
        return {q: unjudged_negatives(sorted(docs, key=lambda d: -docs[d]), judged.get(q, ()), depth)
                for q, docs in run.items()}

    settings = {"source": source, "n_passages": len(corpus), "queries": len(queries), "depth": depth,
                "miner": "bm25s-lucene-0.9-0.4"}
    return _cache_json("negatives", settings, compute)


def teacher_order(queries: list[TrainQuery], query_texts: dict[str, str], corpus: Corpus, teacher: str,
                  source: str, query_max_length: int = 32, passage_max_length: int = 256, *,
                  pooling: str | None = None, normalize: bool | None = None,
                  trust_remote_code: bool = False, prompts: dict | None = None) -> None:
    """Reorder each query's gold and silver positives by descending teacher score (in place). Cached.

    ``teacher`` is a checkpoint name/path loaded as a :class:`~multipos.model.encoder.DualEncoder` with the
    checkpoint's own settings: the pooling/normalisation saved in its ``multipos_encoder.json``, else
    ``pooling`` / ``normalize`` (pass the model config's ``model.pooling`` / ``model.normalize``), else those
    of its sentence-transformers files (mean + L2 for all-MiniLM-L6-v2), else the DualEncoder defaults.
    ``prompts``: ``{"query": …, "passage": …}`` (the model config's prompts; None values = the checkpoint's own).

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
        from multipos.assets import cache_dir

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


class BeirGradedSource:
    """Training queries from a BEIR folder with graded training qrels.

    Args:
        path: BEIR folder or dataset name (e.g. ``nfcorpus``; resolved via MULTIPOS_ASSETS).
        qrels_file: graded qrels (TREC or BEIR TSV) relative to the folder, e.g. ``qrels-graded/train.s-3.qrel``;
            else a path (absolute, or relative to the working directory: ``annotations/<name>/qrels/relevance.tsv``
            written by ``python annotate.py``).
        gold_grade: grade of gold (human) positives; silver_grade: grade of silver positives.
        negatives: ``bm25`` (BM25 top-``negative_depth``) or ``dense`` (``negative_model``'s top-``negative_depth``,
            :func:`multipos.mining.dense_negatives.mine_with_checkpoint`); judged passages removed either way
            (:func:`multipos.data.groups.unjudged_negatives`). Cached under ``<cache>/negatives``.
        negative_depth: hard negatives mined per query.
        negative_model: checkpoint of the dense miner (the data configs: the starting checkpoint);
            negative_encoder: its DualEncoder keyword arguments (pooling, normalize, max lengths).
        negative_refresh_epochs: re-mine with the weights being trained every K epochs
            (:class:`multipos.training.callbacks.NegativeRefresh`), None = never.
        ordering: ``given`` (qrels file order) or ``teacher``; teacher: checkpoint for ``teacher``.
        negative_filter: positive-aware filtering of the mined negatives (``{share, margin, reference}``,
            :class:`multipos.mining.negative_filter.NegativeFilter`; scored by ``negative_model``), None = off.
        teacher_pooling, teacher_normalize: the teacher's pooling and L2 when its checkpoint saved none
            (the data configs pass the model config's); teacher_prompts: ``{"query": …, "passage": …}`` (the model
            config's prompts; None = the teacher checkpoint's own).
        max_queries: keep only the first N queries (smoke tests); None = all.
        grade_weights: {grade: weight in (0, 1]}: each positive's target weight for the soft-target objectives
            (:data:`multipos.losses.SOFT_OBJECTIVES`), e.g. ``{2: 1.0, 1: 0.5}``; None = no targets.
        teacher_scores: ``{path, temperature}``: a teacher's scores of the training passages (a TREC run or JSONL,
            :class:`multipos.mining.teacher_scores.TeacherScores`): raw targets of ``margin_mse`` and, softmaxed at
            the temperature, target weights of the other soft-target objectives; None = none.
        teacher_model: ``{path, kind: bi | cross, temperature, negatives}``: a sentence-transformers teacher that
            scores each query's positives and hard negatives once, cached
            (:class:`multipos.mining.teacher_model.TeacherModel`); targets as ``teacher_scores``.
        label_noise: ``{rate, kind, seed}``: replace that share of each query's positives by false positives
            (:class:`multipos.data.label_noise.LabelNoise`); None = the labels as published.

    Queries whose judgments are all below ``silver_grade`` have no positive: they are kept (their judged
    passages are still never negatives elsewhere), counted and logged here, and skipped by the data module.

    Raises: FileNotFoundError for a missing qrels file (listing those present); DataFormatError for file
    errors (file and line), qrels naming unknown ids, qrels without any query, or a judged query with empty
    text; ValueError for an unknown ordering or bad hard-negative settings (naming the field).
    """

    def __init__(self, path: str, qrels_file: str, gold_grade: int = 2, silver_grade: int = 1,
                 negative_depth: int = 100, ordering: str = "given", teacher: str | None = None,
                 max_queries: int | None = None, teacher_pooling: str | None = None,
                 teacher_normalize: bool | None = None, negatives: str = "bm25", negative_model: str | None = None,
                 negative_encoder: dict | None = None, negative_refresh_epochs: int | None = None,
                 teacher_prompts: dict | None = None, negative_filter: dict | None = None,
                 grade_weights: dict | None = None, label_noise: dict | None = None,
                 teacher_scores: dict | None = None, teacher_model: dict | None = None):
        _check_negative_options(negatives, ("bm25", "dense"), negative_model, negative_refresh_epochs, negative_depth)
        self.grade_weights = _check_grade_weights(grade_weights)
        self.teacher_scores = TeacherScores.from_config(teacher_scores)
        self.teacher_model = TeacherModel.from_config(teacher_model)
        given = [n for n, v in (("grade_weights", self.grade_weights), ("teacher_scores", self.teacher_scores),
                                ("teacher_model", self.teacher_model)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"data.source.{' and data.source.'.join(given)} each give target weights: set one")
        self.teacher_counts: dict | None = None
        self.label_noise = LabelNoise.from_config(label_noise)
        self.noise_counts: dict | None = None
        self.negatives, self.negative_model = negatives, negative_model
        self.negative_encoder, self.negative_refresh_epochs = negative_encoder, negative_refresh_epochs
        if ordering not in ORDERINGS:
            raise ValueError(f"unknown data.source.ordering {ordering!r}; allowed: {', '.join(ORDERINGS)}")
        if ordering == "teacher" and not teacher:
            raise ValueError("data.source.ordering=teacher needs data.source.teacher (a checkpoint)")
        self.path, self.qrels_file = path, qrels_file
        self.gold_grade, self.silver_grade = gold_grade, silver_grade
        self.negative_depth, self.ordering, self.teacher = negative_depth, ordering, teacher
        self.max_queries = max_queries
        self.teacher_pooling, self.teacher_normalize = teacher_pooling, teacher_normalize
        self.teacher_prompts = dict(teacher_prompts) if teacher_prompts else None
        self.negative_filter = NegativeFilter.from_config(negative_filter)
        self.filter_counts: dict | None = None

    def load(self) -> tuple[Corpus, list[TrainQuery]]:
        """Read the folder → (corpus, one :class:`TrainQuery` per query of the qrels file, with its gold and silver
        positives in the configured order and its mined hard-negative pool; a query without a positive is kept and
        skipped by the data module). Raises as the class says."""
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
            weights = {}
            if self.grade_weights is not None:
                for d in (*gold, *silver):
                    if docs[d] not in self.grade_weights:
                        raise ValueError(f"{qpath}: query {qid!r} has a positive of grade {docs[d]}, which "
                                         f"data.source.grade_weights ({self.grade_weights}) gives no weight")
                    weights[d] = self.grade_weights[docs[d]]
            queries.append(TrainQuery(qid, texts[qid], gold, silver, judged=set(docs), weights=weights))
        unjudged = [q.query_id for q in queries if not q.gold and not q.silver]
        if unjudged:
            log.warning("%s: %d of %d training queries have no judgment with grade >= %d (no positive): "
                        "they will be skipped, e.g. %s", qpath, len(unjudged), len(queries), self.silver_grade,
                        unjudged[:5])
        tag = f"{folder.resolve()}|{self.qrels_file}"
        if self.negatives == "dense":
            negatives = _dense_pools(self.negative_model, self.negative_encoder, corpus, queries, self.negative_depth)
        else:
            negatives = mine_bm25_negatives(corpus, {q.query_id: q.query for q in queries},
                                            {q.query_id: q.judged for q in queries}, self.negative_depth, tag)
        for q in queries:
            q.negatives = negatives.get(q.query_id, [])
        if self.ordering == "teacher":
            teacher_order(queries, texts, corpus, self.teacher, tag, pooling=self.teacher_pooling,
                          normalize=self.teacher_normalize, prompts=self.teacher_prompts)
        if self.negative_filter:  # after the ordering: reference=first means the teacher's best positive
            self.filter_counts = _filter_pools(self.negative_filter, self.negative_model, self.negative_encoder,
                                               corpus, queries)
        if self.teacher_scores is not None:
            self.teacher_counts = self.teacher_scores.apply(queries)
        if self.teacher_model is not None:  # after mining: it scores each query's positives and hard negatives
            self.teacher_counts = self.teacher_model.apply(queries, corpus, cache_dir())
        if self.label_noise:  # last: the false positives take the ordered places of the positives they replace
            elsewhere = (judged_in_every_split(folder, texts)
                         if self.label_noise.exclude == "every_split" else None)
            self.noise_counts = self.label_noise.apply(queries, corpus.ids, elsewhere)
            log.info("label noise %s (%s): %d of %d training positives replaced by false positives",
                     self.label_noise.rate, self.label_noise.kind, self.noise_counts["replaced"],
                     self.noise_counts["positives"])
        return corpus, queries


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


class TevatronSource:
    """Training queries in the Tevatron JSONL schema (paper's released MS MARCO / NQ data).

    Args:
        path: a ``.jsonl`` file, ``<asset>/<file>`` of a registered asset (``msmarco-multipos/heterogeneous.jsonl``:
            :func:`asset_file`, built by ``python -m multipos.assets fetch <asset>`` where missing), a folder saved by
            ``datasets``, or an HF hub dataset id.
        split: split for HF datasets.
        gold_positives: how many leading ``positive_passages`` are gold (human): 1 for the
            heterogeneous files (human positive first), 0 for homogeneous (LLM positives only).
        max_queries: keep only the first N lines.
        negatives: ``given`` (each line's ``negative_passages``), ``bm25`` (BM25 top-``negative_depth``, as
            :class:`BeirGradedSource`) or ``dense`` (``negative_model``'s top-``negative_depth``,
            :func:`multipos.mining.dense_negatives.mine_with_checkpoint`) over the corpus; mined ones exclude the
            query's
            judged passages, here its positives.
        negative_corpus: a BEIR ``corpus.jsonl`` the miners search (the full collection, e.g. MS MARCO's 8.8M
            passages), the training file's passages added to it; None = the training file's passages only.
        negative_depth, negative_model, negative_encoder, negative_refresh_epochs, negative_filter: as in
            :class:`BeirGradedSource`.

    Raises: DataFormatError for a bad line (file and line, see :func:`multipos.formats.tevatron.parse_tevatron`), a
    query id on two lines (naming both) or no line at all; FileNotFoundError for a filesystem ``path`` that does not
    exist (no hub lookup); AssetNotFoundError for an asset file that cannot be had (:func:`asset_file`); ValueError for
    bad hard-negative settings (naming the field). A passage id given with two different texts keeps its first text
    (the negative corpus's first); their number is logged as a warning.
    """

    def __init__(self, path: str, split: str = "train", gold_positives: int = 0, max_queries: int | None = None,
                 negatives: str = "given", negative_depth: int = 100, negative_model: str | None = None,
                 negative_encoder: dict | None = None, negative_refresh_epochs: int | None = None,
                 negative_corpus: str | None = None, negative_filter: dict | None = None):
        _check_negative_options(negatives, ("given", "bm25", "dense"), negative_model, negative_refresh_epochs,
                                negative_depth)
        self.path, self.split, self.gold_positives, self.max_queries = path, split, gold_positives, max_queries
        self.negatives, self.negative_depth, self.negative_model = negatives, negative_depth, negative_model
        self.negative_encoder, self.negative_refresh_epochs = negative_encoder, negative_refresh_epochs
        self.negative_corpus = negative_corpus
        self.negative_filter = NegativeFilter.from_config(negative_filter)
        if self.negative_filter and negatives == "given":
            raise ValueError("data.source.negative_filter filters mined negatives: set data.source.negatives to bm25 "
                             "or dense (the file's own negative_passages are kept as given)")
        self.filter_counts: dict | None = None

    def load(self) -> tuple[Corpus, list[TrainQuery]]:
        """Read the file or dataset → (corpus of every passage it names, plus ``negative_corpus``; one
        :class:`TrainQuery` per line, its first ``gold_positives`` positives gold and the rest silver, in the file's
        order, with the given or mined hard negatives). Raises as the class says."""
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
        if self.negatives == "dense":
            pools = _dense_pools(self.negative_model, self.negative_encoder, corpus, queries, self.negative_depth)
        elif self.negatives == "bm25":
            tag = f"{self.path}|{self.split}|{self.negative_corpus}|{len(corpus)}"
            pools = mine_bm25_negatives(corpus, {q.query_id: q.query for q in queries},
                                        {q.query_id: q.judged for q in queries}, self.negative_depth, tag)
        if self.negatives != "given":
            for q in queries:
                q.negatives = pools.get(q.query_id, [])
            if self.negative_filter:
                self.filter_counts = _filter_pools(self.negative_filter, self.negative_model, self.negative_encoder,
                                                   corpus, queries)
        return corpus, queries


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

