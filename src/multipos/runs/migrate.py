"""Re-key finished runs: ``python -m multipos.runs.migrate <sweep dir>...``.

Every run folder below the given paths (a folder with ``run_info.json`` and ``.hydra/config.yaml``) gets its
:class:`multipos.runs.spec.RunSpec` computed from its own config and written to ``spec.json``, and its
``run_info.json`` gets ``run_key``, ``equivalence_key`` and ``spec_version``; nothing else changes. Run it on a sweep
extracted from an archive made before run keys were specs, and after raising
:data:`multipos.runs.spec.SPEC_VERSION`.

A config resolves differently on different machines (``${auto_precision:}``, ``${auto_bf16:}``,
``${auto_workers:}``): a run is resolved as the machine that ran it resolved it. A folder from before specs
records the hash its run had then (``config_hash``); the machine is the one whose resolution gives that hash again
(:func:`legacy_config_hash`, the retired rule, kept here only to read such folders). A folder whose machine cannot be
told is listed and left as it is; the command then exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Iterator

from omegaconf import OmegaConf

from multipos.runs.folder import hydra_file, read_run_info, write_run_info
from multipos.runs.spec import SPEC_FILE, SPEC_VERSION, RunSpec, spec_from_plain

log = logging.getLogger(__name__)

__all__ = ["MACHINES", "legacy_config_hash", "run_config", "migrate_run", "migrate", "main"]

#: The resolutions of the machine-dependent resolvers a run may have had: (precision, bf16 encoding, workers).
MACHINES = (("32-true", False, 0), ("bf16-mixed", True, 0), *(("bf16-mixed", True, w) for w in (1, 2, 3, 4)))

# The retired run hash (a sha1 of the whole resolved config minus exclusions), exactly as finished runs were keyed
# before specs. Read by legacy_config_hash only.
_LEGACY_VOLATILE = ("paths", "resume", "hydra", "report", "experiment_name", "size", "reuse_equivalent", "threads",
                    "pack_sequences", "return_freed_memory", "length_buckets", "parallel_jobs", "prepare_only")
_LEGACY_MOVED = {
    "multipos.callbacks.NegativeRefresh": "multipos.dense_negatives.NegativeRefresh",
    "multipos.callbacks.GradientDiagnostics": "multipos.diagnostics.GradientDiagnostics",
    "multipos.data.sources.": "multipos.sources.", "multipos.data.dense_negatives.": "multipos.dense_negatives.",
    "multipos.data.groups.": "multipos.groups.", "multipos.data.datamodule.": "multipos.data.",
    "multipos.evaluation.sets.": "multipos.evalsets.", "multipos.evaluation.metrics.": "multipos.metrics.",
    "multipos.retrieval.dense.": "multipos.retrieval.",
}
_LEGACY_ABSENT = {
    "init_from": None, "model.query_prompt": None, "model.passage_prompt": None, "model.lora": None,
    "data.source.negative_encoder.query_prompt": None, "data.source.negative_encoder.passage_prompt": None,
    "data.source.teacher_prompts": {"query": None, "passage": None}, "data.source.negative_filter": None,
    "data.source.grade_weights": None, "data.source.label_noise": None, "data.source.teacher_scores": None,
    "data.source.teacher_model": None,
}


def _legacy_targets(node):
    if isinstance(node, dict):
        return {k: (next((old + v[len(new):] for new, old in _LEGACY_MOVED.items() if v.startswith(new)), v)
                    if k == "_target_" and isinstance(v, str) else _legacy_targets(v)) for k, v in node.items()}
    return [_legacy_targets(v) for v in node] if isinstance(node, list) else node


def legacy_config_hash(plain: dict) -> str:
    """The hash a run folder from before specs records as ``config_hash``, of a resolved config as plain dicts."""
    plain = _legacy_targets(json.loads(json.dumps(plain, default=str)))
    for key in _LEGACY_VOLATILE:
        plain.pop(key, None)
    plain.get("trainer", {}).pop("enable_progress_bar", None)
    for dotted, absent in _LEGACY_ABSENT.items():
        *parents, leaf = dotted.split(".")
        node = plain
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == absent:
            del node[leaf]
    if isinstance(plain.get("trainer"), dict) and "log_every_n_steps" in plain["trainer"]:
        plain["trainer"]["log_every_n_steps"] = 1
    if (plain.get("wise_ft") or {}).get("alpha", 1.0) == 1.0:
        plain.pop("wise_ft", None)
    if not (plain.get("passages") or {}).get("frozen"):
        plain.pop("passages", None)
    return hashlib.sha1(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _resolving_as(machine: tuple[str, bool, int], run_dir: Path) -> Iterator[None]:
    """The machine-dependent resolvers pinned to ``machine`` (and ``${hydra:...}`` to ``run_dir``), then put back."""
    from hydra.core.utils import setup_globals

    from multipos.config_resolvers import register_resolvers

    precision, bf16, workers = machine
    pinned = {"auto_precision": lambda: precision, "auto_bf16": lambda: bf16, "auto_workers": lambda: workers,
              "auto_log_interval": lambda: 1, "cores_per_job": lambda jobs=1: 1, "hydra": lambda *_: str(run_dir)}
    register_resolvers()  # the others (${sweep_dir:...}, ...) as the entry points register them
    try:
        for name, fn in pinned.items():
            OmegaConf.register_new_resolver(name, fn, replace=True)
        yield
    finally:
        for name in pinned:
            OmegaConf.clear_resolver(name)
        register_resolvers()
        setup_globals()  # Hydra's own resolvers, ${hydra:...} among them


def _config_file(run_dir: Path) -> Path:
    """The run's own config: ``.hydra.accepted/`` (the copy a folder keeps of the job that ran it), else
    ``.hydra/``."""
    return hydra_file(run_dir, "config.yaml")


def _sources(info: dict) -> list[Path]:
    """Run folders a ``run_info.json`` names: where its kept checkpoints were, and the run it was copied from."""
    places = [Path(r["kept"].split("/checkpoints/")[0]) for r in info.get("stage_records", [])
              if isinstance(r, dict) and isinstance(r.get("kept"), str) and "/checkpoints/" in r["kept"]]
    return [*places, *([Path(info["reused_from"])] if isinstance(info.get("reused_from"), str) else [])]


def _places(run_dir: Path, info: dict, roots: list[Path]) -> list[Path]:
    """Where the run may have run (its folder was in the retired hash, as ``logger.save_dir``): Hydra's
    ``runtime.output_dir`` in its ``.hydra/hydra.yaml``; the folder its kept checkpoints were in; ``<sweep>/<cell>``
    below each folder that held a sweep (``roots``, and those of the folders its ``run_info.json`` names); and
    ``run_dir`` itself."""
    sources = _sources(info)
    roots = [*dict.fromkeys([*(p.parent.parent for p in sources), *roots])]
    hydra_file = _config_file(run_dir).parent / "hydra.yaml"
    hydra = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.runtime.output_dir") if hydra_file.is_file() else None
    below = [root / run_dir.parent.name / run_dir.name for root in roots]
    return list(dict.fromkeys([*([Path(hydra)] if hydra else []), *sources[:1], *below, run_dir]))


def run_config(run_dir: Path, info: dict, roots: list[Path] = ()) -> tuple[dict, tuple | None]:
    """The run's config resolved as its machine resolved it → (plain dict, the machine). A folder keyed by an earlier
    spec version is resolved as its ``spec.json`` says (precision, bf16 encoding); a folder from before specs as the
    machine of :data:`MACHINES` that gives its recorded ``config_hash`` again (an empty dict and None when none does);
    a folder with neither comes back resolved as the first machine, with None. ``roots``: folders that held sweeps
    where the run may have run (:func:`_places`)."""
    cfg = OmegaConf.load(_config_file(run_dir))
    recorded = info.get("config_hash")
    spec_file = run_dir / SPEC_FILE
    if recorded is None and spec_file.is_file():  # keyed by an earlier spec: it says how its machine resolved
        old = json.loads(spec_file.read_text())
        machine = (old["optimization"]["trainer"].get("precision", "32-true"),
                   bool(old["evaluation"].get("bf16", False)), 0)
        with _resolving_as(machine, run_dir):
            return OmegaConf.to_container(cfg, resolve=True), machine
    for place in _places(run_dir, info, list(roots)):
        for machine in MACHINES:
            with _resolving_as(machine, place):
                plain = OmegaConf.to_container(cfg, resolve=True)
            if recorded is None:
                return plain, None
            if legacy_config_hash(plain) == recorded:
                return plain, machine
    return {}, None


def migrate_run(run_dir: Path, roots: list[Path] = ()) -> RunSpec | None:
    """Write ``spec.json`` and the keys into ``run_dir``'s ``run_info.json`` → its spec; None (nothing written) when
    its machine cannot be told (:func:`run_config`). A folder already at :data:`SPEC_VERSION` is left alone."""
    info = read_run_info(run_dir)
    if info.get("spec_version") == SPEC_VERSION and (run_dir / SPEC_FILE).is_file():
        return RunSpec(**json.loads((run_dir / SPEC_FILE).read_text()))
    plain, machine = run_config(run_dir, info, roots)
    if not plain:
        return None
    spec = spec_from_plain(plain)
    from multipos import atomic

    atomic.write_json(run_dir / SPEC_FILE, spec.to_dict())
    write_run_info(run_dir, {**info, "run_key": spec.key(), "equivalence_key": spec.equivalence_key(),
                             "spec_version": SPEC_VERSION})
    return spec


def run_dirs(paths: list[Path]) -> list[Path]:
    """Every run folder (``run_info.json`` beside a Hydra config) at or below ``paths``, sorted."""
    found = set()
    for path in paths:
        for info in [path / "run_info.json", *path.rglob("run_info.json")]:
            folder = info.parent
            if info.is_file() and _config_file(folder).is_file():
                found.add(folder)
    return sorted(found)


def migrate(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """:func:`migrate_run` on every run folder below ``paths`` → (re-keyed, left as they are)."""
    done, left = [], []
    folders = run_dirs(paths)
    roots = [*dict.fromkeys(p.parent.parent for f in folders for p in _sources(read_run_info(f)))]
    for folder in folders:
        (done if migrate_run(folder, roots) is not None else left).append(folder)
    return done, left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m multipos.runs.migrate", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="sweep folders (or run folders)")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such folder: {', '.join(map(str, missing))}")
    done, left = migrate(args.paths)
    print(f"{len(done)} run folders keyed by their spec (version {SPEC_VERSION})")
    for folder in left:
        print(f"left as it is: {folder} (no machine resolves its config to its recorded config_hash)", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
