"""The run folder: the one owner of what a run directory holds and when it counts as finished.

A run directory (``hydra.run.dir``, or one cell of a study's sweep folder) holds ``.hydra/`` (the composed config),
``run_info.json`` (status ``running`` | ``complete``, config hash, equivalence key, stages, wall time, device,
``resumed_from``), ``metrics.json`` and the result files of :func:`multipos.evaluation.runner.write_results`,
``model/``, ``checkpoints/`` and the Lightning CSV logs. This module is the only reader of ``run_info.json`` and
the only place that decides:

* **finished** (:func:`is_finished`): ``run_info.json`` says ``"status": "complete"`` *and* ``metrics.json`` exists.
  Training skips such a run, equivalent-run reuse copies it, the report tabulates it and the notebooks list it;
  anything else under a sweep is in progress (or was killed) and is resumed by training, left out by the report.
* **what a run computes** (:data:`VOLATILE_KEYS`): the config keys that only name, place or lay out a run. The
  config hash (:func:`multipos.equivalent_runs.config_hash`) leaves them out, and so does the report when it
  groups the seeds of one configuration (:data:`SEED_FREE_KEYS` = these plus ``seed``).

It also reads JSON files with errors that name the file (:func:`read_json`; writes go through
:func:`multipos.atomic.write_json`), finds runs (:func:`find_runs`, :func:`sweep_runs`) and joins a run's CSV training
logs (one per stage in a multi-stage run: ``csv/metrics.csv`` or ``csv/stage1/metrics.csv``, ``csv/stage2/…``, each
stage counting its steps from 0; :func:`training_log` gives one list with a ``stage`` number and a ``global_step``
that continues across stages).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import shutil
from pathlib import Path

from multipos import atomic

log = logging.getLogger(__name__)

__all__ = ["RUN_INFO", "METRICS", "VOLATILE_KEYS", "SEED_FREE_KEYS", "read_json", "read_run_info", "write_run_info",
           "remove_checkpoints", "keep_hydra_files", "restore_hydra_files", "prepare_run_dir", "RESUME_FILENAME", "newest_checkpoint", "is_finished", "find_runs", "latest_run", "sweep_runs", "stage_logs", "training_log", "series"]

RUN_INFO = "run_info.json"
METRICS = "metrics.json"

#: Config keys that do not change what a run computes (paths, report layout, study name and CPU size, resume and
#: reuse switches): left out of the config hash. Hydra's ``override_dirname.exclude_keys`` (conf/hydra/default.yaml)
#: is a different list on purpose: it names *command-line overrides* left out of a sweep cell's folder name, among
#: them ``experiment``, ``scale`` and ``fine_tuning``, which do change the computation but name the sweep folder.
VOLATILE_KEYS = ("paths", "resume", "hydra", "report", "experiment_name", "size", "reuse_equivalent")
#: Keys on which the seeds of one configuration may differ (report rows): :data:`VOLATILE_KEYS` and ``seed``.
SEED_FREE_KEYS = ("seed", *VOLATILE_KEYS)


def read_json(path: str | Path, missing_ok: bool = False) -> object:
    """``json.loads`` of a file. Raises ValueError naming the file for invalid JSON (e.g. an interrupted write by
    a tool other than :mod:`multipos.atomic`), FileNotFoundError naming it when absent unless ``missing_ok`` (then
    None)."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from None


def read_run_info(run_dir: str | Path) -> dict:
    """``<run_dir>/run_info.json`` as a dict; ``{}`` when absent, and (with a warning naming it) when not a valid
    JSON object."""
    path = Path(run_dir) / RUN_INFO
    try:
        info = read_json(path, missing_ok=True)
    except (ValueError, OSError) as exc:
        log.warning("%s ignored: %s", path, exc)
        return {}
    if info is None:
        return {}
    if not isinstance(info, dict):
        log.warning("%s is not a JSON object: ignored", path)
        return {}
    return info


def write_run_info(run_dir: str | Path, info: dict) -> None:
    """Write ``<run_dir>/run_info.json`` atomically (a reader sees the old or the new file, never a part)."""
    atomic.write_json(Path(run_dir) / RUN_INFO, info)


#: Hydra's files of a run (``.hydra/``) and the copy kept of those of the configuration the folder accepted.
HYDRA_DIR, ACCEPTED_HYDRA_DIR = ".hydra", ".hydra.accepted"
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


def keep_hydra_files(run_dir: str | Path) -> None:
    """Copy ``.hydra/*.yaml`` to ``.hydra.accepted/`` (atomically, file by file) once training has accepted the
    folder for this configuration: Hydra rewrites ``.hydra/`` *before* the job starts, also when the job then
    refuses the folder because it holds a run of another configuration (:func:`restore_hydra_files`)."""
    src, dst = Path(run_dir) / HYDRA_DIR, Path(run_dir) / ACCEPTED_HYDRA_DIR
    for name in HYDRA_FILES:
        if (src / name).is_file():
            atomic.write_text(dst / name, (src / name).read_text())


def restore_hydra_files(run_dir: str | Path) -> bool:
    """Put back the ``.hydra/`` files of the configuration the folder holds (from :func:`keep_hydra_files`) after
    Hydra overwrote them with a refused one. Returns False when there is no kept copy (runs from before it)."""
    src, dst = Path(run_dir) / ACCEPTED_HYDRA_DIR, Path(run_dir) / HYDRA_DIR
    kept = [name for name in HYDRA_FILES if (src / name).is_file()]
    for name in kept:
        atomic.write_text(dst / name, (src / name).read_text())
    return bool(kept)


