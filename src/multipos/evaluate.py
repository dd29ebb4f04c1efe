"""``evaluate.py``: evaluate any HF-format checkpoint on the configured eval sets."""

from __future__ import annotations

import logging

from hydra.utils import instantiate
from omegaconf import DictConfig

from multipos.assets import cache_dir
from multipos.evaluation import EvalSet, write_metrics
from multipos.train import evaluate_sets, format_table, output_dir, references

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict:
    """Encode with ``cfg.model``, retrieve with FAISS, score with ranx; write ``metrics.json`` and runs.

    With ``eval.references=true`` also writes ``references.json`` (BM25 on the same sets). Returns {set: {metric: value}}.
    """
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    sets: list[EvalSet] = [instantiate(s) for s in cfg.eval.test_sets.values()]
    if not sets:
        raise ValueError("no eval set selected: use eval=<set> (e.g. eval=nfcorpus_test)")
    model = instantiate(cfg.model)
    results = evaluate_sets(model, sets, cfg, out, cache_dir())
    write_metrics(out / "metrics.json", results)
    refs = {}
    if cfg.eval.references:
        refs = references(cfg, sets, zero_shot=False)
    print("\n" + format_table(results, refs, sets) + "\n")
    print(f"run directory: {out}")
    return results
