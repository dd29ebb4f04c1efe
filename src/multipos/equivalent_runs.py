"""What a run computes, and reusing a finished run that computed the same thing.

Two hashes identify a run (both 16 hex digits of sha1 over the resolved config as sorted JSON):

* :func:`config_hash` — the whole resolved config without :data:`VOLATILE_KEYS` (paths, report layout, study
  name, …). It guards a run directory: re-running into a folder that holds a run of another configuration is
  refused (:func:`multipos.run_folder.prepare_run_dir`).
* :func:`equivalence_key` — :func:`config_hash` of the config with the fields the run's stages ignore left out
  as well. Single-positive objectives (SingleLH takes the first positive, Rand1LH draws one per epoch) put one
  positive in every group whatever M (``data.max_positives``) and the positive selection are
  (:meth:`multipos.data.groups.GroupBuilder.select_positives`), so the ratio figure's SingleLH cell at G=8, M=2
  trains, bit for bit, the model of its cell at G=8, M=4; and Appendix B's first-M cells at G=16 are the
  figure's G=16 cells of the same objective.

With ``reuse_equivalent: true`` (every study in ``conf/experiment/`` sets it; ``conf/train.yaml`` leaves it off)
a run that finds a finished run with its equivalence key in the index (``<cache>/runs/<key>.json``, written
when a run finishes or a finished run is skipped) copies that run's results and model into its own directory
instead of training (:func:`adopt`), and its ``run_info.json`` names the source (``reused_from``). The report
counts such runs apart (:func:`multipos.report.render.provenance`). The source is copied, never linked, so a
later ``resume=false`` re-run of either directory cannot change the other.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from multipos import atomic
from multipos.assets import cache_dir
from multipos.run_folder import VOLATILE_KEYS, is_finished, read_json, read_run_info, write_run_info

log = logging.getLogger(__name__)

#: Config keys left out of :func:`equivalence_key` besides :data:`VOLATILE_KEYS`: where and how metrics are
#: logged (``logger.save_dir`` is the run directory) does not change the model or its evaluation.
NOT_COMPUTED = ("logger",)

#: ``data`` fields a stage with a single-positive objective (SingleLH, Rand1LH) does not read.
IGNORED_BY_SINGLE_POSITIVE = ("max_positives", "positive_selection")

#: Files of a finished run directory copied by :func:`adopt` (glob patterns), besides ``model/`` and the files of
#: :func:`multipos.evaluation.runner.write_results` (written there from the source's metrics and references).
RESULT_FILES = ("per_query.*.json", "run.*.trec", "references/*/per_query.*.json", "references/*/run.*.trec")


#: Where classes named by ``_target_`` lived when their runs' hashes were first computed: a class's module moving
#: (the data / evaluation / retrieval subpackages, every callback into multipos.callbacks, 2026-11-24) does not change what a run computes, so the hash
#: reads the old path. {current prefix: prefix in the hash}.
HASHED_TARGET_PATHS = {
    "multipos.callbacks.NegativeRefresh": "multipos.dense_negatives.NegativeRefresh",
    "multipos.callbacks.GradientDiagnostics": "multipos.diagnostics.GradientDiagnostics",
    "multipos.data.sources.": "multipos.sources.",
    "multipos.data.dense_negatives.": "multipos.dense_negatives.",
    "multipos.data.groups.": "multipos.groups.",
    "multipos.data.datamodule.": "multipos.data.",
    "multipos.evaluation.sets.": "multipos.evalsets.",
    "multipos.evaluation.metrics.": "multipos.metrics.",
    "multipos.retrieval.dense.": "multipos.retrieval.",
}


def _hashed_targets(node):
    """``node`` with every ``_target_`` string mapped by :data:`HASHED_TARGET_PATHS`."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "_target_" and isinstance(v, str):
                v = next((old + v[len(new):] for new, old in HASHED_TARGET_PATHS.items() if v.startswith(new)), v)
            out[k] = _hashed_targets(v)
        return out
    if isinstance(node, list):
        return [_hashed_targets(v) for v in node]
    return node


#: Settings added after runs were hashed, with the value that computes what those runs computed: at that value the
#: key is left out of the hash, so finished sweeps stay finished. {dotted key: neutral value}.
NEUTRAL_SETTINGS = {
    "init_from": None,
    "model.query_prompt": None, "model.passage_prompt": None, "model.lora": None,
    "data.source.negative_encoder.query_prompt": None, "data.source.negative_encoder.passage_prompt": None,
    "data.source.teacher_prompts": {"query": None, "passage": None}, "data.source.negative_filter": None,
}


def _drop_neutral(plain: dict) -> None:
    for dotted, neutral in NEUTRAL_SETTINGS.items():
        *parents, leaf = dotted.split(".")
        node = plain
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == neutral:
            del node[leaf]


