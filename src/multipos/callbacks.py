"""Lightning callbacks: retrieval validation (dev nDCG@10 each epoch, used to select the checkpoint), the
checkpoint that resuming starts from, and the RNG states saved with it. (The ANCE-style negative refresh lives with
the dense miner it drives, :class:`multipos.data.dense_negatives.NegativeRefresh`, and the gradient diagnostics with their
statistics, :mod:`multipos.diagnostics`.)"""

from __future__ import annotations

import logging
import random

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from multipos.evaluation.sets import EvalSet
from multipos.retrieval.dense import dense_run

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
        pl_module.log(f"val/{self.metric}", float(value), prog_bar=True, on_epoch=True, sync_dist=trainer.world_size > 1)

    def retrieve(self, pl_module: L.LightningModule) -> float:
        """Dev retrieval with the current weights (encoded where the model trains) → the monitored metric's value."""
        if self._data is None:
            self._data = self.eval_set.load()
        run = self.eval_set.clean(dense_run(pl_module.model, self._data, cache=self.cache, progress=False,
                                            device=None, **self.retrieval))
        means, _ = self.eval_set.score(run, self._data)[self.eval_set.name]
        if self.metric not in means:
            raise ValueError(f"validation metric {self.metric!r} is not among {self.eval_set.name}'s metrics {list(means)}")
        return float(means[self.metric])


class StepCheckpoint(ModelCheckpoint):
    """Lightning ``ModelCheckpoint`` (``conf/callbacks``: ``model_checkpoint``) whose every-N-steps save skips an
    epoch's last batch.

    A step checkpoint written at an epoch's last batch comes before that epoch's dev retrieval and before the
    best-dev checkpoint records it, and Lightning then skips the epoch-end save of the same step; a run resumed
    from it would not know that epoch's dev score and could keep a worse checkpoint. Skipping that one step save
    leaves the epoch-end save (after validation, with the best-dev state) as the resume point.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if batch_idx + 1 >= trainer.num_training_batches:
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class RNGStateCheckpoint(L.Callback):
    """Saves and restores the Python, NumPy and torch RNG states in checkpoints (dropout after a resume).

    Stored as tensors and plain numbers so the checkpoint still loads with ``weights_only=True``.
    """

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        kind, key, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["multipos_rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                                      "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss]}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        state = checkpoint.get("multipos_rng")
        if state:
            torch.set_rng_state(state["torch"])
            version, internal, gauss = state["python"]
            random.setstate((version, tuple(internal), gauss))
            kind, key, pos, has_gauss, gauss = state["numpy"]
            np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
