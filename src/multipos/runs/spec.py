"""What a run computes, as an explicit, versioned spec (:class:`RunSpec`); the hash of the spec identifies the run.

A spec holds the values that decide the trained model and its evaluation, read from the composed config by name
(:func:`run_spec`): the seed, the starting weights, the encoder, the training data and its groups, the objective,
the optimisation, the stage plan, the passage side, the evaluation sets and their search, and WiSE-FT. Everything
else is simply not in it: where a run writes, how it is logged, named or rendered, how many threads, workers or
processes run it, how texts are batched for speed (``pack_sequences``, encoding batch sizes, GradCache chunks),
and which module a class lives in (a ``_target_`` enters as its class name).

* :meth:`RunSpec.key` — the run's key: it guards a run folder (a folder holding a run with another key is
  refused, :func:`multipos.runs.folder.prepare_run_dir`), and a finished run with the same key is skipped.
* :meth:`RunSpec.equivalence_key` — the key of what the run trains and evaluates, without the fields its stages
  ignore: single-positive objectives (SingleLH, Rand1LH) put one positive in every group whatever M and the
  positive selection are, and only soft-target objectives read target weights. Runs in different folders that
  share it are reused (:mod:`multipos.runs.reuse`).

A run that trains nothing (``evaluate.py``'s job, :func:`evaluates_only`) has an evaluation spec
(:func:`evaluation_spec`): the weights it evaluates (``init_from``), the encoder settings, the evaluation and WiSE-FT;
its training sections are empty and it has no seed (the weights' folder names the seed that trained them).

The seeds of one report row are runs whose specs agree but for the seed (:func:`multipos.report.seeds.group_seeds`).

A setting that changes nothing is not added. A new optional feature whose off value is null (inside a section the spec
reads whole, such as ``data.source``) enters the spec only when it is set, so earlier runs keep their keys. Any other
setting that changes what runs compute is added here, with the value that computes what earlier runs computed as
its default, and :data:`SPEC_VERSION` is raised; ``python -m multipos.runs.migrate <sweep dir>`` then re-keys
finished runs from their own ``.hydra/config.yaml``. A setting left out is declared in :data:`NOT_IN_SPEC` with the
reason: a test fails for any setting that is neither (tests/runs/test_spec_coverage.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from multipos.losses import SOFT_OBJECTIVES
from multipos.training.stages import DEFAULTS as STAGE_DEFAULTS
from multipos.training.stages import plan

__all__ = ["SPEC_VERSION", "SPEC_FILE", "NOT_IN_SPEC", "RunSpec", "run_spec", "run_key", "spec_from_plain",
           "evaluates_only", "evaluation_spec", "digest"]

#: Version of the spec's layout: raised whenever a field is added, removed or renamed. 2: runs that train nothing have
#: evaluation specs (:func:`evaluation_spec`); the regime is the stages' alone (no ``data.regime``).
SPEC_VERSION = 2
#: The file a run folder keeps its spec in (written when the run opens).
SPEC_FILE = "spec.json"

#: ``model`` fields that change the encoder's outputs.
MODEL_FIELDS = ("name_or_path", "pooling", "normalize", "temperature", "shared", "query_max_length",
                "passage_max_length", "attention_dropout", "hidden_dropout", "lora", "query_prompt", "passage_prompt")
#: ``data`` fields that change the training groups (``data.source`` enters whole; the regime is each stage's).
DATA_FIELDS = ("tokenizer", "group_size", "max_positives", "positive_selection", "negative_selection",
               "batch_size", "query_max_length", "passage_max_length", "budget")
#: ``data`` fields that a stage with a single-positive objective does not read.
IGNORED_BY_SINGLE_POSITIVE = ("max_positives", "positive_selection")
#: ``data.source`` fields that only soft-target objectives read.
READ_BY_SOFT_TARGETS = ("grade_weights", "teacher_scores", "teacher_model")
#: ``trainer`` fields that change the optimisation (the accelerator: its kernels round differently).
TRAINER_FIELDS = ("accelerator", "precision", "max_epochs", "max_steps", "gradient_clip_val", "gradient_clip_algorithm",
                  "accumulate_grad_batches", "limit_train_batches", "devices", "num_nodes", "deterministic")
#: ``eval`` fields that change the evaluation's numbers (the sets enter whole).
EVAL_FIELDS = ("k", "bf16", "passage_max_length", "index", "references", "average")
#: ``eval.faiss`` fields that change an approximate search's results.
FAISS_FIELDS = ("hnsw_m", "ef_search", "nlist", "nprobe")


#: Every setting of a composed config that is not part of the spec, as ``fnmatch`` patterns over dotted leaf paths,
#: each with why it changes nothing a run computes. tests/runs/test_spec_coverage.py composes every study cell and the
#: main job, changes each leaf in turn and fails for a leaf that changes no key and matches none of these patterns
#: (a new setting must be put in the spec or declared here), or that changes the key and matches one.
NOT_IN_SPEC = {
    "paths.*": "where a run writes",
    "run_name": "the run folder's name",
    "experiment_name": "the study's name (its sweep folder)",
    "logger.*": "where and how training is logged",
    "report.*": "how a study is rendered",
    "optimized_metric": "the result a Hydra Optuna sweep reads back",
    "run_file": "evaluate.py scores the given TREC run as it is, with no spec and no run folder key",
    "resume": "whether a run folder is continued or trained again",
    "reuse_equivalent": "whether a finished equivalent run is copied instead of trained",
    "prepare_only": "stops a run before training; the same command then continues it",
    "keep_checkpoints": "whether resume checkpoints are kept after the run",
    "callbacks.model_checkpoint.every_n_train_steps": "extra resume checkpoints mid-epoch",
    "callbacks.model_checkpoint.filename": "a checkpoint file's name",
    "callbacks.model_checkpoint.save_last": "a link to the newest checkpoint",
    "trainer.enable_progress_bar": "terminal output",
    "trainer.log_every_n_steps": "logging frequency",
    "trainer.num_sanity_val_steps": "Lightning's validation loop is unused (dev retrieval is a callback)",
    "trainer.limit_val_batches": "Lightning's validation loop is unused (dev retrieval is a callback)",
    "trainer.reload_dataloaders_every_n_epochs": "each batch index carries its epoch (EpochSampler): no batch changes",
    "*._target_": "the class, not what it computes (the loss by loss.name, the rest by their settings)",
    "*._partial_": "how Hydra instantiates the class",
    "threads": "torch threads: speed",
    "parallel_jobs": "runs side by side: speed",
    "pack_sequences": "padding-free CPU batches: the same embeddings up to rounding (multipos.model.packing)",
    "return_freed_memory": "when freed memory goes back to the OS",
    "data.num_workers": "tokenisation processes: speed",
    "data.name": "the data's label in logs; the data themselves are data.source",
    "eval.batch_size": "encoding batch size: the same embeddings up to rounding",
    "passages.chunk_size": "frozen-index scoring in chunks: speed and memory",
    "passages.index": "none: two-tower training has no frozen index (its settings enter the spec where there is one)",
    "passages.index.batch_size": "frozen-index encoding batch size: speed",
    "callbacks.negative_refresh.batch_size": "re-mining encoding batch size: speed",
    "module.grad_cache_chunk_size": "GradCache chunks: the same gradient up to rounding (multipos.training.grad_cache)",
    "module.optimizer.fused": "one AdamW kernel instead of several: the same update up to rounding",
    "eval.faiss.shard_size": "exact top-k merged across index shards",
    "eval.faiss.use_gpu": "where FAISS searches",
    "model.trust_remote_code": "permission to run a checkpoint's own code",
    "objective": "a study's selector: the loss it names is in the spec",
    "ratio": "a study's selector: the group size and M it names are in the spec",
    "negative_filter": "a study's selector: the filter it names is in data.source",
    "labels": "a study's selector: the qrels file it names is in data.source",
    "budget": "a study's selector: the budget it names is data.budget",
    "data_path": "own data: read as data.source.path",
    "scale.*": "a scale's presets, read through interpolations into settings in the spec",
    **{section: "evaluate.py: null (conf/evaluation_only.yaml); a run that trains nothing has no training section"
       for section in ("data", "passages", "stages", "trainer", "module", "callbacks")},
    "budgets.*": "Table 7's budgets, read through the budget selector",
    "ratios.*": "the ratio figure's cells, read through the ratio selector",
    "negative_filters.*": "the negative-filter study's cells, read through its selector",
    "label_sets.*": "the closed-loop study's label sets, read through the labels selector",
}


def _plain(node: Any) -> Any:
    """A resolved config node as plain Python, every ``_target_`` replaced by its class name (``kind``), every
    ``_partial_`` dropped (where a class lives is not what it computes), and every field that is null (an optional
    feature left off, as when the field did not exist) or an empty mapping left out."""
    if isinstance(node, Mapping):
        out = {}
        for k, v in node.items():
            if k == "_partial_" or v is None:
                continue
            if k == "_target_":
                out["kind"] = str(v).rsplit(".", 1)[-1]
            elif (value := _plain(v)) != {}:
                out[k] = value
        return out
    if isinstance(node, (list, tuple)):
        return [_plain(v) for v in node]
    return node


def _pick(node: Mapping | None, fields: tuple[str, ...]) -> dict:
    """The ``fields`` that ``node`` has, in that order, through :func:`_plain` (absent and null fields are left out:
    their default computes)."""
    return _plain({f: (node or {})[f] for f in fields if f in (node or {})})


def digest(value: Any) -> str:
    """16 hex digits of sha1 over ``value`` as sorted JSON."""
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunSpec:
    """What one run computes (see the module docstring). Every section is plain JSON data.

    ``seed``: None for a run that trains nothing; ``stages``: each training stage's fields
    (:class:`multipos.training.stages.Stage`) with those at their default left out;
    ``passages``: ``None`` for two-tower training, else the frozen index's settings; ``wise_ft``: ``None`` when no
    interpolation happens (alpha 1).
    """

    seed: int | None
    init_from: str | None
    model: dict
    data: dict
    objective: dict
    optimization: dict
    stages: list[dict]
    passages: dict | None
    evaluation: dict
    wise_ft: dict | None = None
    version: int = field(default=SPEC_VERSION)

    def to_dict(self) -> dict:
        """The spec as plain JSON data (what ``spec.json`` holds)."""
        return asdict(self)

    def key(self) -> str:
        """The run's key: :func:`digest` of the whole spec."""
        return digest(self.to_dict())

    def equivalence_key(self) -> str:
        """The key of what the run trains and evaluates: without :data:`IGNORED_BY_SINGLE_POSITIVE` when every stage
        that trains is single-positive (or none trains: nothing builds a group), and without
        :data:`READ_BY_SOFT_TARGETS` when no stage's objective is a soft-target one."""
        plain = self.to_dict()
        training = [s for s in plain["stages"] if s.get("epochs", 0) > 0]
        if all(s.get("single_positive") is not None for s in training):
            for name in IGNORED_BY_SINGLE_POSITIVE:
                plain["data"].pop(name, None)
        if not any(s.get("objective") in SOFT_OBJECTIVES for s in plain["stages"]):
            for name in READ_BY_SOFT_TARGETS:
                plain["data"].get("source", {}).pop(name, None)
        return digest(plain)


