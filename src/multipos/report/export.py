"""A finished study as plain text for version control: each finished run of a sweep reduced to the files
:mod:`multipos.report.render` reads, in the same layout, so the committed copy renders the same tables.

    python -m multipos.report.export multirun/<sweep>              # -> experiments/runs/<sweep>/
    python -m multipos.report.render experiments/runs/<sweep>      # the study's tables, from the text copy

Kept per run: ``.hydra/config.yaml`` and ``.hydra/overrides.yaml`` (the cell; from ``.hydra.accepted/`` when the
folder kept one, :func:`multipos.runs.folder.keep_hydra_files`), ``metrics.json``, ``run_info.json`` (status, device,
wall time), ``spec.json`` (what the run computed, :mod:`multipos.runs.spec`), ``references.json`` (BM25 and zero-shot
rows), and ``per_query.<set>.json`` for the sets the report names (its columns and plot), holding only the metrics it
names — the per-query values its paired t-tests read. A run from before specs (no ``spec.json``) also keeps
``.hydra/hydra.yaml``: :mod:`multipos.runs.migrate` reads where it ran from it to key it. Left out: weights,
checkpoints, TREC run files, logs (the text copy is about 30 KB a run instead of 100-300 MB).

The archived studies in ``experiments/sweeps/<archive>/`` are such copies, one folder of sweeps per archive.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from multipos import atomic
from multipos.atomic import read_json
from multipos.report.render import read_spec
from multipos.report.tables import parse_column
from multipos.runs.find import sweep_runs
from multipos.runs.folder import HYDRA_DIR, hydra_file

__all__ = ["export_sweep", "reported_metrics", "main"]

#: Files copied whole from each run folder (when present).
KEPT_FILES = (".hydra/config.yaml", ".hydra/overrides.yaml", "metrics.json", "run_info.json", "spec.json",
              "references.json")
#: Kept too for a run without ``spec.json`` (from before specs): where it ran, which migration reads.
LEGACY_FILES = (".hydra/hydra.yaml",)


def _source(run: Path, name: str) -> Path:
    """The file ``name`` of ``run`` to copy: a Hydra file as :func:`multipos.runs.folder.hydra_file` finds it (the
    accepted copy first: Hydra rewrites ``.hydra/`` before a job that may then refuse the folder), else
    ``run / name``."""
    return hydra_file(run, name.split("/", 1)[1]) if name.startswith(HYDRA_DIR + "/") else run / name


def reported_metrics(spec: Mapping) -> dict[str, set[str]]:
    """``{eval set: {metric}}`` that a ``report`` node (:func:`multipos.report.render.read_spec`) shows: its
    ``SET:METRIC`` columns and its plot's set and metrics."""
    wanted: dict[str, set[str]] = {}
    for column in spec["columns"]:
        eval_set, metric = parse_column(str(column))
        wanted.setdefault(eval_set, set()).add(metric)
    plot = spec.get("plot") or {}
    metrics = plot.get("metrics") or ["ndcg@10"]
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    for eval_set in ([plot["eval_set"]] if plot.get("eval_set") else []) + list(plot.get("eval_sets") or []):
        wanted.setdefault(str(eval_set), set()).update(metrics)
    return wanted


def export_sweep(sweep_dir: str | Path, out: str | Path = "experiments/runs") -> Path:
    """Write the text copy of the finished runs of ``sweep_dir`` to ``<out>/<sweep folder name>/`` → that folder.

    The folder is replaced as a whole (:func:`multipos.atomic.replace_dir`), so a failed export leaves the previous
    copy as it was. Unfinished runs are left out. Raises FileNotFoundError when ``sweep_dir`` holds no finished run, and
    ValueError (from :func:`~multipos.report.render.read_spec`) when its runs carry no valid ``report`` node.
    """
    sweep = Path(sweep_dir)
    finished, _ = sweep_runs(sweep)
    if not finished:
        raise FileNotFoundError(f"{sweep}: no finished run to export")
    wanted = reported_metrics(read_spec(finished))
    target = Path(out) / sweep.resolve().name
    with atomic.replace_dir(target) as staging:
        for run in finished:
            dest = staging / run.relative_to(sweep)
            legacy = () if (run / "spec.json").is_file() else LEGACY_FILES
            for name in (*KEPT_FILES, *legacy):
                source = _source(run, name)
                if source.is_file():
                    (dest / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, dest / name)
            for eval_set, metrics in wanted.items():
                source = run / f"per_query.{eval_set}.json"
                if source.is_file():
                    values = read_json(source)
                    atomic.write_json(dest / source.name, {m: values[m] for m in sorted(metrics) if m in values},
                                      indent=None)
    return target


def main(argv: Sequence[str] | None = None) -> Path:
    """CLI: ``python -m multipos.report.export <sweep> [--out DIR]``; errors exit with status 2."""
    p = argparse.ArgumentParser(prog="python -m multipos.report.export",
                                description="A finished study as text (what render reads), for version control.")
    p.add_argument("sweep_dir", help="the study's sweep directory")
    p.add_argument("--out", default="experiments/runs", help="parent folder of the copy (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        target = export_sweep(args.sweep_dir, args.out)
    except (FileNotFoundError, ValueError) as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    print(target)
    return target


if __name__ == "__main__":
    main(sys.argv[1:])
