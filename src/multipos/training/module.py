"""LightningModule: dual encoder + contrastive objective, optimizer and schedule from config (``conf/module``).

One path from scores to loss. Every passage side ends in the same :class:`Scores` (the local queries' scores against
their candidates, the two masks, the soft targets, the loss scale under DDP):

* two-tower training: the batch's passages encoded, gathered from every rank (:meth:`RetrieverModule.in_batch_scores`);
* query-side fine-tuning over a frozen index, ``candidates=group``: the same, the passages looked up by corpus row;
* ``candidates=corpus``: every corpus passage, as the exact reduced problem of
  :mod:`multipos.training.corpus_candidates` (:meth:`RetrieverModule.corpus_candidate_scores`);

and :meth:`RetrieverModule.scores_loss` turns it into the loss and the step's outputs. GradCache
(:mod:`multipos.training.grad_cache`) changes only how the embeddings are computed: its representation-gradient
pass calls the same :meth:`RetrieverModule.scores_loss` on cached embeddings. The module's settings are typed
(:class:`OptimizerSettings`, :class:`ScheduleSettings`, :class:`GradCacheSettings`, :class:`PassageSettings`), built
from ``conf/module`` and the stage (:class:`StageSettings`) in one place, :meth:`RetrieverModule.from_config`.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch import Tensor

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
from multipos.training.grad_cache import Encoder, Tokens, grad_cache_step
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


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer of one training stage (:meth:`RetrieverModule.configure_optimizers`).

    Attributes:
        factory: ``_partial_`` optimizer factory called with parameter groups (``module.optimizer``:
            ``torch.optim.AdamW`` with lr and weight decay; biases and LayerNorm weights get no decay). None (the
            default) is AdamW with lr 2e-5 and weight decay 0.01.
        lr: the stage's peak learning rate (``stages.<name>.lr``), or None for the factory's.
        state: the optimizer ``state_dict`` the previous stage left (``stages.<name>.optimizer: carry``), or None.
    """

    factory: Callable | None = None
    lr: float | None = None
    state: dict | None = None

    def __post_init__(self):
        if self.factory is None:
            object.__setattr__(self, "factory", partial(torch.optim.AdamW, lr=2e-5, weight_decay=0.01))


@dataclass(frozen=True)
class ScheduleSettings:
    """The learning-rate schedule of one training stage.

    Attributes:
        factory: ``_partial_`` factory ``(optimizer, num_warmup_steps, num_training_steps) -> LRScheduler``
            (``module.scheduler``) stepped every optimizer step, or None (the default) for a constant learning rate.
        warmup_ratio: share of the schedule's steps used for warm-up (``module.warmup_ratio``).
        offset, total: where this stage starts in its schedule and the schedule's length in optimizer steps
            (:func:`multipos.training.stages.schedule_spans`); ``total=None``: this fit's steps.

    Raises:
        ValueError: ``warmup_ratio`` outside [0, 1).
    """

    factory: Callable | None = None
    warmup_ratio: float = 0.1
    offset: int = 0
    total: int | None = None

    def __post_init__(self):
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"module.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")


@dataclass(frozen=True)
class GradCacheSettings:
    """GradCache (:mod:`multipos.training.grad_cache`) and the gradient clipping that comes with it.

    Attributes:
        chunk_size: None (plain training: one forward/backward of the batch, Lightning's automatic optimization) or
            the rows per chunk (``module.grad_cache_chunk_size``; manual optimization: the same gradient with the
            activation memory of one chunk).
        gradient_clip_val, gradient_clip_algorithm: clipping applied by the module under GradCache (Lightning refuses
            ``Trainer(gradient_clip_val=...)`` with manual optimization; ``conf/module/retriever.yaml`` takes both
            from ``trainer``, and the trainer is then built without them). Plain training leaves clipping to the
            trainer and ignores these.

    Raises:
        ValueError: ``chunk_size`` < 1.
    """

    chunk_size: int | None = None
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"

    def __post_init__(self):
        if self.chunk_size is None:
            return
        if int(self.chunk_size) < 1:
            raise ValueError(f"module.grad_cache_chunk_size must be >= 1 or null (no GradCache), got {self.chunk_size}")
        object.__setattr__(self, "chunk_size", int(self.chunk_size))