def _stages(stages: Mapping | None) -> list[dict]:
    """The stage plan as spec sections (:func:`multipos.training.stages.plan`), fields at their default left out."""
    out = []
    for stage in plan(stages or {}):
        described = stage.describe()
        out.append({k: v for k, v in described.items() if not (k in STAGE_DEFAULTS and v == STAGE_DEFAULTS[k])})
    return out


def _evaluation(eval_cfg: Mapping | None) -> dict:
    eval_cfg = eval_cfg or {}
    out = _pick(eval_cfg, EVAL_FIELDS)
    out["faiss"] = _pick(eval_cfg.get("faiss"), FAISS_FIELDS)
    out["validation"] = _plain(eval_cfg.get("validation"))
    out["test_sets"] = _plain(eval_cfg.get("test_sets"))
    return out


def _callbacks(callbacks: Mapping | None, refresh: bool) -> dict:
    """The callbacks that change the kept model: dev validation (which epoch is kept) and, when the data refreshes
    its negatives, the refresh's search."""
    callbacks = callbacks or {}
    out = {}
    if callbacks.get("retrieval_validation"):
        out["validation"] = _pick(callbacks["retrieval_validation"], ("metric", "every_n_epochs"))
    if callbacks.get("model_checkpoint"):
        out["checkpoint"] = _pick(callbacks["model_checkpoint"], ("mode", "save_top_k"))
    if refresh and callbacks.get("negative_refresh"):
        out["negative_refresh"] = _pick(callbacks["negative_refresh"], ("bf16", "index"))
    return out


