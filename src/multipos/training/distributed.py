"""Cross-device negatives for data-parallel training (Lightning DDP, ``trainer=ddp``; torch.distributed).

Every rank encodes its own B_local queries and B_local·G passages. The passage embeddings of all ranks are
all-gathered *with gradient* (the local shard keeps its autograd graph; the backward of the gather sums the
gradients of every rank's loss for this rank's passages), so each rank scores its local queries against the
global batch::

    scores         [B_local, N_global]   N_global = Σ_r B_r·G, columns in rank order
    positive_mask  [B_local, N_global]   this rank's groups start at column ``offset`` = Σ_{r < rank} N_r
    negative_mask  [B_local, N_global]   false negatives masked by passage id across ranks

(:func:`multipos.data.groups.group_masks` with the global columns; one process is the special case ``columns`` =
the local batch, ``offset`` = 0.) Query embeddings are not gathered: no objective uses queries as negatives,
and each rank's loss needs only its own queries' rows.

Gradient scale. DDP averages parameter gradients over the W ranks. With the rank loss
``L_r = (W / B_global) Σ_{i ∈ rank r} ℓ_i`` (:attr:`BatchLayout.loss_scale` × the rank's mean loss), the
averaged gradient is ``(1 / W) Σ_r ∇L_r = (1 / B_global) Σ_i ∇ℓ_i``: the gradient of the mean loss over the
concatenated batch in one process (the objectives' batch loss, :class:`multipos.losses.ContrastiveLoss`).
The mean of ``L_r`` over ranks is that same batch loss, which is what is logged.
"""

from __future__ import annotations

import logging
import os
import platform
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from multipos.data.groups import group_masks
from multipos.model.transfer import to_device

