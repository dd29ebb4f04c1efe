"""The Lightning loop's host cost over a bare PyTorch loop, with the module calling ``self.log`` at every step
against only on the steps a logger writes (:meth:`multipos.training.module.RetrieverModule._logs_this_step`, since
2026-11-26).

A GPU step hides none of the host's per-step work when the loop is timed step by step, so what Lightning adds to each
step (hooks, the precision plugin, ``self.log``) is measured here on the CPU with a model small enough for that work
to show: a 2-layer 64-dim random BERT at B=4 × G=2 (:func:`common._tiny`), one thread, bf16 autocast where native (as
the trainer), over the same collated batches (:func:`sides.lightning_loop` with a list of batches; the bare loop:
:func:`sides.bare_step`). The trainer logs every ``--log-every`` steps (10, a GPU's interval). Each round times the
bare loop, the Lightning loop logging every step (the module before 2026-11-26) and the Lightning loop as shipped, one
after the other, so drift in machine load falls on all three; the results are medians over rounds of the median step.
``logged_steps_only_vs_every_step`` > 1: the change made the loop faster. Appends to ``bench/results/speed.jsonl``.

    python bench/bench_loop_logging.py [--rounds 6 --steps 150 --log-every 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from common import _tiny, append_result, interleaved, machine_info
from sides import bare_step, cycled, data_module, lightning_loop

OUT = Path(__file__).resolve().parent / "results" / "speed.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=150, help="timed steps of each loop in a round")
    ap.add_argument("--log-every", type=int, default=10, help="trainer.log_every_n_steps")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from multipos.hardware import native_bf16

    device, bf16 = torch.device("cpu"), native_bf16()
    data = _tiny(Path(tempfile.mkdtemp(prefix="multipos-bench-model-")))
    dm = data_module(data, batch_size=4, group_size=2, query_len=16, passage_len=32)
    dm.num_workers = 0
    batches = []
    for batch in dm.train_dataloader():
        batches.append(batch)
        if len(batches) == 20:
            break
    bare = {"bare": bare_step(data, device, bf16, group_size=2)}
    overrides = (f"trainer.log_every_n_steps={args.log_every}",)
    rounds = {"bare": [], "every_step": [], "logged_steps_only": []}
    for _ in range(args.rounds):
        rounds["bare"].append(interleaved(bare, cycled(batches, args.steps))["bare"])
        for name, every in (("every_step", True), ("logged_steps_only", False)):
            rounds[name].append(statistics.median(lightning_loop(data, batches, device, args.steps,
                                                                 overrides=overrides, log_every_step=every)))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    append_result(args.out, {
        **machine_info(), "bench": "loop_logging", "model": "tiny random BERT (2 layers, 64 dims)", "batch": 4,
        "group": 2, "precision": "bf16 autocast" if bf16 else "fp32", "log_every_n_steps": args.log_every,
        "rounds": args.rounds, "steps": args.steps,
        "step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "rounds_ms": {k: [round(x * 1e3, 3) for x in v] for k, v in rounds.items()},
        "loop_cost_ms": {k: round((med[k] - med["bare"]) * 1e3, 3) for k in ("every_step", "logged_steps_only")},
        "logged_steps_only_vs_every_step": round(med["every_step"] / med["logged_steps_only"], 3),
        "lightning_vs_bare": {k: round(med["bare"] / med[k], 3) for k in ("every_step", "logged_steps_only")},
    })


if __name__ == "__main__":
    main()
