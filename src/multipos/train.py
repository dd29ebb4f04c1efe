"""The main job: train a dual encoder through its stages (:mod:`multipos.stages`), then evaluate it.

``python train.py loss=<objective> data=<regime config> model=<encoder>`` or ``python train.py -m
experiment=<study>`` (Hydra entry point at the repository root) calls :func:`train`. Outputs in the run
directory (files listed in :mod:`multipos.evaluation.runner`), plus:

* ``model/`` — the kept weights in HF and sentence-transformers format;
* ``checkpoints/stage<i>/`` — Lightning checkpoints per stage (the newest state ``resume-epoch=E-step=S.ckpt``
  at each epoch end and every ``callbacks.model_checkpoint.every_n_train_steps`` steps, ``last.ckpt`` a link to
  it; the best dev one) and ``kept.json`` once the stage is finished;
* ``run_info.json`` — status (``running`` | ``complete``), config hash and equivalence key, stages, training
  queries and positive labels per stage, wall time (summed over resumes), device, ``resumed`` and
  ``resumed_from`` (the checkpoints an interrupted stage continued from, the ``kept.json`` of stages finished
  before; per stage also in ``stage_records``);
* ``csv/`` — Lightning logs (one version per stage in multi-stage runs).

``init_from=<model folder>`` starts from trained weights instead of ``model.name_or_path`` (the zero-shot row
keeps the latter); with ``trainer.max_epochs=0`` the run trains nothing and only evaluates them (Table 3).

Re-running the identical command into the same run directory (``hydra.run.dir``, or a study's fixed sweep
folder) resumes: a finished run is skipped, finished stages are not re-trained, and an interrupted stage
continues from its newest checkpoint (:func:`newest_checkpoint`) — optimizer, schedule, RNG and data order included. With
``reuse_equivalent=true`` (set by every study) a run whose model and evaluation a finished run elsewhere already
computed copies that run's results instead of training (:mod:`multipos.equivalent_runs`).
"""

from __future__ import annotations

import json
import logging
import platform
import re
import shutil
import time
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from multipos import atomic
from multipos.assets import cache_dir
from multipos.callbacks import RNGStateCheckpoint
from multipos.distributed import check_launch, is_rank_zero, trainer_world_size
from multipos.equivalent_runs import adopt, config_hash, equivalence_key, find_equivalent, register
from multipos.run_folder import is_finished, keep_hydra_files, read_run_info, restore_hydra_files, write_run_info
from multipos.evaluation.runner import eval_sets, evaluate_sets, references, retrieval_options, write_results
from multipos.loggers import log_config, log_final_metrics
from multipos.losses import ContrastiveLoss
from multipos.passage_index import check_settings as check_passages
from multipos.passage_index import for_training as frozen_passage_index
from multipos.weight_interpolation import interpolate_toward_start
from multipos.stages import Stage, plan, schedule_spans

log = logging.getLogger(__name__)

def output_dir(cfg: DictConfig) -> Path:
    """The run directory ``cfg.paths.output_dir`` (Hydra's run dir under ``train.py``)."""
    return Path(cfg.paths.output_dir)


