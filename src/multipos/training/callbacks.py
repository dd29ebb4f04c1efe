"""Every Lightning callback of multipos: retrieval validation (dev nDCG@10 each epoch, used to select the checkpoint),
the checkpoint that resuming starts from and the RNG states saved with it, the ANCE-style hard-negative refresh
(:class:`NegativeRefresh`, driving :func:`multipos.mining.dense_negatives.mine_dense_negatives`) and the Sec. 3.3
gradient
diagnostics (:class:`GradientDiagnostics`, logging :func:`multipos.training.diagnostics.batch_diagnostics`), and the
terminal
progress bar (:class:`LoggedProgressBar`)."""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Mapping, Sequence

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

from multipos.evaluation.sets import EvalSet
from multipos.losses import SINGLE_POSITIVE, check_name
from multipos.mining.dense_negatives import mine_dense_negatives, pools_from_rows, pools_to_rows
from multipos.retrieval.dense import dense_run
from multipos.training.diagnostics import DEFAULT_OBJECTIVES, OUTPUT_KEYS, batch_diagnostics

log = logging.getLogger(__name__)


class RetrievalValidation(L.Callback):
    """At the end of every ``every_n_epochs``-th training epoch, retrieve on ``eval_set`` with the current
    weights and log ``val/<metric>`` (e.g. ``val/ndcg@10``) for ModelCheckpoint to monitor.

    Args: eval_set: the dev set; metric: the metric logged (monitored), one of the set's metrics;
    every_n_epochs: validation frequency; cache: embedding cache folder (None = no caching);
    retrieval: keyword arguments of :func:`multipos.retrieval.dense.dense_run` (k, batch_size, bf16,
    passage_max_length, index, index_options).

    Under data-parallel training (``trainer=ddp``) global rank 0 alone retrieves; the value is broadcast so every
    rank's ModelCheckpoint sees the same ``val/<metric>``. On a large dev corpus mind the process group's timeout
    (``trainer.strategy.timeout``): the other ranks wait in the broadcast while rank 0 encodes.

    Raises ValueError when ``metric`` is not one of ``eval_set.metrics``.
    """

    def __init__(self, eval_set: EvalSet, metric: str = "ndcg@10", every_n_epochs: int = 1, cache=None, **retrieval):
        self.eval_set, self.metric, self.every_n_epochs = eval_set, metric, every_n_epochs
        self.cache = cache  # embedding cache dir: the final test on the same corpus reuses the best epoch's
        self.retrieval = {"k": 100, **retrieval}
        self._data = None
        metrics = getattr(eval_set, "metrics", None)
        if metrics is not None and metric not in metrics:  # fail now, not in rank 0 alone mid-training
            raise ValueError(f"validation metric {metric!r} (callbacks.retrieval_validation.metric) is not among "
                             f"{eval_set.name}'s metrics {list(metrics)}")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        value = self.retrieve(pl_module) if trainer.is_global_zero else None
        value = trainer.strategy.broadcast(value, src=0)
        log.info("epoch %d: %s %s = %.4f", trainer.current_epoch, self.eval_set.name, self.metric, value)
        # identical on every rank: sync_dist's mean changes nothing and keeps Lightning's epoch-level logging exact
        pl_module.log(f"val/{self.metric}", float(value), prog_bar=True, on_epoch=True,
                      sync_dist=trainer.world_size > 1)

    def retrieve(self, pl_module: L.LightningModule) -> float:
        """Dev retrieval with the current weights (encoded where the model trains) → the monitored metric's value."""
        if self._data is None:
            self._data = self.eval_set.load()
        run = self.eval_set.clean(dense_run(pl_module.model, self._data, cache=self.cache, progress=False,
                                            device=None, **self.retrieval))
        means, _ = self.eval_set.score(run, self._data)[self.eval_set.name]
        if self.metric not in means:
            raise ValueError(f"validation metric {self.metric!r} is not among "
                             f"{self.eval_set.name}'s metrics {list(means)}")
        return float(means[self.metric])


