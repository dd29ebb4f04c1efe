"""DDP on 2 CPU processes: throughput vs 1 process, and peak memory with and without GradCache at B=128 × G=8.

:func:`ddp_and_grad_cache` (called by ``bench_speed.py``) starts this file as ``--worker`` subprocesses, one
Lightning ``fit`` each (``trainer=ddp`` from ``conf/trainer/ddp.yaml`` for 2 processes, with gloo on a CPU;
Lightning's launcher starts the second rank by re-running the same command). Every rank writes its step
times and peak resident memory (``VmHWM``) to a JSON file. It returns ``{"status": "not available: ..."}``
and no numbers while the checkout lacks ``trainer=ddp`` or ``module.grad_cache_chunk_size``.

Sizes: throughput with B = 8 queries per process × G = 4, 32/64-token queries/passages (quick; full on a GPU:
B = 64, G = 8, 32/128 tokens), 4 timed steps after one untimed; memory at B = 128 × G = 8 (quick: 8/16-token
queries/passages; full: 32/128), one step, without GradCache and with GradCache chunks of 16 rows (full: 32); its
``first_step_s`` is that step's time, warm-up included.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUICK = {"throughput": dict(batch=8, group=4, query_len=32, passage_len=64, steps=4),
         "memory": dict(batch=128, group=8, query_len=8, passage_len=16, steps=0, chunk=16)}
FULL = {"throughput": dict(batch=64, group=8, query_len=32, passage_len=128, steps=10),
        "memory": dict(batch=128, group=8, query_len=32, passage_len=128, steps=0, chunk=32)}


def missing() -> list[str]:
    """What the measurement needs and this checkout lacks: the ``trainer=ddp`` config and GradCache in the module."""
    out = []
    if not (REPO / "conf" / "trainer" / "ddp.yaml").is_file():
        out.append("conf/trainer/ddp.yaml (trainer=ddp)")
    from multipos.training.module import RetrieverModule

    build = getattr(RetrieverModule, "from_config", RetrieverModule)  # conf/module's target
    if "grad_cache_chunk_size" not in inspect.signature(build).parameters:
        out.append("RetrieverModule(grad_cache_chunk_size=...) (module.grad_cache_chunk_size)")
    return out


def _trainer_config(devices: int, accelerator: str):
    """The project's trainer config (``trainer=ddp`` for several devices, else the default) composed by Hydra."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from multipos.config_resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", [f"trainer={'ddp' if devices > 1 else 'default'}", f"trainer.devices={devices}",
                                f"trainer.accelerator={accelerator}"])
    return OmegaConf.to_container(cfg.trainer, resolve=True)


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB: ``VmHWM`` of ``/proc/self/status``. (``ru_maxrss`` would carry
    the parent's peak over ``fork`` + ``exec``, so every worker started by a big benchmark process would report it.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # pragma: no cover - no /proc


def worker(args) -> None:
    """One ``fit`` of ``args.steps`` + 1 steps; each rank writes ``{out}.rank<r>.json``."""
    import torch
    from common import bench_data, pick_device
    from hydra.utils import instantiate
    from sides import StepTimer, data_module, multipos_model

    from multipos.losses import ContrastiveLoss
    from multipos.training.module import RetrieverModule

    device = pick_device()
    data = bench_data()
    dm = data_module(data, args.batch, args.group, args.query_len, args.passage_len)
    chunk = args.chunk or None
    timer = StepTimer(device)
    cfg = _trainer_config(args.devices, "gpu" if device.type == "cuda" else "cpu")
    cfg.update(max_steps=args.steps + 1, max_epochs=-1, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, logger=False)
    clip = cfg.get("gradient_clip_val")
    if chunk:  # manual optimization: the module clips (as train.py arranges it)
        cfg["gradient_clip_val"] = None
    trainer = instantiate(cfg, callbacks=[timer])
    module = RetrieverModule.from_config(multipos_model(data), ContrastiveLoss("singlelh"), scheduler=None,
                                         grad_cache_chunk_size=chunk, gradient_clip_val=clip if chunk else None)
    trainer.fit(module, datamodule=dm)
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    Path(f"{args.out}.rank{trainer.global_rank}.json").write_text(json.dumps({
        "rank": trainer.global_rank, "world": trainer.world_size, "steps": timer.steps, "first_step": timer.first_step,
        "max_rss_mb": peak_rss_mb(), "max_cuda_mb": peak_gpu}))


def _run(devices: int, size: dict, chunk: int | None, threads: int) -> list[dict]:
    """Start one worker (Lightning starts the other ranks) → every rank's JSON record."""
    out = Path(tempfile.mkdtemp(prefix="multipos-bench-ddp-")) / "result"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--devices", str(devices), "--out", str(out),
           "--chunk", str(chunk or 0), *[f"--{k.replace('_', '-')}={v}" for k, v in size.items() if k != "chunk"]]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO / "bench")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(devices)]


# ---------------------------------------------------------------- DDP / GradCache benchmark (issue 9)
def ddp_and_grad_cache(quick: bool) -> dict:
    """Throughput of 2 CPU processes vs 1 (same per-process batch; queries/s = processes × B / median step; the one
    process runs once with the threads of one of the two processes — data-parallel scaling, ideal 2 — and once with
    all cores — what DDP adds on this machine), and
    peak memory of one process at B=128 × G=8 without and with GradCache. ``{"status": "not available: ..."}``
    (no numbers) while :func:`missing` names anything; ``{"status": "failed: ..."}`` if a run fails."""
    lacking = missing()
    if lacking:
        return {"status": "not available: this checkout has no " + " and no ".join(lacking)}
    sizes = QUICK if quick else FULL
    cores = os.cpu_count() or 2
    res: dict = {"status": "measured", "sizes": sizes}
    try:
        t = sizes["throughput"]
        for n, threads in ((1, 1), (1, cores), (2, max(1, cores // 2))):
            ranks = _run(n, t, None, threads)
            step = statistics.median(ranks[0]["steps"])
            res[f"processes_{n}_threads_{threads}"] = {
                "step_s": round(step, 3), "queries_per_s": round(n * t["batch"] / step, 2),
                "max_rss_mb": [round(r["max_rss_mb"]) for r in ranks]}
        two = res[f"processes_2_threads_{max(1, cores // 2)}"]["queries_per_s"]
        res["throughput_2_vs_1_same_threads_per_process"] = round(
            two / res["processes_1_threads_1"]["queries_per_s"], 3)
        res["throughput_2_vs_1_all_cores"] = round(two / res[f"processes_1_threads_{cores}"]["queries_per_s"], 3)
        m = sizes["memory"]
        for tag, chunk in (("no_grad_cache", None), ("grad_cache", m["chunk"])):
            rank = _run(1, m, chunk, cores)[0]
            res[f"memory_{tag}"] = {"max_rss_mb": round(rank["max_rss_mb"]), "max_cuda_mb": rank["max_cuda_mb"],
                                    "first_step_s": round(rank["first_step"], 2)}
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
        res["status"] = f"failed: {e}"
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", required=True)
    for name in ("devices", "batch", "group", "query-len", "passage-len", "steps", "chunk"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--out", required=True)
    worker(ap.parse_args())
