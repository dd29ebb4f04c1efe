"""Reusing a finished run that computed the same thing.

With ``reuse_equivalent: true`` (every study in ``conf/experiment/`` sets it; ``conf/train.yaml`` leaves it off)
a run that finds a finished run with its equivalence key (:meth:`multipos.runs.spec.RunSpec.equivalence_key`) in the
index (``<cache>/runs/<key>.json``, written when a run finishes or a finished run is skipped) copies that run's
results and model into its own directory instead of training (:func:`adopt`), and its ``run_info.json`` names
the source (``reused_from``). The report counts such runs apart (:func:`multipos.report.render.provenance`).
Files are hard-linked where the filesystem allows it (copied otherwise): a study of 200 cells, most of them
copies, would otherwise hold every model several times (a query-side run folder is about 250 MB). A hard link is
safe because every multipos writer replaces a file (a temporary file, then ``os.replace``: :mod:`multipos.atomic`)
and none writes into one, so a later ``resume=false`` re-run of either directory gives that directory new files
and cannot change the other.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from multipos import atomic
from multipos.assets import cache_dir
from multipos.runs.folder import METRICS, is_finished, read_json, read_run_info, write_run_info

log = logging.getLogger(__name__)

__all__ = ["RESULT_FILES", "register", "find_equivalent", "link_or_copy", "adopt"]

#: Files of a finished run directory copied by :func:`adopt` (glob patterns), besides ``model/`` and
#: ``results.txt`` (copied with a line naming the source).
RESULT_FILES = ("metrics.json", "references.json", "per_query.*.json", "run.*.trec", "references/*/per_query.*.json",
                "references/*/run.*.trec")


def _index_file(key: str) -> Path:
    return cache_dir() / "runs" / f"{key}.json"


def _listed(key: str) -> list[str]:
    """The run folders the index lists under ``key`` (none when the index file is absent or unreadable: it is a
    cache)."""
    entries = read_json(_index_file(key), missing_ok=True, invalid_ok=True)
    return [r for r in entries if isinstance(r, str)] if isinstance(entries, list) else []


def register(key: str, run_dir: Path) -> None:
    """Record the finished ``run_dir`` under ``key`` in the index (entries whose run is gone are dropped); a run
    that is not finished with that key (:func:`multipos.runs.folder.is_finished`) is not recorded."""
    path = str(Path(run_dir).resolve())
    listed = _listed(key)
    runs = [r for r in dict.fromkeys([*listed, path]) if is_finished(Path(r), key)]
    if path in runs and path not in listed:
        atomic.write_json(_index_file(key), runs)


def find_equivalent(key: str, run_dir: Path) -> Path | None:
    """A finished run other than ``run_dir`` with equivalence key ``key``, or None (an index entry is trusted
    only when the run it names still says so in its ``run_info.json``)."""
    here = Path(run_dir).resolve()
    for entry in _listed(key):
        candidate = Path(entry)
        if candidate.resolve() != here and is_finished(candidate, key) and (candidate / "model").is_dir():
            return candidate
    return None


def link_or_copy(source: Path, target: Path) -> None:
    """Make ``target`` a hard link to the file ``source`` (a copy where linking fails: another filesystem, or one
    without hard links), atomically: ``target`` is replaced in one step and never left half written."""
    tmp = atomic.temp_path(target)
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def adopt(source: Path, run_dir: Path, info: dict) -> dict:
    """Copy the results and model of the finished run ``source`` into ``run_dir`` → its metrics.

    Hard-links (or copies: :func:`link_or_copy`) :data:`RESULT_FILES` and ``model/`` (atomically: a copy cut short
    leaves no half file), then
    ``results.txt`` with a line naming the source, and writes ``run_info.json`` last, from ``info`` plus
    ``status: complete``, ``reused_from`` and the source's ``stage_records``. ``wall_s`` is the time spent here.
    Raises FileNotFoundError when ``source`` has no ``metrics.json`` or ``model/``.
    """
    source, run_dir = Path(source), Path(run_dir)
    if not (source / METRICS).is_file() or not (source / "model").is_dir():
        raise FileNotFoundError(f"{source}: not a finished run (metrics.json and model/ expected)")
    metrics = read_json(source / METRICS)
    run_dir.mkdir(parents=True, exist_ok=True)
    for pattern in RESULT_FILES:
        for file in sorted(source.glob(pattern)):
            target = run_dir / file.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(file, target)
    with atomic.replace_dir(run_dir / "model") as tmp:
        shutil.copytree(source / "model", tmp, dirs_exist_ok=True, copy_function=link_or_copy)
    table = (source / "results.txt").read_text().rstrip() + "\n" if (source / "results.txt").is_file() else ""
    atomic.write_text(run_dir / "results.txt", f"{table}copied from the equivalent finished run {source.resolve()} "
                      f"(equivalence key {info.get('equivalence_key')}; its results above, wall time included); "
                      "trained nothing here\n")
    write_run_info(run_dir, {**info, "status": "complete", "reused_from": str(source.resolve()),
                             "stage_records": read_run_info(source).get("stage_records", [])})
    log.info("%s: the finished run %s computes the same model and evaluation (equivalence key %s): copied its "
             "results instead of training (reuse_equivalent=false trains it)", run_dir, source,
             info.get("equivalence_key"))
    return metrics