def is_finished(run_dir: str | Path, key: str | None = None) -> bool:
    """The one rule: ``run_info.json`` status ``complete`` and ``metrics.json`` present (and the equivalence key
    ``key`` when given)."""
    info = read_run_info(run_dir)
    return (info.get("status") == "complete" and (Path(run_dir) / METRICS).is_file()
            and (key is None or info.get("equivalence_key") == key))


def sweep_runs(sweep_dir: str | Path) -> tuple[list[Path], list[Path]]:
    """``(finished, unfinished)`` run directories under ``sweep_dir`` (any depth, sorted): folders holding
    ``.hydra/config.yaml`` or ``run_info.json``, split by :func:`is_finished`. Raises FileNotFoundError naming the
    folder when it does not exist."""
    sweep = Path(sweep_dir)
    if not sweep.is_dir():
        raise FileNotFoundError(f"{sweep}: no such sweep directory")
    dirs = {p.parent.parent for p in sweep.rglob("config.yaml") if p.parent.name == ".hydra"}
    dirs |= {p.parent for p in sweep.rglob(RUN_INFO)}
    dirs = sorted(d for d in dirs if not any(part == "model" for part in d.relative_to(sweep).parts))
    finished = [d for d in dirs if is_finished(d)]
    return finished, [d for d in dirs if d not in finished]


def prepare_run_dir(cfg, out: Path, digest: str, writer: bool = True) -> tuple[dict, bool]:
    """Check the run directory against this configuration (hash ``digest``) → (previous run_info, finished).

    Raises ValueError when the folder holds a run of another configuration and ``resume`` is on: nothing is
    overwritten, and the ``.hydra/`` files Hydra already replaced before the job started are put back
    (:func:`multipos.run_folder.restore_hydra_files`). An accepted folder keeps a copy of them
    (:func:`~multipos.run_folder.keep_hydra_files`). With ``resume=false`` earlier checkpoints and CSV logs are
    removed first. ``writer``: this process writes the run folder (global rank 0 under DDP; the others only read).
    """
    info = read_run_info(out)
    if not cfg.get("resume", True):
        if writer:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            shutil.rmtree(out / "csv", ignore_errors=True)  # the CSV logger appends to a resumed run's log
            keep_hydra_files(out)
        return {}, False
    if info and info.get("config_hash") != digest:
        restored = restore_hydra_files(out) if writer else True  # Hydra wrote this job's .hydra/ already
        raise ValueError(f"{out} holds a run of another configuration (config hash {info.get('config_hash')} != "
                         f"{digest}); use another hydra.run.dir, or resume=false to train it again from scratch"
                         + ("" if restored else f" (Hydra has already replaced {out / '.hydra'} with this job's "
                            "configuration and the folder keeps no copy of its own: run_info.json and metrics.json "
                            "describe the run that is there)"))
    if writer:
        keep_hydra_files(out)
    return info, is_finished(out)


#: File name of the resume checkpoints (Lightning ModelCheckpoint pattern): one kept per stage, the newest.
RESUME_FILENAME = "resume-{epoch}-{step}"
_STEP = re.compile(r"(?:^|-)step=(\d+)(?:-v\d+)?\.ckpt$")


def remove_checkpoints(run_dir: str | Path) -> int:
    """Delete the Lightning checkpoint files (``*.ckpt``: weights, optimizer and schedule state, only needed to resume
    an interrupted run) under ``<run_dir>/checkpoints`` of a finished run → bytes freed. ``model/`` (the kept
    weights) and each stage's ``kept.json`` stay. Studies do this for every finished run (``size.keep_checkpoints:
    false`` in ``conf/scale``): a 40-trial recipe search kept 34 GB of them on a 2-core machine's disk.
    Raises ValueError when the run is not finished (:func:`is_finished`)."""
    run_dir = Path(run_dir)
    if not is_finished(run_dir):
        raise ValueError(f"{run_dir}: not a finished run; its checkpoints are what an interrupted run resumes from")
    freed = 0
    for file in sorted((run_dir / "checkpoints").rglob("*.ckpt")):
        freed += 0 if file.is_symlink() else file.stat().st_size
        file.unlink()
    return freed


def newest_checkpoint(stage_dir: Path) -> Path | None:
    """The checkpoint of ``stage_dir`` with the highest training step → the one a killed stage resumes from.

    Every ``*.ckpt`` file whose name carries ``step=S`` counts (the resume checkpoint, step checkpoints and the
    best-dev checkpoint all hold the full training state); ``last.ckpt`` is a link to one of them and is read
    only when no file names a step (runs from before the resume checkpoints). At equal steps a resume checkpoint
    wins. None when the folder holds no checkpoint.
    """
    if not stage_dir.is_dir():
        return None
    found = []
    for f in stage_dir.glob("*.ckpt"):
        m = _STEP.search(f.name)
        if m and f.is_file() and not f.is_symlink():
            found.append((int(m.group(1)), f.name.startswith("resume-"), f))
    if found:
        return max(found, key=lambda x: (x[0], x[1]))[2]
    last = stage_dir / "last.ckpt"
    return last if last.is_file() else None


def _run_time(run: Path) -> float:
    """Modification time of the run's ``run_info.json`` (else ``metrics.json``, else the folder), in seconds."""
    for name in (RUN_INFO, METRICS):
        if (run / name).is_file():
            return (run / name).stat().st_mtime
    return run.stat().st_mtime


def find_runs(*roots: str | Path, complete: bool = True) -> list[Path]:
    """Run directories (holding ``run_info.json``) under ``roots`` (any depth), newest first.

    ``complete``: only finished runs (:func:`is_finished`). Missing roots are skipped.
    """
    runs = []
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for info in root.rglob(RUN_INFO):
            if complete and not is_finished(info.parent):
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
