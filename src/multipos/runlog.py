"""A run directory's training log (Lightning's CSV files, one per stage) and finding the newest run.

A single-stage run logs to ``<run>/csv/metrics.csv``; a multi-stage run (``stages=curriculum``) to
``<run>/csv/stage1/metrics.csv``, ``<run>/csv/stage2/metrics.csv``, … (:func:`multipos.train.build_trainer`), each
stage counting its steps from 0. :func:`training_log` joins them into one list of rows with a ``stage`` number and a
``global_step`` that continues across stages. :func:`find_runs` lists run directories newest first by the time of
their ``run_info.json`` (written when a run starts and when it completes), not by name.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

__all__ = ["find_runs", "latest_run", "stage_logs", "training_log", "series"]


def _run_time(run: Path) -> float:
    """Modification time of the run's ``run_info.json`` (else ``metrics.json``, else the folder), in seconds."""
    for name in ("run_info.json", "metrics.json"):
        if (run / name).is_file():
            return (run / name).stat().st_mtime
    return run.stat().st_mtime


def find_runs(*roots: str | Path, complete: bool = True) -> list[Path]:
    """Run directories (holding ``run_info.json``) under ``roots`` (any depth), newest first.

    ``complete``: only runs whose ``run_info.json`` says ``"status": "complete"``. Missing roots are skipped.
    """
    runs = []
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for info in root.rglob("run_info.json"):
            if complete:
                try:
                    if json.loads(info.read_text()).get("status") != "complete":
                        continue
                except (json.JSONDecodeError, OSError, AttributeError):
                    continue
            runs.append(info.parent)
    return sorted(set(runs), key=lambda r: (-_run_time(r), str(r)))


def latest_run(*roots: str | Path, complete: bool = True) -> Path:
    """The newest run of :func:`find_runs`. Raises FileNotFoundError naming the roots when there is none."""
    runs = find_runs(*roots, complete=complete)
    if not runs:
        raise FileNotFoundError(f"no {'complete ' if complete else ''}run (folder with run_info.json) under "
                                f"{', '.join(map(str, roots))}")
    return runs[0]


def stage_logs(run: str | Path) -> list[Path]:
    """The run's CSV logs in stage order: ``[csv/metrics.csv]`` or ``[csv/stage1/metrics.csv, csv/stage2/…]``.

    Raises FileNotFoundError naming the folder when the run has no CSV log (e.g. ``logger=wandb`` or ``none``).
    """
    folder = Path(run) / "csv"
    staged = sorted(folder.glob("stage*/metrics.csv"), key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    if staged:
        return staged
    if (folder / "metrics.csv").is_file():
        return [folder / "metrics.csv"]
    raise FileNotFoundError(f"{folder}: no metrics.csv nor stage*/metrics.csv (was the run logged with logger=csv?)")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def training_log(run: str | Path) -> list[dict[str, float]]:
    """Every row of the run's CSV logs as ``{column: float}`` (empty cells left out), plus ``stage`` (1, 2, …) and
    ``global_step`` (the row's ``step`` offset by the steps of the earlier stages). Raises as :func:`stage_logs`."""
    rows, offset = [], 0
    for stage, path in enumerate(stage_logs(run), start=1):
        last = -1
        with path.open(newline="") as f:
            for raw in csv.DictReader(f):
                row = {k: v for k, v in ((k, _number(v)) for k, v in raw.items()) if v is not None}
                step = int(row.get("step", 0))
                last = max(last, step)
                rows.append({**row, "stage": stage, "global_step": offset + step})
        offset += last + 1
    return rows


def series(rows: list[dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    """(global steps, values) of the rows that hold a finite ``key``, e.g. ``series(log, "train/loss")``."""
    pts = [(int(r["global_step"]), r[key]) for r in rows if key in r and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]
