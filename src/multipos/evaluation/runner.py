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

import json
import logging
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from multipos import atomic
from multipos.assets import cache_dir
from multipos.evaluation.sets import EvalSet
from multipos.evaluation.metrics import add_average
from multipos.retrieval.dense import bm25_run, dense_run
from multipos.data.trec import write_run

log = logging.getLogger(__name__)


def retrieval_options(cfg: DictConfig) -> dict:
    """Keyword arguments of :func:`multipos.retrieval.dense.dense_run` from ``cfg.eval`` (encoding and FAISS settings)."""
    faiss = OmegaConf.to_container(cfg.eval.faiss) if cfg.eval.get("faiss") else {}
    return dict(k=cfg.eval.k, batch_size=cfg.eval.batch_size, bf16=cfg.eval.bf16,
                passage_max_length=cfg.eval.passage_max_length, index=cfg.eval.index, index_options=faiss)


def eval_sets(cfg: DictConfig) -> tuple[EvalSet | None, list[EvalSet]]:
    """(validation set or None, test sets) instantiated from ``cfg.eval``."""
    val = instantiate(cfg.eval.validation) if cfg.eval.get("validation") else None
    return val, [instantiate(s) for s in (cfg.eval.get("test_sets") or {}).values()]


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


def evaluate_sets(model, sets: list[EvalSet], cfg: DictConfig, out: Path | None, cache: Path | None) -> dict:
    """Dense retrieval + metrics on each set (:func:`score_set`) → {result name: {metric: value}}, plus the
    ``cfg.eval.average`` row when set. Writes runs and per-query values into ``out`` if given."""
    results = {}
    for es in sets:
        data = es.load()
        run = es.clean(dense_run(model, data, cache=cache, **retrieval_options(cfg)))
        results.update(score_set(es, run, data, out, tag=str(cfg.get("run_name", "multipos"))))
    return add_average(results, cfg.eval.average, [es.name for es in sets]) if cfg.eval.get("average") else results


def references(cfg: DictConfig, sets: list[EvalSet], zero_shot: bool = True, zero_shot_model: str | None = None,
               out: Path | None = None) -> dict:
    """Floor rows on ``sets``: ``bm25`` and, with ``zero_shot``, ``zero-shot`` = ``cfg.model`` as configured
    (``zero_shot_model`` replaces its ``name_or_path``, e.g. the starting checkpoint of a fine-tuned model).
    Embeddings are cached across runs. With ``out``, each row's runs and per-query values go to
    ``out/<row>/`` (:func:`score_set`: ``per_query.<result>.json``, for paired tests against the floor rows).
    Returns {row: {result name: {metric: value}}}."""
    refs = {"bm25": {}}
    for es in sets:
        data = es.load()
        refs["bm25"].update(score_set(es, es.clean(bm25_run(data, cfg.eval.k)), data,
                                      out / "bm25" if out is not None else None, tag="bm25"))
    if cfg.eval.get("average"):
        add_average(refs["bm25"], cfg.eval.average, [es.name for es in sets])
    if zero_shot:
        extra = {"name_or_path": zero_shot_model} if zero_shot_model else {}
        refs["zero-shot"] = evaluate_sets(instantiate(cfg.model, **extra), sets, cfg,
                                          out / "zero-shot" if out is not None else None, cache_dir())
    return refs


def write_results(out: Path, results: dict, refs: dict | None = None, extra_lines: list[str] | None = None) -> str:
    """The one results writer: ``metrics.json``, ``references.json`` (when ``refs``) and ``results.txt`` (the
    comparison table, plus ``extra_lines``), all atomic. Returns the table text (also printed by the jobs)."""
    from multipos.report import format_plain

    atomic.write_json(out / "metrics.json", results)
    if refs:
        atomic.write_json(out / "references.json", refs)
    table = format_plain(results, refs or {})
    text = table + ("\n\n" + "\n".join(extra_lines) if extra_lines else "")
    atomic.write_text(out / "results.txt", text + "\n")
    return text
