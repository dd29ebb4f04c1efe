"""One number per cell: ``python -m multipos.report.consistency [PATH ...]``.

Walks every committed results source — the run folders below ``experiments/runs/`` and the sweeps packed in
``experiments/sweeps/*.tar.xz`` (unpacked into a temporary folder) — and finds the places where the same cell has
two values:

* a **cell** is a run's spec (:class:`multipos.runs.spec.RunSpec` key; a folder from before specs is keyed by
  :func:`multipos.runs.migrate.migrate_run`, in the temporary copy) trained in one setting (device kind, training
  and encoding precision, :func:`multipos.report.setting.run_setting`): two runs of one cell must report the same
  value of every metric of every evaluation set;
* a **reference row** (``references.json``: BM25, zero-shot) is keyed by what it depends on: BM25 by the evaluation
  set alone, the zero-shot row by the starting checkpoint and its encoder settings (model fields of the spec, the
  evaluation's max length and bf16 encoding) and the device kind; two rows with one key must agree.

"Agree" is to :data:`TOLERANCE` (results are shown to four decimals). The exit status is 1 when anything disagrees,
with one line per disagreement naming the key, the values and the folders that hold them. Reported numbers that come
from a file (a rendered table) are the renderer's concern (:mod:`multipos.report.render` reads one run folder per
cell); this command is about the run folders those tables are rendered from.
"""

from __future__ import annotations

import argparse
import json
import logging
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multipos.assets import REPO_ROOT

__all__ = ["TOLERANCE", "Disagreement", "default_sources", "unpack", "cell_values", "reference_values",
           "disagreements", "main"]

log = logging.getLogger(__name__)

#: Largest difference two values of one cell may have and still count as one number.
TOLERANCE = 5e-5


@dataclass
class Disagreement:
    """Two or more values for one key: ``kind`` (``cell`` | ``reference``), the key, the metric
    (``<set>:<metric>``) and {value → folders holding it}."""

    kind: str
    key: str
    metric: str
    values: dict[float, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        shown = "; ".join(f"{v:.4f} in {', '.join(sorted(f)[:3])}{' …' if len(f) > 3 else ''}"
                          for v, f in sorted(self.values.items()))
        return f"{self.kind} {self.key} {self.metric}: {shown}"


def default_sources(root: Path = REPO_ROOT) -> list[Path]:
    """``experiments/runs/`` and every ``experiments/sweeps/*.tar.xz`` below ``root`` that exist."""
    runs = root / "experiments" / "runs"
    return [*([runs] if runs.is_dir() else []), *sorted((root / "experiments" / "sweeps").glob("*.tar.xz"))]


def unpack(sources: Iterable[Path], into: Path) -> list[Path]:
    """Copies to walk below ``into`` (one subfolder each) of the JSON files and Hydra configs of each folder or
    archive in ``sources``: keying an old folder writes its ``spec.json`` into the copy, never into the source."""
    import shutil

    folders = []
    for n, source in enumerate(sources):
        source = Path(source)
        target = into / f"{n}-{source.name.split('.tar')[0]}"
        if source.is_dir():
            shutil.copytree(source, target, ignore=lambda d, names: [
                x for x in names if x.startswith("per_query") or x in ("references", "checkpoints")
                or (Path(d, x).is_file() and not x.endswith((".json", ".yaml")))])
            folders.append(target)
            continue
        with tarfile.open(source) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and not m.name.startswith(("/", ".."))
                       and ".." not in Path(m.name).parts and (m.name.endswith(".json") or "/.hydra" in m.name)
                       and "/per_query" not in m.name and "/references/" not in m.name]
            tar.extractall(target, members=members, filter="data")
        folders.append(target)
    return folders


