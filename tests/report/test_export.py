"""The text copy of a study (:mod:`multipos.report.export`) renders the same tables as the sweep it came from."""

from __future__ import annotations

import json

import numpy as np
import pytest

from multipos.report import render_sweep
from multipos.report.export import export_sweep, main, reported_metrics
from tests.report.fakes import SET, make_run, qmap

REPORT = f"""report:
  name: table2_homogeneous
  title: T
  row_key: objective
  columns: ['{SET}:ndcg@10']
  plot: null
"""


def _study(root):
    rng = np.random.default_rng(0)
    for objective, shift in (("singlelh", 0.0), ("jointlh", 0.05), ("lsepair", 0.1)):
        for seed in (42, 43, 44):
            values = rng.uniform(0, 1, 40) + shift
            make_run(root, f"loss={objective},seed={seed}", objective, seed=seed, extra_config=REPORT,
                     per_query={SET: {"ndcg@10": qmap(values), "recall@100": qmap(values / 2)},
                                "other_set": {"ndcg@10": qmap(values)}})
    return root


def test_the_text_copy_renders_the_same_table_and_keeps_only_reported_values(tmp_path):
    sweep = _study(tmp_path / "table2_homogeneous-cpu")
    (sweep / "loss=lsepair,seed=42" / "model").mkdir()
    (sweep / "loss=lsepair,seed=42" / "model" / "weights.bin").write_bytes(b"x" * 1000)
    copy = export_sweep(sweep, tmp_path / "runs")
    assert copy == tmp_path / "runs" / "table2_homogeneous-cpu"
    run = copy / "loss=lsepair,seed=42"
    assert not (run / "model").exists() and not (run / "per_query.other_set.json").exists()
    assert set(json.loads((run / f"per_query.{SET}.json").read_text())) == {"ndcg@10"}
    a = render_sweep(sweep, tmp_path / "a", name="t")
    b = render_sweep(copy, tmp_path / "b", name="t")
    strip = lambda md: [line for line in md.splitlines() if "table2_homogeneous-cpu" not in line]  # noqa: E731
    assert strip(a) == strip(b) and "lsepair" in a


def test_a_second_export_replaces_the_copy_and_an_empty_sweep_is_an_error(tmp_path, capsys):
    sweep = _study(tmp_path / "s")
    export_sweep(sweep, tmp_path / "runs")
    (tmp_path / "runs" / "s" / "stale").mkdir()
    main([str(sweep), "--out", str(tmp_path / "runs")])
    assert not (tmp_path / "runs" / "s" / "stale").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "empty"), "--out", str(tmp_path / "runs")])
    assert exc.value.code == 2 and "no finished run" in capsys.readouterr().err


def test_reported_metrics_reads_columns_and_plot():
    spec = {"columns": ["a:ndcg@10", "a:mrr@10", "b.gold:ndcg@10"],
            "plot": {"kind": "ratio_ablation", "eval_set": "c", "metrics": ["recall@100"]}}
    assert reported_metrics(spec) == {"a": {"ndcg@10", "mrr@10"}, "b.gold": {"ndcg@10"}, "c": {"recall@100"}}


def test_the_accepted_hydra_files_are_copied_and_a_run_from_before_specs_keeps_hydra_yaml(tmp_path):
    sweep = _study(tmp_path / "s")
    run = sweep / "loss=lsepair,seed=42"
    accepted = (run / ".hydra" / "config.yaml").read_text()
    (run / ".hydra.accepted").mkdir()
    (run / ".hydra.accepted" / "config.yaml").write_text(accepted)
    (run / ".hydra" / "config.yaml").write_text(accepted.replace("lsepair", "refused"))  # a refused job's config
    for name in ("loss=lsepair,seed=42", "loss=jointlh,seed=42"):
        (sweep / name / ".hydra" / "hydra.yaml").write_text("hydra: {runtime: {output_dir: /elsewhere}}\n")
    (sweep / "loss=jointlh,seed=42" / "spec.json").write_text("{}")  # keyed by a spec: hydra.yaml not needed
    copy = export_sweep(sweep, tmp_path / "runs")
    assert (copy / "loss=lsepair,seed=42" / ".hydra" / "config.yaml").read_text() == accepted
    assert (copy / "loss=lsepair,seed=42" / ".hydra" / "hydra.yaml").is_file()
    assert not (copy / "loss=jointlh,seed=42" / ".hydra" / "hydra.yaml").exists()