__all__ = ["BatchLayout", "batch_layout", "gather_with_grad", "global_masks", "world", "is_rank_zero",
           "trainer_world_size", "check_launch"]


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_rank_zero() -> bool:
    """True in the process that writes a run's outputs: global rank 0.

    Read from the launcher's environment so it is right before the process group exists: Lightning's DDP
    launcher re-runs ``train.py`` in one subprocess per extra device (``LOCAL_RANK``), and those processes start
    the job from the top; torchrun sets ``RANK``, SLURM ``SLURM_PROCID`` (Lightning's ``rank_zero_only.rank``
    reads these), and on a multi-node run started by hand every node's first process has ``NODE_RANK``.
    """
    from lightning.pytorch.utilities import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) != 0:
        return False
    global_rank_known = any(k in os.environ for k in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"))
    return global_rank_known or int(os.environ.get("NODE_RANK", 0)) == 0


@dataclass(frozen=True)
class BatchLayout:
    """Where this rank's batch sits in the global batch.

    Attributes:
        rank, world_size: this process and the number of data-parallel processes (W).
        query_counts, passage_counts: B_r and N_r = B_r·G of every rank, in rank order.
        passage_ids: the N_global column ids (every rank's ``Batch.passage_ids`` concatenated in rank order;
            in one process the batch's ids, or empty when it has none).
        offset: column of this rank's first passage, Σ_{r < rank} N_r.
    """

    rank: int
    world_size: int
    query_counts: tuple[int, ...]
    passage_counts: tuple[int, ...]
    passage_ids: tuple[str, ...]
    offset: int

    @property
    def global_queries(self) -> int:
        """B_global = Σ_r B_r."""
        return sum(self.query_counts)

    @property
    def loss_scale(self) -> float:
        """W · B_local / B_global: multiplies the rank's mean loss so that DDP's gradient average equals the
        gradient of the mean loss over the global batch (module docstring); 1.0 for equal local batches."""
        return self.world_size * self.query_counts[self.rank] / self.global_queries


def batch_layout(n_queries: int, passage_ids: list[str] | None, n_passages: int) -> BatchLayout:
    """Gather every rank's query count and passage ids (``all_gather_object``, no gradient) → :class:`BatchLayout`.

    One process (no process group): the trivial layout, no communication (``passage_ids`` may then be None).
    Every rank must call this in the same step (a collective). Raises ValueError when W > 1 and
    ``passage_ids`` is None or does not hold ``n_passages`` ids (a Batch without its column ids).
    """
    rank, size = world()
    if size == 1:
        return BatchLayout(0, 1, (n_queries,), (n_passages,), tuple(passage_ids or ()), 0)
    if passage_ids is None or len(passage_ids) != n_passages:
        raise ValueError(f"cross-device negatives need Batch.passage_ids with one id per passage ({n_passages}), "
                         f"got {None if passage_ids is None else len(passage_ids)} (multipos.data.collate.Batch)")
    parts: list = [None] * size
    dist.all_gather_object(parts, (int(n_queries), list(passage_ids)))
    query_counts = tuple(n for n, _ in parts)
    passage_counts = tuple(len(ids) for _, ids in parts)
    columns = tuple(pid for _, ids in parts for pid in ids)
    return BatchLayout(rank, size, query_counts, passage_counts, columns, sum(passage_counts[:rank]))


def gather_with_grad(local: Tensor, counts: tuple[int, ...]) -> Tensor:
    """All-gather ``local`` [n_rank, ...] from every rank along dim 0 → [Σ counts, ...], in rank order.

    The local shard keeps its autograd graph; the backward sums, for this rank's rows, the gradients of every
    rank's loss (``torch.distributed._functional_collectives.all_gather_single``, the replacement PyTorch names
    for the deprecated ``torch.distributed.nn.functional.all_gather``). Unequal shards (``counts``) are padded
    to the largest and trimmed. One process: returns ``local``. Raises ValueError when ``local`` does not have
    ``counts[rank]`` rows.
    """
    rank, size = world()
    if local.shape[0] != counts[rank]:
        raise ValueError(f"gather_with_grad: rank {rank} has {local.shape[0]} rows, layout says {counts[rank]}")
    if size == 1:
        return local
    try:
        from torch.distributed._functional_collectives import all_gather_single
    except ImportError:  # torch < 2.13 (2.11 on the lent H100's image): the same autograd all-gather, older name
        from torch.distributed._functional_collectives import all_gather_tensor_autograd as all_gather_single

    longest = max(counts)
    if local.shape[0] < longest:
        local = torch.cat([local, local.new_zeros(longest - local.shape[0], *local.shape[1:])])
    gathered = all_gather_single(local.contiguous(), 0, dist.group.WORLD)  # [W · longest, ...]
    if all(c == longest for c in counts):
        return gathered
    return torch.cat([gathered[r * longest: r * longest + c] for r, c in enumerate(counts)])


def global_masks(batch, layout: BatchLayout) -> tuple[Tensor, Tensor]:
    """Positive and negative masks [B_local, N_global] of this rank's queries over the global batch's columns.

    One process: the batch's own masks (built by the same :func:`multipos.data.groups.group_masks` with the local
    columns). Several: ``group_masks(batch.groups, layout.passage_ids, layout.offset)`` — positives in this
    rank's block, negatives every other column except passages judged for the query, whichever rank they came
    from. Masks are on the batch masks' device (copied there without a host wait,
    :func:`multipos.model.transfer.to_device`).

    Raises ValueError when ``batch.groups`` is None with W > 1 (the judged passages are needed).
    """
    if layout.world_size == 1:
        return batch.positive_mask, batch.negative_mask
    if batch.groups is None:
        raise ValueError("cross-device false-negative masking needs Batch.groups (judged passages per query); "
                         "build batches with multipos.data.datamodule.MultiPosDataModule.collate")
    positive, negative = group_masks(batch.groups, layout.passage_ids, layout.offset)
    device = batch.positive_mask.device
    return to_device(positive, device), to_device(negative, device)


@contextmanager
def _quiet(logger_names: tuple[str, ...]):
    loggers = [logging.getLogger(n) for n in logger_names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def trainer_world_size(trainer_cfg) -> int:
    """Data-parallel processes (devices × nodes) of a ``lightning.Trainer`` built from ``trainer_cfg`` (a Hydra
    node), resolved by Lightning itself (``devices=auto``, lists, -1) on a throwaway Trainer: nothing is
    launched. Needed before training to size the learning-rate schedule (optimizer steps per epoch per rank)."""
    from hydra.utils import instantiate

    with _quiet(("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")):
        trainer = instantiate(trainer_cfg, logger=False, callbacks=[], enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)
    return int(trainer.world_size)


def check_launch(world_size: int) -> None:
    """Refuse data-parallel training that Lightning's own launcher would start from a local Hydra multirun (``-m``).

    That launcher starts the extra processes by re-running the command line (``-m`` and the sweep included) with
    the run's ``hydra.run.dir``, which a sweep job does not use: the processes would not share a run folder. A
    sweep fans out data-parallel jobs through a launcher whose processes the cluster starts (``hydra/launcher=
    submitit_slurm`` with ``tasks_per_node`` = ``trainer.devices``; ``SLURM_NTASKS`` set) or under torchrun
    (``RANK`` set). Raises ValueError naming both ways; no-op for one process or outside a multirun.
    """
    if world_size <= 1:
        return
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if any(k in os.environ for k in ("SLURM_NTASKS", "RANK", "LOCAL_RANK")):
        return
    raise ValueError(f"trainer with {world_size} processes inside a local multirun (-m): Lightning's DDP launcher "
                     "re-runs the command line and cannot join a sweep job's folder. Run single jobs (no -m), or sweep "
                     "with hydra/launcher=submitit_slurm and hydra.launcher.tasks_per_node=<trainer.devices>")


def device_description() -> str:
    """The accelerator the run trains on, in words (GPU name, else CPU model and cores)."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {model}, {os.cpu_count()} cores"