def _runs(folders: Sequence[Path]) -> list[tuple[Path, dict, dict]]:
    """(folder, run_info, spec as a dict) of every finished run below ``folders`` whose spec can be told."""
    from multipos.runs.folder import read_run_info
    from multipos.runs.migrate import migrate_run, run_dirs

    found = []
    for folder in run_dirs(list(folders)):
        info = read_run_info(folder)
        if info.get("status") != "complete" or not (folder / "metrics.json").is_file():
            continue
        spec = migrate_run(folder) if not (folder / "spec.json").is_file() else None
        spec_file = folder / "spec.json"
        if spec is None and not spec_file.is_file():
            log.warning("%s: its machine cannot be told; not checked", folder)
            continue
        found.append((folder, read_run_info(folder), json.loads(spec_file.read_text())))
    return found


def _flat(rows: dict) -> dict[str, float]:
    return {f"{s}:{m}": float(v) for s, metrics in rows.items() if isinstance(metrics, dict)
            for m, v in metrics.items() if isinstance(v, (int, float))}


def _group(entries: Iterable[tuple[str, str, float, str]], kind: str) -> list[Disagreement]:
    by: dict[tuple[str, str], dict[float, list[str]]] = {}
    for key, metric, value, where in entries:
        by.setdefault((key, metric), {}).setdefault(value, []).append(where)
    out = []
    for (key, metric), values in sorted(by.items()):
        if len(values) > 1 and max(values) - min(values) > TOLERANCE:
            out.append(Disagreement(kind, key, metric, values))
    return out


def _name(folder: Path, base: Path) -> str:
    try:
        return str(folder.relative_to(base))
    except ValueError:
        return str(folder)


def cell_values(runs, base: Path) -> list[tuple[str, str, float, str]]:
    """(cell key, metric, value, folder) of every metric of every run (module docstring)."""
    from multipos.report.setting import run_setting
    from multipos.runs.spec import RunSpec

    out = []
    for folder, info, spec in runs:
        key = f"{RunSpec(**spec).key()} [{', '.join(run_setting(info, folder))}]"
        metrics = json.loads((folder / "metrics.json").read_text())
        out += [(key, metric, value, _name(folder, base)) for metric, value in _flat(metrics).items()]
    return out


def reference_values(runs, base: Path) -> list[tuple[str, str, float, str]]:
    """(reference key, metric, value, folder) of every row of every run's ``references.json`` (module docstring)."""
    from multipos.report.setting import run_setting

    out = []
    for folder, info, spec in runs:
        ref_file = folder / "references.json"
        if not ref_file.is_file():
            continue
        refs = json.loads(ref_file.read_text())
        evaluation = spec.get("evaluation") or {}
        encoder = {"model": spec.get("model"), "init_from": spec.get("init_from"),
                   "zero_shot_model": evaluation.get("zero_shot_model"), "bf16": evaluation.get("bf16"),
                   "passage_max_length": evaluation.get("passage_max_length"), "device": run_setting(info, folder)[0]}
        for row, values in refs.items():
            key = "bm25" if row == "bm25" else f"{row} {json.dumps(encoder, sort_keys=True, default=str)}"
            out += [(key, metric, value, _name(folder, base)) for metric, value in _flat(values).items()]
    return out


def disagreements(sources: Sequence[Path] | None = None) -> list[Disagreement]:
    """Every key with more than one value in ``sources`` (default :func:`default_sources`)."""
    sources = default_sources() if sources is None else [Path(s) for s in sources]
    with tempfile.TemporaryDirectory(prefix="multipos-consistency-") as tmp:
        folders = unpack(sources, Path(tmp))
        runs = _runs(folders)
        base = Path(tmp)
        return [*_group(cell_values(runs, base), "cell"), *_group(reference_values(runs, base), "reference")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multipos.report.consistency", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="run folders, sweeps or .tar.xz archives (default: every committed "
                                                 "results source)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    found = disagreements(args.paths or None)
    for d in found:
        print(d)
    print(f"{len(found)} disagreement{'s' * (len(found) != 1)}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
