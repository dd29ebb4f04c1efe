"""LightningModule: dual encoder + contrastive objective + AdamW with linear warm-up/decay."""

from __future__ import annotations

import lightning as L
import torch

from multipos.losses import ContrastiveLoss
from multipos.data import Batch
from multipos.model import DualEncoder


class RetrieverModule(L.LightningModule):
    """Trains a :class:`DualEncoder` with a :class:`ContrastiveLoss`.

    Args:
        model: the dual encoder; loss: the objective.
        lr: peak AdamW learning rate; weight_decay: AdamW decay (not on biases/LayerNorm);
        warmup_ratio: share of steps with linear warm-up, then linear decay to 0.
    """

    def __init__(self, model: DualEncoder, loss: ContrastiveLoss, lr: float = 2e-5, weight_decay: float = 0.01,
                 warmup_ratio: float = 0.1):
        super().__init__()
        self.model, self.loss = model, loss
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score matrix [B, B·G] of a batch (already divided by τ)."""
        q = self.model.encode_queries(batch.query)
        p = self.model.encode_passages(batch.passages)
        return self.model.score(q, p)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        scores = self(batch)
        loss = self.loss(scores, batch.positive_mask, batch.negative_mask)
        self.log("train/loss", loss, prog_bar=True, batch_size=scores.shape[0])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], prog_bar=False, batch_size=scores.shape[0])
        return loss

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.ndim < 2 else decay).append(param)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.lr)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(self.warmup_ratio * total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