class StepCheckpoint(ModelCheckpoint):
    """Lightning ``ModelCheckpoint`` (``conf/callbacks``: ``model_checkpoint``) whose every-N-steps save skips an
    epoch's last batch.

    A step checkpoint written at an epoch's last batch comes before that epoch's dev retrieval and before the
    best-dev checkpoint records it, and Lightning then skips the epoch-end save of the same step; a run resumed
    from it would not know that epoch's dev score and could keep a worse checkpoint. Skipping that one step save
    leaves the epoch-end save (after validation, with the best-dev state) as the resume point.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if batch_idx + 1 >= trainer.num_training_batches:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class LoggedProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar, showing ``shown`` (default ``train/loss``) read from the trainer's logged
    metrics each time it refreshes (every ``refresh_rate`` steps and at an epoch's last step).

    Why not ``self.log(..., prog_bar=True)``: Lightning converts every progress-bar metric to a Python number at
    every training step, whether a bar shows it or not (Lightning-AI/pytorch-lightning issue 21232). On a GPU each
    conversion makes the host wait until the device has finished the step, so the host stops preparing the next
    step while the device runs this one. The module logs ``train/loss`` without ``prog_bar`` and this bar reads it
    back only when it refreshes (:func:`multipos.training.fit.progress_bar`: every ``trainer.log_every_n_steps`` steps,
    when
    the logger reads it anyway). The module logs only on the steps the loggers write and on an epoch's last
    (:meth:`multipos.training.module.RetrieverModule._logs_this_step`), so the bar shows the latest such step's loss:
    this
    step's, unless an epoch whose length is not a multiple of the interval has shifted the bar's refreshes (counted
    within the epoch) against the logging steps (counted over the run), by fewer than ``refresh_rate`` steps.

    Args: refresh_rate: steps between refreshes (≥ 1); shown: logged metric names to show, those not logged yet are
    left out.
    """

    def __init__(self, refresh_rate: int = 1, shown: Sequence[str] = ("train/loss",)):
        super().__init__(refresh_rate=refresh_rate)
        self.shown = tuple(shown)

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        logged = trainer.callback_metrics
        for name in self.shown:
            if name in logged and name not in metrics:
                value = logged[name]
                metrics[name] = value.item() if isinstance(value, torch.Tensor) else value
        return metrics


class RNGStateCheckpoint(L.Callback):
    """Saves and restores the Python, NumPy and torch RNG states in checkpoints (dropout after a resume).

    The torch states are the CPU generator's and, where CUDA is initialised, the current CUDA device's generator
    (dropout on a GPU draws from it): without it a run resumed mid-epoch on an H100 (2026-11-25) trained with other
    dropout masks than the uninterrupted run and ended with other weights. Under DDP every rank is seeded alike, so
    rank 0's state (the one the checkpoint holds) is every rank's. A checkpoint written without a CUDA state (on the
    CPU, or before this was saved) leaves the CUDA generator as seeded. Stored as tensors and plain numbers so the
    checkpoint still loads with ``weights_only=True``.
    """

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        kind, key, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["multipos_rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                                      "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss]}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint["multipos_rng"]["cuda"] = torch.cuda.get_rng_state()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        state = checkpoint.get("multipos_rng")
        if state:
            torch.set_rng_state(state["torch"])
            if state.get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state(state["cuda"])
            version, internal, gauss = state["python"]
            random.setstate((version, tuple(internal), gauss))
            kind, key, pos, has_gauss, gauss = state["numpy"]
            np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))