def device_description() -> str:
    """The accelerator the run trains on, in words (GPU name, else CPU model and cores)."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    import os

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {model}, {os.cpu_count()} cores"


def build_callbacks(cfg: DictConfig, stage_dir: Path, val_set) -> tuple[list, object | None]:
    """The stage's callbacks from ``cfg.callbacks`` → (callbacks, the best-checkpoint callback or None).

    ``retrieval_validation`` (dev retrieval each epoch, when a validation set is configured) and
    ``model_checkpoint`` (best dev checkpoint) come from the config; a second ModelCheckpoint keeps the newest
    state (``resume-epoch=E-step=S.ckpt``, with ``last.ckpt`` a link to it) at each epoch end and every
    ``every_n_train_steps`` steps, for resuming (:func:`newest_checkpoint`). Every other entry
    with a ``_target_`` (e.g. ``gradient_diagnostics``, ``callbacks=diagnostics``) is instantiated as is.
    """
    cbs = cfg.get("callbacks") or {}
    callbacks, best = [], None
    if val_set is not None and cbs.get("retrieval_validation"):
        opts = {**retrieval_options(cfg), "k": 100}
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
        if key not in ("retrieval_validation", "model_checkpoint") and isinstance(node, DictConfig) and "_target_" in node:
            callbacks.append(instantiate(node))
    return callbacks, best


def build_trainer(cfg: DictConfig, out: Path, max_epochs: int, callbacks: list, stage: str | None = None,
                  **overrides) -> L.Trainer:
    """Instantiate ``cfg.trainer`` for one stage with the logger and the stage's callbacks.

    ``stage`` (multi-stage runs) becomes the logger's ``version`` so stages log side by side
    (``csv/stage1/metrics.csv``, ``csv/stage2/…``) instead of overwriting each other, or its metric ``prefix``
    (W&B: ``stage1-train/loss``); a W&B logger also records the resolved config (:func:`multipos.loggers.log_config`).
    Checkpoints are written atomically and read with ``weights_only=True`` (:class:`multipos.atomic.AtomicCheckpointIO`).
    """
    logger = False
    if cfg.get("logger"):
        key = next((k for k in ("version", "prefix") if k in cfg.logger), None)
        extra = {key: stage} if stage is not None and key else {}
        logger = instantiate(cfg.logger, **extra)
        log_config(logger, cfg)
    return instantiate(cfg.trainer, default_root_dir=str(out), logger=logger, callbacks=callbacks, max_epochs=max_epochs,
                       plugins=[atomic.AtomicCheckpointIO()], **overrides)


def start_weights(cfg: DictConfig) -> dict:
    """Keyword arguments that make ``cfg.model`` start from ``cfg.init_from`` (a trained model folder, e.g.
    another study's ``<run>/model``) instead of ``model.name_or_path``; ``{}`` when ``init_from`` is unset.

    The zero-shot reference row stays ``model.name_or_path`` (the un-fine-tuned encoder). With
    ``trainer.max_epochs=0`` a run trains nothing and only evaluates those weights: Table 3 evaluates Table 2's
    models this way (``conf/experiment/table3_ood.yaml``).

    Raises: FileNotFoundError naming ``init_from`` when the folder does not exist.
    """
    init = cfg.get("init_from")
    if not init:
        return {}
    if not Path(init).is_dir():
        raise FileNotFoundError(f"init_from={init}: no such model folder (a finished run's <run dir>/model; train "
                                f"the run it names first, e.g. the study it belongs to with `python train.py -m "
                                f"experiment=<study>`)")
    return {"name_or_path": str(init)}


def prepare_run_dir(cfg: DictConfig, out: Path, digest: str) -> tuple[dict, bool]:
    """Check the run directory against this configuration (hash ``digest``) → (previous run_info, finished).

    Raises ValueError when the folder holds a run of another configuration and ``resume`` is on: nothing is
    overwritten, and the ``.hydra/`` files Hydra already replaced before the job started are put back
    (:func:`multipos.run_folder.restore_hydra_files`). An accepted folder keeps a copy of them
    (:func:`~multipos.run_folder.keep_hydra_files`). With ``resume=false`` earlier checkpoints and CSV logs are
    removed first.
    """
    info = read_run_info(out)
    if not cfg.get("resume", True):
        if is_rank_zero():
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            shutil.rmtree(out / "csv", ignore_errors=True)  # the CSV logger appends to a resumed run's log
            keep_hydra_files(out)
        return {}, False
    if info and info.get("config_hash") != digest:
        restored = restore_hydra_files(out) if is_rank_zero() else True  # Hydra wrote this job's .hydra/ already
        raise ValueError(f"{out} holds a run of another configuration (config hash {info.get('config_hash')} != "
                         f"{digest}); use another hydra.run.dir, or resume=false to train it again from scratch"
                         + ("" if restored else f" (Hydra has already replaced {out / '.hydra'} with this job's "
                            "configuration and the folder keeps no copy of its own: run_info.json and metrics.json "
                            "describe the run that is there)"))
    if is_rank_zero():
        keep_hydra_files(out)
    return info, is_finished(out)


#: File name of the resume checkpoints (Lightning ModelCheckpoint pattern): one kept per stage, the newest.
RESUME_FILENAME = "resume-{epoch}-{step}"
_STEP = re.compile(r"(?:^|-)step=(\d+)(?:-v\d+)?\.ckpt$")


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


def run_stage(cfg: DictConfig, out: Path, i: int, stage: Stage, n_stages: int, model, datamodule, val_set,
              span: tuple[int, int], optimizer_state: dict | None, index=None) -> tuple[dict | None, dict]:
    """Train (or resume, or skip when finished) stage ``i`` → (optimizer state after it, stage record).

    ``index``: the frozen passage index of query-side fine-tuning (:mod:`multipos.passage_index`), or None."""
    stage_dir = out / "checkpoints" / f"stage{i + 1}"
    kept_file = stage_dir / "kept.json"
    if kept_file.is_file():
        kept = json.loads(kept_file.read_text())
        log.info("stage %d (%s) already finished: loading %s", i + 1, stage.name, kept["checkpoint"] or "its weights")
        state = atomic.load_checkpoint(kept["checkpoint"]) if kept.get("checkpoint") else None
        if state is not None:
            model.load_state_dict({k[len("model."):]: v for k, v in state["state_dict"].items() if k.startswith("model.")})
        record = {**kept["record"], "resumed_from": str(kept_file)}  # finished before this process: nothing trained
        return (state["optimizer_states"][0] if state and state.get("optimizer_states") else None), record
    datamodule.set_stage(stage.regime, stage.single_positive)
    datamodule.setup()
    log.info("stage %d/%d %s: regime=%s objective=%s single_positive=%s epochs=%d optimizer=%s lr_schedule=%s "
             "(schedule steps %d..%d)", i + 1, n_stages, stage.name, stage.regime, stage.objective, stage.single_positive,
             stage.epochs, stage.optimizer, stage.lr_schedule, span[0], span[1])
    # keep=last: no dev retrieval during the stage (nothing to select); the final evaluation still scores dev
    callbacks, best = build_callbacks(cfg, stage_dir, val_set if stage.keep == "best" else None)
    objective = ContrastiveLoss(stage.objective, normalize_by_positives=bool(cfg.loss.get("normalize_by_positives", False)))
    module = instantiate(cfg.module)(model=model, loss=objective, lr=stage.lr, schedule_offset=span[0],
                                     schedule_total=span[1] or None,
                                     optimizer_state=optimizer_state if stage.optimizer == "carry" else None,
                                     **passage_side(cfg, index))
    # manual optimization (GradCache) clips in the module: Lightning refuses Trainer(gradient_clip_val) with it
    manual = {} if module.automatic_optimization else {"gradient_clip_val": None}
    trainer = build_trainer(cfg, out, stage.epochs, [*callbacks, RNGStateCheckpoint()],
                            stage=f"stage{i + 1}" if n_stages > 1 else None, **manual)
    last = stage_dir / "last.ckpt"
    newest = newest_checkpoint(stage_dir)
    resume_from = str(newest) if newest else None
    if resume_from:
        log.info("stage %d: resuming from %s", i + 1, resume_from)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    kept_path = best.best_model_path if (best is not None and stage.keep == "best" and best.best_model_path) else (
        str(last) if last.is_file() else "")
    opt_state = trainer.optimizers[0].state_dict() if trainer.optimizers else None
    if kept_path:
        state = atomic.load_checkpoint(kept_path)
        module.load_state_dict(state["state_dict"])
        opt_state = state["optimizer_states"][0] if state.get("optimizer_states") else opt_state
        log.info("stage %d: kept %s (%s=%s)", i + 1, kept_path, best.monitor if best else "last",
                 best.best_model_score if best else "-")
    record = {**stage.describe(), **datamodule.stats, "kept": kept_path, "resumed_from": resume_from,
              "best_dev": float(best.best_model_score) if best is not None and best.best_model_score is not None else None}
    if is_rank_zero():
        atomic.write_json(kept_file, {"checkpoint": kept_path, "record": record})
    return opt_state, record


def passage_side(cfg: DictConfig, index) -> dict:
    """The module's passage-side arguments (``cfg.passages``): {} for two-tower training, else the frozen index,
    the candidate set and the chunk size."""
    if index is None:
        return {}
    return {"passage_index": index, "candidates": cfg.passages.candidates,
            "chunk_size": cfg.passages.get("chunk_size") or 65536}


def train(cfg: DictConfig) -> dict | None:
    """Run the main job described in the module docstring; returns the metrics dict written to ``metrics.json``.

    Data-parallel training (``trainer=ddp``): every process runs this function (Lightning's launcher starts the
    others at the first ``fit``, re-running the command) and trains; only global rank 0 writes files and runs the
    references and the final evaluation; the other ranks return None after the last stage.

    Raises: ValueError / DataFormatError for invalid configuration or data, before anything is written.
    """
    out = output_dir(cfg)
    start = time.time()
    stages = plan(cfg.stages, evaluate_only=bool(cfg.get("init_from")))  # configuration errors first
    check_passages(cfg.get("passages"))
    digest = config_hash(cfg)
    key = equivalence_key(cfg, [s.single_positive for s in stages if s.epochs > 0])
    info, finished = prepare_run_dir(cfg, out, digest)
    zero = is_rank_zero()
    if finished:
        log.info("%s: finished run with this configuration, skipped (resume=false trains it again)", out)
        if zero:
            if info.get("equivalence_key") != key:  # runs from before the key existed
                write_run_info(out, {**info, "equivalence_key": key})
            register(key, out)
        return json.loads((out / "metrics.json").read_text())
    reuse = cfg.get("reuse_equivalent", False) and cfg.get("resume", True)  # resume=false: train it again
    source = find_equivalent(key, out) if reuse else None
    if source is not None:
        if not zero:
            return None
        metrics = adopt(source, out, {"config_hash": digest, "equivalence_key": key,
                                      "experiment": cfg.get("experiment_name"), "seed": int(cfg.seed),
                                      "device": device_description(),
                                      "wall_s": round(float(info.get("wall_s", 0.0)) + time.time() - start, 1),
                                      "stages": [s.describe() for s in stages], "resumed": bool(info)})
        register(key, out)
        return metrics
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data, seed=cfg.seed)
    val_set, test_sets = eval_sets(cfg)
    world = trainer_world_size(cfg.trainer)  # data-parallel processes: optimizer steps per epoch per rank
    check_launch(world)
    steps = [datamodule.steps_per_epoch(s.regime, world) * s.epochs if s.epochs else 0 for s in stages]  # data errors here
    spans = schedule_spans(stages, steps)
    model = instantiate(cfg.model, **start_weights(cfg))  # checkpoint and tokenizer errors, before anything is written
    index = None
    if any(s.epochs > 0 for s in stages):  # query-side: freeze E_d, encode the corpus once (the embedding cache)
        index = frozen_passage_index(cfg.get("passages"), model, datamodule.corpus, cache_dir())
        datamodule.tokenize_passages = index is None
    out.mkdir(parents=True, exist_ok=True)
    info = {"status": "running", "config_hash": digest, "equivalence_key": key, "experiment": cfg.get("experiment_name"),
            "seed": int(cfg.seed), "device": device_description(), "wall_s": float(info.get("wall_s", 0.0)),
            "stages": [s.describe() for s in stages], "resumed": bool(info)}
    if zero:
        write_run_info(out, info)

    refs = {}
    if cfg.eval.references and zero:
        ref_file = out / "references.json"
        refs = json.loads(ref_file.read_text()) if ref_file.is_file() else references(
            cfg, ([val_set] if val_set else []) + test_sets, out=out / "references")  # per-query values for tests
        atomic.write_json(ref_file, refs)

    opt_state, records = None, []
    for i, stage in enumerate(stages):
        if stage.epochs <= 0:
            continue
        opt_state, record = run_stage(cfg, out, i, stage, len(stages), model, datamodule, val_set, spans[i], opt_state,
                                      index)
        records.append(record)
        log.info("stage %d: %d training queries, %d positive labels", i + 1, record.get("training_queries", 0),
                 record.get("positive_labels", 0))
    if not zero:
        return None
    wise = cfg.get("wise_ft") or {}  # WiSE-FT toward the starting checkpoint; alpha 1 (default) changes nothing
    interpolate_toward_start(model, wise.get("start") or cfg.model.name_or_path, wise.get("alpha", 1.0))
    model.save_pretrained(out / "model")

    results = evaluate_sets(model, ([val_set] if val_set else []) + test_sets, cfg, out, cache_dir())
    resumed_from = [r["resumed_from"] for r in records if r.get("resumed_from")]
    info.update(status="complete", stage_records=records, wall_s=round(info["wall_s"] + time.time() - start, 1),
                resumed=bool(resumed_from), resumed_from=resumed_from)
    text = write_results(out, results, refs, extra_lines=[f"wall time {info['wall_s']:.0f} s on {info['device']}"])
    write_run_info(out, info)
    register(key, out)
    log_final_metrics(results)  # W&B: test/<set>/<metric>, then the run is closed
    print("\n" + text + "\n")
    print(f"run directory: {out}")
    return results


def optimized_value(results: dict, key: str | None) -> float | None:
    """``results[set][metric]`` for ``key = "<set>/<metric>"`` (the value a sweeper maximises), or None."""
    if not key or results is None:  # results None: a data-parallel rank other than 0
        return None
    name, _, metric = str(key).rpartition("/")
    if name not in results or metric not in results[name]:
        raise ValueError(f"optimized_metric={key!r}: no such result; have {sorted(results)}")
    return float(results[name][metric])
