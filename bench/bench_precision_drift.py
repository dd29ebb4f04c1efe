"""How far a cell's nDCG@10 moves with the encoding precision and with the CPU: the bound under which a difference
between two tables is not a difference.

Trains the same Table 2 query-side cells (``experiment=table2_homogeneous scale=cpu_query_side``; default SingleLH,
JointLH, LSEPair × seeds 42, 43) twice on this machine, with the frozen index and the evaluation encoded in fp32
(``MULTIPOS_BF16=0``) and in bf16 (``MULTIPOS_BF16=1``, where the CPU has native bf16; the query encoder trains in
fp32 in both, ``scale.query_side_precision``), two runs side by side. It then compares each cell's NFCorpus test
nDCG@10 across the two precisions, and each against the same cell (objective, seed) of the archived Table 2
query-side sweep in ``experiments/sweeps/cpu-query_side-table2-table8-figure-2026-11-26/`` (trained on an AMD
EPYC, bf16 encoding), whose CPU and precision it reads from the runs. Appends one JSON line to
``bench/results/drift.jsonl``: per cell the three values, and the largest and mean absolute differences; then
writes the newest record as a table to ``bench/results/drift.md`` (``--table`` does only that).

    python bench/bench_precision_drift.py [--objectives singlelh,jointlh,lsepair] [--seeds 42,43] [--out multirun/drift]
    python bench/bench_precision_drift.py --table
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "drift.jsonl"
TABLE = RESULTS.with_suffix(".md")
ARCHIVE = ROOT / "experiments" / "sweeps" / "cpu-query_side-table2-table8-figure-2026-11-26"
SET, METRIC = "nfcorpus_test", "ndcg@10"


def train(objectives: str, seeds: str, sweep: Path, bf16: bool) -> float:
    """The Table 2 query-side cells into ``sweep`` with bf16 or fp32 encoding; returns the wall time in seconds."""
    env = {**os.environ, "MULTIPOS_BF16": "1" if bf16 else "0"}
    start = time.time()
    subprocess.run([sys.executable, "train.py", "-m", "experiment=table2_homogeneous", "scale=cpu_query_side",
                    f"loss={objectives}", f"seed={seeds}", "parallel_jobs=2", f"hydra.sweep.dir={sweep}",
                    "trainer.enable_progress_bar=false"], cwd=ROOT, env=env, check=True)
    return time.time() - start


def cells(sweep: Path) -> dict[str, dict]:
    """{``loss=<o>,seed=<s>``: {"value", "device", "precision"}} of the finished runs under ``sweep``."""
    from multipos.report.setting import run_setting

    out = {}
    for metrics in sorted(sweep.rglob("metrics.json")):
        run = metrics.parent
        info = json.loads((run / "run_info.json").read_text())
        device, _, encoding = run_setting(info, run)
        out[run.name] = {"value": json.loads(metrics.read_text())[SET][METRIC], "device": device,
                         "encoding": encoding}
    return out


def archived(names: set[str]) -> dict[str, dict]:
    """The archived Table 2 query-side cells named in ``names`` (their encoding precision from ``spec.json``)."""
    return {name: cell for name, cell in cells(ARCHIVE / "table2_homogeneous-cpu-query_side").items()
            if name in names}


def write_table(record: dict) -> str:
    """``bench/results/drift.md``: the record's cells and the differences, four decimals."""
    f = "{:.4f}".format
    lines = [f"Table: NFCorpus test nDCG@10 of Table 2 query-side cells, {record['time']}, trained on "
             f"{record['device']} (training fp32; frozen index and evaluation encoded in fp32 or bf16) and, archived, "
             f"on {record['cells'][0]['archived_device']} ({record['cells'][0]['archived_encoding']} encoding)", "",
             "| cell | fp32 | bf16 | archived | bf16 − fp32 | bf16 − archived |", "|:---|---:|---:|---:|---:|---:|"]
    for c in record["cells"]:
        lines.append(f"| {c['cell']} | {f(c['fp32'])} | {f(c['bf16'])} | {f(c['archived'])} | "
                     f"{c['bf16'] - c['fp32']:+.4f} | {c['bf16'] - c['archived']:+.4f} |")
    lines += ["", f"Largest absolute difference: between precisions {f(record['precision_max_abs'])} (mean "
              f"{f(record['precision_mean_abs'])}); between CPUs {f(record['cpu_max_abs'])} (mean "
              f"{f(record['cpu_mean_abs'])}). Written by `python bench/bench_precision_drift.py` from the newest "
              "record of drift.jsonl."]
    text = "\n".join(lines) + "\n"
    TABLE.write_text(text, encoding="utf-8")
    return text


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objectives", default="singlelh,jointlh,lsepair")
    ap.add_argument("--seeds", default="42,43")
    ap.add_argument("--out", type=Path, default=ROOT / "multirun" / "drift")
    ap.add_argument("--table", action="store_true", help="only write drift.md from the newest record")
    args = ap.parse_args(argv)
    if args.table:
        record = json.loads(RESULTS.read_text(encoding="utf-8").splitlines()[-1])
        print(write_table(record))
        return record
    walls = {p: train(args.objectives, args.seeds, args.out / p, p == "bf16") for p in ("fp32", "bf16")}
    fp32, bf16 = cells(args.out / "fp32"), cells(args.out / "bf16")
    other = archived(set(fp32))
    rows, precision_d, cpu_d = [], [], []
    for name in sorted(fp32):
        row = {"cell": name, "fp32": fp32[name]["value"], "bf16": bf16.get(name, {}).get("value"),
               "archived": other.get(name, {}).get("value"), "archived_device": other.get(name, {}).get("device"),
               "archived_encoding": other.get(name, {}).get("encoding")}
        if row["bf16"] is not None:
            precision_d.append(abs(row["bf16"] - row["fp32"]))
        if row["archived"] is not None and row["bf16"] is not None:
            cpu_d.append(abs(row["bf16"] - row["archived"]))
        rows.append(row)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "bench": "precision_drift", "set": SET, "metric": METRIC,
        "device": next(iter(fp32.values()))["device"], "study": "table2_homogeneous scale=cpu_query_side",
        "cells": rows, "wall_s": {k: round(v, 1) for k, v in walls.items()},
        "precision_max_abs": max(precision_d), "precision_mean_abs": statistics.mean(precision_d),
        "cpu_max_abs": max(cpu_d) if cpu_d else None, "cpu_mean_abs": statistics.mean(cpu_d) if cpu_d else None,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(write_table(record))
    return record


if __name__ == "__main__":
    main()
