"""The main job: train a dual encoder through its stages (:mod:`multipos.training.stages`), then evaluate it.

``python train.py [overrides]`` (the main job, ``conf/experiment/default.yaml``) or ``python train.py -m
experiment=<study>`` (Hydra entry point at the repository root) calls :func:`train`. Outputs in the run
directory (files listed in :mod:`multipos.evaluation.runner`), plus:

* ``model/`` — the kept weights in HF and sentence-transformers format;
* ``checkpoints/stage<i>/`` — Lightning checkpoints per stage (the newest state ``resume-epoch=E-step=S.ckpt``
  at each epoch end and every ``callbacks.model_checkpoint.every_n_train_steps`` steps, ``last.ckpt`` a link to
  it; the best dev one) and ``kept.json`` once the stage is finished;
* ``run_info.json`` — status (``running`` | ``prepared`` (``prepare_only``, below) | ``complete``), run key and
  equivalence key, stages, training queries and positive labels per stage, wall time (summed over resumes), device,
  ``resumed`` and ``resumed_from`` (the checkpoints an interrupted stage continued from, the ``kept.json`` of stages
  finished before; per stage also in ``stage_records``);
* ``csv/`` — Lightning logs (one version per stage in multi-stage runs).

``init_from=<model folder>`` starts from trained weights instead of ``model.name_or_path`` (the zero-shot row
keeps the latter). A run that trains nothing is ``evaluate.py``'s job (:mod:`multipos.evaluate`).

``prepare_only=true`` stops the run after everything training reads from the caches and before its first stage:
the training data (BM25 negatives, teacher ordering), the frozen passage index, and the reference rows (their
passages encoded), all through :func:`multipos.assets.cache_dir`; ``run_info.json`` says ``prepared``. Running the
same command without it continues the run. ``make train`` prepares the first seed on every core, then trains
all seeds side by side, one core's share each (``parallel_jobs=2``), none of them encoding a corpus.

Re-running the identical command into the same run directory (``hydra.run.dir``, or a study's fixed sweep folder)
resumes: a finished run is skipped, finished stages are not re-trained, and an interrupted stage continues from its
newest checkpoint (:func:`multipos.training.fit.newest_checkpoint`) — optimizer, schedule, RNG and data order included.
With
``reuse_equivalent=true`` (set by every study) a run whose model and evaluation a finished run elsewhere already
computed copies that run's results instead of training (:mod:`multipos.runs.reuse`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from multipos import atomic
from multipos.assets import cache_dir
from multipos.data.datamodule import StageInputs
from multipos.evaluation.runner import Evaluation
from multipos.hardware import return_freed_memory, set_torch_threads
from multipos.model.interpolation import interpolate_toward_start
from multipos.model.packing import check_pack_sequences
from multipos.runs.folder import RunFolder, model_folder, write_run_info
from multipos.runs.lifecycle import close_run, open_run, write_spec
from multipos.runs.spec import RunSpec, run_spec
from multipos.training.distributed import check_launch, device_description, is_rank_zero, trainer_world_size
from multipos.training.fit import FitPlan, StageRun, TrainingParts, run_stage
from multipos.training.loggers import log_final_metrics
from multipos.training.passage_index import check_settings as check_passages
from multipos.training.passage_index import for_training as frozen_passage_index
from multipos.training.stages import Stage, plan, schedule_spans

log = logging.getLogger(__name__)

@dataclass
class TrainingJob:
    """The training job as typed pieces, built by :meth:`setup`, the only reader of the composed config; :meth:`run`
    trains and evaluates.

    ``spec``: what the run computes (:class:`multipos.runs.spec.RunSpec`); ``folder``: the run folder and how it is
    treated; ``stages``: the stage plan; ``fit``: how each stage is trained (:class:`multipos.training.fit.FitPlan`);
    ``data`` / ``model``: the config nodes of the data module and the encoder, instantiated as they are (the model
    with ``start_weights``); ``evaluation``: the evaluation sets and their search; ``passages``: the passage side
    (the ``passages`` node: query-side fine-tuning's frozen index, or two-tower); ``seed``; ``wise_ft``:
    (alpha, start) of WiSE-FT after training; ``threads``, ``return_freed_memory``, ``pack_sequences``: speed and
    memory settings; ``prepare_only``: stop once the caches hold what training reads.
    """

    spec: RunSpec
    folder: RunFolder
    stages: list[Stage]
    fit: FitPlan
    data: DictConfig
    model: DictConfig
    start_weights: dict
    evaluation: Evaluation
    passages: DictConfig | None
    seed: int
    wise_ft: tuple[float, str]
    threads: int | None = None
    return_freed_memory: bool = False
    pack_sequences: int = 0
    prepare_only: bool = False

    @classmethod
    def setup(cls, cfg: DictConfig) -> TrainingJob:
        """Read the composed config once into typed pieces. Configuration errors surface here, before anything is
        written: ValueError for an invalid stage plan, passage side or speed setting, FileNotFoundError for a
        missing ``init_from`` folder, what instantiating an evaluation set raises."""
        if cfg.get("job", "train") != "train":
            raise ValueError(f"experiment={cfg.get('experiment_name')} trains nothing (job: {cfg.job}): run it with "
                             f"`python evaluate.py -m experiment={cfg.get('experiment_name')}`")
        if "regime" in (cfg.get("data") or {}):
            raise ValueError(f"data.regime={cfg.data.regime}: the regime is the stage plan's, set with regime=<name> "
                             "(homogeneous | heterogeneous | gold | all | curriculum; conf/regime)")
        init_from = model_folder(cfg.get("init_from"))  # a missing folder fails before anything is written
        stages = plan(cfg.stages)
        from multipos.data.sources import check_regime_keeps_positives

        check_regime_keeps_positives(cfg.data.source, cfg.stages, where=f"data={cfg.data.get('name')}")
        passages = cfg.get("passages")
        check_passages(passages)
        out = Path(cfg.paths.output_dir)
        logger = cfg.get("logger")
        record = {}  # what a W&B run records: the resolved config (other loggers record nothing)
        if logger and "wandb" in str(logger.get("_target_", "")).lower():
            record = OmegaConf.to_container(cfg, resolve=True)
            record.pop("hydra", None)
        frozen = bool(passages and passages.get("frozen"))
        wise = cfg.get("wise_ft") or {}
        return cls(
            spec=run_spec(cfg),
            folder=RunFolder(out=out, writer=is_rank_zero(), resume=bool(cfg.get("resume", True)),
                             reuse_equivalent=bool(cfg.get("reuse_equivalent", False)),
                             keep_checkpoints=bool(cfg.keep_checkpoints),
                             experiment=cfg.get("experiment_name")),
            stages=stages,
            fit=FitPlan(out=out, trainer=cfg.trainer, callbacks=cfg.get("callbacks"), logger=logger,
                        loss=cfg.loss, module=cfg.module, config_record=record,
                        passages={"candidates": passages.candidates, "chunk_size": passages.get("chunk_size") or "auto"}
                        if frozen else {}),
            data=cfg.data, model=cfg.model, start_weights={"name_or_path": init_from} if init_from else {},
            evaluation=Evaluation.from_node(cfg.eval, cfg.get("run_name")),  # the sets' errors, before any write
            passages=passages, seed=int(cfg.seed),
            wise_ft=(float(wise.get("alpha", 1.0)), wise.get("start") or cfg.model.name_or_path),
            threads=cfg.get("threads"), return_freed_memory=bool(cfg.get("return_freed_memory", False)),
            pack_sequences=check_pack_sequences(cfg.get("pack_sequences")),  # a speed setting, like threads
            prepare_only=bool(cfg.get("prepare_only")),
        )

    def run(self) -> dict | None:
        """Train the stages, then evaluate; see :func:`train`."""
        out, zero, start = self.folder.out, self.folder.writer, time.time()
        threads = set_torch_threads(self.threads)
        return_freed_memory(self.return_freed_memory)  # a memory setting (threads: a speed one)
        precision = {"training": str(self.fit.trainer.get("precision")),
                     "encoding": "bf16" if self.evaluation.retrieval.get("bf16") else "fp32"}
        run = open_run(self.spec, self.folder, self.stages, device=device_description() + threads, started=start,
                       precision=precision)
        if run.done:  # finished here before, or copied from an equivalent run
            return run.metrics
        L.seed_everything(self.seed, workers=True)
        stages = self.stages
        # checkpoint and tokenizer errors, before anything is written
        model = instantiate(self.model, **self.start_weights, pack_sequences=self.pack_sequences)
        frozen = bool(self.passages and self.passages.get("frozen"))  # query-side: the frozen index
        datamodule = instantiate(self.data, seed=self.seed, tokenize_passages=not frozen)
        datamodule.set_inputs(StageInputs.of_encoder(model))  # its tokenizer and prompts: training sees eval's inputs
        world = trainer_world_size(self.fit.trainer)  # data-parallel processes: optimizer steps per epoch per rank
        check_launch(world)
        # data errors here
        steps = [datamodule.steps_per_epoch(s.regime, world) * s.epochs if s.epochs else 0 for s in stages]
        for name, content in datamodule.run_files().items():  # label_noise.json: which positives were replaced
            if zero:
                atomic.write_json(out / name, content)
        spans = schedule_spans(stages, steps)
        # query-side: freeze E_d, encode the corpus once (the embedding cache)
        index = frozen_passage_index(self.passages, model, datamodule.corpus, cache_dir())
        out.mkdir(parents=True, exist_ok=True)
        info = run.info
        if zero:
            write_spec(out, run.spec)
            write_run_info(out, info)

        evaluation = self.evaluation
        refs = {}
        if evaluation.references and zero:
            refs = evaluation.run_folder_references(out, lambda: instantiate(self.model))
        if self.prepare_only:
            info.update(status="prepared", wall_s=round(info["wall_s"] + time.time() - start, 1))
            if zero:
                write_run_info(out, info)
            log.info("prepared in %.0f s (prepare_only=true): the caches hold what training and evaluation read; "
                     "the same command without prepare_only trains", time.time() - start)
            return None

        parts = TrainingParts(model=model, datamodule=datamodule, evaluation=evaluation, index=index,
                              n_stages=len(stages))
        opt_state, records = None, []
        for i, stage in enumerate(stages):
            if stage.epochs <= 0:
                continue
            opt_state, record = run_stage(self.fit, parts, StageRun(i, stage, spans[i], opt_state))
            records.append(record)
            log.info("stage %d: %d training queries, %d positive labels", i + 1, record.get("training_queries", 0),
                     record.get("positive_labels", 0))
        if not zero:
            return None
        alpha, start_point = self.wise_ft  # WiSE-FT toward the starting checkpoint; alpha 1 changes nothing
        if alpha != 1.0:
            interpolate_toward_start(model, model.starting_point(start_point), alpha)
        model.save_pretrained(out / "model")

        results = evaluation.evaluate(model, out, cache_dir())
        resumed_from = [r["resumed_from"] for r in records if r.get("resumed_from")]
        info.update(stage_records=records, wall_s=round(info["wall_s"] + time.time() - start, 1),
                    resumed=bool(resumed_from), resumed_from=resumed_from)
        text = evaluation.write(out, results, refs,
                                extra_lines=[f"wall time {info['wall_s']:.0f} s on {info['device']}"])
        close_run(out, info, keep_checkpoints=self.folder.keep_checkpoints)
        log_final_metrics(results)  # W&B: test/<set>/<metric>, then the run is closed
        print("\n" + text + "\n")
        print(f"run directory: {out}")
        return results


def train(cfg: DictConfig) -> dict | None:
    """Run the main job described in the module docstring (:meth:`TrainingJob.setup`, then :meth:`TrainingJob.run`);
    returns the metrics dict written to ``metrics.json``.

    Data-parallel training (``trainer=ddp``): every process runs this function (Lightning's launcher starts the
    others at the first ``fit``, re-running the command) and trains; only global rank 0 writes files and runs the
    references and the final evaluation; the other ranks return None after the last stage.

    Raises: ValueError / DataFormatError for invalid configuration or data, before anything is written.
    """
    return TrainingJob.setup(cfg).run()


def optimized_value(results: dict, key: str | None) -> float | None:
    """``results[set][metric]`` for ``key = "<set>/<metric>"`` (the value a sweeper maximises), or None."""
    if not key or results is None:  # results None: a data-parallel rank other than 0
        return None
    name, _, metric = str(key).rpartition("/")
    if name not in results or metric not in results[name]:
        raise ValueError(f"optimized_metric={key!r}: no such result; have {sorted(results)}")
    return float(results[name][metric])
