"""LightningModule: dual encoder + contrastive objective, optimizer and schedule from config (``conf/module``)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from functools import partial
from typing import Callable

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType

from multipos.data.collate import Batch
from multipos.data.groups import group_targets
from multipos.losses import HARDEST_NEGATIVE, SOFT_OBJECTIVES, ContrastiveLoss
from multipos.model.encoder import DualEncoder
from multipos.model.transfer import to_device
from multipos.training import distributed
from multipos.training.corpus_candidates import (
    chunk_size_setting,
    corpus_scores,
    corpus_targets,
    resolve_chunk_size,
)
from multipos.training.embedding_gradients import RowSparseEmbeddingGrads
from multipos.training.grad_cache import grad_cache_step
from multipos.training.passage_index import FrozenPassageIndex

#: ``passages.candidates``: ``group`` (each query's G-passage group plus in-batch negatives) or ``corpus`` (every
#: corpus passage, :mod:`multipos.training.corpus_candidates`; needs the frozen passage index).
CANDIDATES = ("group", "corpus")


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


#: Where a checkpoint that leaves out the frozen passage encoder keeps that encoder's fingerprint
#: (:meth:`multipos.model.encoder.DualEncoder.fingerprint`), and the state-dict prefix of its weights.
FROZEN_PASSAGE_KEY = "multipos_frozen_passage_encoder"
PASSAGE_PREFIX = "model.passage_encoder."


def drop_frozen_passage_encoder(model: DualEncoder, checkpoint: dict) -> None:
    """Leave the frozen passage encoder out of ``checkpoint["state_dict"]`` (query-side fine-tuning: E_d is the
    starting checkpoint, which every run of the stage loads anyway) and record its fingerprint under
    :data:`FROZEN_PASSAGE_KEY`, in place. MiniLM: 364 → 273 MB a checkpoint (weights and AdamW moments of E_q, no
    E_d). A model whose passage encoder trains is left as it is."""
    if not model.passage_frozen:
        return
    state = checkpoint["state_dict"]
    for key in [k for k in state if k.startswith(PASSAGE_PREFIX)]:
        del state[key]
    checkpoint[FROZEN_PASSAGE_KEY] = model.fingerprint()


def restore_frozen_passage_encoder(model: DualEncoder, checkpoint: dict, source: str = "checkpoint") -> None:
    """Put ``model``'s passage-encoder weights back into a ``checkpoint`` that left them out
    (:func:`drop_frozen_passage_encoder`), in place, so it loads strictly; a checkpoint holding them is left as it
    is. Raises ValueError naming ``source`` when ``model``'s passage encoder is not frozen or not the one the
    checkpoint was written with (another fingerprint)."""
    recorded = checkpoint.get(FROZEN_PASSAGE_KEY)
    if recorded is None:
        return
    if not model.passage_frozen or model.fingerprint() != recorded:
        raise ValueError(f"{source}: written without its frozen passage encoder (fingerprint {recorded}), but this "
                         "model's passage encoder is " + (f"another one ({model.fingerprint()})" if model.passage_frozen
                                                          else "not frozen (passages=trained)"))
    state = checkpoint["state_dict"]
    for name, tensor in model.passage_encoder.state_dict().items():
        state.setdefault(PASSAGE_PREFIX + name, tensor)


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
            optimizer steps (:func:`multipos.training.stages.schedule_spans`); ``schedule_total=None`` = this fit's
            steps.
        optimizer_state: optimizer ``state_dict`` carried over from the previous stage (``optimizer: carry``).
        grad_cache_chunk_size: None (plain training: one forward/backward of the batch, Lightning's automatic
            optimization) or the rows per chunk of GradCache (:mod:`multipos.training.grad_cache`; manual optimization:
            the same gradient with the activation memory of one chunk).
        gradient_clip_val, gradient_clip_algorithm: clipping applied by this module under GradCache (Lightning
            refuses ``Trainer(gradient_clip_val=...)`` with manual optimization; ``conf/module/retriever.yaml``
            takes both from ``trainer``, and train.py then builds the trainer without them). Plain training
            leaves clipping to the trainer and ignores these.

        passage_index: query-side fine-tuning (``passages=frozen_index``): the frozen corpus embeddings
            (:class:`~multipos.training.passage_index.FrozenPassageIndex`, held as a non-persistent buffer on the
            training
            device); batches' passages are looked up by corpus row, never encoded, and only E_q trains. None:
            two-tower training (both encoders, passages encoded every step).
        candidates: ``group`` (the batch's groups, in-batch negatives) or ``corpus`` (every corpus passage;
            exact, in chunks of ``chunk_size`` rows: :mod:`multipos.training.corpus_candidates`).
            ``passages.candidates``.
        chunk_size: corpus rows scored at a time with ``candidates="corpus"`` (``passages.chunk_size``): a number, or
            ``auto`` (from the device's free memory at the first step, one chunk where the corpus fits; logged:
            :func:`multipos.training.corpus_candidates.resolve_chunk_size`).

    Data-parallel training (``trainer=ddp``): every step scores the local queries against the passages of all
    ranks with masks over the global batch (:mod:`multipos.training.distributed`); one process is the special case W =
    1.
    With ``candidates="corpus"`` every rank scores its queries against the whole corpus (it holds the index).

    Raises:
        ValueError: ``warmup_ratio`` outside [0, 1), ``grad_cache_chunk_size`` < 1, an unknown ``candidates``,
            ``candidates="corpus"`` without a passage index, or a passage index with a passage encoder that trains.
    """

    def __init__(self, model: DualEncoder, loss: ContrastiveLoss, optimizer: Callable | None = None,
                 scheduler: Callable | None = None, warmup_ratio: float = 0.1, lr: float | None = None,
                 schedule_offset: int = 0, schedule_total: int | None = None, optimizer_state: dict | None = None,
                 grad_cache_chunk_size: int | None = None, gradient_clip_val: float | None = None,
                 gradient_clip_algorithm: str = "norm", passage_index: FrozenPassageIndex | None = None,
                 candidates: str = "group", chunk_size: int | str | None = "auto"):
        super().__init__()
        if candidates not in CANDIDATES:
            raise ValueError(f"passages.candidates={candidates!r}; allowed: {', '.join(CANDIDATES)}")
        if candidates == "corpus" and passage_index is None:
            raise ValueError("passages.candidates=corpus scores every corpus passage and needs the frozen passage "
                             "index: use passages=frozen_index (query-side fine-tuning)")
        if passage_index is not None and not model.passage_frozen:
            raise ValueError("a frozen passage index needs a frozen passage encoder "
                             "(DualEncoder.freeze_passage_encoder, done by passages=frozen_index)")
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"module.warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if grad_cache_chunk_size is not None and int(grad_cache_chunk_size) < 1:
            raise ValueError(f"module.grad_cache_chunk_size must be >= 1 or null (no GradCache), "
                             f"got {grad_cache_chunk_size}")
        self.model, self.loss = model, loss
        self.optimizer_factory = optimizer or partial(torch.optim.AdamW, lr=2e-5, weight_decay=0.01)
        self.scheduler_factory = scheduler
        self.warmup_ratio, self.lr = warmup_ratio, lr
        self.schedule_offset, self.schedule_total = schedule_offset, schedule_total
        self.optimizer_state = optimizer_state
        self.grad_cache_chunk_size = None if grad_cache_chunk_size is None else int(grad_cache_chunk_size)
        self.gradient_clip_val, self.gradient_clip_algorithm = gradient_clip_val, gradient_clip_algorithm
        self.automatic_optimization = self.grad_cache_chunk_size is None
        # a bad setting fails here, before training; auto (None) is sized at the first step
        self.candidates, self.chunk_size = candidates, chunk_size_setting(chunk_size)
        self.passage_row = passage_index.row if passage_index is not None else None
        self._embedding_grads: RowSparseEmbeddingGrads | None = None  # CPU fits: on_fit_start .. teardown
        if passage_index is not None:  # moved to the training device with the module, never checkpointed
            self.register_buffer("passage_embeddings", passage_index.embeddings, persistent=False)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score matrix [B, B·G] of a batch's own queries and passages (already divided by τ; no gathering)."""
        q = self.model.encode_queries(batch.query)
        p = self.model.encode_passages(batch.passages)
        return self.model.score(q, p)

    def batch_loss(self, q: torch.Tensor, p: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict]:
        """Loss of local query embeddings ``q`` [B_local, H] against the passages ``p`` [N_local, H] of every rank.

        Gathers the passages with gradient, scores [B_local, N_global] (/ τ), builds the global masks and scales
        the mean loss by :attr:`multipos.training.distributed.BatchLayout.loss_scale` (1 in one process) so that DDP's
        gradient average is the gradient of the global batch's mean loss. Returns (loss, ``{"scores" (detached),
        "positive_mask", "negative_mask"}``). A collective when W > 1: every rank calls it once per step.
        """
        layout = distributed.batch_layout(q.shape[0], batch.passage_ids, p.shape[0])
        scores = self.model.score(q, distributed.gather_with_grad(p, layout.passage_counts))
        positive_mask, negative_mask = distributed.global_masks(batch, layout)
        target = None
        if self.soft_targets:  # query i's weight of each global column (multipos.data.groups.group_targets)
            columns = layout.passage_ids if layout.world_size > 1 else batch.passage_ids
            target = to_device(group_targets(self._groups(batch), columns, self.target_kind), scores.device)
        loss = self.loss(scores, positive_mask, negative_mask, target) * layout.loss_scale
        return loss, {"scores": scores.detach(), "positive_mask": positive_mask, "negative_mask": negative_mask}

    def training_step(self, batch: Batch, batch_idx: int) -> dict:
        """One optimisation step's loss → ``{"loss", "scores", "positive_mask", "negative_mask"}``.

        ``scores`` [B_local, N_global] (already / τ, detached; N_global = B·G in one process) and the bool masks of
        the same shape are returned for callbacks that read ``outputs`` in ``on_train_batch_end`` (e.g. gradient
        diagnostics); ``loss`` is this rank's scalar loss (:meth:`batch_loss`). With GradCache the step also runs
        the backward, gradient clipping, the optimizer and the scheduler (manual optimization).
        """
        n, logged = batch.positive_mask.shape[0], self._logs_this_step()
        if logged:  # this step's rate as a CPU tensor: a Python number would be copied to the device (a host wait)
            self.log("train/lr", torch.tensor(self.optimizers().param_groups[0]["lr"]), prog_bar=False, batch_size=n)
        if self.grad_cache_chunk_size is not None:
            loss, extra = self._grad_cache_step(batch)
        elif self.passage_row is not None:
            loss, extra = self.query_side_loss(self.model.encode_queries(batch.query), batch)
        else:
            loss, extra = self.batch_loss(self.model.encode_queries(batch.query),
                                          self.model.encode_passages(batch.passages), batch)
        # the mean of the ranks' losses is the global batch's mean loss (multipos.training.distributed). Not prog_bar:
        # Lightning
        # reads a progress-bar metric back from the device at every step; multipos.training.callbacks.LoggedProgressBar
        # shows
        # it, read only when the bar refreshes
        if logged:
            self.log("train/loss", loss, prog_bar=False, batch_size=n, sync_dist=self.trainer.world_size > 1)
        return {"loss": loss, **extra}

    def _logs_this_step(self) -> bool:
        """Whether this training step's ``train/loss`` and ``train/lr`` can reach anyone: a step whose values the
        loggers write (every ``trainer.log_every_n_steps`` steps, when training stops, every step of a
        ``fast_dev_run``), or an epoch's last step (the progress bar's epoch summary). The same test as Lightning's
        own ``LearningRateMonitor`` and ``ThroughputMonitor``.

        Why not log every step and let Lightning keep what it writes: each ``self.log`` call walks the logged value's
        whole record to its device (Lightning-AI/pytorch-lightning issue 20388), 0.4–0.6 ms on the 2-core EPYC, and
        with ``sync_dist`` (DDP) it is a collective. The rows a logger writes are the same either way
        (``tests/training/test_step_logging.py``)."""
        trainer = self._trainer
        if trainer is None:
            return True
        return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run or trainer.is_last_batch)

    def query_side_loss(self, q: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict]:
        """Query-side fine-tuning's loss of query embeddings ``q`` [B_local, H] (frozen passages, no passage
        encoding) → (loss, ``{"scores", "positive_mask", "negative_mask"}``) as :meth:`batch_loss`.

        ``group``: the batch's passages looked up by corpus row [N_local, H], then :meth:`batch_loss` (in-batch and
        cross-device negatives as in two-tower training). ``corpus``: the exact reduced problem of
        :func:`multipos.training.corpus_candidates.corpus_scores` ([B, P + 1]: each query's positives and one column
        summarising every corpus passage not judged for it), scaled like :meth:`batch_loss` under DDP.
        """
        if self.candidates == "group":
            rows = to_device(FrozenPassageIndex.rows_of(self.passage_row, batch.passage_ids),
                             self.passage_embeddings.device)
            return self.batch_loss(q, self.passage_embeddings[rows], batch)
        if batch.groups is None:
            raise ValueError("passages.candidates=corpus needs Batch.groups (positives and judged passages per query)")
        targets = corpus_targets([g.passage_ids[: g.n_positives] for g in batch.groups],
                                 [g.judged for g in batch.groups], self.passage_row).to(q.device)
        summary = "max" if self.loss.name in HARDEST_NEGATIVE else "lse"
        if self.chunk_size is None:  # auto: sized once, against the first batch and the device
            self.chunk_size = resolve_chunk_size("auto", q.shape[0], *self.passage_embeddings.shape, q.device)
        scores, positive_mask, negative_mask = corpus_scores(q, self.passage_embeddings, self.model.temperature,
                                                             targets, self.chunk_size, summary)
        ids = batch.passage_ids or []
        layout = distributed.batch_layout(q.shape[0], ids, len(ids))
        target = None
        if self.soft_targets:  # the positives' weights in their columns, 0 for the negatives' summary column
            target = torch.full(scores.shape, float("nan") if self.target_kind == "scores" else 0.0)
            for i, g in enumerate(self._groups(batch)):
                positives = g.passage_ids[: g.n_positives]
                target[i, : len(positives)] = group_targets([g], positives, self.target_kind)[0]
            target = to_device(target, scores.device)
        loss = self.loss(scores, positive_mask, negative_mask, target) * layout.loss_scale
        return loss, {"scores": scores.detach(), "positive_mask": positive_mask, "negative_mask": negative_mask}

    def _grad_cache_step(self, batch: Batch) -> tuple[torch.Tensor, dict]:
        """GradCache forward/backward (:func:`multipos.training.grad_cache.grad_cache_step`), optimizer step (clipping
        in
        :meth:`on_before_optimizer_step`) and scheduler step; gradients are synchronised across ranks by the last
        chunk's backward only."""
        opt = self.optimizers()
        opt.zero_grad()
        strategy = self.trainer.strategy
        no_sync = getattr(strategy, "block_backward_sync", nullcontext)
        if self.passage_row is not None:  # query-side: only the queries are encoded
            parts = [(self.model.encode_queries, batch.query)]
            loss_fn = lambda q: self.query_side_loss(q, batch)  # noqa: E731
        else:
            parts = [(self.model.encode_queries, batch.query), (self.model.encode_passages, batch.passages)]
            loss_fn = lambda q, p: self.batch_loss(q, p, batch)  # noqa: E731
        loss, extra = grad_cache_step(parts, loss_fn, self.grad_cache_chunk_size, backward=self.manual_backward,
                                      no_sync=no_sync)
        opt.step()  # clips in on_before_optimizer_step
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        return loss, extra

    def needs_batch_groups(self) -> bool:
        """Whether a training batch must carry its groups (``Batch.groups``, the data module's loader asks): for the
        masks over the global batch when several processes train (:func:`multipos.training.distributed.global_masks`),
        and
        for the judged passages of every query when every corpus passage is a candidate (``candidates=corpus``).
        Otherwise the batches leave them in the DataLoader workers, which saves the main process rebuilding them
        (:class:`multipos.data.collate.GroupCollator`)."""
        world_size = self.trainer.world_size if self._trainer is not None else 1
        return world_size > 1 or self.candidates == "corpus" or self.soft_targets

    @property
    def soft_targets(self) -> bool:
        """Whether the objective reads a target matrix (:data:`multipos.losses.SOFT_OBJECTIVES`)."""
        return self.loss.name in SOFT_OBJECTIVES

    @property
    def target_kind(self) -> str:
        """``scores`` (a teacher's raw scores) for ``margin_mse``, else ``weights`` (:func:`group_targets`)."""
        return "scores" if self.loss.name == "margin_mse" else "weights"

    @staticmethod
    def _groups(batch: Batch) -> list:
        if batch.groups is None:
            raise ValueError("a soft-target objective needs Batch.groups (the target weights per query)")
        return batch.groups

    def on_fit_start(self) -> None:
        """CPU training in one process: the trained encoders' word embeddings get row-sparse gradients written
        into a kept dense buffer (:mod:`multipos.training.embedding_gradients`; the same gradient, bit for bit, without
        a
        fresh vocabulary-sized matrix each step). A shared encoder keeps the dense backward (its embedding is
        looked up twice a step, and the two sums would round differently)."""
        if self.device.type == "cpu" and self.trainer.world_size == 1 and not self.model.shared:
            self._embedding_grads = RowSparseEmbeddingGrads([self.model.query_encoder, self.model.passage_encoder])

    def teardown(self, stage: str) -> None:
        """The dense embedding backward again once ``fit`` ends, normally or not (Lightning calls this either way)."""
        if self._embedding_grads is not None:
            self._embedding_grads.remove()
            self._embedding_grads = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Query-side fine-tuning: the frozen passage encoder stays out of checkpoints
        (:func:`drop_frozen_passage_encoder`)."""
        drop_frozen_passage_encoder(self.model, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Lightning calls this before loading the weights: a checkpoint without the frozen passage encoder gets
        this model's back (:func:`restore_frozen_passage_encoder`)."""
        restore_frozen_passage_encoder(self.model, checkpoint)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Under GradCache, clip the gradients here (``gradient_clip_val``): Lightning calls this hook after
        unscaling fp16 gradients and before the step, where it clips itself in automatic optimization."""
        if not self.automatic_optimization and self.gradient_clip_val:
            self.configure_gradient_clipping(optimizer, self.gradient_clip_val, self.gradient_clip_algorithm)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, except that bf16-mixed training clips with a fused optimizer too.

        Lightning refuses gradient clipping with a fused optimizer under any mixed precision, because under fp16 the
        fused step unscales the gradients itself, after clipping would have seen them scaled. bf16 autocast scales
        nothing (the plugin has no grad scaler), so the gradients are clipped as they are, as in fp32 training."""
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val,
                                     GradClipAlgorithmType(gradient_clip_algorithm or GradClipAlgorithmType.NORM))
            return
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

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
        """The stage's optimizer over :meth:`parameter_groups` and, with a scheduler, its per-step schedule.

        A continued stage (``optimizer_state`` from the stage before) keeps that optimizer's moments but starts at
        this stage's own peak lr. The schedule runs over ``schedule_total`` steps (else Lightning's estimate), warms
        up over ``warmup_ratio`` of them and is fast-forwarded by ``schedule_offset`` steps when it continues.
        Returns the optimizer alone, or Lightning's ``{"optimizer", "lr_scheduler"}`` dict (interval "step")."""
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
        total = (int(self.schedule_total) if self.schedule_total
                 else max(1, int(self.trainer.estimated_stepping_batches)))
        sched = self.scheduler_factory(opt, num_warmup_steps=int(self.warmup_ratio * total), num_training_steps=total)
        if self.schedule_offset:
            with warnings.catch_warnings():  # fast-forward a continued schedule: no optimizer step is meant
                warnings.simplefilter("ignore")
                for _ in range(int(self.schedule_offset)):
                    sched.step()
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