class NegativeRefresh(L.Callback):
    """ANCE-style refresh of the hard-negative pools with the weights being trained (Xiong et al., 2021).

    Every ``K = data.source.negative_refresh_epochs`` epochs (read from the data module's source; None = idle) it
    re-mines at the end of epoch e with (e + 1) % K == 0, unless e is the stage's last epoch, via
    :func:`mine_dense_negatives` with the current model over the source's corpus and all its queries, depth
    ``data.source.negative_depth``, and hands the pools to
    :meth:`multipos.data.datamodule.MultiPosDataModule.set_negatives`:
    epochs K..2K−1 build their groups from the pools mined after epoch K−1, and so on; epochs 0..K−1 from the
    source's (``data.source.negatives``: BM25 or the starting checkpoint). Groups stay a function of
    (seed, epoch, query) given the pools. Each training stage starts again from the source's pools.

    Args: batch_size, bf16 (None = where native), index, index_options, progress: as in :func:`mine_dense_negatives`
    (encoding on the device the model trains on); cache: keep each refresh's pools in the cache too.

    Checkpoints hold the pools in use (:meth:`state_dict`: query ids, int32 corpus rows [Q, depth], corpus digest,
    epoch and weight fingerprint): Q·depth·4 bytes, 1 MB for NFCorpus's 2.6k queries at depth 100, 200 MB for 0.5M
    MS MARCO queries, besides the query ids. With DataLoader
    workers the loader is rebuilt every epoch (``trainer.reload_dataloaders_every_n_epochs = 1``), as persistent
    workers would keep the old pools. Under data-parallel training every rank mines the same pools.

    Raises ValueError on resume when the checkpoint's pools were mined over another corpus.
    """

    def __init__(self, batch_size: int = 64, bf16: bool | None = None, index: str = "flat",
                 index_options: dict | None = None, cache: bool = True, progress: bool = True):
        self.options = dict(batch_size=batch_size, bf16=bf16, index=index, index_options=dict(index_options or {}),
                            cache=cache, progress=progress)
        self.every: int | None = None
        self.state: dict = {}
        self._restored: dict | None = None
        self._digest: str | None = None

    def _corpus_digest(self, datamodule) -> str:
        from multipos.retrieval.encoding import corpus_digest

        if self._digest is None:
            self._digest = corpus_digest(datamodule.corpus.ids, datamodule.corpus.texts())
        return self._digest

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = trainer.datamodule
        self.every = getattr(getattr(datamodule, "source", None), "negative_refresh_epochs", None)
        if self.every and getattr(datamodule, "num_workers", 0) > 0 and not trainer.reload_dataloaders_every_n_epochs:
            log.info("negative refresh with %d DataLoader workers: the loader is rebuilt every epoch",
                     datamodule.num_workers)
            trainer.reload_dataloaders_every_n_epochs = 1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state, self._restored = self._restored, None
        if not state:
            return
        datamodule = trainer.datamodule
        if state["corpus"] != self._corpus_digest(datamodule):
            raise ValueError(f"the checkpoint's refreshed negatives (mined after epoch {state['epoch']}) were mined "
                             "over another corpus than data.source's: resume=false to train again")
        self.state = state
        datamodule.set_negatives(pools_from_rows(state["query_ids"], state["rows"].numpy(), datamodule.corpus.ids))
        log.info("restored the hard-negative pools mined after epoch %d (weights %s)", state["epoch"], state["weights"])

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        if not self.every or (epoch + 1) % self.every or epoch + 1 >= trainer.max_epochs:
            return
        datamodule, model = trainer.datamodule, pl_module.model
        queries = {q.query_id: q.query for q in datamodule.queries}
        judged = {q.query_id: q.judged for q in datamodule.queries}
        log.info("epoch %d: refreshing hard negatives with the current weights (every %d epochs)", epoch, self.every)
        rule = getattr(datamodule.source, "negative_filter", None)  # positive-aware, by the weights being trained
        positives = {q.query_id: [*q.gold, *q.silver] for q in datamodule.queries} if rule else None
        counts: dict = {}
        pools = mine_dense_negatives(model, datamodule.corpus, queries, judged, int(datamodule.source.negative_depth),
                                     device=None, negative_filter=rule, positives=positives, filter_counts=counts,
                                     **self.options)
        if rule:
            datamodule.stats.setdefault("negative_filter_refresh", []).append({"epoch": epoch, **counts})
        datamodule.set_negatives(pools)
        qids = list(queries)
        self.state = {"query_ids": qids, "rows": torch.from_numpy(pools_to_rows(pools, qids, datamodule.corpus.ids)),
                      "corpus": self._corpus_digest(datamodule), "epoch": epoch,
                      "weights": model.fingerprint(include_query=True)}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state_dict: dict) -> None:
        self._restored = dict(state_dict) if state_dict else None


