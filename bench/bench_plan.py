"""Predicted against actual wall time of ``make train`` and ``make train DATA=...``, from a fresh clone.

Both commands print a plan with an estimate before they start (:mod:`multipos.runs.plan`, the own-data path's
``_estimate``): a few timed batches of encoding and of training on this machine, scaled by the job's counts
(:mod:`multipos.runs.speed`). This benchmark clones the repository at HEAD into a temporary folder (the virtual
environment linked, not reinstalled), runs the command there with an empty cache (so every corpus is encoded, as on a
fresh machine), reads the estimate the command printed ("expected wall time: about N min") and times the whole
command. One JSON line per command in ``bench/results/plan_vs_actual.jsonl``: the command, predicted and actual
minutes, their ratio, the precision, the machine (``bench/common.py``), and the closing summary the command printed
(each test set's nDCG@10 over the seeds).
With ``--data`` the line also holds the recipe search (trials finished and pruned, the chosen recipe and its dev
nDCG@10, from the command's ``search/trials.json`` and ``recipe.json``) and its test summary (``summary.txt``), and
``bench/results/recipe_search.md`` is rendered from every such line: pruned against unpruned searches per budget.

    python bench/bench_plan.py                                   # make train (3 seeds), about 15-25 min on 2 cores
    python bench/bench_plan.py --data <BEIR folder> --budget 10  # make train DATA=... BUDGET=10
    python bench/bench_plan.py --data <BEIR folder> --budget 10 --no-pruning   # every search trial to its end
    MULTIPOS_BF16=0 python bench/bench_plan.py                   # the fp32 path (a CPU without native bf16)

Start-up, BM25 and scoring are not in the estimate (it says so), so actual / predicted above 1 is expected; the
line records by how much. Run nothing else on the machine meanwhile: other jobs slow the command, not the estimate.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, append_result, machine_info  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "plan_vs_actual.jsonl"
ESTIMATE = re.compile(r"expected wall time: about (\d+(?:\.\d+)?) min")


def predicted_minutes(output: str) -> float | None:
    """The minutes of the first ``expected wall time: about N min`` line in ``output`` (None when none is printed)."""
    match = ESTIMATE.search(output)
    return float(match.group(1)) if match else None


def summary_block(output: str) -> list[str]:
    """The closing summary the command printed (:func:`multipos.report.summary.format_summary`): its last
    ``mean ± sd over seeds`` header and the indented line of each test set after it (``[]`` when none was printed)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if "mean ± sd over seeds" in line]
    if not starts:
        return []
    block = [lines[starts[-1]]]
    for line in lines[starts[-1] + 1:]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    return block


