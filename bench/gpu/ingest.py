"""Take a GPU call's results into the repository: what a session does after each `device` call (docs/gpu.md).

    python bench/gpu/ingest.py FOLDER [--dry-run]

FOLDER holds what the call wrote under ``$OUT`` (the `run` reply's ``files_at``): any of ``suite.tar.gz``
(``call_suite.sh``), ``main.tar.gz`` (``call_main.sh``), ``studies.tar.gz`` (``call_studies.sh``). Each is unpacked
into a temporary folder, then:

* every benchmark line (``*.jsonl`` in the results folders) is appended, as written on the GPU machine, to
  ``bench/results/gpu/<date>-<gpu>-<kind>.jsonl`` (date from its ``time``, ``h100`` / ``h200`` from its ``gpu``, kind
  ``speed``, ``fit_vs_st`` or ``paper_scale`` from its ``bench``), unless that file already holds the same line;
* every sweep folder (``multirun/<study>-…-gpu``) is copied into ``multirun/``, its files replacing those of the same
  run there; when a study sweep came back (any but the main job's ``default-cpu-gpu``), each study sweep in
  ``multirun/`` is written into the archive folder ``experiments/sweeps/gpu-h100/`` as text
  (:func:`multipos.report.export.export_sweep`: what the renderer reads), after the runs the archive already holds
  were copied into ``multirun/`` (no file there replaced), so the next GPU call skips their finished runs;
* the call's log lines worth reading first are printed: the suite's counts and failures, ``times.txt``, the main job's
  summary, each benchmark line's ratios, and the render command of each sweep.

Raises SystemExit naming the folder when it holds none of the three tarballs, and naming the file and line of a
benchmark line that is not JSON or lacks ``time``, ``gpu`` or ``bench``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARBALLS = ("suite.tar.gz", "main.tar.gz", "studies.tar.gz")
KINDS = {"speed": "speed", "batch_receive": "speed", "fit_vs_st_train": "fit_vs_st", "paper_scale": "paper_scale"}
ARCHIVE = Path("experiments/sweeps/gpu-h100")  # the name the earlier sessions gave it; it holds H200 runs too
MAIN_SWEEP = "default-cpu-gpu"
RATIOS = ("step_vs_bare", "step_vs_st_mnrl", "lightning_vs_bare", "lightning_collated_vs_bare",
          "lightning_descriptors_vs_bare", "lightning_pinned_vs_bare", "gap_s_lightning_collated",
          "gap_s_lightning_loop", "gap_s_lightning_descriptors", "gap_s_lightning_pinned", "lightning_unlogged_vs_bare",
          "lightning_run_vs_bare_run", "profile_bare_step", "receive_groups_vs_no_groups", "stage_torch_vs_one_thread",
          "lightning_vs_bare_workers_8", "lightning_vs_bare_workers_12", "encode_vs_st", "fit_vs_st_train",
          "stopped_in")
#: An outcome line: at a line's start (``-rA``'s summary) or after xdist's ``[gw3] [ 59%]``; not indented text a test
#: printed (H7: an ingest test's captured output named ``tests/test_x.py::test_y`` as failed)
OUTCOME = re.compile(r"^(?:\[gw\d+\] \[\s*\d+%\] )?(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+)")


def gpu_tag(name: str) -> str:
    """``NVIDIA H200`` → ``h200``, ``NVIDIA H100 80GB HBM3`` → ``h100``: the first letter-and-three-digits word, lower
    case; ``gpu`` when there is none."""
    found = re.search(r"\b([A-Za-z]\d{3})\b", name)
    return found.group(1).lower() if found else "gpu"


def route(line: str, where: str) -> Path:
    """The results file (relative to the repository) a benchmark line belongs in. Raises SystemExit naming ``where``
    (file:line) when the line is not a JSON object with ``time``, ``gpu`` and ``bench``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise SystemExit(f"{where}: not a JSON line ({err})") from None
    missing = [k for k in ("time", "gpu", "bench") if not isinstance(record, dict) or k not in record]
    if missing:
        raise SystemExit(f"{where}: a benchmark line without {', '.join(missing)} (a GPU run writes all three)")
    kind = KINDS.get(record["bench"], record["bench"])
    return Path("bench/results/gpu") / f"{record['time'][:10]}-{gpu_tag(record['gpu'])}-{kind}.jsonl"


