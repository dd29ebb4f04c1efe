"""``evaluate.py``: evaluate any HF-format checkpoint on the configured eval sets."""

from __future__ import annotations

import logging

from hydra.utils import instantiate
from omegaconf import DictConfig

from multipos.assets import cache_dir
from multipos.evaluation import EvalSet, evaluate_run, write_metrics
from multipos.readers import read_run
from multipos.train import evaluate_sets, format_table, output_dir, references

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict:
    """Encode with ``cfg.model``, retrieve with FAISS, score with ranx; write ``metrics.json`` and runs.

    With ``run_file=<TREC run>`` the run is scored as it is (no encoding).
    With ``eval.references=true`` also writes ``references.json`` (BM25 on the same sets). Returns {set: {metric: value}}.
    """
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    sets: list[EvalSet] = [instantiate(s) for s in cfg.eval.test_sets.values()]
    if not sets:
        raise ValueError("no eval set selected: use eval=<set> (e.g. eval=nfcorpus_test)")
    if cfg.get("run_file"):
        results = score_run_file(cfg.run_file, sets)
    else:
        results = evaluate_sets(instantiate(cfg.model), sets, cfg, out, cache_dir())
    write_metrics(out / "metrics.json", results)
    refs = {}
    if cfg.eval.references:
        refs = references(cfg, sets, zero_shot=False)
    print("\n" + format_table(results, refs, sets) + "\n")
    print(f"run directory: {out}")
    return results


def score_run_file(path: str, sets: list[EvalSet]) -> dict:
    """Score an existing TREC run against each set's qrels. Passages absent from the set's corpus and
    queries without judgments are dropped with a warning that gives their number and examples."""
    run = read_run(path)
    results = {}
    for es in sets:
        data = es.load()
        unknown = sorted({d for docs in run.values() for d in docs if d not in data.corpus})
        if unknown:
            log.warning("%s: dropping %d passage ids not in the %s corpus, e.g. %s", path, len(unknown), es.name, unknown[:5])
        kept = {q: {d: s for d, s in docs.items() if d in data.corpus} for q, docs in run.items()}
        results[es.name] = evaluate_run(data.qrels, kept, es.metrics, es.relevance_threshold)
    return results
