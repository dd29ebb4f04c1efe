"""The archived studies (experiments/sweeps/<archive>/, text copies, :mod:`multipos.report.export`) after
``python -m multipos.runs.migrate`` on a copy: every run is re-keyed, every cell is found finished by today's configs
(its run key is the key of the config its overrides compose now), and the tables rendered from them are the committed
ones, byte for byte.

The four smallest archives (text copies: no unpacking) run in the default suite; the others are marked ``slow``
(``make test-slow``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from multipos.report.render import main as render
from multipos.runs import migrate
from multipos.runs.spec import run_spec
from tests.helpers import compose_cfg

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "experiments" / "sweeps"
RESULTS = ROOT / "experiments" / "results"

#: Committed results rendered from archived sweeps by ``python -m multipos.report.render <sweep>`` alone: (archives
#: extracted together, sweep folder, result stems).
RENDERED = [
    (["cpu-query_side_objectives-2026-11-27"], "query_side_objectives-cpu", ["query_side_objectives"]),
    (["cpu-two_tower-2026-11-27"], "two_tower-cpu", ["two_tower"]),
    (["cpu-two_tower-2026-11-27"], "two_tower_objectives-cpu", ["two_tower_objectives"]),
    (["cpu-two_tower_search-2026-11-27"], "two_tower_recipe_search-cpu", ["two_tower_recipe_search"]),
    (["cpu-query_side-2026-11-25"], "table5_curriculum-cpu-query_side", ["table5_curriculum_query_side"]),
    (["cpu-query_side-2026-11-25"], "table6_lsepair_variants-cpu-query_side", ["table6_lsepair_variants_query_side"]),
    (["cpu-query_side-2026-11-25"], "table7_budget-cpu-query_side", ["table7_budget_query_side"]),
    (["cpu-query_side-2026-11-25"], "table9_recontriever-cpu-query_side", ["table9_recontriever_query_side"]),
    (["cpu-query_side-table2-table8-figure-2026-11-26"], "table2_homogeneous-cpu-query_side",
     ["table2_homogeneous_query_side"]),
    (["cpu-query_side-table2-table8-figure-2026-11-26"], "table8_first_vs_random_m-cpu-query_side",
     ["table8_first_vs_random_m_query_side"], ["--baselines", "data.positive_selection=first"]),
    (["cpu-query_side-candidate_set-figure-2026-11-25"], "candidate_set-cpu-query_side", ["candidate_set_query_side"]),
    (["cpu-query_side-candidate_set-figure-2026-11-25"], "figure_ratio_ablation-cpu-query_side",
     ["figure_ratio_ablation_query_side"]),
    *[(["gpu-h100"], f"{name}-cpu-gpu", [f"{name}_gpu"]) for name in (
        "table2_homogeneous", "table3_ood", "table4_heterogeneous", "table5_curriculum", "table6_lsepair_variants",
        "table8_first_vs_random_m", "table9_recontriever")],
]
FAST = {"cpu-two_tower_wise_ft-2026-11-27", "cpu-query_side_objectives-2026-11-27", "cpu-two_tower-2026-11-27",
        "cpu-two_tower_search-2026-11-27"}


def todays_overrides(overrides: list[str], evaluates: bool = False) -> list[str]:
    """An archived run's command-line overrides as today's configs spell them: ``launcher=parallel`` is retired
    (``parallel_jobs=<n>`` alone runs cells at once) and names no cell; the ``fine_tuning`` group became the scale
    ``cpu_query_side``, the ``training_regime`` group the ``regime`` group (the stage plan) and the ``size`` group's
    settings ``scale``'s (``++size.suffix=-gpu``: ``++scale.suffix=-gpu``). A run that trained
    nothing (``evaluates``: Table 3, the WiSE-FT curves) is evaluate.py's now: its ``loss=`` names the objective of
    the model it evaluates and it has no trainer."""
    renamed = {"fine_tuning=query_side": "scale=cpu_query_side"}
    kept = [re.sub(r"^(\+*)size([.=])", r"\1scale\2", renamed.get(o, o).replace("training_regime=", "regime=", 1))
            for o in overrides if not o.startswith("launcher=")]
    if evaluates:
        kept = [o.replace("loss=", "objective=", 1) if o.startswith("loss=") else o
                for o in kept if not o.startswith("trainer")]
    return kept


def _extract(names: list[str], into: Path) -> Path:
    """Copy the archives ``names`` (folders of ``experiments/sweeps/``) into ``into``: migrating writes into its
    copy, never into the committed text."""
    for name in names:
        shutil.copytree(SWEEPS / name, into, dirs_exist_ok=True)
    return into


ARCHIVES = sorted(p.name for p in SWEEPS.iterdir() if p.is_dir())


def _marks(names: list[str]):
    return [] if set(names) <= FAST else [pytest.mark.slow]


def test_the_archives_are_text_and_every_rendered_archive_is_there():
    assert not list(SWEEPS.glob("*.tar*")), "archives are committed as text folders (python -m multipos.report.export)"
    if os.environ.get("MULTIPOS_TEST_ACCELERATOR") == "gpu":
        pytest.skip("a GPU call leaves the big CPU archives behind (bench/gpu/pack.sh: the 64 MiB working-tree limit)")
    assert {n for names, *_ in RENDERED for n in names} <= set(ARCHIVES)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks([n])) for n in ARCHIVES])
def test_every_archived_run_is_rekeyed_and_found_finished_by_todays_configs(name, tmp_path):
    root = _extract([name], tmp_path)
    done, left = migrate.migrate([root])
    assert done and not left
    for folder in done:
        info = json.loads((folder / "run_info.json").read_text())
        assert info["run_key"] and info["spec_version"] and (folder / "spec.json").is_file()
        overrides = list(OmegaConf.load(migrate._config_file(folder).parent / "overrides.yaml"))
        evaluates = json.loads((folder / "spec.json").read_text())["stages"] == []
        cfg = compose_cfg("evaluate" if evaluates else "train", todays_overrides(overrides, evaluates))
        keys = set()
        for machine in migrate.MACHINES:  # the machine that ran it: CPU fp32, bf16, or a GPU
            with migrate._resolving_as(machine, folder):
                keys.add(run_spec(cfg).key())
        assert info["run_key"] in keys, f"{folder}: today's configs compute another run"


@pytest.mark.parametrize(("names", "sweep", "stems", "flags"), [
    pytest.param(names, sweep, stems, flags[0] if flags else [], marks=_marks(names), id=sweep)
    for names, sweep, stems, *flags in RENDERED])
def test_rendered_tables_of_a_migrated_archive_are_the_committed_ones(names, sweep, stems, flags, tmp_path):
    root = _extract(names, tmp_path / "sweeps" / names[0])  # the provenance line names the archive
    assert not migrate.migrate([root])[1]
    out = tmp_path / "results"
    render([str(root / sweep), "--out", str(out), *flags])
    for stem in stems:
        for suffix in (".md", ".tex"):
            assert (out / f"{stem}{suffix}").read_text() == (RESULTS / f"{stem}{suffix}").read_text(), stem + suffix


def test_a_spec_keyed_run_is_rekeyed_as_its_spec_says_it_was_resolved(tmp_path, monkeypatch):
    """After ``SPEC_VERSION`` is raised, a run keyed by the earlier spec (no ``config_hash``) is resolved again with
    the precision and bf16 encoding its ``spec.json`` recorded, not with this machine's."""
    root = _extract(["cpu-query_side_objectives-2026-11-27"], tmp_path)
    folder = migrate.run_dirs([root])[0]
    info = json.loads((folder / "run_info.json").read_text())
    spec = migrate.migrate_run(folder).to_dict()
    spec["optimization"]["trainer"]["precision"], spec["evaluation"]["bf16"] = "bf16-mixed", True
    (folder / "spec.json").write_text(json.dumps(spec))
    info = {k: v for k, v in info.items() if k != "config_hash"}
    (folder / "run_info.json").write_text(json.dumps({**info, "spec_version": 0}))
    monkeypatch.setenv("MULTIPOS_BF16", "0")  # this machine would resolve fp32
    rekeyed = migrate.migrate_run(folder)
    assert rekeyed.optimization["trainer"]["precision"] == "bf16-mixed" and rekeyed.evaluation["bf16"] is True
    assert json.loads((folder / "run_info.json").read_text())["run_key"] == rekeyed.key()
