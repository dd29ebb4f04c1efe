"""The run folder: what a run directory holds, and the one rule for when it counts as finished.

A run directory (``hydra.run.dir``, or one cell of a study's sweep folder) holds ``.hydra/`` (the composed config),
``run_info.json`` (status ``running`` | ``prepared`` | ``complete``, run key, equivalence key, stages, wall time,
device, ``resumed_from``), ``metrics.json`` and the result files of :func:`multipos.evaluation.runner.write_results`,
``model/``, ``checkpoints/`` and the Lightning CSV logs. This module is the only reader and writer of
``run_info.json`` and the only place that decides **finished** (:func:`is_finished`): ``run_info.json`` says
``"status": "complete"`` *and* ``metrics.json`` exists. Training skips such a run, equivalent-run reuse copies it,
the report tabulates it and the notebooks list it; anything else under a sweep is in progress (or was killed) and
is resumed by training, left out by the report.

It also reads JSON files with errors that name the file (:func:`read_json`; writes go through
:func:`multipos.atomic.write_json`), guards a folder against a run of another configuration
(:func:`prepare_run_dir`) and removes a finished run's resume checkpoints (:func:`remove_checkpoints`; the stage
that writes them finds the newest, :func:`multipos.training.fit.newest_checkpoint`).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from multipos import atomic
from multipos.atomic import read_json as read_json  # the reader beside the atomic writers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunFolder:
    """Where a run lives and how its folder is treated: ``out`` (the run directory), ``writer`` (this process writes
    it: global rank 0 under DDP), ``resume`` (re-running resumes or skips a finished run; false trains it again from
    scratch), ``reuse_equivalent`` (copy a finished run with the same equivalence key instead of training),
    ``keep_checkpoints`` (false: a finished run's resume checkpoints are deleted) and ``experiment`` (the study's
    name, recorded in ``run_info.json``)."""

    out: Path
    writer: bool = True
    resume: bool = True
    reuse_equivalent: bool = False
    keep_checkpoints: bool = True
    experiment: str | None = None

__all__ = ["RUN_INFO", "METRICS", "RunFolder", "read_json", "read_run_info", "write_run_info", "hydra_file",
           "keep_hydra_files", "restore_hydra_files", "is_finished", "prepare_run_dir", "remove_checkpoints",
           "model_folder"]

RUN_INFO = "run_info.json"
METRICS = "metrics.json"


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


def hydra_file(run_dir: str | Path, name: str) -> Path:
    """The run's Hydra file ``name`` (one of :data:`HYDRA_FILES`): the copy in ``.hydra.accepted/`` when the folder
    kept one (:func:`keep_hydra_files`: the configuration that ran there), else the one in ``.hydra/``."""
    accepted = Path(run_dir) / ACCEPTED_HYDRA_DIR / name
    return accepted if accepted.is_file() else Path(run_dir) / HYDRA_DIR / name


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


def prepare_run_dir(out: Path, digest: str, resume: bool = True, writer: bool = True) -> tuple[dict, bool]:
    """Check the run directory against this run (its key ``digest``, :meth:`multipos.runs.spec.RunSpec.key`) →
    (previous run_info, finished).

    Raises ValueError when the folder holds a run with another key, or one keyed before run keys were specs
    (:mod:`multipos.runs.migrate` re-keys it), and ``resume`` is true: nothing is
    overwritten, and the ``.hydra/`` files Hydra already replaced before the job started are put back
    (:func:`restore_hydra_files`). An accepted folder keeps a copy of them
    (:func:`keep_hydra_files`). With ``resume=false`` earlier checkpoints and CSV logs are
    removed first. ``writer``: this process writes the run folder (global rank 0 under DDP; the others only read).
    """
    info = read_run_info(out)
    if not resume:
        if writer:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            shutil.rmtree(out / "csv", ignore_errors=True)  # the CSV logger appends to a resumed run's log
            keep_hydra_files(out)
        return {}, False
    if info and info.get("run_key") != digest:
        restored = restore_hydra_files(out) if writer else True  # Hydra wrote this job's .hydra/ already
        if "run_key" not in info:
            reason = (f"{out} holds a run keyed before run keys were specs: re-key it with `python -m "
                      f"multipos.runs.migrate {out.parent}`")
        else:
            reason = (f"{out} holds a run of another configuration (run key {info['run_key']} != {digest}; its "
                      f"spec.json says what it computed); use another hydra.run.dir, or resume=false to train it "
                      "again from scratch")
        raise ValueError(reason + ("" if restored else f" (Hydra has already replaced {out / '.hydra'} with this "
                                   "job's configuration and the folder keeps no copy of its own: run_info.json and "
                                   "metrics.json describe the run that is there)"))
    if writer:
        keep_hydra_files(out)
    return info, is_finished(out)


def remove_checkpoints(run_dir: str | Path) -> int:
    """Delete the Lightning checkpoint files (``*.ckpt``: weights, optimizer and schedule state, only needed to resume
    an interrupted run) under ``<run_dir>/checkpoints`` of a finished run → bytes freed. ``model/`` (the kept
    weights) and each stage's ``kept.json`` stay. Studies do this for every finished run (``keep_checkpoints:
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


def model_folder(init_from: str | Path | None) -> str | None:
    """``init_from`` (a trained model folder, e.g. a finished run's ``<run dir>/model``) as a string, checked to exist;
    None when it is unset.

    Raises: FileNotFoundError naming ``init_from`` when the folder does not exist.
    """
    if not init_from:
        return None
    if not Path(init_from).is_dir():
        raise FileNotFoundError(f"init_from={init_from}: no such model folder (a finished run's <run dir>/model; "
                                f"train the run it names first, e.g. the study it belongs to with `python train.py -m "
                                f"experiment=<study>`)")
    return str(init_from)
