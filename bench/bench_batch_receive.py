"""What the main process pays for each training batch before it reaches the device: receiving it from a DataLoader
worker (unpickling it, opening the shared memory of its tensors) with and without its groups, and staging its tensors
for the copy to the device with PyTorch's copy against multipos's one-thread copy, after an idle wait.

On an accelerator the main process only queues kernels and waits for the device, so whatever it does per batch is time
the device may wait (docs/gpu.md: the Lightning loop against the bare loop). The batches are the two-tower study's
NFCorpus data (``experiment=two_tower``: graded qrels, BM25 hard negatives, G=8 at 128 tokens; positives in qrels
order) at ``bench_speed.py``'s GPU batch size, B=64 (the study's is 32), made by the training loader itself with
``--workers`` worker processes (default 1).

* ``receive_s_groups`` / ``receive_s_no_groups``: seconds of the loader's ``next()`` with the groups in the batch (the
  judged passages of each query: what data-parallel training and ``candidates=corpus`` need) and without them
  (:meth:`multipos.training.module.RetrieverModule.needs_batch_groups` False, the default in one process since
  2026-11-27), ``--wait-ms`` (default 30: a step on the device) after the last batch, the two loaders taking turns;
  ``receive_groups_vs_no_groups`` their ratio (> 1: leaving the groups behind is faster);
* ``stage_s_torch`` / ``stage_s_one_thread``: seconds to copy one received batch's token tensors and masks into
  staging memory, ``--wait-ms`` after the last copy, with PyTorch's copy (``Tensor.pin_memory`` on CUDA; elsewhere
  ``clone``, the same parallel copy kernel) and with :func:`multipos.model.transfer.pinned` (elsewhere its copy into
  ordinary memory), taking turns; median and 90th percentile; ``stage_torch_vs_one_thread`` the ratio of medians
  (> 1: the one-thread copy is faster). PyTorch's copy of a batch-sized tensor is split over its intra-op threads,
  which sleep while the main process waits; waking one can cost far more than the copy (2-core AMD EPYC, 2026-11-27:
  about 11 ms after a 30 ms wait against 0.03 ms without one).

One JSON line with machine info is appended to ``bench/results/speed.jsonl`` (``"bench": "batch_receive"``).

    python bench/bench_batch_receive.py [--rounds 40 --workers 1 --wait-ms 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import REPO, append_result, machine_info

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


def data_module(workers: int):
    """The two-tower study's NFCorpus data module, set up, with ``workers`` DataLoader workers."""
    import os

    os.environ.setdefault("MULTIPOS_CACHE", str(REPO / ".cache"))
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from multipos.config_resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", ["experiment=two_tower", "data.batch_size=64", "data.source.ordering=given",
                                f"data.num_workers={workers}"])
    dm = instantiate(cfg.data, seed=0)
    dm.setup("fit")
    return dm


def loader(dm, keep_groups: bool):
    """The training loader of a stage whose module does (not) need the groups (:class:`multipos.data.StageInputs`)."""
    from dataclasses import replace

    dm.set_inputs(replace(dm.inputs, batch_groups=keep_groups))
    return dm.train_dataloader()


def tensors(batch) -> list[torch.Tensor]:
    return [*batch.query.values(), *(batch.passages or {}).values(), batch.positive_mask, batch.negative_mask]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--wait-ms", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from multipos.model.transfer import _copy_into, pinned

    cuda = torch.cuda.is_available()
    if cuda:
        stage = {"torch": lambda t: t.pin_memory(), "one_thread": pinned}
    else:
        stage = {"torch": torch.Tensor.clone,
                 "one_thread": lambda t: _copy_into(t, lambda shape, dtype: torch.empty(shape, dtype=dtype))}
    res = {**machine_info(), "bench": "batch_receive", "data": "nfcorpus two_tower, B=64 x G=8, 128 tokens",
           "workers": args.workers, "wait_ms": args.wait_ms, "rounds": args.rounds,
           "staging": "pinned (CUDA)" if cuda else "ordinary memory (no accelerator)"}
    dm = data_module(args.workers)
    loaders = {"groups": loader(dm, True), "no_groups": loader(dm, False)}
    its = {k: iter(v) for k, v in loaders.items()}
    first = {k: next(it) for k, it in its.items()}  # the workers start
    assert first["groups"].groups and first["no_groups"].groups is None
    judged = [len(g.judged) for g in first["groups"].groups]
    receive = {k: [] for k in its}
    wait = args.wait_ms / 1000
    for r in range(args.rounds):
        for kind in (list(its) if r % 2 == 0 else list(its)[::-1]):
            time.sleep(wait)
            start = time.perf_counter()
            batch = next(its[kind], None)
            if batch is None:  # an epoch ended: the next one, from the same (persistent) workers
                its[kind] = iter(loaders[kind])
                continue
            receive[kind].append(time.perf_counter() - start)
            judged += [len(g.judged) for g in batch.groups or ()]
    staged = {k: [] for k in stage}
    batch = next(its["no_groups"])
    time.sleep(1.0)  # the workers have refilled their queues and are idle
    for r in range(args.rounds):
        for side in (list(stage) if r % 2 == 0 else list(stage)[::-1]):
            time.sleep(wait)
            start = time.perf_counter()
            for t in tensors(batch):
                stage[side](t)
            staged[side].append(time.perf_counter() - start)
    res["judged_per_query"] = round(statistics.mean(judged), 1)  # what each group carries: its judged passages
    for kind, v in receive.items():
        res[f"receive_s_{kind}"] = round(statistics.median(v), 5)
    for side, v in staged.items():
        v = sorted(v)
        res[f"stage_s_{side}"] = round(statistics.median(v), 5)
        res[f"stage_s_{side}_p90"] = round(v[int(0.9 * (len(v) - 1))], 5)
    res["receive_groups_vs_no_groups"] = round(res["receive_s_groups"] / res["receive_s_no_groups"], 2)
    res["stage_torch_vs_one_thread"] = round(res["stage_s_torch"] / res["stage_s_one_thread"], 2)
    append_result(args.out, res)


if __name__ == "__main__":
    main()
