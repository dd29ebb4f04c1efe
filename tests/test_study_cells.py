"""Every cell of every study composes to the run it composed when ``tests/fixtures/study_cells.json`` was written:
the same run key (what it computes, :mod:`multipos.runs.spec`) and the same run folder name. A restructure of
``conf/`` that changes either fails here; a change meant to change a study rewrites the file with
``python -m tests.test_study_cells`` and says why in its commit."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from multipos.runs.spec import run_key
from tests.helpers import compose_cfg
from tests.test_configs import EXPERIMENT_NEEDS, EXPERIMENTS, job_config, sweep_cells

FIXTURE = Path(__file__).parent / "fixtures" / "study_cells.json"
#: Each study as it is and query-side (an evaluation-only study: the query-side models, the same ``scale``).
VARIANTS = ([], ["scale=cpu_query_side"])


def study_cells(experiment: str) -> dict[str, list[str]]:
    """{"<experiment>|<variant>|<cell overrides>": [run key, run folder name]} of one study, first seed only, in
    fp32 (``MULTIPOS_BF16=0``: a key does not depend on this machine's bf16)."""
    out = {}
    job = job_config(experiment)
    for variant in VARIANTS:
        for cell in sweep_cells(experiment, seeds_once=True):
            overrides = [f"experiment={experiment}", *variant, *cell, *EXPERIMENT_NEEDS.get(experiment, [])]
            cfg = compose_cfg(job, [*overrides, "paths.output_dir=out"])
            folder = compose_cfg(job, overrides, return_hydra_config=True).hydra.job.override_dirname
            out[f"{experiment}|{' '.join(variant)}|{' '.join(sorted(cell))}"] = [run_key(cfg), folder]
    return out


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_study_cell_computes_and_is_named_as_before(experiment, monkeypatch):
    monkeypatch.setenv("MULTIPOS_BF16", "0")
    expected = {k: v for k, v in json.loads(FIXTURE.read_text()).items() if k.split("|")[0] == experiment}
    assert study_cells(experiment) == expected


if __name__ == "__main__":
    os.environ["MULTIPOS_BF16"] = "0"
    cells = {k: v for e in EXPERIMENTS for k, v in study_cells(e).items()}
    FIXTURE.write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")
    print(f"{FIXTURE}: {len(cells)} cells", file=sys.stderr)