def run_make(clone: Path, make_args: list[str], env: dict, log: Path) -> tuple[float, str, int]:
    """Run ``make -o .venv/.installed train <make_args>`` in ``clone`` (the linked environment counts as installed),
    teeing its output to ``log`` → (wall seconds, output, exit status)."""
    start = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(["make", "-o", ".venv/.installed", "train", *make_args], cwd=clone, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            f.write(line)
            lines.append(line)
        status = proc.wait()
    return time.perf_counter() - start, "".join(lines), status


def make_args(data: str | None, budget: float, seeds: str, no_pruning: bool, out: Path) -> tuple[list[str], list[str]]:
    """The ``make train`` arguments → (as recorded in the results line, as run). With ``data`` the run also passes
    ``--out out`` through ``ARGS`` so that the own-data command writes into the clone being timed (an editable install
    linked from elsewhere would otherwise write under that install's ``multirun/``); the recorded command leaves the
    temporary folder out."""
    common = [f"SEEDS={seeds}"]
    if not data:
        return common, common
    common += [f"DATA={Path(data).resolve()}", f"BUDGET={budget:g}"]
    flags = " --no-pruning" if no_pruning else ""
    return common + ([f"ARGS={flags.strip()}"] if flags else []), common + [f"ARGS=--out {out}{flags}"]


def search_record(out: Path) -> dict:
    """The own-data command's recipe search and result, read from its output folder ``out`` (its ``--out``):
    ``trials``, ``pruned``, ``recipe``, ``best_dev`` (dev nDCG@10 of the chosen trial), ``test_summary`` (the text
    of ``summary.txt``). Empty when the command wrote no such folder."""
    import json

    if not out.is_dir():
        return {}
    trials = json.loads((out / "search" / "trials.json").read_text()) if (out / "search" / "trials.json").is_file() \
        else {}
    rows = trials.get("trials", []) if isinstance(trials, dict) else trials
    finished = [t for t in rows if t.get("state") != "pruned" and t.get("value") is not None]
    best = max(finished, key=lambda t: t["value"], default=None)
    return {"trials": len(rows), "pruned": sum(t.get("state") == "pruned" for t in rows),
            "trial_epochs": [t.get("epochs") for t in rows],
            "recipe": json.loads((out / "recipe.json").read_text()) if (out / "recipe.json").is_file() else None,
            "best_dev": best["value"] if best else None,
            "test_summary": (out / "summary.txt").read_text().strip() if (out / "summary.txt").is_file() else None}


TEST_MEAN = re.compile(r"own_test\s+(\d\.\d+) ± (\d\.\d+)")


def render_search(results: Path, out: Path) -> None:
    """``out`` (Markdown): one row per ``make train DATA=...`` line of ``results`` (the JSONL this script appends):
    data, budget, pruning, trials finished / pruned, the chosen recipe, its dev nDCG@10, test nDCG@10 over the
    seeds and the wall time."""
    import json

    lines = ["# Recipe search: successive halving against every trial to its end", "",
             "Written by `bench/bench_plan.py --data ...` from `plan_vs_actual.jsonl`: each row is one fresh-clone run "
             "of `make train DATA=<folder> BUDGET=<min>` (search, then the chosen recipe with each seed). Dev: "
             "nDCG@10 of the chosen trial (seed 42); test: nDCG@10 mean ± sd over the seeds.", "",
             "| data | budget (min) | pruning | trials | pruned | chosen recipe | dev nDCG@10 | test nDCG@10 | "
             "wall (min) | machine | commit |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for raw in results.read_text().splitlines():
        r = json.loads(raw)
        if r.get("bench") != "plan_vs_actual" or "DATA=" not in r.get("command", "") or "trials" not in r:
            continue
        data = Path(re.search(r"DATA=(\S+)", r["command"]).group(1)).name
        budget = re.search(r"BUDGET=(\S+)", r["command"]).group(1)
        pruning = "off" if "--no-pruning" in r["command"] else "on"
        test = TEST_MEAN.search(r.get("test_summary") or "")
        recipe = ", ".join(f"{k}={v}" for k, v in r["recipe"].items()) if isinstance(r.get("recipe"), dict) else "—"
        dev = f"{r['best_dev']:.4f}" if r.get("best_dev") is not None else "—"
        lines.append(f"| {data} | {budget} | {pruning} | {r['trials']} | {r['pruned']} | {recipe} | {dev} | "
                     f"{f'{test.group(1)} ± {test.group(2)}' if test else '—'} | {r['actual_min']} | "
                     f"{r.get('cpu') or r.get('gpu')} ({r.get('cpus')} cores, bf16 env {r.get('bf16_env')}) | "
                     f"{r.get('commit')} |")
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="a BEIR folder or Tevatron .jsonl: make train DATA=... instead of the main job")
    ap.add_argument("--budget", type=float, default=20, help="BUDGET= minutes of recipe search (with --data)")
    ap.add_argument("--no-pruning", action="store_true", help="with --data: the search trains every trial to its end")
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--log", type=Path, help="also keep the command's whole output here")
    ap.add_argument("--keep", type=Path, help="copy the clone's multirun/ (run folders, trained models) here")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        clone = Path(tmp) / "clone"
        own_out = clone / "multirun" / "own_data-bench"
        recorded, run_args = make_args(args.data, args.budget, args.seeds, args.no_pruning, own_out)
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        (clone / ".venv").symlink_to(REPO / ".venv")
        env = {**os.environ, "MULTIPOS_CACHE": str(Path(tmp) / "cache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        wall, output, status = run_make(clone, run_args, env, Path(tmp) / "make.log")
        search = search_record(own_out) if args.data else {}
        if args.keep and (clone / "multirun").is_dir():
            shutil.copytree(clone / "multirun", args.keep, dirs_exist_ok=True)
    if args.log:
        args.log.write_text(output)
    predicted = predicted_minutes(output)
    summary = summary_block(output)
    res = {"bench": "plan_vs_actual", **machine_info(), "command": "make train " + " ".join(recorded),
           "bf16_env": os.environ.get("MULTIPOS_BF16"), "exit_status": status, "predicted_min": predicted,
           "actual_min": round(wall / 60, 2),
           "actual_over_predicted": round(wall / 60 / predicted, 2) if predicted else None,
           "summary": summary, **search}
    append_result(args.out, res)
    if args.data:
        render_search(args.out, args.out.with_name("recipe_search.md"))
    return res


if __name__ == "__main__":
    main()