def check_refresh_callback(trainer: L.Trainer, source) -> None:
    """Raise ValueError when ``data.source.negative_refresh_epochs`` is set but ``trainer`` has no
    :class:`NegativeRefresh` (``callbacks.negative_refresh``, in ``conf/callbacks/default.yaml``; ``callbacks=none``
    drops it), rather than training on never-refreshed pools."""
    every = getattr(source, "negative_refresh_epochs", None)
    if every and not any(isinstance(cb, NegativeRefresh) for cb in trainer.callbacks):
        raise ValueError(f"data.source.negative_refresh_epochs={every} needs the callbacks.negative_refresh callback "
                         "(multipos.training.callbacks.NegativeRefresh, conf/callbacks/default.yaml); this run's "
                         "callbacks config has none")


class GradientDiagnostics(L.Callback):
    """Logs :func:`batch_diagnostics` of the training batch every ``every_n_steps`` optimizer steps (``diag/…``).

    Reads ``outputs`` of ``training_step`` (a dict with ``scores`` [B, N], ``positive_mask``, ``negative_mask``, as
    :class:`multipos.training.module.RetrieverModule` returns); other outputs (e.g. a bare loss tensor) are skipped
    with one
    warning. Values go through ``pl_module.log`` (CSV and W&B loggers). Lightning writes step logs every
    ``trainer.log_every_n_steps`` steps, so the interval is raised to the least common multiple of both (warning).

    Args: every_n_steps: interval in optimizer steps (≥ 1); objectives: objectives analysed besides the trained one
    (``pl_module.loss.name``), default JointLH, SumMargLH, LSEPair; prefix: key prefix.
    Raises: ValueError for every_n_steps < 1, unknown objective names, or single-positive objectives (``singlelh``,
    ``rand1lh``: their gradient on a multi-positive batch is undefined; when trained, they are analysed anyway).
    """

    def __init__(self, every_n_steps: int = 50, objectives: Sequence[str] | None = DEFAULT_OBJECTIVES,
                 prefix: str = "diag"):
        if int(every_n_steps) < 1:
            raise ValueError(f"callbacks.gradient_diagnostics.every_n_steps must be ≥ 1, got {every_n_steps}")
        objectives = [check_name(str(o)) for o in (objectives or ())]
        single = [o for o in objectives if o in SINGLE_POSITIVE]
        if single:
            raise ValueError(f"callbacks.gradient_diagnostics.objectives: {single} train on one positive per query; "
                             "list multi-positive objectives (the trained objective is always analysed)")
        self.every_n_steps, self.objectives, self.prefix = int(every_n_steps), objectives, prefix
        self._interval, self._last_step, self._warned = self.every_n_steps, -1, False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        every_log = int(trainer.log_every_n_steps or 0)
        self._interval = math.lcm(self.every_n_steps, every_log) if every_log else 0
        if every_log and self._interval != self.every_n_steps:
            warnings.warn(f"callbacks.gradient_diagnostics.every_n_steps={self.every_n_steps} is not a multiple of "
                          f"trainer.log_every_n_steps={every_log}: diagnostics every {self._interval} steps",
                          stacklevel=2)

    def objectives_for(self, pl_module: L.LightningModule) -> list[str]:
        """The trained objective (``pl_module.loss.name``, if any) followed by :attr:`objectives`, without repeats."""
        trained = getattr(getattr(pl_module, "loss", None), "name", None)
        return list(dict.fromkeys([*([trained] if trained else []), *self.objectives]))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if not self._interval or step == self._last_step or step % self._interval:
            return
        if not isinstance(outputs, Mapping) or any(k not in outputs for k in OUTPUT_KEYS):
            if not self._warned:
                warnings.warn(f"GradientDiagnostics: training_step returned {type(outputs).__name__}, not a dict with "
                              f"{', '.join(OUTPUT_KEYS)}: no gradient diagnostics are logged", stacklevel=2)
                self._warned = True
            return
        self._last_step = step
        scores = outputs["scores"]
        normalize = bool(getattr(getattr(pl_module, "loss", None), "normalize_by_positives", False))
        values = batch_diagnostics(scores, outputs["positive_mask"], outputs["negative_mask"],
                                   self.objectives_for(pl_module), normalize, self.prefix)
        for key, value in values.items():
            pl_module.log(key, value, on_step=True, on_epoch=False, batch_size=scores.shape[0])
