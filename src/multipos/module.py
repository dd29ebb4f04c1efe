"""LightningModule: dual encoder + contrastive objective, optimizer and schedule from config (``conf/module``)."""

from __future__ import annotations

import warnings
from functools import partial
from typing import Callable

import lightning as L
import torch

from multipos.data import Batch
from multipos.losses import ContrastiveLoss
from multipos.model import DualEncoder


def linear_warmup_decay(optimizer: torch.optim.Optimizer, num_warmup_steps: int, num_training_steps: int):
    """Linear warm-up to the peak learning rate, then linear decay to 0 (BERT / DPR schedule).

    Multiplier at step t: (t + 1) / (warmup + 1) during warm-up, then (total − t) / (total − warmup).
    Returns a ``LambdaLR`` stepped once per optimizer step.
    """
    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return (step + 1) / (num_warmup_steps + 1)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class RetrieverModule(L.LightningModule):
    """Trains a :class:`DualEncoder` with a :class:`ContrastiveLoss` for one training stage.

    Args:
        model: the dual encoder; loss: the stage's objective.
        optimizer: ``_partial_`` optimizer factory called with parameter groups (``conf/module``:
            ``torch.optim.AdamW`` with lr and weight decay); biases and LayerNorm weights get no decay.
        scheduler: ``_partial_`` factory ``(optimizer, num_warmup_steps, num_training_steps) -> LRScheduler``
            stepped every optimizer step, or None for a constant learning rate.
        warmup_ratio: share of the schedule's steps used for warm-up.
        lr: peak learning rate of this stage (None = the optimizer config's).
        schedule_offset, schedule_total: where this stage starts in its schedule and the schedule's length in
            optimizer steps (:func:`multipos.stages.schedule_spans`); ``schedule_total=None`` = this fit's steps.
        optimizer_state: optimizer ``state_dict`` carried over from the previous stage (``optimizer: carry``).
    """

    def __init__(self, model: DualEncoder, loss: ContrastiveLoss, optimizer: Callable | None = None,
                 scheduler: Callable | None = None, warmup_ratio: float = 0.1, lr: float | None = None,
                 schedule_offset: int = 0, schedule_total: int | None = None, optimizer_state: dict | None = None):
        super().__init__()
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"module.warmup_ratio must be in [0, 1), got {warmup_ratio}")
        self.model, self.loss = model, loss
        self.optimizer_factory = optimizer or partial(torch.optim.AdamW, lr=2e-5, weight_decay=0.01)
        self.scheduler_factory = scheduler
        self.warmup_ratio, self.lr = warmup_ratio, lr
        self.schedule_offset, self.schedule_total = schedule_offset, schedule_total
        self.optimizer_state = optimizer_state

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score matrix [B, B·G] of a batch (already divided by τ)."""
        q = self.model.encode_queries(batch.query)
        p = self.model.encode_passages(batch.passages)
        return self.model.score(q, p)

    def training_step(self, batch: Batch, batch_idx: int) -> dict:
        """One optimisation step's loss → ``{"loss", "scores", "positive_mask", "negative_mask"}``.

        ``scores`` [B, N] (already / τ, detached) and the bool masks [B, N] are returned for callbacks that read
        ``outputs`` in ``on_train_batch_end`` (e.g. gradient diagnostics); ``loss`` is the scalar batch loss.
        """
        scores = self(batch)
        loss = self.loss(scores, batch.positive_mask, batch.negative_mask)
        self.log("train/loss", loss, prog_bar=True, batch_size=scores.shape[0])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], prog_bar=False, batch_size=scores.shape[0])
        return {"loss": loss, "scores": scores.detach(), "positive_mask": batch.positive_mask,
                "negative_mask": batch.negative_mask}

    def parameter_groups(self) -> list[dict]:
        """AdamW parameter groups: weights with decay, biases and LayerNorm weights (ndim < 2) without."""
        decay, no_decay = [], []
        for _, param in self.model.named_parameters():
            if param.requires_grad:
                (no_decay if param.ndim < 2 else decay).append(param)
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.lr is not None:
            for g in groups:
                g["lr"] = self.lr
        return groups

    def configure_optimizers(self):
        opt = self.optimizer_factory(self.parameter_groups())
        if self.optimizer_state is not None:
            lrs = [g["lr"] for g in opt.param_groups]
            opt.load_state_dict(self.optimizer_state)
            for g, lr in zip(opt.param_groups, lrs):  # the stage's peak lr, not the previous stage's last one
                g["lr"] = g["initial_lr"] = lr
        if self.scheduler_factory is None:
            return opt
        # a known schedule length avoids estimated_stepping_batches, which builds the train dataloader before a
        # checkpoint's dataloader state is restored (a mid-epoch resume would then replay the epoch's start)
        total = int(self.schedule_total) if self.schedule_total else max(1, int(self.trainer.estimated_stepping_batches))
        sched = self.scheduler_factory(opt, num_warmup_steps=int(self.warmup_ratio * total), num_training_steps=total)
        if self.schedule_offset:
            with warnings.catch_warnings():  # fast-forward a continued schedule: no optimizer step is meant
                warnings.simplefilter("ignore")
                for _ in range(int(self.schedule_offset)):
                    sched.step()
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
