"""One number per cell: ``python -m multipos.report.consistency [PATH ...]``.

Walks every committed results source — the run folders below ``experiments/runs/`` and the archived studies in
``experiments/sweeps/<archive>/`` (text copies, :mod:`multipos.report.export`; a ``.tar.xz`` archive named on the
command line is unpacked into a temporary folder) — and finds the places where the same cell has two values:

* a **cell** is a run's spec (:class:`multipos.runs.spec.RunSpec` key; a folder from before specs is keyed by
  :func:`multipos.runs.migrate.migrate_run`, in the temporary copy) trained in one setting (device kind, training
  and encoding precision, :func:`multipos.report.setting.run_setting`): two runs of one cell must report the same
  value of every metric of every evaluation set;
* a **reference row** (``references.json``: BM25, zero-shot) is keyed by what it depends on: BM25 by the evaluation
  set alone, the zero-shot row by the starting checkpoint and its encoder settings (model fields of the spec, the
  evaluation's max length and bf16 encoding) and the device kind; two rows with one key must agree.

"Agree" is to :data:`TOLERANCE` (results are shown to four decimals). The exit status is 1 when anything disagrees,
with one line per disagreement naming the key, the values and the folders that hold them.

``--resolve`` makes the archives agree (:func:`resolve`): a cell keeps the run of its newest source (the date in an
archive's name; ``experiments/runs/`` is newer than every archive) — the study that re-trained a cell another study
already had made the later, and so canonical, run; a reference row keeps the value most folders hold (ties: the
newest). Every other folder of that key becomes a copy: its results files are replaced by the kept run's and its
``run_info.json`` records ``copied_from`` (the run it now reads), as :mod:`multipos.runs.reuse` does for new runs.
Folders are rewritten in place, ``.tar.xz`` archives re-packed. Re-render the studies whose
runs changed (the command lists them). Reported numbers that come
from a file (a rendered table) are the renderer's concern (:mod:`multipos.report.render` reads one run folder per
cell); this command is about the run folders those tables are rendered from.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multipos.assets import REPO_ROOT

__all__ = ["TOLERANCE", "Disagreement", "default_sources", "unpack", "cell_values", "reference_values",
           "disagreements", "resolve", "main"]

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
    """``experiments/runs/`` and every archive folder ``experiments/sweeps/<archive>/`` below ``root`` that exist."""
    runs, sweeps = root / "experiments" / "runs", root / "experiments" / "sweeps"
    return [*([runs] if runs.is_dir() else []), *sorted(p for p in sweeps.glob("*") if p.is_dir())]


def unpack(sources: Iterable[Path], into: Path, everything: bool = False) -> list[Path]:
    """Copies to walk below ``into`` (one subfolder each) of the JSON files and Hydra configs of each folder or
    archive in ``sources``: keying an old folder writes its ``spec.json`` into the copy, never into the source.
    ``everything``: copy every file (to re-pack an archive from the copy)."""
    folders = []
    for n, source in enumerate(sources):
        source = Path(source)
        target = into / f"{n}-{source.name.split('.tar')[0]}"
        if source.is_dir():
            shutil.copytree(source, target, ignore=None if everything else lambda d, names: [
                x for x in names if x.startswith("per_query") or x in ("references", "checkpoints")
                or (Path(d, x).is_file() and not x.endswith((".json", ".yaml")))])
            folders.append(target)
            continue
        with tarfile.open(source) as tar:
            members = [m for m in tar.getmembers() if (m.isfile() or m.islnk() or (everything and m.isdir()))
                       and not m.name.startswith("/") and ".." not in Path(m.name).parts
                       and (everything or ((m.name.endswith(".json") or "/.hydra" in m.name)
                                           and "/per_query" not in m.name and "/references/" not in m.name))]
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
        spec_file = folder / "spec.json"
        if not spec_file.is_file() and migrate_run(folder) is None:  # keyed in the copy, as its machine keyed it
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


_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def _age(source: Path) -> str:
    """Sort key of a source's age: the date in its name; else newest for ``experiments/runs/`` (a folder not in a
    ``sweeps`` folder), oldest for an archive."""
    found = _DATE.search(Path(source).name)
    if found:
        return found.group(1)
    return "9999" if Path(source).is_dir() and Path(source).parent.name != "sweeps" else "0000"


def _copy_results(kept: Path, folder: Path, names: Sequence[str], copied_from: str) -> None:
    from multipos.runs.folder import read_run_info, write_run_info

    for name in names:
        for old in folder.glob(name):
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        for new in kept.glob(name):
            target = folder / new.relative_to(kept)
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if new.is_dir() else shutil.copy2)(new, target)
    info = read_run_info(folder)
    earlier = info.get("copied_from") if isinstance(info.get("copied_from"), list) else []
    write_run_info(folder, {**info, "copied_from": sorted({*earlier, copied_from})})


def resolve(sources: Sequence[Path] | None = None) -> list[str]:
    """Make every key of ``sources`` (default :func:`default_sources`) hold one value (module docstring) → the
    sweeps whose runs changed (``<source name>/<sweep>``). Raises ValueError when a cell's newest source holds two
    values (which run is canonical is then not decided by age: name them by hand)."""
    sources = default_sources() if sources is None else [Path(s) for s in sources]
    changed: dict[Path, set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="multipos-resolve-") as tmp:
        folders = unpack(sources, Path(tmp), everything=True)
        owner = {f: s for f, s in zip(folders, sources)}
        runs = _runs(folders)
        where = {folder: next(f for f in folders if folder.is_relative_to(f)) for folder, _, _ in runs}
        base = Path(tmp)
        by_path = {_name(folder, base): folder for folder, _, _ in runs}
        for d in _group(cell_values(runs, base), "cell"):
            holders = [(v, by_path[n]) for v, names in d.values.items() for n in names]
            newest = max(_age(owner[where[f]]) for _, f in holders)
            top = {v for v, f in holders if _age(owner[where[f]]) == newest}
            if len(top) > 1:
                raise ValueError(f"{d}: its newest source holds {len(top)} values; decide which run is the cell's")
            kept = next(f for v, f in holders if v in top)
            for v, f in holders:
                if v not in top:
                    _copy_results(kept, f, ["metrics.json", "per_query.*.json", "results.txt"],
                                  f"{owner[where[kept]].name}/{kept.relative_to(where[kept])}")
                    changed.setdefault(where[f], set()).add(f.relative_to(where[f]).parts[0])
        for d in _group(reference_values(runs, base), "reference"):
            row = d.key.split(" ", 1)[0]
            holders = [(v, by_path[n]) for v, names in d.values.items() for n in names]
            count = {v: len(names) for v, names in d.values.items()}
            best = max(count, key=lambda v: (count[v], max(_age(owner[where[f]]) for x, f in holders if x == v)))
            kept = next(f for v, f in holders if v == best)
            eval_set = d.metric.split(":", 1)[0]
            kept_values = json.loads((kept / "references.json").read_text())[row][eval_set]
            for v, f in holders:
                if v == best:
                    continue
                refs = json.loads((f / "references.json").read_text())
                refs[row][eval_set] = kept_values  # that set's row; the run's other sets keep theirs
                (f / "references.json").unlink()  # a hard link (a reused run's copy) must not change its twin
                (f / "references.json").write_text(json.dumps(refs, indent=2))
                _copy_results(kept, f, [f"references/{row}/per_query.{eval_set}.json"], f"{owner[where[kept]].name}/"
                              f"{kept.relative_to(where[kept])} (references: {row}, {eval_set})")
                changed.setdefault(where[f], set()).add(f.relative_to(where[f]).parts[0])
        for folder, sweeps in changed.items():
            source = owner[folder]
            if source.is_dir():
                for sweep in sweeps:
                    shutil.rmtree(source / sweep)
                    shutil.copytree(folder / sweep, source / sweep)
            else:
                staged = source.with_name(source.name + ".tmp")
                with tarfile.open(staged, "w:xz") as tar:
                    for top in sorted(folder.iterdir()):
                        tar.add(top, arcname=top.name)
                staged.replace(source)
    return sorted(f"{owner[folder].name}/{sweep}" for folder, sweeps in changed.items() for sweep in sweeps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multipos.report.consistency", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="run folders, sweeps or .tar.xz archives (default: every committed "
                                                 "results source)")
    parser.add_argument("--resolve", action="store_true", help="make every key hold one value (module docstring)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.resolve:
        for sweep in resolve(args.paths or None):
            print(f"changed: {sweep}")
    found = disagreements(args.paths or None)
    for d in found:
        print(d)
    print(f"{len(found)} disagreement{'s' * (len(found) != 1)}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
