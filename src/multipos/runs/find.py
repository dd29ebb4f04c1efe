"""Finding runs: the run directories under a sweep or a results root, finished
(:func:`multipos.runs.folder.is_finished`) or not, newest first."""

from __future__ import annotations

from pathlib import Path

from multipos.runs.folder import METRICS, RUN_INFO, is_finished

__all__ = ["sweep_runs", "find_runs", "latest_run"]


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