def evaluates_only(plain: Mapping) -> bool:
    """Whether a resolved config (nested plain dicts) describes a run that trains nothing: ``evaluate.py``'s job
    (``job: evaluate``), or a training config from ``init_from`` whose every stage has 0 epochs (how Table 3 and the
    WiSE-FT curves ran before ``evaluate.py`` ran studies)."""
    if plain.get("job") == "evaluate":
        return True
    stages = plain.get("stages") or {}
    return bool(plain.get("init_from")) and bool(stages) and not any(
        int((s or {}).get("epochs") or 0) > 0 for s in stages.values())


def evaluation_spec(plain: Mapping) -> RunSpec:
    """:class:`RunSpec` of a run that trains nothing (:func:`evaluates_only`): the weights it evaluates
    (``init_from``; else ``model.name_or_path``), the encoder settings (``model.name_or_path`` is then the starting
    checkpoint: the zero-shot reference row and WiSE-FT's default start), the evaluation (with ``zero_shot_model``
    when one is named) and WiSE-FT; no seed, no training sections."""
    evaluation = _evaluation(plain.get("eval"))
    if plain.get("zero_shot_model"):
        evaluation["zero_shot_model"] = plain["zero_shot_model"]
    wise_ft = plain.get("wise_ft") or {}
    return RunSpec(seed=None, init_from=plain.get("init_from"), model=_pick(plain.get("model"), MODEL_FIELDS),
                   data={}, objective={}, optimization={}, stages=[], passages=None, evaluation=evaluation,
                   wise_ft=_plain(wise_ft) if wise_ft.get("alpha", 1.0) != 1.0 else None)