@dataclass(frozen=True)
class PassageSettings:
    """The passage side of training (``passages``).

    Attributes:
        index: query-side fine-tuning (``passages=frozen_index``): the frozen corpus embeddings
            (:class:`~multipos.training.passage_index.FrozenPassageIndex`; the module holds them as a non-persistent
            buffer on the training device); batches' passages are looked up by corpus row, never encoded, and only
            E_q trains. None (the default): two-tower training, both encoders, passages encoded every step.
        candidates: ``group`` (the batch's groups, in-batch negatives) or ``corpus`` (every corpus passage, exact,
            in chunks of ``chunk_size`` rows: :mod:`multipos.training.corpus_candidates`); ``passages.candidates``.
        chunk_size: corpus rows scored at a time with ``candidates="corpus"`` (``passages.chunk_size``): a number, or
            ``auto`` (from the device's free memory at the first step, one chunk where the corpus fits; logged:
            :func:`multipos.training.corpus_candidates.resolve_chunk_size`).

    Raises:
        ValueError: an unknown ``candidates``, ``candidates="corpus"`` without an index, or a ``chunk_size`` that is
            neither a number >= 1 nor ``auto``.
    """

    index: FrozenPassageIndex | None = None
    candidates: str = "group"
    chunk_size: int | str | None = "auto"

    def __post_init__(self):
        if self.candidates not in CANDIDATES:
            raise ValueError(f"passages.candidates={self.candidates!r}; allowed: {', '.join(CANDIDATES)}")
        if self.candidates == "corpus" and self.index is None:
            raise ValueError("passages.candidates=corpus scores every corpus passage and needs the frozen passage "
                             "index: use passages=frozen_index (query-side fine-tuning)")
        chunk_size_setting(self.chunk_size)  # a bad setting fails here, before training


@dataclass(frozen=True)
class StageSettings:
    """What a training stage sets on the module (:func:`multipos.training.fit.run_stage`): its peak learning rate
    (``lr``, None for the optimizer config's), its span of the schedule (``schedule_offset``, ``schedule_total``:
    :func:`multipos.training.stages.schedule_spans`; ``schedule_total=None`` = this fit's steps) and the optimizer
    state carried over from the stage before (``optimizer_state``, or None)."""

    lr: float | None = None
    schedule_offset: int = 0
    schedule_total: int | None = None
    optimizer_state: dict | None = None


@dataclass
class Scores:
    """What every passage side hands the objective (:meth:`RetrieverModule.scores_loss`).

    Attributes:
        scores: [B_local, C] float, already divided by τ, with gradient to the embeddings: the local queries against
            their C candidate columns (C = N_global = W·B·G for in-batch candidates, P + 1 over the corpus).
        positive_mask, negative_mask: bool [B_local, C]: which columns are each query's positives and negatives
            (columns in neither are ignored).
        target: float32 [B_local, C], the soft targets of :data:`multipos.losses.SOFT_OBJECTIVES` (a passage's
            weight, or a teacher's score: :func:`multipos.data.groups.group_targets`), or None.
        loss_scale: factor of the rank's mean loss (:attr:`multipos.training.distributed.BatchLayout.loss_scale`,
            1.0 in one process) that makes DDP's gradient average the gradient of the global batch's mean loss.
    """

    scores: Tensor
    positive_mask: Tensor
    negative_mask: Tensor
    target: Tensor | None = None
    loss_scale: float = 1.0

    def outputs(self) -> dict[str, Tensor]:
        """``{"scores" (detached), "positive_mask", "negative_mask"}``: what ``training_step`` returns besides the loss,
        for callbacks that read ``outputs`` in ``on_train_batch_end`` (e.g. gradient diagnostics)."""
        return {"scores": self.scores.detach(), "positive_mask": self.positive_mask,
                "negative_mask": self.negative_mask}


#: A passage side of one batch: the (encoder, tokens) pairs whose embeddings it needs, and the function of those
#: embeddings ([B, H] queries, then [N, H] passages where they are encoded) to the batch's :class:`Scores`.
PassageSide = tuple[list[tuple[Encoder, Tokens]], Callable[..., Scores]]


