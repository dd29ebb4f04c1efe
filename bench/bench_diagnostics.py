"""Cost of the gradient diagnostics (:mod:`multipos.training.diagnostics`) against one training step on the same batch.

``python bench/bench_diagnostics.py [--queries 8 --group 4 --passage-tokens 64]`` (quick size by default) builds one
batch of B queries × G passages (M = G/2 positives each, every other column a negative) for all-MiniLM-L6-v2 (from
the assets), times a training step (forward, LSEPair, backward, AdamW; fp32) and the callback's computation
(:func:`~multipos.training.diagnostics.batch_diagnostics` for the trained objective plus JointLH / SumMargLH, autograd
on
the score matrix only), each the median of ``--repeat`` runs, and appends one line with machine info and date to
``bench/results/diagnostics.txt``. The diagnostics of a paper-size score matrix (128 × 1024) are timed too.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import machine_info

OUT = Path(__file__).resolve().parent / "results" / "diagnostics.txt"


def median_seconds(fn, repeat: int) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs after one warm-up run (seconds)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def masks(queries: int, group: int, positives: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks [B, B·G]: the first ``positives`` columns of each query's own group are its positives."""
    pos = torch.zeros(queries, queries * group, dtype=torch.bool)
    for i in range(queries):
        pos[i, i * group: i * group + positives] = True
    return pos, ~pos


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="all-MiniLM-L6-v2")
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--passage-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)

    from multipos.losses import ContrastiveLoss
    from multipos.model.encoder import DualEncoder
    from multipos.training.diagnostics import DEFAULT_OBJECTIVES, batch_diagnostics

    model = DualEncoder(args.model, pooling="mean", normalize=True, temperature=0.05, attention_dropout=0.0)
    model.train()
    b, g = args.queries, args.group
    pos, neg = masks(b, g, max(1, g // 2))
    words = "statin cholesterol artery heart dietary fiber vitamin bone density cancer risk sleep".split()
    passages = [" ".join(words[(i + j) % len(words)] for j in range(args.passage_tokens)) for i in range(b * g)]
    q_tok = model.tokenize([" ".join(words[i % 5: i % 5 + 6]) for i in range(b)], "query", max_length=16)
    p_tok = model.tokenize(passages, "passage", max_length=args.passage_tokens)
    loss_fn = ContrastiveLoss("lsepair")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    objectives = list(dict.fromkeys(["lsepair", *DEFAULT_OBJECTIVES]))
    held = {}

    def step():
        scores = model.score(model.encode_queries(q_tok), model.encode_passages(p_tok))
        loss = loss_fn(scores, pos, neg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        held["scores"] = scores.detach()

    step_s = median_seconds(step, args.repeat)
    diag_s = median_seconds(lambda: batch_diagnostics(held["scores"], pos, neg, objectives), max(args.repeat, 20))
    big_pos, big_neg = masks(128, 8, 4)
    big = torch.randn(128, 1024) * 5
    big_s = median_seconds(lambda: batch_diagnostics(big, big_pos, big_neg, objectives), 10)
    info = machine_info()
    line = (f"{info['time']}  {info['machine']} {info['cpus']} cpus, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads  {args.model} fp32 B={b} G={g} M={max(1, g // 2)} "
            f"passage {args.passage_tokens} tok: train step {step_s:.3f} s, diagnostics ({', '.join(objectives)}) "
            f"{diag_s * 1e3:.2f} ms = {100 * diag_s / step_s:.3f} % of the step; "
            f"diagnostics of a 128 x 1024 score matrix {big_s * 1e3:.1f} ms\n")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("a") as f:
        f.write(line)
    print(line, end="")
    return line


if __name__ == "__main__":
    main()
