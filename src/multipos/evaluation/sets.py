"""Evaluation sets: what a run is scored on (``conf/benchmark``, ``conf/eval``).

Set kinds: :class:`EvalSet` (BEIR layout, graded qrels; optional qrels *views* such as gold-only / silver-only
labels, and self-hit removal for ArguAna/Quora) and :class:`QAEvalSet` (DPR open-domain QA: Acc@k by
answer-string match, :mod:`multipos.evaluation.qa`). Both expose ``load()``, ``clean(run)`` and
``score(run, data) -> {result name: (means, per-query values)}``; the metrics are :mod:`multipos.evaluation.metrics`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from multipos.assets import resolve_dataset
from multipos.evaluation.metrics import DEFAULT_METRICS, evaluate_run
from multipos.formats.beir import check_qrels_ids, load_beir, read_qrels_files
from multipos.formats.types import BeirDataset, Qrels, Run

log = logging.getLogger(__name__)

#: BEIR sets whose corpora contain the queries themselves: a hit with the query's own id is removed
#: before scoring, as the BEIR benchmark does for them (never by default elsewhere).
SELF_HIT_SETS = frozenset({"arguana", "quora"})


@dataclass
class EvalSet:
    """A BEIR-layout evaluation set scored with ranx against graded qrels.

    Args:
        name: key in ``metrics.json`` and run-file name.
        path: BEIR folder or dataset name (resolved by :func:`multipos.assets.resolve_dataset`).
        split: qrels split (``qrels/<split>.tsv``).
        qrels_file: qrels path(s) relative to the folder, overriding the split file; a list is merged
            (highest grade per pair).
        relevance_threshold: minimum grade counted relevant by binary metrics (MRR, Recall, Acc).
        metrics: ranx metric names, plus ``acc@k`` (= ranx ``hit_rate@k``: a relevant passage in the top k).
        max_queries: evaluate only the first N judged queries (smoke tests); None = all.
        max_passages: shrink the corpus to the kept queries' judged passages plus the first
            passages in corpus order up to this many (smoke tests); None = whole corpus.
        remove_self_hits: drop a retrieved passage whose id equals the query id (ArguAna, Quora).
        views: extra qrels views scored on the same run, reported as ``<name>.<view>``: {view:
            {"qrels_file": file(s) (default: the set's qrels), "grades": grades kept (default: all)}}.
            Used by ``hybrid_annotation`` to score one run against gold (human) and silver (LLM) labels.
        group: the name of the one column this set is part of (CQADupStack's 12 forums: ``cqadupstack``): the
            written results add ``<group>`` = the unweighted mean of its sets, and an average row over sets counts
            the group once in their place (as BEIR reports CQADupStack; :meth:`Evaluation.write`).
    """

    name: str
    path: str
    split: str = "test"
    qrels_file: str | list[str] | None = None
    relevance_threshold: int = 1
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    max_queries: int | None = None
    max_passages: int | None = None
    remove_self_hits: bool = False
    views: dict[str, dict] | None = None
    group: str | None = None

    def load(self) -> BeirDataset:
        """The set's corpus, queries and qrels; read from disk once per process and shared after."""
        key = (str(resolve_dataset(self.path).resolve()), self.split, _hashable(self.qrels_file), self.max_queries,
               self.max_passages)
        if key not in _LOADED:
            _LOADED[key] = self._read()
        return replace(_LOADED[key], name=self.name)

    def _read(self) -> BeirDataset:
        data = load_beir(resolve_dataset(self.path), self.split, _plain(self.qrels_file))
        if self.max_queries is not None:
            keep = list(data.qrels)[: self.max_queries]
            data.qrels = {q: data.qrels[q] for q in keep}
            data.queries = {q: data.queries[q] for q in keep}
        if self.max_passages is not None:
            judged = {d for docs in data.qrels.values() for d in docs}
            keep_ids = list(dict.fromkeys([*(d for d in data.corpus.ids if d in judged),
                                           *data.corpus.ids[: self.max_passages]]))
            data.corpus.passages = {d: data.corpus.passages[d] for d in keep_ids[: max(self.max_passages, len(judged))]}
        return data

    def clean(self, run: Run) -> Run:
        """``run`` without self-hits when ``remove_self_hits`` (else unchanged)."""
        if not self.remove_self_hits:
            return run
        return {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}

    def view_qrels(self, data: BeirDataset) -> dict[str, Qrels]:
        """{result name → qrels}: the set's own qrels under ``name`` and each view under ``name.view``.

        Raises ValueError for an unknown key in a view spec, DataFormatError for unknown ids in a view's file.
        """
        out = {self.name: data.qrels}
        for view, spec in (self.views or {}).items():
            spec = dict(spec or {})
            unknown = set(spec) - {"qrels_file", "grades"}
            if unknown:
                raise ValueError(f"eval set {self.name!r}, view {view!r}: unknown keys {sorted(unknown)} "
                                 "(allowed: qrels_file, grades)")
            qrels = data.qrels
            if spec.get("qrels_file"):
                folder = resolve_dataset(self.path)
                files = _plain(spec["qrels_file"])
                files = [files] if isinstance(files, str) else files
                key = ("view", str(folder.resolve()), tuple(files), self.split)
                if key not in _LOADED:  # read once per process (validation scores every epoch)
                    _LOADED[key] = read_qrels_files(folder, files, self.split)
                qrels = {q: docs for q, docs in _LOADED[key].items() if q in data.queries}
                check_qrels_ids(qrels, data.queries, data.corpus, ", ".join(str(folder / f) for f in files))
            if spec.get("grades") is not None:
                keep = {int(g) for g in spec["grades"]}
                qrels = {q: {d: g for d, g in docs.items() if g in keep} for q, docs in qrels.items()}
            out[f"{self.name}.{view}"] = {q: docs for q, docs in qrels.items() if docs}
        return out

    def score(self, run: Run, data: BeirDataset | None = None) -> dict[str, tuple[dict, dict]]:
        """Score ``run`` → {result name → (metric means, per-query values)}; one entry per view.

        Result names are ``name`` and ``name.<view>`` (see ``views``); values follow :func:`evaluate_run`.
        """
        data = data if data is not None else self.load()
        run = self.clean(run)
        out = {}
        for name, qrels in self.view_qrels(data).items():
            # a view judges a subset of the set's queries: the others are not "run queries without qrels"
            scored = run if name == self.name else {q: docs for q, docs in run.items() if q in qrels}
            out[name] = evaluate_run(qrels, scored, self.metrics, self.relevance_threshold, per_query=True)
        return out


def _plain(value):
    """OmegaConf containers → plain Python (lists of qrels files arrive as ListConfig)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _hashable(value):
    value = _plain(value)
    return tuple(value) if isinstance(value, list) else value


_LOADED: dict[tuple, object] = {}  # loaded sets and view qrels, per process


@dataclass
class QADataset(BeirDataset):
    """A QA evaluation set loaded: corpus, questions as ``queries`` and their gold answer strings."""

    answers: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class QAEvalSet:
    """An open-domain QA set scored by answer-string match (DPR / pyserini top-k accuracy), e.g. NQ test
    over DPR's 21M-passage Wikipedia split: a query counts at k when a top-k passage contains an answer
    (:func:`multipos.evaluation.qa.has_answer`).

    Args:
        name: key in ``metrics.json``.
        path: folder (or dataset name looked up by :func:`multipos.assets.resolve_files`) holding
            ``corpus_file`` (DPR ``psgs_w100.tsv`` layout) and ``qa_file`` (``nq-test.qa.csv`` layout, or JSONL).
        metrics: ``acc@k`` names (fractions in [0, 1]).
        max_queries: evaluate only the first N questions (smoke tests); None = all.
    """

    name: str
    path: str
    corpus_file: str = "psgs_w100.tsv"
    qa_file: str = "nq-test.qa.csv"
    metrics: list[str] = field(default_factory=lambda: ["acc@20", "acc@100"])
    max_queries: int | None = None

    def __post_init__(self):
        bad = [m for m in self.metrics if not (m.startswith("acc@") and m[4:].isdigit())]
        if bad:
            raise ValueError(f"eval set {self.name!r}: answer-match sets support acc@k metrics only, got {bad}")

    def load(self) -> QADataset:
        """Passages, questions and answers; read once per process."""
        from multipos.assets import resolve_files

        folder = resolve_files(self.path, [self.corpus_file, self.qa_file])
        key = ("qa", str(folder.resolve()), self.corpus_file, self.qa_file, self.max_queries)
        if key not in _LOADED:
            from multipos.formats.dpr import read_dpr_passages, read_dpr_qa

            qa = read_dpr_qa(folder / self.qa_file)
            if self.max_queries is not None:
                qa = dict(list(qa.items())[: self.max_queries])
            _LOADED[key] = QADataset(read_dpr_passages(folder / self.corpus_file),
                                     {q: p.question for q, p in qa.items()},
                                     {}, folder.name, answers={q: list(p.answers) for q, p in qa.items()})
        return replace(_LOADED[key], name=self.name)

    def clean(self, run: Run) -> Run:
        return run

    def score(self, run: Run, data: QADataset | None = None) -> dict[str, tuple[dict, dict]]:
        """{name → (accuracy means, per-query 0/1 values)} by :func:`multipos.evaluation.qa.answer_accuracy`."""
        from multipos.evaluation.qa import answer_accuracy
        from multipos.formats.dpr import QAPair

        data = data if data is not None else self.load()
        qa = {q: QAPair(data.queries[q], data.answers[q]) for q in data.queries}
        ks = [int(m[4:]) for m in self.metrics]
        means, per_q = answer_accuracy(run, qa, data.corpus, ks=ks, per_query=True)
        return {self.name: ({m: means[m] for m in self.metrics}, {m: per_q[m] for m in self.metrics})}


def beir_sets(paths, split: str = "test", metrics=("ndcg@10",), relevance_threshold: int = 1) -> dict[str, dict]:
    """Eval-set configs for a list of BEIR folders (``eval=beir eval.paths=[…]``): {folder name → EvalSet kwargs
    with ``_target_``}. Folders named in :data:`SELF_HIT_SETS` get ``remove_self_hits``. The name ``cqadupstack``
    stands for its 12 forums (:data:`multipos.assets.registry.CQADUPSTACK_FORUMS`): one set each, named
    ``cqadupstack-<forum>``, in group ``cqadupstack``, which the written results report as their mean (BEIR's
    CQADupStack column).

    Raises ValueError for an empty list or two folders with the same name (their metrics would collide).
    """
    from multipos.assets.registry import CQADUPSTACK_FORUMS

    paths = [str(p) for p in (_plain(paths) or [])]
    if not paths:
        raise ValueError("eval.paths is empty: give BEIR folders, e.g. eval.paths=[/data/scifact,/data/nfcorpus]")
    out: dict[str, dict] = {}
    for path in paths:
        name = path.rstrip("/").split("/")[-1]
        members = [(f"{name}-{forum}", f"{path.rstrip('/')}/{forum}", name) for forum in CQADUPSTACK_FORUMS] \
            if name == "cqadupstack" else [(name, path, None)]
        for set_name, set_path, group in members:
            if set_name in out:
                raise ValueError(f"eval.paths: two folders are named {set_name!r} ({out[set_name]['path']}, {path})")
            out[set_name] = {"_target_": "multipos.evaluation.sets.EvalSet", "name": set_name, "path": set_path,
                             "split": split, "metrics": list(_plain(metrics)),
                             "relevance_threshold": int(relevance_threshold),
                             "remove_self_hits": name.lower() in SELF_HIT_SETS, "group": group}
    return out
