"""Two runs at a time on a CPU: query-side training steps per second of two one-thread processes side by side
(``launcher=parallel``) against one process with every core (the default launcher).

Each worker process trains the query encoder of all-MiniLM-L6-v2 over a frozen index as a query-side study run does
(``fine_tuning=query_side``: B=16 queries of up to 32 tokens, G=8 passages looked up per query, JointLH, fp32, fused
AdamW) for ``--steps`` timed steps after two untimed ones, and prints its seconds per step. Each round runs the two
arrangements one after the other (one process with ``--threads`` threads; two processes with one thread each, at
once), so drift in machine load falls on both; the result is the median over rounds of the ratio of steps per
second. Target: ≥ 1.2 (the parallel launcher is worth its extra memory). CPU only: on a GPU it prints a note and
writes nothing. Appends to ``bench/results/speed.jsonl``.

    python bench/bench_parallel_runs.py [--rounds 3 --steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


def worker(steps: int, threads: int) -> None:
    """Train ``steps`` query-side steps with ``threads`` torch threads; print {"s_per_step": …} as JSON."""
    import torch

    torch.set_num_threads(threads)
    from bench_query_side import group_lookup_loss, lookup_groups
    from common import bench_setup
    from multipos.model import DualEncoder

    device, _, data = bench_setup()
    ids = list(data.passages)
    row = {p: i for i, p in enumerate(ids)}
    rng = random.Random(0)
    B, G = 16, 8
    model = DualEncoder(data.model, query_max_length=32, passage_max_length=128)
    model.freeze_passage_encoder()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-5, fused=True)
    index = torch.nn.functional.normalize(torch.randn(len(ids), 384, generator=torch.Generator().manual_seed(0)), dim=-1)

    def step(j: int) -> None:
        groups = lookup_groups(data, ids, rng, (j * B) % (len(data.queries) - B), B, G)
        opt.zero_grad()
        q = model.encode_queries(model.tokenize([g.query for g in groups], "query"))
        group_lookup_loss(model, q, groups, index, row).backward()
        opt.step()

    for j in range(2):
        step(j)
    start = time.perf_counter()
    for j in range(2, steps + 2):
        step(j)
    print(json.dumps({"s_per_step": (time.perf_counter() - start) / steps}), flush=True)


def _spawn(steps: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, __file__, "--worker", "--steps", str(steps), "--threads", str(threads)],
                            env=env, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent)


def _s_per_step(p: subprocess.Popen) -> float:
    out, _ = p.communicate(timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"benchmark worker failed (exit {p.returncode})")
    return json.loads(out.strip().splitlines()[-1])["s_per_step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="threads of the one-process side")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.worker:
        return worker(args.steps, args.threads)
    import torch

    if torch.cuda.is_available():
        print("bench_parallel_runs: a CPU benchmark (runs sharing the cores); nothing measured on a GPU machine")
        return
    from common import append_result, machine_info

    start = time.perf_counter()
    one, two, ratios = [], [], []
    for _ in range(args.rounds):
        s_one = _s_per_step(_spawn(args.steps, args.threads))
        pair = [_spawn(args.steps, 1), _spawn(args.steps, 1)]
        s_two = [_s_per_step(p) for p in pair]
        one.append(s_one)
        two.append(s_two)
        ratios.append(sum(1 / s for s in s_two) / (1 / s_one))  # steps per second, two processes vs one
    res = {**machine_info(), "bench": "parallel_runs", "device": "cpu", "precision": "fp32", "model": "all-MiniLM-L6-v2",
           "step": "query-side, B=16, G=8 looked up, JointLH, fused AdamW", "rounds": args.rounds, "steps": args.steps,
           "threads_one_process": args.threads, "targets": {"two_one_thread_vs_one_process": 1.2},
           "s_per_step_one_process": [round(s, 4) for s in one],
           "s_per_step_two_processes": [[round(s, 4) for s in pair] for pair in two],
           "two_one_thread_vs_one_process": round(statistics.median(ratios), 3),
           "wall_s": round(time.perf_counter() - start, 1)}
    append_result(args.out, res)


if __name__ == "__main__":
    main()
