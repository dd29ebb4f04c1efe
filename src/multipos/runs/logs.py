"""A run's training logs: its Lightning CSV logs (one per stage in a multi-stage run: ``csv/metrics.csv`` or
``csv/stage1/metrics.csv``, ``csv/stage2/…``, each stage counting its steps from 0) joined into one list with a
``stage`` number and a ``global_step`` that continues across stages (:func:`training_log`), and one series of it
(:func:`series`) for the notebooks' plots."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

__all__ = ["stage_logs", "training_log", "series"]


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
