"""``evaluate.py``: evaluate any HF-format checkpoint (or an existing TREC run) on the configured eval sets."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from multipos.assets import cache_dir
from multipos.evaluation.runner import Evaluation, score_set
from multipos.evaluation.sets import EvalSet
from multipos.formats.trec import read_run
from multipos.model.interpolation import interpolate_toward_start

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict:
    """Encode with ``cfg.model``, retrieve with FAISS, score each set; write ``metrics.json``, runs and per-query
    values.

    With ``run_file=<TREC run>`` the run is scored as it is (no encoding). With ``eval.references=true``
    also writes ``references.json``: BM25 on the same sets, and with ``zero_shot_model=<name or dir>`` that
    un-fine-tuned encoder (the floor rows of report tables). Returns {result name: {metric: value}}.
    Raises ValueError when no set is selected.
    """
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    evaluation = Evaluation.from_node(cfg.eval, cfg.get("run_name"))
    sets = evaluation.test_sets
    if not sets:
        raise ValueError("no eval set selected: use eval=<set> (e.g. eval=nfcorpus_test) or eval=[<set>,<set>]")
    if cfg.get("run_file"):
        results = score_run_file(cfg.run_file, sets, out)
    else:
        results = evaluation.evaluate(load_model(cfg.model, cfg.get("wise_ft")), out, cache_dir(), sets)
    refs = {}
    if evaluation.references:
        zs = cfg.get("zero_shot_model")
        zero_shot = instantiate(cfg.model, name_or_path=zs) if zs and not cfg.get("run_file") else None
        refs = evaluation.reference_rows(zero_shot, sets=sets)
    table = evaluation.write(out, results, refs, sets=sets)
    print("\n" + table + "\n")
    print(f"run directory: {out}")
    return results


def load_model(model_cfg: DictConfig, wise_ft: DictConfig | None = None):
    """The ``model`` node instantiated, then interpolated toward ``wise_ft.start`` when ``wise_ft.alpha`` < 1
    (:func:`multipos.model.interpolation.interpolate_toward_start`). Raises ValueError when ``wise_ft.alpha`` < 1
    without ``wise_ft.start`` (the starting checkpoint cannot be guessed from a fine-tuned folder)."""
    model = instantiate(model_cfg)
    wise = wise_ft or {}
    alpha = float(wise.get("alpha", 1.0))
    if alpha != 1.0:
        if not wise.get("start"):
            raise ValueError(f"wise_ft.alpha={alpha} needs wise_ft.start=<the checkpoint {model_cfg.name_or_path} "
                             "was fine-tuned from> (e.g. wise_ft.start=all-MiniLM-L6-v2)")
        interpolate_toward_start(model, model.starting_point(wise.start), alpha)
    return model


def score_run_file(path: str, sets: list[EvalSet], out=None) -> dict:
    """Score an existing TREC run against each set → {result name: {metric: value}}.

    Passages absent from the set's corpus and queries without judgments are dropped with a warning that
    gives their number and examples. With ``out``, writes ``per_query.<result>.json`` there (and the run
    as scored, ``run.<set>.trec``), so runs from other systems enter significance tests like ours.
    """
    run = read_run(path)
    results = {}
    for es in sets:
        data = es.load()
        unknown = sorted({d for docs in run.values() for d in docs if d not in data.corpus})
        if unknown:
            log.warning("%s: dropping %d passage ids not in the %s corpus, e.g. %s", path, len(unknown), es.name,
                        unknown[:5])
        kept = es.clean({q: {d: s for d, s in docs.items() if d in data.corpus} for q, docs in run.items()})
        results.update(score_set(es, kept, data, out, tag="scored"))
    return results


def set_list_override(argv: Sequence[str], group: str = "eval") -> list[str]:
    """Rewrite ``eval=a,b`` as Hydra's list selection ``eval=[a,b]`` so several sets are scored in one run
    (Hydra itself reads a bare comma list as a sweep and refuses it without ``--multirun``). Left as is
    under ``-m/--multirun``, where the comma keeps its sweep meaning."""
    argv = list(argv)
    if any(a in ("-m", "--multirun") for a in argv):
        return argv
    prefix = f"{group}="
    return [f"{prefix}[{a[len(prefix):]}]" if a.startswith(prefix) and "," in a and "[" not in a else a for a in argv]