class RetrieverModule(L.LightningModule):
    """Trains a :class:`DualEncoder` with a :class:`ContrastiveLoss` for one training stage.

    Args:
        model: the dual encoder; loss: the stage's objective.
        optimizer: :class:`OptimizerSettings` (default: AdamW, lr 2e-5, weight decay 0.01).
        schedule: :class:`ScheduleSettings` (default: a constant learning rate).
        grad_cache: :class:`GradCacheSettings` (default: off, Lightning's automatic optimization).
        passages: :class:`PassageSettings` (default: two-tower training over the batch's groups).

    Training builds it from ``conf/module`` and the stage with :meth:`from_config`. Every training step scores the
    batch on its passage side (:meth:`passage_side`: two-tower, query-side over a frozen index, every corpus passage)
    into :class:`Scores`, which :meth:`scores_loss` turns into the loss, with or without GradCache.

    Data-parallel training (``trainer=ddp``): every step scores the local queries against the passages of all
    ranks with masks over the global batch (:mod:`multipos.training.distributed`); one process is the special case
    W = 1. With ``candidates="corpus"`` every rank scores its queries against the whole corpus (it holds the index).

    Raises:
        ValueError: a passage index with a passage encoder that trains (and what the settings raise).
    """

    def __init__(self, model: DualEncoder, loss: ContrastiveLoss, optimizer: OptimizerSettings | None = None,
                 schedule: ScheduleSettings | None = None, grad_cache: GradCacheSettings | None = None,
                 passages: PassageSettings | None = None):
        super().__init__()
        passages = passages or PassageSettings()
        if passages.index is not None and not model.passage_frozen:
            raise ValueError("a frozen passage index needs a frozen passage encoder "
                             "(DualEncoder.freeze_passage_encoder, done by passages=frozen_index)")
        self.model, self.loss = model, loss
        self.optimizer_settings = optimizer or OptimizerSettings()
        self.schedule = schedule or ScheduleSettings()
        self.grad_cache = grad_cache or GradCacheSettings()
        self.automatic_optimization = self.grad_cache.chunk_size is None
        # auto (None) is sized at the first step
        self.candidates, self.chunk_size = passages.candidates, chunk_size_setting(passages.chunk_size)
        self.passage_row = passages.index.row if passages.index is not None else None
        self._embedding_grads: RowSparseEmbeddingGrads | None = None  # CPU fits: on_fit_start .. teardown
        if passages.index is not None:  # moved to the training device with the module, never checkpointed
            self.register_buffer("passage_embeddings", passages.index.embeddings, persistent=False)

    @classmethod
    def from_config(cls, model: DualEncoder, loss: ContrastiveLoss, *, optimizer: Callable | None = None,
                    scheduler: Callable | None = None, warmup_ratio: float = 0.1,
                    grad_cache_chunk_size: int | None = None, gradient_clip_val: float | None = None,
                    gradient_clip_algorithm: str = "norm", stage: StageSettings | None = None,
                    passages: PassageSettings | None = None) -> RetrieverModule:
        """The module of one training stage from ``conf/module`` (its ``_target_``: the keyword arguments are that
        node's keys, ``optimizer`` and ``scheduler`` instantiated as ``_partial_`` factories), the stage's
        :class:`StageSettings` and the run's :class:`PassageSettings` — the one place config becomes settings.

        Raises:
            ValueError: what :class:`ScheduleSettings`, :class:`GradCacheSettings` and the constructor raise.
        """
        stage = stage or StageSettings()
        return cls(model, loss,
                   optimizer=OptimizerSettings(optimizer, stage.lr, stage.optimizer_state),
                   schedule=ScheduleSettings(scheduler, warmup_ratio, stage.schedule_offset, stage.schedule_total),
                   grad_cache=GradCacheSettings(grad_cache_chunk_size, gradient_clip_val, gradient_clip_algorithm),
                   passages=passages)

    def forward(self, batch: Batch) -> Tensor:
        """Score matrix [B, B·G] of a batch's own queries and passages (already divided by τ; no gathering)."""
        q = self.model.encode_queries(batch.query)
        p = self.model.encode_passages(batch.passages)
        return self.model.score(q, p)

    # -- the passage sides: embeddings -> Scores ---------------------------------------------------------------------

    def passage_side(self, batch: Batch) -> PassageSide:
        """This module's passage side for ``batch`` → (the (encoder, tokens) pairs to embed, the function of their
        embeddings to :class:`Scores`): two-tower ``[queries, passages]`` → :meth:`in_batch_scores`; query-side
        ``[queries]`` → :meth:`in_batch_scores` over :meth:`indexed_passages` (``candidates=group``) or
        :meth:`corpus_candidate_scores` (``candidates=corpus``)."""
        queries = (self.model.encode_queries, batch.query)
        if self.passage_row is None:
            return [queries, (self.model.encode_passages, batch.passages)], partial(self.in_batch_scores, batch=batch)
        if self.candidates == "group":
            return [queries], lambda q: self.in_batch_scores(q, self.indexed_passages(batch), batch)
        return [queries], partial(self.corpus_candidate_scores, batch=batch)

    def in_batch_scores(self, q: Tensor, p: Tensor, batch: Batch) -> Scores:
        """Local query embeddings ``q`` [B_local, H] against the passages ``p`` [N_local, H] of every rank →
        :class:`Scores` [B_local, N_global] (/ τ).

        Gathers the passages with gradient, builds the global masks and the soft targets of the global columns, and
        the loss scale of :attr:`multipos.training.distributed.BatchLayout.loss_scale` (1 in one process). A
        collective when W > 1: every rank calls it once per step. Raises ValueError when a soft-target objective
        meets a batch without ``groups``.
        """
        layout = distributed.batch_layout(q.shape[0], batch.passage_ids, p.shape[0])
        scores = self.model.score(q, distributed.gather_with_grad(p, layout.passage_counts))
        positive_mask, negative_mask = distributed.global_masks(batch, layout)
        target = None
        if self.soft_targets:  # query i's weight of each global column (multipos.data.groups.group_targets)
            columns = layout.passage_ids if layout.world_size > 1 else batch.passage_ids
            target = to_device(group_targets(self._groups(batch), columns, self.target_kind), scores.device)
        return Scores(scores, positive_mask, negative_mask, target, layout.loss_scale)

    def indexed_passages(self, batch: Batch) -> Tensor:
        """Query-side fine-tuning: the batch's passages [N_local, H] looked up in the frozen index by corpus row
        (never encoded). Raises KeyError naming a passage outside the indexed corpus."""
        rows = to_device(FrozenPassageIndex.rows_of(self.passage_row, batch.passage_ids),
                         self.passage_embeddings.device)
        return self.passage_embeddings[rows]

    def corpus_candidate_scores(self, q: Tensor, batch: Batch) -> Scores:
        """Query embeddings ``q`` [B_local, H] against every corpus passage (``candidates=corpus``) → the exact
        reduced problem of :func:`multipos.training.corpus_candidates.corpus_scores` as :class:`Scores` [B, P + 1]
        (each query's positives and one column summarising every corpus passage not judged for it; soft targets:
        the positives' weights in their columns, 0 for the summary column), scaled like :meth:`in_batch_scores`
        under DDP. The chunk size ``auto`` is resolved at the first call.

        Raises ValueError when the batch has no ``groups`` (positives and judged passages per query).
        """
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
        return Scores(scores, positive_mask, negative_mask, target, layout.loss_scale)

    # -- the one path from scores to loss ----------------------------------------------------------------------------

    def scores_loss(self, scored: Scores) -> tuple[Tensor, dict[str, Tensor]]:
        """The objective on a passage side's :class:`Scores` → (this rank's scalar loss: the objective's mean over
        the local queries × ``scored.loss_scale``, ``scored.outputs()``). Every training path ends here, GradCache's
        representation-gradient pass included; what the step logs is this loss."""
        loss = self.loss(scored.scores, scored.positive_mask, scored.negative_mask, scored.target) * scored.loss_scale
        return loss, scored.outputs()

    def batch_loss(self, q: Tensor, p: Tensor, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`scores_loss` of :meth:`in_batch_scores`: the loss of query embeddings ``q`` [B_local, H] against the
        passages ``p`` [N_local, H] of every rank, and ``{"scores" (detached), "positive_mask", "negative_mask"}``
        [B_local, N_global]. A collective when W > 1."""
        return self.scores_loss(self.in_batch_scores(q, p, batch))

    def training_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        """One optimisation step's loss → ``{"loss", "scores", "positive_mask", "negative_mask"}``.

        The batch's :meth:`passage_side` is embedded (plain: one forward, Lightning's automatic optimization runs the
        backward and the step; GradCache: :meth:`_grad_cache_step`, which also runs the backward, gradient clipping,
        the optimizer and the scheduler) and scored, then :meth:`scores_loss`. ``scores`` [B_local, C] (already / τ,
        detached) and the bool masks of the same shape are for callbacks that read ``outputs`` in
        ``on_train_batch_end`` (e.g. gradient diagnostics); ``loss`` is this rank's scalar loss. ``train/lr`` and
        ``train/loss`` are logged on the steps whose values reach a logger or the progress bar
        (:meth:`_logs_this_step`).
        """
        n, logged = batch.positive_mask.shape[0], self._logs_this_step()
        if logged:  # this step's rate as a CPU tensor: a Python number would be copied to the device (a host wait)
            self.log("train/lr", torch.tensor(self.optimizers().param_groups[0]["lr"]), prog_bar=False, batch_size=n)
        inputs, score = self.passage_side(batch)
        if self.automatic_optimization:
            loss, outputs = self.scores_loss(score(*[encode(tokens) for encode, tokens in inputs]))
        else:
            loss, outputs = self._grad_cache_step(inputs, score)
        # the mean of the ranks' losses is the global batch's mean loss (multipos.training.distributed). Not prog_bar:
        # Lightning reads a progress-bar metric back from the device at every step;
        # multipos.training.callbacks.LoggedProgressBar shows it, read only when the bar refreshes
        if logged:
            self.log("train/loss", loss, prog_bar=False, batch_size=n, sync_dist=self.trainer.world_size > 1)
        return {"loss": loss, **outputs}

    def _grad_cache_step(self, inputs: list[tuple[Encoder, Tokens]],
                         score: Callable[..., Scores]) -> tuple[Tensor, dict[str, Tensor]]:
        """GradCache forward/backward of a passage side (:func:`multipos.training.grad_cache.grad_cache_step`, whose
        loss is :meth:`scores_loss` of ``score`` on the cached embeddings), optimizer step (clipping in
        :meth:`on_before_optimizer_step`) and scheduler step → (loss detached, outputs); gradients are synchronised
        across ranks by the last chunk's backward only."""
        opt = self.optimizers()
        opt.zero_grad()
        no_sync = getattr(self.trainer.strategy, "block_backward_sync", nullcontext)
        loss, outputs = grad_cache_step(inputs, lambda *embeddings: self.scores_loss(score(*embeddings)),
                                        self.grad_cache.chunk_size, backward=self.manual_backward, no_sync=no_sync)
        opt.step()  # clips in on_before_optimizer_step
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        return loss, outputs

    def _attached_trainer(self) -> L.Trainer | None:
        """The trainer this module is attached to, or None (a module used on its own)."""
        try:
            return self.trainer
        except RuntimeError:  # LightningModule.trainer raises when no trainer is attached
            return None

    def _logs_this_step(self) -> bool:
        """Whether this training step's ``train/loss`` and ``train/lr`` can reach anyone: a step whose values the
        loggers write (every ``trainer.log_every_n_steps`` steps, counted by ``trainer.global_step``, the optimizer
        steps before this one; when training stops; every step of a ``fast_dev_run``), or an epoch's last step (the
        progress bar's epoch summary). Lightning's own test (``should_update_logs``, which ``LearningRateMonitor``
        and ``ThroughputMonitor`` read) from the trainer's public attributes; without a trainer every step logs.

        Why not log every step and let Lightning keep what it writes: each ``self.log`` call walks the logged value's
        whole record to its device (Lightning-AI/pytorch-lightning issue 20388), 0.4–0.6 ms on the 2-core EPYC, and
        with ``sync_dist`` (DDP) it is a collective. The rows a logger writes are the same either way
        (``tests/training/test_step_logging.py``)."""
        trainer = self._attached_trainer()
        if trainer is None or trainer.fast_dev_run or trainer.is_last_batch:
            return True
        every = trainer.log_every_n_steps
        return every > 0 and ((trainer.global_step + 1) % every == 0 or trainer.should_stop)

    def needs_batch_groups(self) -> bool:
        """Whether a training batch must carry its groups (``Batch.groups``, the data module's loader asks): for the
        masks over the global batch when several processes train (:func:`multipos.training.distributed.global_masks`),
        for the judged passages of every query when every corpus passage is a candidate (``candidates=corpus``), and
        for the targets of a soft-target objective. Otherwise the batches leave them in the DataLoader workers, which
        saves the main process rebuilding them (:class:`multipos.data.collate.GroupCollator`)."""
        trainer = self._attached_trainer()
        world_size = trainer.world_size if trainer is not None else 1
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
        into a kept dense buffer (:mod:`multipos.training.embedding_gradients`; the same gradient, bit for bit,
        without a fresh vocabulary-sized matrix each step). A shared encoder keeps the dense backward (its embedding
        is looked up twice a step, and the two sums would round differently)."""
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
        """Under GradCache, clip the gradients here (:attr:`GradCacheSettings.gradient_clip_val`): Lightning calls this
        hook after unscaling fp16 gradients and before the step, where it clips itself in automatic optimization."""
        if not self.automatic_optimization and self.grad_cache.gradient_clip_val:
            self.configure_gradient_clipping(optimizer, self.grad_cache.gradient_clip_val,
                                             self.grad_cache.gradient_clip_algorithm)

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
        """AdamW parameter groups: weights with decay, biases and LayerNorm weights (ndim < 2) without; each with the
        stage's peak lr (:attr:`OptimizerSettings.lr`) where it has one."""
        decay, no_decay = [], []
        for _, param in self.model.named_parameters():
            if param.requires_grad:
                (no_decay if param.ndim < 2 else decay).append(param)
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        if self.optimizer_settings.lr is not None:
            for g in groups:
                g["lr"] = self.optimizer_settings.lr
        return groups

    def configure_optimizers(self):
        """The stage's optimizer over :meth:`parameter_groups` and, with a scheduler, its per-step schedule.

        A continued stage (:attr:`OptimizerSettings.state` from the stage before) keeps that optimizer's moments but
        starts at this stage's own peak lr. The schedule runs over :attr:`ScheduleSettings.total` steps (else
        Lightning's estimate), warms up over ``warmup_ratio`` of them and is fast-forwarded by
        :attr:`ScheduleSettings.offset` steps when it continues. Returns the optimizer alone, or Lightning's
        ``{"optimizer", "lr_scheduler"}`` dict (interval "step")."""
        settings, schedule = self.optimizer_settings, self.schedule
        opt = settings.factory(self.parameter_groups())
        if settings.state is not None:
            lrs = [g["lr"] for g in opt.param_groups]
            opt.load_state_dict(settings.state)
            for g, lr in zip(opt.param_groups, lrs):  # the stage's peak lr, not the previous stage's last one
                g["lr"] = g["initial_lr"] = lr
        if schedule.factory is None:
            return opt
        # a known schedule length avoids estimated_stepping_batches, which builds the train dataloader before a
        # checkpoint's dataloader state is restored (a mid-epoch resume would then replay the epoch's start)
        total = int(schedule.total) if schedule.total else max(1, int(self.trainer.estimated_stepping_batches))
        sched = schedule.factory(opt, num_warmup_steps=int(schedule.warmup_ratio * total), num_training_steps=total)
        if schedule.offset:
            with warnings.catch_warnings():  # fast-forward a continued schedule: no optimizer step is meant
                warnings.simplefilter("ignore")
                for _ in range(int(schedule.offset)):
                    sched.step()
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