def spec_from_plain(plain: Mapping) -> RunSpec:
    """:class:`RunSpec` of a resolved config given as nested plain dicts (a run folder's ``.hydra/config.yaml``
    resolved, or :func:`run_spec`'s): :func:`evaluation_spec` for a run that trains nothing. Raises KeyError naming
    ``seed`` when a training config has none."""
    if evaluates_only(plain):
        return evaluation_spec(plain)
    data = plain.get("data") or {}
    source = _plain(data.get("source") or {})
    if "label_noise" in source and not float(source["label_noise"].get("rate", 0)):
        del source["label_noise"]  # rate 0 replaces nothing: the run of the labels as published
    module = plain.get("module") or {}
    wise_ft = plain.get("wise_ft") or {}
    passages = plain.get("passages") or {}
    optimization = {
        "optimizer": _plain(module.get("optimizer")),
        "scheduler": _plain(module.get("scheduler")),
        "warmup_ratio": module.get("warmup_ratio"),
        "trainer": _pick(plain.get("trainer"), TRAINER_FIELDS),
        "callbacks": _callbacks(plain.get("callbacks"), bool(source.get("negative_refresh_epochs"))),
    }
    optimization["optimizer"].pop("fused", None)  # one kernel instead of several: the same update up to rounding
    trainer = plain.get("trainer") or {}
    clipping = {k: module[k] for k, default in (("gradient_clip_val", None), ("gradient_clip_algorithm", "norm"))
                if k in module and module[k] != trainer.get(k, default)}
    if clipping:  # GradCache clips in the module: a value of its own, not the trainer's it copies by default
        optimization["module_clipping"] = clipping
    model = _pick(plain.get("model"), MODEL_FIELDS)
    if (plain.get("model") or {}).get("prefer_saved") is False:  # the given settings over a checkpoint's saved ones
        model["prefer_saved"] = False
    return RunSpec(
        seed=plain["seed"],
        init_from=plain.get("init_from"),
        model=model,
        data={**_pick(data, DATA_FIELDS), "source": source},
        objective={k: v for k, v in _plain(plain.get("loss") or {}).items() if k != "kind"},
        optimization=optimization,
        stages=_stages(plain.get("stages")),
        passages=({"candidates": passages.get("candidates"),
                   "index": _pick(passages.get("index"), ("max_length", "bf16", "dtype"))}
                  if passages.get("frozen") else None),
        evaluation=_evaluation(plain.get("eval")),
        wise_ft=_plain(wise_ft) if wise_ft.get("alpha", 1.0) != 1.0 else None,
    )


#: Top-level config sections a spec reads (only these are resolved).
READ_SECTIONS = ("job", "seed", "init_from", "zero_shot_model", "model", "data", "loss", "module", "trainer",
                 "callbacks", "stages", "passages", "eval", "wise_ft")


def run_spec(cfg: DictConfig) -> RunSpec:
    """:class:`RunSpec` of a composed config: its :data:`READ_SECTIONS` resolved, then :func:`spec_from_plain`.
    Raises what resolving raises (an interpolation that does not resolve names its key)."""
    plain = {name: OmegaConf.to_container(cfg[name], resolve=True) if OmegaConf.is_config(cfg[name]) else cfg[name]
             for name in READ_SECTIONS if name in cfg}
    return spec_from_plain(plain)


def run_key(cfg: DictConfig) -> str:
    """The key of the run a composed config describes: ``run_spec(cfg).key()``."""
    return run_spec(cfg).key()
