"""The evaluation runner shared by both jobs (``train.py`` and ``evaluate.py``): retrieve on each
configured set, score it, write runs, per-query values and the results files.

Neither job module imports the other; both call this module. Every file goes through
:mod:`multipos.atomic`, so an interrupted run never leaves a half-written result that looks valid.

Files written into a run directory ``out``:

* ``metrics.json`` — ``{result: {metric: value}}`` (results = eval sets and their views, ``<set>.<view>``);
* ``references.json`` — the same for the floor rows (``bm25``, ``zero-shot``);
* ``per_query.<result>.json`` — ``{metric: {query id: value}}`` for paired significance tests;
* ``run.<set>.trec`` — the TREC run (top-k);
* ``results.txt`` — the printed comparison table.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from multipos import atomic
from multipos.assets import cache_dir, resolve_dataset
from multipos.atomic import read_json
from multipos.evaluation.sets import EvalSet
from multipos.formats.trec import write_run
from multipos.retrieval.bm25 import bm25_run
from multipos.retrieval.dense import dense_run

log = logging.getLogger(__name__)

#: Floor rows this process has computed (:meth:`Evaluation.reference_rows`): key → (rows, the folder their files went
#: to, or None). The runs of a sweep share the zero-shot model and the sets, so each process computes them once.
_REFERENCE_MEMO: dict[str, tuple[dict, Path | None]] = {}

#: Part of the reference rows' cache key: raise it when what the rows hold or how they are computed changes, so
#: that rows stored by an older multipos are computed again.
REFERENCE_FORMAT = 1


def _set_files(es: EvalSet) -> list:
    """(name, size in bytes, modification time in ns) of every file in ``es``'s folder (recursively): part of the
    reference rows' cache key, so edited set files are scored again. [] when the folder does not resolve."""
    try:
        folder = resolve_dataset(es.path)
    except Exception:  # noqa: BLE001 - a hub name or a missing folder: the set's own load() reports it
        return []
    if not folder.is_dir():
        return []
    return [(str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()]


def _stored_reference_rows(key: str) -> tuple[dict, Path] | None:
    """The rows and folder stored under ``key`` in ``<cache>/references/`` (:func:`_store_reference_rows`), or None
    when there are none or ``rows.json`` is unreadable."""
    folder = cache_dir() / "references" / key
    rows = read_json(folder / "rows.json", missing_ok=True, invalid_ok=True)
    return (rows, folder / "files") if isinstance(rows, dict) and (folder / "files").is_dir() else None


def _store_reference_rows(key: str, refs: dict, out: Path) -> None:
    """Store ``refs`` and the files written under ``out`` as ``<cache>/references/<key>/`` (``rows.json``, ``files/``),
    through :func:`multipos.atomic.replace_dir` (a temporary folder renamed into place). A folder another process
    stored first is kept; a failure to store (e.g. a full disk) is logged, since the rows themselves are already
    computed."""
    folder = cache_dir() / "references" / key
    if folder.is_dir():
        return
    try:
        with atomic.replace_dir(folder) as tmp:
            shutil.copytree(out, tmp / "files")
            atomic.write_json(tmp / "rows.json", refs)
    except OSError as e:
        log.warning("reference rows not stored in the cache (%s): later runs compute them again", e)


def score_set(es: EvalSet, run, data, out: Path | None, tag: str) -> dict:
    """Score ``run`` on ``es`` → {result name: {metric: value}} (the set, plus ``<set>.<view>`` for qrels views).

    With ``out``, writes ``per_query.<result>.json`` (for paired significance tests) and ``run.<set>.trec``.
    """
    results = {}
    for name, (means, per_query) in es.score(run, data).items():
        results[name] = means
        if out is not None:
            atomic.write_json(out / f"per_query.{name}.json", per_query)
        log.info("%s: %s", name, json.dumps({k: round(v, 4) for k, v in means.items()}))
    if out is not None:
        write_run(run, out / f"run.{es.name}.trec", tag=tag)
    return results


def add_average(results: dict[str, dict[str, float]], name: str, sets: list[str] | None = None,
                min_sets: int = 2) -> dict:
    """Add ``results[name]`` = unweighted mean over ``sets`` (default: all) of each metric every set has
    (the BEIR average row). Returns ``results``; needs at least ``min_sets`` sets, else leaves it unchanged."""
    sets = [s for s in (sets or list(results)) if s in results and s != name]
    if len(sets) < min_sets:
        return results
    common = [m for m in results[sets[0]] if all(m in results[s] for s in sets)]
    results[name] = {m: sum(results[s][m] for s in sets) / len(sets) for m in common}
    return results


@dataclass
class Evaluation:
    """What a job evaluates and how, read once from the config (:meth:`from_config`); both jobs and the
    per-epoch dev retrieval of training take their sets and retrieval settings from it.

    ``validation``: the dev set (or None); ``test_sets``: the sets scored at the end; ``retrieval``: keyword
    arguments of :func:`multipos.retrieval.dense.dense_run` (``k`` in passages, encoding batch size, bf16, passage
    length in tokens, FAISS index and options); ``average``: the name of the row averaging the sets'
    metrics (:func:`add_average`), or None; ``references``: whether the floor rows
    (BM25, zero-shot) are computed; ``tag``: the run tag in written TREC runs.
    """

    validation: EvalSet | None
    test_sets: list[EvalSet]
    retrieval: dict
    average: str | None = None
    references: bool = False
    tag: str = "multipos"

    @classmethod
    def from_node(cls, ev: DictConfig, tag: str | None = None) -> Evaluation:
        """From the ``eval`` config node (sets instantiated; ``faiss`` options as a plain dict) and the run tag of
        written TREC runs (``run_name``; None: ``multipos``). Raises what instantiating a set raises."""
        return cls(validation=instantiate(ev.validation) if ev.get("validation") else None,
                   test_sets=[instantiate(s) for s in (ev.get("test_sets") or {}).values()],
                   retrieval=dict(k=ev.k, batch_size=ev.batch_size, bf16=ev.bf16,
                                  passage_max_length=ev.passage_max_length, index=ev.index,
                                  index_options=OmegaConf.to_container(ev.faiss) if ev.get("faiss") else {}),
                   average=ev.get("average") or None, references=bool(ev.get("references")),
                   tag=str(tag or "multipos"))

    @property
    def sets(self) -> list[EvalSet]:
        """The validation set (when there is one), then the test sets: what the final evaluation scores."""
        return ([self.validation] if self.validation is not None else []) + list(self.test_sets)

    def evaluate(self, model, out: Path | None, cache: Path | None, sets: list[EvalSet] | None = None) -> dict:
        """Dense retrieval with ``model`` + metrics on each of ``sets`` (default :attr:`sets`; :func:`score_set`)
        → {result name: {metric: value}} (the :attr:`average` row is added when the results are written,
        :meth:`write`). Writes runs and per-query values into ``out`` if given."""
        sets = self.sets if sets is None else sets
        results = {}
        for es in sets:
            data = es.load()
            run = es.clean(dense_run(model, data, cache=cache, **self.retrieval))
            results.update(score_set(es, run, data, out, tag=self.tag))
        return results

    def reference_rows(self, zero_shot_model=None, out: Path | None = None,
                       sets: list[EvalSet] | None = None) -> dict:
        """Floor rows on ``sets`` (default :attr:`sets`): ``bm25`` and, when ``zero_shot_model`` (an
        un-fine-tuned encoder, e.g. the starting checkpoint) is given, ``zero-shot``. Embeddings are cached across
        runs, and so are the rows: a later call with the same zero-shot model (by weights), sets (and their files),
        retrieval settings and tag returns the first call's rows and copies its files into ``out`` — from this
        process's memory, or from ``<cache>/references/<key>/`` (:func:`multipos.assets.cache_dir`), which a call
        with ``out`` fills (a temporary folder renamed into place, so a reader never sees half of one). A sweep's
        runs, in one process or several, compute them once. With ``out``, each row's runs and per-query values go
        to ``out/<row>/`` (:func:`score_set`, for paired tests against the floor rows). Returns
        {row: {result name: {metric: value}}} (average rows: :meth:`write`)."""
        sets = self.sets if sets is None else sets
        key = self._reference_key(zero_shot_model, sets)
        known = _REFERENCE_MEMO.get(key)
        if known is None:
            known = _stored_reference_rows(key)
        if known is not None and (out is None or (known[1] is not None and known[1].is_dir())):
            if out is not None and known[1] != out:
                shutil.copytree(known[1], out, dirs_exist_ok=True)  # the same runs and per-query files
            log.info("reference rows: the ones computed before for the same zero-shot model and sets (%s)",
                     known[1] or "not written")
            _REFERENCE_MEMO.setdefault(key, known)
            return copy.deepcopy(known[0])
        zero_shot = None
        if zero_shot_model is not None:
            zero_shot = self.evaluate(zero_shot_model, out / "zero-shot" if out is not None else None, cache_dir(),
                                      sets)
        bm25 = {}
        for es in sets:
            data = es.load()
            bm25.update(score_set(es, es.clean(bm25_run(data, self.retrieval["k"])), data,
                                  out / "bm25" if out is not None else None, tag="bm25"))
        refs = {"bm25": bm25}
        if zero_shot is not None:
            refs["zero-shot"] = zero_shot
        _REFERENCE_MEMO[key] = (copy.deepcopy(refs), out)
        if out is not None:
            _store_reference_rows(key, refs, out)
        return refs

    def run_folder_references(self, out: Path, zero_shot_model=None) -> dict:
        """The reference rows of the run folder ``out``: its ``references.json`` when an earlier attempt wrote it,
        else :meth:`reference_rows` with per-query values under ``out/references/`` (for paired tests);
        ``references.json`` is written either way. ``zero_shot_model``: a callable returning the zero-shot encoder
        (called only when the rows are computed), or None for BM25 alone."""
        ref_file = Path(out) / "references.json"
        refs = json.loads(ref_file.read_text()) if ref_file.is_file() else self.reference_rows(
            zero_shot_model() if zero_shot_model else None, out=Path(out) / "references")
        atomic.write_json(ref_file, refs)
        return refs

    def _reference_key(self, zero_shot_model, sets: list[EvalSet]) -> str:
        """What the floor rows depend on: the zero-shot model's weights and settings
        (:meth:`multipos.model.encoder.DualEncoder.fingerprint`, both sides; its query length), the sets, the retrieval
        settings and the tag."""
        fingerprint = zero_shot_model.fingerprint(include_query=True) if zero_shot_model is not None else None
        length = getattr(zero_shot_model, "query_max_length", None)
        what = [REFERENCE_FORMAT, fingerprint, length, [repr(es) for es in sets], [_set_files(es) for es in sets],
                self.retrieval, self.tag]
        return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()

    def write(self, out: Path, results: dict, refs: dict | None = None, extra_lines: list[str] | None = None,
              sets: list[EvalSet] | None = None) -> str:
        """Write a job's results (:func:`write_results`) after adding the :attr:`average` row over ``sets``
        (default :attr:`sets`) to ``results`` and to every row of ``refs``, in place (:func:`add_average`). Sets of
        one ``group`` (CQADupStack's forums) first get their group row, their mean, which the average then counts
        once in their place. The validation set is never part of the average (a dev split is no test set).
        Returns the table text."""
        dev = self.validation.name if self.validation is not None else None
        tested = [es for es in (self.sets if sets is None else sets) if es.name != dev]
        groups: dict[str, list[str]] = {}
        for es in tested:
            if getattr(es, "group", None):
                groups.setdefault(es.group, []).append(es.name)
        names = list(dict.fromkeys(getattr(es, "group", None) or es.name for es in tested))
        for rows in [results, *(refs or {}).values()]:
            for group, members in groups.items():
                add_average(rows, group, members, min_sets=1)
            if self.average:
                add_average(rows, self.average, names)
        return write_results(out, results, refs, extra_lines)


def write_results(out: Path, results: dict, refs: dict | None = None, extra_lines: list[str] | None = None) -> str:
    """The one results writer: ``metrics.json``, ``references.json`` (when ``refs``) and ``results.txt`` (the
    comparison table, plus ``extra_lines``), all atomic. Returns the table text (also printed by the jobs)."""
    atomic.write_json(out / "metrics.json", results)
    if refs:
        atomic.write_json(out / "references.json", refs)
    table = format_plain(results, refs or {})
    text = table + ("\n\n" + "\n".join(extra_lines) if extra_lines else "")
    atomic.write_text(out / "results.txt", text + "\n")
    return text


def format_plain(results: dict, refs: dict) -> str:
    """The jobs' plain-text comparison table (``results.txt``): one row per system, the rows of ``refs``
    in order (BM25, zero-shot) then ``this run`` (``results``); one column per result/metric of
    ``results`` in order, values with 4 decimals (``nan`` where a system lacks one).

    ``results``: ``{result name: {metric: value}}``; ``refs``: ``{system: {result name: {metric: value}}}``.
    """
    cols = [(s, m) for s, ms in results.items() for m in ms]
    head = "system".ljust(12) + "".join(f"{s}:{m}".rjust(max(14, len(s) + len(m) + 2)) for s, m in cols)
    lines = [head]
    rows = [*((name, r) for name, r in refs.items()), ("this run", results)]
    for name, res in rows:
        cells = "".join(f"{res.get(s, {}).get(m, float('nan')):.4f}".rjust(max(14, len(s) + len(m) + 2))
                        for s, m in cols)
        lines.append(name.ljust(12) + cells)
    return "\n".join(lines)
