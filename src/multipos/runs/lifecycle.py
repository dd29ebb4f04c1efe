"""A run's life in its folder: open it before anything trains (skip a finished run, copy an equivalent one, or
train, fresh or resumed), close it when it is trained and evaluated."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from multipos import atomic
from multipos.runs.folder import METRICS, RunFolder, prepare_run_dir, read_json, remove_checkpoints, write_run_info
from multipos.runs.reuse import adopt, find_equivalent, register
from multipos.runs.spec import SPEC_FILE, SPEC_VERSION, RunSpec

log = logging.getLogger(__name__)

__all__ = ["RunStart", "open_run", "close_run", "write_spec"]


@dataclass
class RunStart:
    """What :func:`open_run` found in a run directory.

    ``info``: the ``run_info.json`` of this run so far (status ``running``, run key, equivalence key, spec version,
    experiment, seed, device, ``wall_s`` summed over earlier attempts, stages, ``resumed``); ``metrics``: the run's
    results when it needs no training (finished here before, or copied from an equivalent run), else None;
    ``done``: nothing is left to do in this process (``metrics`` is None on the non-writing ranks of a reused run);
    ``spec``: the run's spec as plain data (written to ``spec.json`` with the first ``run_info.json`` of a run that
    trains: :func:`write_spec`, after its data and model have loaded, so bad input leaves the folder untouched).
    """

    info: dict
    metrics: dict | None = None
    done: bool = False
    spec: dict | None = None


def write_spec(out: Path, spec: dict) -> None:
    """Write the run's spec (:meth:`multipos.runs.spec.RunSpec.to_dict`) to ``<out>/spec.json``."""
    atomic.write_json(Path(out) / SPEC_FILE, spec)


def open_run(spec: RunSpec, folder: RunFolder, stages: list, device: str, started: float,
             precision: dict | None = None) -> RunStart:
    """Decide what a run directory needs before anything trains: skip a finished run, copy an equivalent one, or
    train (fresh or resumed).

    ``spec``: what the run computes; its key guards the folder and its equivalence key finds runs to copy.
    ``folder``: the run folder and how it is treated; ``stages``: the :class:`multipos.training.stages.Stage` plan;
    ``device``: the run's device description; ``started``: ``time.time()`` when the job started (the wall time of a
    copied run); ``precision``: ``{"training": <Lightning precision>, "encoding": "bf16" | "fp32"}``, recorded so
    that a table compares runs of one setting only (:mod:`multipos.report.setting`).
    Raises ValueError (from :func:`multipos.runs.folder.prepare_run_dir`) when ``out`` holds a run of another
    configuration.
    """
    out, writer = folder.out, folder.writer
    digest, key = spec.key(), spec.equivalence_key()
    previous, finished = prepare_run_dir(out, digest, resume=folder.resume, writer=writer)
    info = {"status": "running", "run_key": digest, "equivalence_key": key, "spec_version": SPEC_VERSION,
            "experiment": folder.experiment, "seed": None if spec.seed is None else int(spec.seed), "device": device,
            "wall_s": float(previous.get("wall_s", 0.0)), "stages": [s.describe() for s in stages],
            "resumed": bool(previous), **({"precision": precision} if precision else {})}
    if finished:  # skipped: its index entry is written again (runs from before the key existed get theirs here)
        log.info("%s: finished run with this configuration, skipped (resume=false trains it again)", out)
        if writer and previous.get("equivalence_key") != key:
            write_run_info(out, {**previous, "equivalence_key": key})
        info, metrics = previous, read_json(out / METRICS)
    else:
        reuse = folder.reuse_equivalent and folder.resume  # resume=false: train it again
        source = find_equivalent(key, out) if reuse else None
        if source is None:
            return RunStart(info, spec=spec.to_dict())
        if not writer:
            return RunStart(info, done=True)
        metrics = adopt(source, out, {**info, "wall_s": round(info["wall_s"] + time.time() - started, 1)})
    if writer:
        write_spec(out, spec.to_dict())
        register(key, out)
    return RunStart(info, metrics, done=True, spec=spec.to_dict())


def close_run(out: Path, info: dict, keep_checkpoints: bool = True) -> None:
    """Mark a trained and evaluated run finished: write ``info`` as its ``run_info.json`` (status ``complete``),
    record it under its equivalence key, and with ``keep_checkpoints=False`` delete its resume checkpoints
    (:func:`multipos.runs.folder.remove_checkpoints`; ``model/`` holds the kept weights)."""
    write_run_info(out, {**info, "status": "complete"})
    register(info["equivalence_key"], out)
    if not keep_checkpoints:
        log.info("finished: removed %.1f GB of resume checkpoints (keep_checkpoints=false)",
                 remove_checkpoints(out) / 1e9)
