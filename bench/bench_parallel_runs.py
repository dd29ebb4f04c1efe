"""Runs at a time on a CPU: query-side training steps per second of k one-thread processes side by side
(``parallel_jobs=k``) against one process with every core (the default launcher).

Each worker process trains the query encoder of all-MiniLM-L6-v2 over a frozen index (packed batches, row-sparse
word-embedding gradients, fused AdamW, fp32 or ``--bf16`` autocast) for ``--steps`` timed steps after two untimed
ones, and prints its seconds per step. ``--step study``: a query-side study run's step (``scale=cpu_query_side``:
B=16 queries of up to 32 tokens, G=8 passages looked up per query, JointLH); ``--step main``: ``make train``'s step
(B=64, every corpus passage a candidate, JointLH, in chunks; :mod:`multipos.training.corpus_candidates`). Each round
runs the
arrangements one after the other (one process with ``--threads`` threads; then, for each k of ``--side-by-side``, k
one-thread processes at once), so drift in machine load falls on all of them; the result is the median over rounds
of the ratio of steps per second. Target: ≥ 1.2 for two (the parallel launcher is worth its extra memory). CPU only:
on a GPU it prints a note and writes nothing. Appends to ``bench/results/speed.jsonl``.

    python bench/bench_parallel_runs.py [--rounds 3 --steps 30 --step study|main --side-by-side 2,3 --bf16]
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


def worker(steps: int, threads: int, kind: str = "study", bf16: bool = False) -> None:
    """Train ``steps`` query-side steps of ``kind`` (``study`` or ``main``) with ``threads`` torch threads; print
    {"s_per_step": …} as JSON."""
    import torch

    torch.set_num_threads(threads)
    from bench_query_side import group_lookup_loss, lookup_groups
    from common import bench_setup

    from multipos.losses import compute
    from multipos.model.encoder import DualEncoder
    from multipos.training.corpus_candidates import corpus_scores, corpus_targets
    from multipos.training.embedding_gradients import RowSparseEmbeddingGrads

    device, _, data = bench_setup()
    ids = list(data.passages)
    row = {p: i for i, p in enumerate(ids)}
    rng = random.Random(0)
    B, G = (16, 8) if kind == "study" else (64, 2)
    model = DualEncoder(data.model, query_max_length=32, passage_max_length=128)
    model.freeze_passage_encoder()
    model.train()
    model.pack_sequences = 128  # as training on a CPU does (conf/train.yaml)
    RowSparseEmbeddingGrads([model.query_encoder])  # as RetrieverModule.on_fit_start does on a CPU
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-5, fused=True)
    index = torch.nn.functional.normalize(torch.randn(len(ids), 384, generator=torch.Generator().manual_seed(0)),
                                          dim=-1)

    def loss_of(q, groups):
        if kind == "study":
            return group_lookup_loss(model, q, groups, index, row)
        targets = corpus_targets([g.passage_ids[:1] for g in groups], [g.judged for g in groups], row)
        scores, pos, neg = corpus_scores(q, index, model.temperature, targets, 65536)
        return compute("jointlh", scores, pos, neg).mean()

    def step(j: int) -> None:
        groups = lookup_groups(data, ids, rng, (j * B) % (len(data.queries) - B), B, G)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model.encode_queries(model.tokenize([g.query for g in groups], "query")), groups)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    for j in range(2):
        step(j)
    start = time.perf_counter()
    for j in range(2, steps + 2):
        step(j)
    print(json.dumps({"s_per_step": (time.perf_counter() - start) / steps}), flush=True)


def _spawn(steps: int, threads: int, kind: str, bf16: bool) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, __file__, "--worker", "--steps", str(steps), "--threads", str(threads),
                             "--step", kind, *(["--bf16"] if bf16 else [])],
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
    ap.add_argument("--step", choices=("study", "main"), default="study",
                    help="study: B=16, G=8 looked up; main: make train's B=64 over every corpus passage")
    ap.add_argument("--side-by-side", default="2", help="comma-separated numbers of one-thread processes at once")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (make train where bf16 is native)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.worker:
        return worker(args.steps, args.threads, args.step, args.bf16)
    import torch

    if torch.cuda.is_available():
        print("bench_parallel_runs: a CPU benchmark (runs sharing the cores); nothing measured on a GPU machine")
        return
    from common import append_result, machine_info

    counts = [int(k) for k in args.side_by_side.split(",")]
    start = time.perf_counter()
    one, many, ratios = [], {k: [] for k in counts}, {k: [] for k in counts}
    for _ in range(args.rounds):
        s_one = _s_per_step(_spawn(args.steps, args.threads, args.step, args.bf16))
        one.append(s_one)
        for k in counts:
            procs = [_spawn(args.steps, 1, args.step, args.bf16) for _ in range(k)]
            s_k = [_s_per_step(p) for p in procs]
            many[k].append(s_k)
            ratios[k].append(sum(1 / s for s in s_k) / (1 / s_one))  # steps per second, k processes vs one
    step = ("query-side, B=16, G=8 looked up, JointLH" if args.step == "study"
            else "make train's: B=64, every corpus passage a candidate, JointLH")
    res = {**machine_info(), "bench": "parallel_runs", "device": "cpu", "precision": "bf16" if args.bf16 else "fp32",
           "model": "all-MiniLM-L6-v2",
           "step": step + ", packed, row-sparse embedding gradients, clipping, fused AdamW",
           "rounds": args.rounds, "steps": args.steps, "threads_one_process": args.threads,
           "targets": {"two_one_thread_vs_one_process": 1.2},
           "s_per_step_one_process": [round(s, 4) for s in one],
           "steps_per_s_one_process": round(statistics.median(1 / s for s in one), 3)}
    for k in counts:
        name = {2: "two", 3: "three"}.get(k, str(k))
        res[f"s_per_step_{name}_processes"] = [[round(s, 4) for s in group] for group in many[k]]
        res[f"steps_per_s_{name}_processes"] = round(statistics.median(sum(1 / s for s in g) for g in many[k]), 3)
        res[f"{name}_one_thread_vs_one_process"] = round(statistics.median(ratios[k]), 3)
    res["wall_s"] = round(time.perf_counter() - start, 1)
    append_result(args.out, res)


if __name__ == "__main__":
    main()