def _digest(plain: dict) -> str:
    plain = _hashed_targets(plain)
    for key in VOLATILE_KEYS:
        plain.pop(key, None)
    plain.get("trainer", {}).pop("enable_progress_bar", None)
    _drop_neutral(plain)
    if (plain.get("wise_ft") or {}).get("alpha", 1.0) == 1.0:  # no interpolation: the hash of runs from before it
        plain.pop("wise_ft", None)
    if not (plain.get("passages") or {}).get("frozen"):  # two-tower: the hash of runs from before query-side training
        plain.pop("passages", None)
    return hashlib.sha1(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_hash(cfg: DictConfig) -> str:
    """Hash of the resolved configuration without :data:`VOLATILE_KEYS` (identifies what a run computes and
    guards its run directory)."""
    return _digest(OmegaConf.to_container(cfg, resolve=True))


def equivalence_key(cfg: DictConfig, single_positive: Iterable[str | None]) -> str:
    """Hash of what the run trains and evaluates: :func:`config_hash` without :data:`NOT_COMPUTED` and the
    ``data`` fields its stages ignore (:data:`IGNORED_BY_SINGLE_POSITIVE` when every training stage is
    single-positive). Runs in different directories can share it; their config hashes differ.

    ``single_positive``: the resolved ``single_positive`` of each stage that trains (``None``, ``"first"`` or
    ``"random"``, :class:`multipos.stages.Stage`); an empty list (evaluation only) also drops them, since nothing
    builds a group.
    """
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in NOT_COMPUTED:
        plain.pop(key, None)
    if all(s is not None for s in single_positive):
        for key in IGNORED_BY_SINGLE_POSITIVE:
            plain.get("data", {}).pop(key, None)
    return _digest(plain)


def _index_file(key: str) -> Path:
    return cache_dir() / "runs" / f"{key}.json"


def _read_json(path: Path) -> object:
    """The index files and a source run's references: None when absent or unreadable (the index is a cache)."""
    try:
        return read_json(path, missing_ok=True)
    except (OSError, ValueError):
        return None


def register(key: str, run_dir: Path) -> None:
    """Record the finished ``run_dir`` under ``key`` in the index (entries whose run is gone are dropped); a run
    that is not finished with that key (:func:`multipos.run_folder.is_finished`) is not recorded."""
    if not is_finished(run_dir, key):
        return
    file = _index_file(key)
    entries = _read_json(file)
    entries = entries if isinstance(entries, list) else []
    runs = [r for r in entries if isinstance(r, str) and is_finished(Path(r), key)]
    path = str(Path(run_dir).resolve())
    if path not in runs:
        atomic.write_json(file, [*runs, path])


def find_equivalent(key: str, run_dir: Path) -> Path | None:
    """A finished run other than ``run_dir`` with equivalence key ``key``, or None (an index entry is trusted
    only when the run it names still says so in its ``run_info.json``)."""
    entries = _read_json(_index_file(key))
    here = Path(run_dir).resolve()
    for entry in entries if isinstance(entries, list) else []:
        candidate = Path(str(entry))
        if candidate.resolve() != here and is_finished(candidate, key) and (candidate / "model").is_dir():
            return candidate
    return None


def adopt(source: Path, run_dir: Path, info: dict) -> dict:
    """Copy the results and model of the finished run ``source`` into ``run_dir`` → its metrics.

    Copies :data:`RESULT_FILES` and ``model/`` (atomically: a copy cut short leaves no half file), writes
    ``metrics.json``, ``references.json`` and ``results.txt`` (with a line naming the source) from the source's, and writes ``run_info.json`` last, from ``info`` plus
    ``status: complete``, ``reused_from`` and the source's ``stage_records``. ``wall_s`` is the time spent here.
    Raises FileNotFoundError when ``source`` has no ``metrics.json`` or ``model/``.
    """
    from multipos.evaluation.runner import write_results  # the one results writer

    source, run_dir = Path(source), Path(run_dir)
    if not (source / "metrics.json").is_file() or not (source / "model").is_dir():
        raise FileNotFoundError(f"{source}: not a finished run (metrics.json and model/ expected)")
    metrics = json.loads((source / "metrics.json").read_text())
    refs = _read_json(source / "references.json")
    run_dir.mkdir(parents=True, exist_ok=True)
    for pattern in RESULT_FILES:
        for file in sorted(source.glob(pattern)):
            target = run_dir / file.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = atomic.temp_path(target)
            shutil.copyfile(file, tmp)
            os.replace(tmp, target)
    with atomic.replace_dir(run_dir / "model") as tmp:
        shutil.copytree(source / "model", tmp, dirs_exist_ok=True)
    src_info = read_run_info(source)
    write_results(run_dir, metrics, refs if isinstance(refs, dict) else None,
                  extra_lines=[f"copied from the equivalent finished run {source.resolve()} (equivalence key "
                               f"{info.get('equivalence_key')}); trained nothing here"])
    write_run_info(run_dir, {**info, "status": "complete", "reused_from": str(source.resolve()),
                                                  "stage_records": src_info.get("stage_records", [])})
    log.info("%s: the finished run %s computes the same model and evaluation (equivalence key %s): copied its "
             "results instead of training (reuse_equivalent=false trains it)", run_dir, source,
             info.get("equivalence_key"))
    return metrics
