"""Lightning callbacks: retrieval validation (dev nDCG@10 each epoch, used to select the checkpoint)."""

from __future__ import annotations

import logging

import lightning as L

from multipos.evaluation import EvalSet, dense_run, evaluate_run

log = logging.getLogger(__name__)


class RetrievalValidation(L.Callback):
    """At the end of every ``every_n_epochs``-th training epoch, retrieve on ``eval_set`` with the current
    weights and log ``val/<metric>`` (e.g. ``val/ndcg@10``) for ModelCheckpoint to monitor.

    Args: eval_set: the dev set; metric: the metric logged first (monitored); batch_size, bf16,
    passage_max_length: encoding settings; every_n_epochs: validation frequency;
    k: retrieval depth; cache: embedding cache folder (None = no caching).
    """

    def __init__(self, eval_set: EvalSet, metric: str = "ndcg@10", batch_size: int = 64, bf16: bool = True,
                 passage_max_length: int | None = None, every_n_epochs: int = 1, k: int = 100, cache=None):
        self.eval_set, self.metric, self.batch_size, self.bf16 = eval_set, metric, batch_size, bf16
        self.passage_max_length, self.every_n_epochs, self.k = passage_max_length, every_n_epochs, k
        self.cache = cache  # embedding cache dir: the final test on the same corpus reuses the best epoch's
        self._data = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        if self._data is None:
            self._data = self.eval_set.load()
        run = dense_run(pl_module.model, self._data, k=self.k, batch_size=self.batch_size, bf16=self.bf16,
                        passage_max_length=self.passage_max_length, cache=self.cache, progress=False)
        metrics = evaluate_run(self._data.qrels, run, [self.metric], self.eval_set.relevance_threshold)
        value = metrics[self.metric]
        log.info("epoch %d: %s %s = %.4f", trainer.current_epoch, self.eval_set.name, self.metric, value)
        pl_module.log(f"val/{self.metric}", value, prog_bar=True, on_epoch=True)
