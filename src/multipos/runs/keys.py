"""What a run computes: the config keys that do not change it, and the two hashes that identify a run.

Both hashes are 16 hex digits of sha1 over the resolved config as sorted JSON:

* :func:`config_hash` — the whole resolved config without :data:`VOLATILE_KEYS` (paths, report layout, study
  name, …). It guards a run directory: re-running into a folder that holds a run of another configuration is
  refused (:func:`multipos.runs.folder.prepare_run_dir`).
* :func:`equivalence_key` — :func:`config_hash` of the config with the fields the run's stages ignore left out
  as well. Single-positive objectives (SingleLH takes the first positive, Rand1LH draws one per epoch) put one
  positive in every group whatever M (``data.max_positives``) and the positive selection are
  (:meth:`multipos.data.groups.GroupBuilder.select_positives`), so the ratio figure's SingleLH cell at G=8, M=2
  trains, bit for bit, the model of its cell at G=8, M=4; and Appendix B's first-M cells at G=16 are the
  figure's G=16 cells of the same objective. Runs that share it are reused (:mod:`multipos.runs.reuse`).

The report groups the seeds of one configuration by the same rule (:data:`SEED_FREE_KEYS`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from multipos.losses import SOFT_OBJECTIVES
from multipos.stages import DEFAULTS as STAGE_DEFAULTS

__all__ = ["VOLATILE_KEYS", "SEED_FREE_KEYS", "NOT_COMPUTED", "IGNORED_BY_SINGLE_POSITIVE", "HASHED_AS",
           "hashed_as", "config_hash", "equivalence_key"]

#: Config keys that do not change what a run computes (paths, report layout, study name and CPU size, resume and
#: reuse switches, the speed settings ``threads``, ``parallel_jobs`` and ``pack_sequences``, the memory setting
#: ``return_freed_memory``, ``prepare_only`` (a run stopped
#: before training is continued by the same command without it), and ``length_buckets``, retired): left out
#: of the config hash. Hydra's ``override_dirname.exclude_keys`` (conf/hydra/default.yaml) is a different list on
#: purpose: it names *command-line overrides* left out of a sweep cell's folder name, among them ``experiment``,
#: ``scale`` and ``fine_tuning``, which do change the computation but name the sweep folder.
VOLATILE_KEYS = ("paths", "resume", "hydra", "report", "experiment_name", "size", "reuse_equivalent", "threads",
                 "pack_sequences", "return_freed_memory", "length_buckets", "parallel_jobs", "prepare_only")
#: Keys on which the seeds of one configuration may differ (report rows): :data:`VOLATILE_KEYS` and ``seed``.
SEED_FREE_KEYS = ("seed", *VOLATILE_KEYS)

#: Config keys (dotted) left out of :func:`equivalence_key` besides :data:`VOLATILE_KEYS`: where and how metrics are
#: logged (``logger.save_dir`` is the run directory) does not change the model or its evaluation, and ``data.name`` and
#: ``run_name`` (by default ``<objective>-<data.name>``) are labels: ``conf/data/nfcorpus_hetero.yaml`` is
#: ``nfcorpus.yaml`` with a regime and its own name, the other ``data`` fields say what is read, and the names only key
#: caches of the same values and tag the TREC run files (a reused run keeps its source's tag). All stay in
#: :func:`config_hash`, so no finished run directory changes its guard.
NOT_COMPUTED = ("logger", "data.name", "run_name")

#: ``data`` fields a stage with a single-positive objective (SingleLH, Rand1LH) does not read.
IGNORED_BY_SINGLE_POSITIVE = ("max_positives", "positive_selection")

#: Where classes named by ``_target_`` lived when their runs' hashes were first computed: a class's module moving
#: (the data / evaluation / retrieval subpackages, every callback into multipos.callbacks, 2026-11-24) does not change
#: what a run computes, so the hash reads the old path. {current prefix: prefix in the hash}.
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
    "data.source.grade_weights": None, "data.source.label_noise": None, "data.source.teacher_scores": None,
    "data.source.teacher_model": None,
}


#: Settings in the hash that do not change what a run computes, with the value every run hashed before this rule had:
#: a run is hashed at that value whatever its own, so a GPU run logging every 10 steps (since 2026-11-26,
#: :func:`multipos.hardware.auto_log_interval`) continues the sweeps of runs that logged every step.
#: {dotted key: value in the hash}.
HASHED_AS = {"trainer.log_every_n_steps": 1}


def _holder(plain: dict, dotted: str) -> tuple[dict | None, str]:
    """(the dict of ``plain`` that holds ``dotted``'s last key, or None where a parent is missing; that key)."""
    *parents, leaf = dotted.split(".")
    node = plain
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), leaf


def hashed_as(plain: dict) -> dict:
    """``plain`` (a config as nested dicts) with each :data:`HASHED_AS` setting it has set to its hashed value, in
    place → ``plain``. Used by both hashes and by the report's grouping of seeds (:mod:`multipos.report.seeds`)."""
    for dotted, value in HASHED_AS.items():
        node, leaf = _holder(plain, dotted)
        if node is not None and leaf in node:
            node[leaf] = value
    return plain


def _drop_neutral(plain: dict) -> None:
    for dotted, neutral in NEUTRAL_SETTINGS.items():
        node, leaf = _holder(plain, dotted)
        if node is not None and leaf in node and node[leaf] == neutral:
            del node[leaf]


def _digest(plain: dict) -> str:
    plain = _hashed_targets(plain)
    for key in VOLATILE_KEYS:
        plain.pop(key, None)
    plain.get("trainer", {}).pop("enable_progress_bar", None)
    _drop_neutral(plain)
    hashed_as(plain)
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
    single-positive, and ``data.source.grade_weights`` when no stage's objective is a soft-target one). Runs in
    different directories can share it; their config hashes differ.

    ``single_positive``: the resolved ``single_positive`` of each stage that trains (``None``, ``"first"`` or
    ``"random"``, :class:`multipos.stages.Stage`); an empty list (evaluation only) also drops them, since nothing
    builds a group. A stage field at its default (:data:`multipos.stages.DEFAULTS`) is left out, so a stage that
    writes ``keep: best`` (the query-side figure, Tables 5 and 8) and one that leaves ``keep`` out (Table 2) have
    one key when they train the same model.

    Changing this rule changes the keys of finished runs, not their config hashes: such a run stays finished and
    gets its new key when its sweep is run again (:func:`multipos.runs.lifecycle.open_run`).
    """
    plain = OmegaConf.to_container(cfg, resolve=True)
    for dotted in NOT_COMPUTED:
        node, leaf = _holder(plain, dotted)
        if node is not None:
            node.pop(leaf, None)
    if all(s is not None for s in single_positive):
        for key in IGNORED_BY_SINGLE_POSITIVE:
            plain.get("data", {}).pop(key, None)
    objectives = [spec.get("objective") for spec in (plain.get("stages") or {}).values() if isinstance(spec, dict)]
    if not any(o in SOFT_OBJECTIVES for o in objectives):  # target weights are read by soft-target objectives only
        for key in ("grade_weights", "teacher_scores", "teacher_model"):
            (plain.get("data", {}).get("source") or {}).pop(key, None)
    for spec in (plain.get("stages") or {}).values():
        if isinstance(spec, dict):
            for field, default in STAGE_DEFAULTS.items():
                if field in spec and spec[field] in (None, default):
                    del spec[field]
    return _digest(plain)