def benchmark_lines(unpacked: Path) -> list[tuple[Path, str]]:
    """Every benchmark line under ``unpacked`` (not in its sweeps) with the results file it belongs in → [(file
    relative to the repository, line)]. Raises SystemExit at the first bad line (:func:`route`), before anything is
    written."""
    lines = []
    for path in sorted(unpacked.rglob("*.jsonl")):
        if "multirun" in path.relative_to(unpacked).parts:
            continue
        for n, raw in enumerate(path.read_text().splitlines(), 1):
            if raw.strip():
                lines.append((route(raw.strip(), f"{path}:{n}"), raw.strip()))
    return lines


def append_lines(lines: list[tuple[Path, str]], repo: Path, dry_run: bool) -> list[tuple[Path, dict]]:
    """Append each (results file, line) of ``lines`` to that file in ``repo`` unless the file already holds the line →
    [(results file, record)] of the lines appended."""
    added, held = [], {}  # results file -> the lines it holds (read once), those appended here included
    for target, line in lines:
        path = repo / target
        if target not in held:
            held[target] = {h.strip() for h in path.read_text().splitlines()} if path.is_file() else set()
        if line in held[target]:
            continue
        held[target].add(line)
        if not dry_run:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(line + "\n")
        added.append((target, json.loads(line)))
    return added


def copy_sweeps(unpacked: Path, repo: Path, dry_run: bool) -> list[str]:
    """Copy every ``multirun/<name>`` folder under ``unpacked`` into ``repo/multirun`` (files of the same run
    replaced) → the sweep names."""
    names = []
    for sweep in sorted(unpacked.glob("multirun/*")):
        if sweep.is_dir():
            names.append(sweep.name)
            if not dry_run:
                shutil.copytree(sweep, repo / "multirun" / sweep.name, dirs_exist_ok=True)
    return names


def _copy_missing(source: Path, target: Path) -> None:
    """Copy the files of ``source`` into ``target`` that ``target`` lacks (none replaced)."""
    for path in sorted(source.rglob("*")):
        dest = target / path.relative_to(source)
        if path.is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)


def rewrite_archive(repo: Path) -> list[str]:
    """Write every ``multirun/*-gpu`` study sweep (not :data:`MAIN_SWEEP`) into :data:`ARCHIVE` as text → their
    names. The runs the archive holds are copied into ``multirun/`` first without replacing any file there, so a sweep
    or run it holds that this checkout lacks (a fresh clone has no ``multirun/``) stays in it. Each sweep's folder in
    the archive is replaced whole (:func:`multipos.report.export.export_sweep`), so a failed export leaves the old one;
    a sweep with no finished run is left out. Weights, checkpoints, TREC runs and logs never reach the archive."""
    from multipos.report.export import export_sweep

    target = repo / ARCHIVE
    (repo / "multirun").mkdir(exist_ok=True)
    if target.is_dir():
        for sweep in sorted(p for p in target.iterdir() if p.is_dir()):
            _copy_missing(sweep, repo / "multirun" / sweep.name)
    names = []
    for sweep in sorted(p for p in (repo / "multirun").glob("*-gpu") if p.is_dir() and p.name != MAIN_SWEEP):
        try:
            export_sweep(sweep, target)
        except FileNotFoundError:  # no finished run yet
            continue
        names.append(sweep.name)
    return names


def suite_outcomes(lines: list[str]) -> dict[str, list[str]]:
    """Each test's outcome in a pytest log → ``{outcome: [test ids]}`` (PASSED, FAILED, ERROR, SKIPPED, ...), from
    the lines ``pytest -v`` prints as each test ends (``[gw3] [ 59%] FAILED tests/test_x.py::test_y``, under xdist)
    and ``-rA``'s summary (``FAILED tests/test_x.py::test_y - reason``); a test named twice counts once, with its
    last outcome. So a suite stopped by its time limit before its summary still names what failed."""
    last: dict[str, str] = {}
    for line in lines:
        match = OUTCOME.search(line)
        if match:
            last[match.group(2)] = match.group(1)
    out: dict[str, list[str]] = {}
    for test, outcome in last.items():
        out.setdefault(outcome, []).append(test)
    return out


