"""One training stage, as the training job (:mod:`multipos.train`) runs it: its callbacks (dev retrieval, the best-dev
and the resume checkpoints, RNG states, anything else the ``callbacks`` node names), its Lightning Trainer, ``fit``
resumed from the stage's newest checkpoint, and the checkpoint it keeps (best on dev, or last).

The job hands this module typed pieces: a :class:`FitPlan` (the config nodes instantiated here, as they are), the
:class:`TrainingParts` built once per run, and one :class:`StageRun` per stage.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig

from multipos import atomic
from multipos.assets import cache_dir
from multipos.losses import ContrastiveLoss
from multipos.training.callbacks import LoggedProgressBar, RNGStateCheckpoint, check_refresh_callback
from multipos.training.distributed import is_rank_zero
from multipos.training.loggers import log_config
from multipos.training.module import PassageSettings, StageSettings, restore_frozen_passage_encoder
from multipos.training.stages import Stage

log = logging.getLogger(__name__)

#: File name of the resume checkpoints (Lightning ModelCheckpoint pattern): one kept per stage, the newest.
RESUME_FILENAME = "resume-{epoch}-{step}"
_STEP = re.compile(r"(?:^|-)step=(\d+)(?:-v\d+)?\.ckpt$")


@dataclass(frozen=True)
class FitPlan:
    """How every stage of a run is trained: the run folder ``out`` and the config nodes instantiated for each stage
    as they are — ``trainer`` (a Lightning Trainer), ``callbacks``, ``logger`` (None: no logger), ``loss`` (a
    :class:`multipos.losses.ContrastiveLoss`, named per stage) and ``module`` (a partial
    :meth:`multipos.training.module.RetrieverModule.from_config`); ``passages``: the module's passage-side settings of
    query-side fine-tuning (``candidates``, ``chunk_size``; empty for two-tower training); ``config_record``: the
    resolved config a W&B logger records (:func:`multipos.training.loggers.log_config`)."""

    out: Path
    trainer: DictConfig
    callbacks: DictConfig | None
    logger: DictConfig | None
    loss: DictConfig
    module: DictConfig
    passages: dict = field(default_factory=dict)
    config_record: dict = field(default_factory=dict)


@dataclass
class TrainingParts:
    """What the stages of one run share: the model, the data module, the job's
    :class:`multipos.evaluation.runner.Evaluation`, the frozen passage index of query-side fine-tuning (or None) and
    the number of stages in the plan."""

    model: Any
    datamodule: Any
    evaluation: Any
    index: Any = None
    n_stages: int = 1


@dataclass
class StageRun:
    """One stage to run: its position ``i`` in the plan, the :class:`multipos.training.stages.Stage`, its span of the
    learning-rate schedule (first step, total steps) and the optimizer state the stage before it left (or None)."""

    i: int
    stage: Stage
    span: tuple[int, int]
    optimizer_state: dict | None = None


def build_callbacks(callbacks_cfg: DictConfig | None, stage_dir: Path, evaluation=None) -> tuple[list, object | None]:
    """The stage's callbacks from the ``callbacks`` node → (callbacks, the best-checkpoint callback or None).

    ``evaluation``: the job's :class:`multipos.evaluation.runner.Evaluation` (its validation set and retrieval
    settings), or None for a stage without dev retrieval.

    ``retrieval_validation`` (dev retrieval each epoch, when a validation set is configured) and
    ``model_checkpoint`` (best dev checkpoint) come from the config; a second ModelCheckpoint keeps the newest
    state (``resume-epoch=E-step=S.ckpt``, with ``last.ckpt`` a link to it) at each epoch end and every
    ``every_n_train_steps`` steps, for resuming (:func:`newest_checkpoint`). Every other entry
    with a ``_target_`` (e.g. ``gradient_diagnostics``, ``callbacks=diagnostics``) is instantiated as is.
    """
    cbs = callbacks_cfg or {}
    callbacks, best = [], None
    val_set = evaluation.validation if evaluation is not None else None
    if val_set is not None and cbs.get("retrieval_validation"):
        opts = {**evaluation.retrieval, "k": 100}
        callbacks.append(instantiate(cbs.retrieval_validation)(eval_set=val_set, cache=cache_dir(), **opts))
    if cbs.get("model_checkpoint"):
        checkpoint = instantiate(cbs.model_checkpoint)  # partial: one for the best dev epoch, one for resuming
        if callbacks:
            best = checkpoint(dirpath=str(stage_dir), monitor=f"val/{cbs.retrieval_validation.metric}", save_last=False,
                              every_n_train_steps=None)
            callbacks.append(best)
        # the newest state for resuming: Lightning >= 2.6 writes last.ckpt only in a step where this callback saved a
        # checkpoint itself, so it keeps its newest one (save_top_k=1, no monitor) and links last.ckpt to it
        callbacks.append(checkpoint(dirpath=str(stage_dir), filename=RESUME_FILENAME, monitor=None, save_top_k=1,
                                    save_last="link", save_on_train_epoch_end=True))
    for key, node in cbs.items():
        if (key not in ("retrieval_validation", "model_checkpoint") and isinstance(node, DictConfig)
                and "_target_" in node):
            callbacks.append(instantiate(node))
    return callbacks, best


def build_trainer(plan: FitPlan, max_epochs: int, callbacks: list, stage: str | None = None,
                  **overrides) -> L.Trainer:
    """Instantiate ``plan.trainer`` for one stage with the logger and the stage's callbacks.

    ``stage`` (multi-stage runs) becomes the logger's ``version`` so stages log side by side
    (``csv/stage1/metrics.csv``, ``csv/stage2/…``) instead of overwriting each other, or its metric ``prefix``
    (W&B: ``stage1-train/loss``); a W&B logger also records the resolved config
    (:func:`multipos.training.loggers.log_config`).
    Checkpoints are written atomically and read with ``weights_only=True``
    (:class:`multipos.atomic.AtomicCheckpointIO`). Under SLURM, Lightning's own requeueing is off
    (:func:`cluster_plugins`).
    """
    logger = False
    if plan.logger:
        key = next((k for k in ("version", "prefix") if k in plan.logger), None)
        extra = {key: stage} if stage is not None and key else {}
        logger = instantiate(plan.logger, **extra)
        log_config(logger, plan.config_record)
    return instantiate(plan.trainer, default_root_dir=str(plan.out), logger=logger,
                       callbacks=[*callbacks, *progress_bar(plan.trainer)], max_epochs=max_epochs,
                       plugins=[atomic.AtomicCheckpointIO(), *cluster_plugins()], **overrides)


def cluster_plugins() -> list:
    """``[SLURMEnvironment(auto_requeue=False)]`` inside a SLURM job (``SLURMEnvironment.detect()``), else ``[]``.

    A SLURM job is requeued by its launcher (``hydra/launcher=slurm``: submitit requeues it on the time-out signal and
    after a preemption, conf/hydra/launcher/slurm.yaml), and the requeued run resumes from its stage's newest
    checkpoint (:func:`newest_checkpoint`). Lightning's default SLURM environment would requeue the job a second
    time on its own signal (SIGUSR1), after saving an ``hpc_ckpt_<n>.ckpt`` into the run folder, outside the stage
    folders, which a later ``fit`` without a checkpoint of its own (the next stage) would then load. The environment
    is the one Lightning picks under SLURM anyway; only its requeueing is off.
    """
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def progress_bar(trainer_cfg: DictConfig) -> list:
    """The terminal progress bar for ``trainer_cfg`` → ``[LoggedProgressBar]``, or ``[]`` when
    ``trainer_cfg.enable_progress_bar`` is false.

    The bar shows ``train/loss``, which lives on the training device: each refresh reads it back, and on a GPU that
    makes the host wait until the device has finished the step, so the host's work between steps (Lightning's hooks,
    the next batch) stops overlapping the device's. It refreshes every ``trainer.log_every_n_steps`` steps (and at
    each epoch's last step), when the logger reads the loss anyway: one setting says how often the host waits for the
    loss (:class:`multipos.training.callbacks.LoggedProgressBar`).
    """
    if not trainer_cfg.get("enable_progress_bar", True):
        return []
    return [LoggedProgressBar(refresh_rate=max(1, int(trainer_cfg.get("log_every_n_steps") or 1)))]


def run_stage(plan: FitPlan, parts: TrainingParts, run: StageRun) -> tuple[dict | None, dict]:
    """Train (or resume, or skip when finished) the stage ``run`` → (optimizer state after it, stage record).

    Dev retrieval runs each epoch (``parts.evaluation``'s validation set) when the stage keeps its best dev
    checkpoint. Raises TypeError when ``plan.loss`` does not build a :class:`multipos.losses.ContrastiveLoss`."""
    i, stage, span, optimizer_state = run.i, run.stage, run.span, run.optimizer_state
    model, datamodule, evaluation, n_stages = parts.model, parts.datamodule, parts.evaluation, parts.n_stages
    stage_dir = plan.out / "checkpoints" / f"stage{i + 1}"
    kept_file = stage_dir / "kept.json"
    if kept_file.is_file():
        kept = json.loads(kept_file.read_text())
        log.info("stage %d (%s) already finished: loading %s", i + 1, stage.name, kept["checkpoint"] or "its weights")
        state = atomic.load_checkpoint(kept["checkpoint"]) if kept.get("checkpoint") else None
        if state is not None:
            restore_frozen_passage_encoder(model, state, source=kept["checkpoint"])
            model.load_state_dict({k[len("model."):]: v for k, v in state["state_dict"].items()
                                   if k.startswith("model.")})
        record = {**kept["record"], "resumed_from": str(kept_file)}  # finished before this process: nothing trained
        return (state["optimizer_states"][0] if state and state.get("optimizer_states") else None), record
    newest = newest_checkpoint(stage_dir)  # an interrupted stage resumes from it
    resume_from = str(newest) if newest else None
    datamodule.set_stage(stage.regime, stage.single_positive)
    datamodule.setup()
    log.info("stage %d/%d %s: regime=%s objective=%s single_positive=%s epochs=%d optimizer=%s lr_schedule=%s "
             "(schedule steps %d..%d)", i + 1, n_stages, stage.name, stage.regime, stage.objective,
             stage.single_positive, stage.epochs, stage.optimizer, stage.lr_schedule, span[0], span[1])
    # keep=last: no dev retrieval during the stage (nothing to select); the final evaluation still scores dev
    callbacks, best = build_callbacks(plan.callbacks, stage_dir, evaluation if stage.keep == "best" else None)
    # conf/loss/<name>.yaml builds the loss; a stage may train another objective with the same settings
    # (the curriculum's gold stage: SingleLH), so the stage's objective names it
    objective = instantiate(plan.loss, name=stage.objective)
    if not isinstance(objective, ContrastiveLoss):
        raise TypeError(f"loss._target_={plan.loss.get('_target_')!r} built {type(objective).__name__}, "
                        "not a multipos.losses.ContrastiveLoss")
    # conf/module's target is RetrieverModule.from_config: the node's keys, then the stage's and the passage side's
    stage_settings = StageSettings(lr=stage.lr, schedule_offset=span[0], schedule_total=span[1] or None,
                                   optimizer_state=optimizer_state if stage.optimizer == "carry" else None)
    passages = PassageSettings(index=parts.index, **plan.passages) if parts.index is not None else PassageSettings()
    module = instantiate(plan.module)(model=model, loss=objective, stage=stage_settings, passages=passages)
    # manual optimization (GradCache) clips in the module: Lightning refuses Trainer(gradient_clip_val) with it
    manual = {} if module.automatic_optimization else {"gradient_clip_val": None}
    trainer = build_trainer(plan, stage.epochs, [*callbacks, RNGStateCheckpoint()],
                            stage=f"stage{i + 1}" if n_stages > 1 else None, **manual)
    check_refresh_callback(trainer, datamodule.source)  # a refresh period without its callback would never refresh
    # the stage hands the data module what it needs from the model: batches carry their groups only where the module
    # reads them (needs_batch_groups sees one process until fit attaches the trainer, hence the world size here)
    if hasattr(datamodule, "set_inputs"):
        datamodule.set_inputs(replace(datamodule.inputs,
                                      batch_groups=trainer.world_size > 1 or module.needs_batch_groups()))
    last = stage_dir / "last.ckpt"
    if resume_from:
        log.info("stage %d: resuming from %s", i + 1, resume_from)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    kept_path = best.best_model_path if (best is not None and stage.keep == "best" and best.best_model_path) else (
        str(last) if last.is_file() else "")
    opt_state = trainer.optimizers[0].state_dict() if trainer.optimizers else None
    if kept_path:
        state = atomic.load_checkpoint(kept_path)
        restore_frozen_passage_encoder(model, state, source=kept_path)
        module.load_state_dict(state["state_dict"])
        opt_state = state["optimizer_states"][0] if state.get("optimizer_states") else opt_state
        log.info("stage %d: kept %s (%s=%s)", i + 1, kept_path, best.monitor if best else "last",
                 best.best_model_score if best else "-")
    record = {**stage.describe(), **datamodule.stats, "kept": kept_path, "resumed_from": resume_from,
              "best_dev": (float(best.best_model_score)
                           if best is not None and best.best_model_score is not None else None)}
    if is_rank_zero():
        atomic.write_json(kept_file, {"checkpoint": kept_path, "record": record})
    return opt_state, record


def newest_checkpoint(stage_dir: Path) -> Path | None:
    """The checkpoint of ``stage_dir`` with the highest training step → the one a killed stage resumes from.

    Every ``*.ckpt`` file whose name carries ``step=S`` counts (the resume checkpoint, step checkpoints and the
    best-dev checkpoint all hold the full training state); ``last.ckpt`` is a link to one of them and is read
    only when no file names a step (runs from before the resume checkpoints). At equal steps a resume checkpoint
    wins. None when the folder holds no checkpoint.
    """
    if not stage_dir.is_dir():
        return None
    found = []
    for f in stage_dir.glob("*.ckpt"):
        m = _STEP.search(f.name)
        if m and f.is_file() and not f.is_symlink():
            found.append((int(m.group(1)), f.name.startswith("resume-"), f))
    if found:
        return max(found, key=lambda x: (x[0], x[1]))[2]
    last = stage_dir / "last.ckpt"
    return last if last.is_file() else None
