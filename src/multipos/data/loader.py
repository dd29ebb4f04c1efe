"""The training loader: the epoch-seeded sampler a resumed run continues, the resumable ``DataLoader``, and how its
worker processes start and send their batches."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Sampler

__all__ = ["EpochSampler", "ResumableLoader", "WorkerInit", "worker_start_method"]

log = logging.getLogger(__name__)


class EpochSampler(Sampler):
    """Shuffles ``n`` items with a generator seeded by ``seed + epoch`` and yields ``(index, epoch)`` pairs.

    Lightning calls :meth:`set_epoch` at the start of every epoch (as for ``DistributedSampler``), so the
    order and the per-epoch draws depend only on (seed, epoch) — also after a resume.

    Data-parallel training (``num_replicas`` ranks, ``use_distributed_sampler: false`` in ``conf/trainer/ddp.yaml``):
    the epoch's order is padded with its first items to a multiple of ``num_replicas`` and rank r takes every
    ``num_replicas``-th item from position r, as ``torch.utils.data.DistributedSampler`` does, so the ranks' batches
    concatenated in rank order hold the same queries as one process with ``num_replicas`` times the batch size.
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True, num_replicas: int = 1, rank: int = 0):
        self.n, self.seed, self.shuffle, self.epoch, self.skip = n, seed, shuffle, 0, 0
        self.skip_epoch: int | None = None  # the epoch ``skip`` belongs to (None = whichever is iterated next)
        self.num_replicas, self.rank = num_replicas, rank

    def set_epoch(self, epoch: int) -> None:
        """Order the next iteration as epoch ``epoch`` (Lightning calls it at each epoch's start)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return -(-self.n // self.num_replicas)

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(self.n))
        if self.num_replicas > 1:
            order = (order * self.num_replicas)[: len(self) * self.num_replicas][self.rank :: self.num_replicas]
        # a resumed epoch starts after the items already trained on, once, and only if it is the epoch that was
        # interrupted: a checkpoint written at an epoch's end resumes at the start of the next one
        skip = self.skip if self.skip_epoch in (None, self.epoch) else 0
        self.skip, self.skip_epoch = 0, None
        return iter([(i, self.epoch) for i in list(order)[skip:]])


class ResumableLoader(DataLoader):
    """A ``DataLoader`` over an :class:`EpochSampler` that Lightning can checkpoint mid-epoch.

    ``state_dict`` records the epoch and the batches already trained on (``progress()``, the trainer's
    processed-batch count); after ``load_state_dict`` the iteration of that same epoch skips those batches, so a
    run resumed from a mid-epoch checkpoint sees exactly the batches an uninterrupted run would have seen, and one
    resumed from an epoch-end checkpoint starts the next epoch from its first batch.
    """

    def __init__(self, *args, progress=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._progress = progress

    def state_dict(self) -> dict:
        """``{"epoch", "batches"}``: the sampler's epoch and the batches of it already trained on."""
        return {"epoch": self.sampler.epoch, "batches": int(self._progress()) if self._progress else 0}

    def load_state_dict(self, state: dict) -> None:
        """Skip ``state["batches"]`` batches of epoch ``state["epoch"]`` at the next iteration of that epoch."""
        self.sampler.skip = int(state.get("batches", 0)) * int(self.batch_size)
        self.sampler.skip_epoch = int(state["epoch"]) if "epoch" in state else None


def worker_start_method(num_workers: int) -> str | None:
    """The start method of the training loader's workers: None (torch's default, this process's start method) unless
    that is not one of the standard library's, as in the loky processes Hydra's joblib launcher (``parallel_jobs=2``)
    runs jobs in, whose ``loky`` method cannot start a plain ``multiprocessing.Process`` (the DataLoader's worker
    fails to start: seen on the H200, 2026-11-26); then the standard library's default for this platform and
    Python (``fork`` on Linux before 3.14, else ``forkserver`` or ``spawn``). None also for ``num_workers=0``."""
    if num_workers == 0 or multiprocessing.get_start_method(allow_none=True) in (None, "fork", "spawn", "forkserver"):
        return None
    available = multiprocessing.get_all_start_methods()
    if sys.platform == "linux" and sys.version_info < (3, 14) and "fork" in available:
        return "fork"
    return "forkserver" if "forkserver" in available else "spawn"


@dataclass(frozen=True)
class WorkerInit:
    """``worker_init_fn`` of the training loader's workers: the tensors of each batch a worker sends reach the main
    process through shared memory named by file (torch's ``file_system`` sharing strategy) rather than through file
    descriptors; then Lightning's worker seeding, as Lightning adds it when no ``worker_init_fn`` is given
    (``seed_everything(workers=True)``: :func:`lightning.fabric.utilities.seed.pl_worker_init_function`).

    Why: with file descriptors (torch's default) the main process fetches each tensor's descriptor from the worker
    through a socket, and the worker answers from a Python thread, which waits for the worker's interpreter while the
    worker collates its next batch. By file name the main process opens the memory itself. Receiving a B=64 × G=8
    NFCorpus batch (6 tensors) from a worker while the main process waits 10–50 ms a step took 1.2–1.7 ms instead of
    2.4–2.5 ms (medians of 34 batches, 1–2 workers, 2-core EPYC, 2026-11-26); from a worker kept busy in Python
    (a synthetic batch), 2.7–3.8 ms instead of 4.9–6.9 ms. Shared memory that a killed run leaves
    behind is removed by torch's ``torch_shm_manager`` once every process of the run has exited (torch documentation,
    "Sharing strategies"). Only the workers switch strategy: what the main process itself shares is unchanged.

    A worker where that strategy fails (a torch build without its ``torch_shm_manager``, a shared-memory folder it
    cannot use: tried on one small tensor at the worker's start) keeps file descriptors and logs a warning.

    ``rank``: this process's global rank (Lightning's seeding of the worker depends on it). ``sharing``: the strategy
    the worker switches to: ``file_system`` (by file name), or ``file_descriptor`` (torch's default on Linux), which
    ``bench/bench_speed.py`` times against it."""

    rank: int = 0
    sharing: str = "file_system"

    def __call__(self, worker_id: int) -> None:
        before = torch.multiprocessing.get_sharing_strategy()
        torch.multiprocessing.set_sharing_strategy(self.sharing)
        try:
            torch.zeros(1).share_memory_()
        except Exception as exc:  # noqa: BLE001 -- any failure keeps torch's default, which works
            torch.multiprocessing.set_sharing_strategy(before)
            log.warning("DataLoader worker %d: tensors by file name failed (%s: %s); sending file descriptors",
                        worker_id, type(exc).__name__, exc)
        if int(os.environ.get("PL_SEED_WORKERS", 0)):
            from lightning.fabric.utilities.seed import pl_worker_init_function

            pl_worker_init_function(worker_id, rank=self.rank)