def report(unpacked: Path) -> None:
    """Print the suite's counts and failures, ``times.txt`` and the main job's summary of one unpacked call."""
    for log in sorted(unpacked.glob("*/suite.log")):
        lines = log.read_text(errors="replace").splitlines()
        print(f"== {log.parent.name}: suite")
        outcomes = suite_outcomes(lines)
        print("  tests by outcome: "
              + (", ".join(f"{k} {len(v)}" for k, v in sorted(outcomes.items())) or "none named"))
        for test in (outcomes.get("FAILED", []) + outcomes.get("ERROR", []))[:30]:
            print("  not passed: " + test)
        for line in lines[-2:]:
            print("  " + line)
    for times in sorted(unpacked.glob("*/times.txt")):
        print(f"== {times.parent.name}: times\n  " + "\n  ".join(times.read_text().splitlines()))
    for summary in sorted(unpacked.glob("*/summary.txt")):
        print(f"== {summary.parent.name}: main job summary\n  " + "\n  ".join(summary.read_text().splitlines()[-25:]))


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    try:
        tar.extractall(dest, filter="data")
    except TypeError:  # Python < 3.10.12 / 3.11.4: no extraction filters
        tar.extractall(dest)


def ingest(folder: Path, repo: Path = REPO, dry_run: bool = False) -> dict:
    """Unpack ``folder``'s tarballs and take their results into ``repo`` (module docstring) → ``{"lines": [(file,
    record)], "sweeps": [names], "archive": [names] or None}``. Raises SystemExit when ``folder`` holds none of
    :data:`TARBALLS`."""
    found = [folder / name for name in TARBALLS if (folder / name).is_file()]
    if not found:
        raise SystemExit(f"{folder}: none of {', '.join(TARBALLS)} (the folder a GPU call's $OUT files were copied to)")
    out = {"lines": [], "sweeps": [], "archive": None}
    with tempfile.TemporaryDirectory(prefix="multipos-gpu-ingest-") as tmp:
        unpacked = [Path(tmp) / tarball.name.split(".")[0] for tarball in found]
        for tarball, into in zip(found, unpacked):
            with tarfile.open(tarball) as tar:
                _safe_extract(tar, into)
        lines = [line for into in unpacked for line in benchmark_lines(into)]  # every line checked before any write
        for into in unpacked:
            report(into)
        out["lines"] = append_lines(lines, repo, dry_run)
        for into in unpacked:
            out["sweeps"] += copy_sweeps(into, repo, dry_run)
    if any(name != MAIN_SWEEP for name in out["sweeps"]) and not dry_run:
        out["archive"] = rewrite_archive(repo)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="where the GPU call's $OUT files were copied (the run reply's files_at)")
    ap.add_argument("--dry-run", action="store_true", help="print what would be appended and copied; change nothing")
    args = ap.parse_args()
    out = ingest(args.folder, dry_run=args.dry_run)
    verb = "would append" if args.dry_run else "appended"
    for target, record in out["lines"]:
        ratios = {k: record[k] for k in RATIOS if k in record}
        print(f"{verb} to {target}: {record['bench']} at {record.get('commit')} on {record['gpu']}: {ratios}")
    for name in out["sweeps"]:
        print(f"sweep {name} {'would be ' if args.dry_run else ''}copied: "
              f"python -m multipos.report.render multirun/{name}"
              + ("  (the main job: python -m multipos.report.summary multirun/" + name + ")"
                 if name == MAIN_SWEEP else ""))
    if out["archive"] is not None:
        print(f"{ARCHIVE} rewritten from {len(out['archive'])} sweeps: {', '.join(out['archive'])}")


if __name__ == "__main__":
    main()
