"""Tests for multipos.report.render: a study's files from a synthetic sweep (fake runs with a ``report:`` node)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from multipos.report import collect, render_sweep, render_table
from multipos.report.render import main
from tests.report.fakes import CONFIG, SEEDS, SET, make_run, md_rows, qmap, seeded_values, unstyled

COLUMNS = [(SET, "ndcg@10"), (SET, "mrr@10")]
TITLE = "Study: objectives over two seeds"
REFS = {"bm25": {SET: {"ndcg@10": 0.31, "mrr@10": 0.5}}}
# the report node as an experiment config writes it: columns and plot set through interpolations
REPORT = """\
scale:
  in_domain_columns: [nfcorpus_test:ndcg@10, nfcorpus_test:mrr@10]
  ratio_set: nfcorpus_test
report:
  name: {name}
  title: "{title}"
  row_key: {row_key}
  columns: ${{scale.in_domain_columns}}
  plot: {plot}
  notes: "Synthetic sweep for the tests."
"""


def report_yaml(name: str = "table2_homogeneous", row_key: str = "objective", plot: str = "null") -> str:
    return REPORT.format(name=name, title=TITLE, row_key=row_key, plot=plot)


@pytest.fixture
def study(tmp_path) -> Path:
    """Three objectives × two seeds (``seeded_values``), run_info.json with wall time and device, BM25
    references in one run, and one incomplete run (config, no metrics.json)."""
    root = tmp_path / "table2_homogeneous-cpu"
    for obj, per_seed in seeded_values().items():
        for seed, v in zip(SEEDS, per_seed):
            pq = {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v / 2)}}
            make_run(root, f"loss={obj},seed={seed}", obj, pq, seed=seed, extra_config=report_yaml(),
                     refs=REFS if (obj, seed) == ("singlelh", 1) else None,
                     run_info={"status": "complete", "wall_s": 100.0 * seed, "device": "CPU x2"})
    unfinished = root / "loss=lsepair,seed=1" / ".hydra"
    unfinished.mkdir(parents=True)
    (unfinished / "config.yaml").write_text(
        CONFIG.format(data="nfcorpus_hetero", G=8, M=4, objective="lsepair", seed=1) + report_yaml())
    return root


def test_render_table_from_sweep(study, tmp_path):
    out = tmp_path / "results"
    incomplete = r"1 incomplete run dir\(s\) \(no metrics.json\) left out: `loss=lsepair,seed=1`"
    with pytest.warns(UserWarning, match=incomplete):
        md = render_sweep(study, out)
    assert (out / "table2_homogeneous.md").read_text() == md
    tex = (out / "table2_homogeneous.tex").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["table2_homogeneous.md", "table2_homogeneous.tex"]  # no temp files
    runs = collect([study])
    assert len(runs) == 6
    # the table is render_table's, seeds aggregated, columns resolved from ${scale.in_domain_columns}
    assert md.startswith(render_table(runs, columns=COLUMNS, title=TITLE) + "\n\n")
    assert tex.startswith(render_table(runs, columns=COLUMNS, title=TITLE, fmt="latex") + "\n% ")
    rows = md_rows(md)
    assert list(rows) == ["objective", "BM25", "singlelh", "rand1lh", "jointlh"]
    assert rows["BM25"] == ["0.3100", "0.5000"]
    assert unstyled(rows["jointlh"][0]).split(" ± ")[0].endswith("+♣") and " ± " in rows["singlelh"][1]
    paragraphs = md.split("\n\n")
    assert paragraphs[-3] == "Synthetic sweep for the tests."
    assert paragraphs[-2] == "Incomplete runs (no metrics.json), not in the table: `loss=lsepair,seed=1`."
    # wall time: 100 s (seed 1) + 200 s (seed 2) per objective → 900 s in total, 150 s per run on average
    assert paragraphs[-1] == ("Provenance: 6 runs (3 rows) in sweep `table2_homogeneous-cpu`; seeds 1, 2; "
                              "wall time 15.0 min in total, 2.5 min per run; device: CPU x2.\n")
    assert tex.endswith("% Synthetic sweep for the tests.\n"
                        "% Incomplete runs (no metrics.json), not in the table: `loss=lsepair,seed=1`.\n"
                        + "% " + paragraphs[-1])


def test_render_rejects_runs_of_another_study(study):
    other = make_run(study, "loss=jointlh,seed=9", "jointlh", {SET: {"ndcg@10": qmap([0.1, 0.2])}}, seed=9,
                     extra_config=report_yaml(name="table3_ood"))
    with pytest.raises(ValueError, match=rf"disagree on report.name: .*'table2_homogeneous', {other} has 'table3_ood'"):
        render_sweep(study, study.parent / "out")


def test_render_names_rows_that_share_a_label(study):
    shutil.rmtree(study / "loss=lsepair,seed=1")  # the incomplete run: not this test's subject
    v = seeded_values()["jointlh"][0]
    make_run(study, "loss=jointlh,seed=3", "jointlh", {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v / 2)}}, seed=3,
             extra_config=report_yaml() + "module:\n  lr: 0.001\n")  # another config: not a seed of the jointlh row
    with pytest.warns(UserWarning, match="rows labelled 'jointlh' differ in module.lr"):
        md = render_sweep(study, study.parent / "out")
    assert "rows labelled 'jointlh' differ in module.lr (`loss=jointlh,seed=1` vs `loss=jointlh,seed=3`)" in md
    assert sum(line.startswith("| jointlh |") for line in md.splitlines()) == 2


def test_render_cli(study, tmp_path, capsys):
    out = tmp_path / "cli"
    with pytest.warns(UserWarning):
        md = main([str(study), "--out", str(out), "--name", "t2"])
    assert capsys.readouterr().out == md == (out / "t2.md").read_text() and (out / "t2.tex").is_file()
    bare = tmp_path / "bare"
    make_run(bare, "r", "singlelh", {SET: {"ndcg@10": qmap([0.1, 0.2])}})
    with pytest.raises(SystemExit) as exc:
        main([str(bare)])
    assert exc.value.code == 2 and "no `report:` node" in capsys.readouterr().err
    empty = tmp_path / "empty" / "r" / ".hydra"
    empty.mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        main([str(empty.parent.parent)])
    assert exc.value.code == 2 and "no complete run" in capsys.readouterr().err


def test_render_cli_title_replaces_the_runs_caption(study, tmp_path, capsys):
    """``--title`` captions the table in both files instead of ``report.title`` (runs trained with a recipe's overrides
    under another experiment's config carry that experiment's title)."""
    out = tmp_path / "titled"
    with pytest.warns(UserWarning):
        md = main([str(study), "--out", str(out), "--title", "Recipe top1, three seeds"])
    assert md.startswith("Table: Recipe top1, three seeds\n") and TITLE not in md
    assert "Recipe top1, three seeds" in (out / "table2_homogeneous.tex").read_text()


def test_render_ratio_plot(tmp_path):
    root = tmp_path / "figure_ratio_ablation-cpu"
    plot = '{kind: ratio_ablation, eval_set: "${oc.select:scale.ratio_set,nfcorpus_test}", metrics: [ndcg@10]}'
    for obj, base in (("singlelh", 0.3), ("jointlh", 0.32)):
        for G, M in ((8, 2), (8, 4), (16, 4)):
            v = [base + 0.01 * M, base + 0.01 * M + (0.02 if obj == "singlelh" else 0.05)]
            make_run(root, f"{obj}-G{G}-M{M}", obj, {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v)}}, G=G, M=M,
                     extra_config=report_yaml(name="figure_ratio_ablation", row_key="objective,G,M", plot=plot))
    md = render_sweep(root, tmp_path / "out")
    png = tmp_path / "out" / "figure_ratio_ablation.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"\n\n![{TITLE}](figure_ratio_ablation.png)\n\n" in md
    assert "| jointlh,G=16,M=4 |" in md
    assert md.endswith("Provenance: 6 runs (6 rows) in sweep `figure_ratio_ablation-cpu`; seed 42.\n")  # no run_info


def test_render_interpolation_plot(tmp_path):
    from multipos.report.plots import sweep_points

    root = tmp_path / "query_side_wise_ft-cpu"
    plot = "{kind: interpolation, key: wise_ft.alpha, eval_sets: [nfcorpus_test], metrics: [ndcg@10]}"
    for alpha in (0.0, 0.5, 1.0):
        for seed in (1, 2):
            v = [0.3 + 0.04 * alpha + 0.01 * seed, 0.3]
            make_run(root, f"wise_ft.alpha={alpha},seed={seed}", "jointlh",
                     {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v)}}, seed=seed,
                     extra_config=report_yaml(name="query_side_wise_ft", row_key="wise_ft.alpha", plot=plot)
                     + f"wise_ft:\n  alpha: {alpha}\n", overrides=[f"wise_ft.alpha={alpha}", f"seed={seed}"])
    md = render_sweep(root, tmp_path / "out")
    assert (tmp_path / "out" / "query_side_wise_ft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| alpha=0.5 |" in md and "| alpha=1.0 |" in md
    runs = collect(sorted(d for d in root.iterdir()))
    points = sweep_points(runs, "wise_ft.alpha", [SET], "ndcg@10")[SET]
    assert [p[0] for p in points] == [0.0, 0.5, 1.0] and all(p[3] == 2 for p in points)
    assert points[1][1] == pytest.approx((0.32 + 0.01 * 1.5 + 0.3) / 2)  # mean over seeds of the per-query means
    assert points[1][2] == pytest.approx(0.005 / 2 ** 0.5)  # sample sd of the two seeds
    bad = report_yaml(name="query_side_wise_ft", plot="{kind: interpolation, eval_sets: [nfcorpus_test]}")
    (root / "wise_ft.alpha=0.0,seed=1" / ".hydra" / "config.yaml").write_text(
        CONFIG.format(data="d", G=8, M=4, objective="jointlh", seed=1) + bad)
    with pytest.raises(ValueError, match="kind: interpolation, key: CONFIG.KEY"):
        render_sweep(root, tmp_path / "out2")


def test_render_trials(tmp_path):
    root = tmp_path / "nfcorpus_recipe_search-cpu"
    spec = """\
optimized_metric: nfcorpus_dev/ndcg@10
report:
  name: nfcorpus_recipe_search
  kind: trials
  title: "Recipe search"
  row_key: objective
  columns: [nfcorpus_dev:recall@100]
  plot: null
"""
    trials = [("lsepair", 1, "3e-5", 0.30, {"status": "complete", "wall_s": 400.0, "device": "CPU x2"}),
              ("singlelh", 2, "1e-5", 0.32, {"status": "complete", "wall_s": 800.0, "device": "CPU x2"}),
              ("lsepair", 2, "1e-5", 0.31, None)]
    for i, (loss, epochs, lr, ndcg, info) in enumerate(trials):
        overrides = ["experiment=nfcorpus_recipe_search", f"loss={loss}", f"trainer.max_epochs={epochs}",
                     f"module.optimizer.lr={lr}"]
        make_run(root, str(i), loss, metrics={"nfcorpus_dev": {"ndcg@10": ndcg, "recall@100": ndcg + 0.3}},
                 overrides=overrides, run_info=info, extra_config=spec)
    md = render_sweep(root, tmp_path / "out")
    lines = md.splitlines()
    assert lines[:7] == [
        "Table: Recipe search", "",
        "| # | loss | trainer.max_epochs | module.optimizer.lr | nfcorpus_dev nDCG@10 | nfcorpus_dev R@100 "
        "| wall time | device |",
        "|---:|:---|:---|:---|---:|---:|---:|:---|",
        "| 1 | singlelh | 2 | 1e-5 | 0.3200 | 0.6200 | 13.3 min | CPU x2 |",
        "| 2 | lsepair | 2 | 1e-5 | 0.3100 | 0.6100 | — | — |",
        "| 3 | lsepair | 1 | 3e-5 | 0.3000 | 0.6000 | 6.7 min | CPU x2 |",
    ]
    assert "Sorted by nfcorpus_dev nDCG@10 (descending)." in md
    assert ("Best trial per value of each searched setting (nfcorpus_dev nDCG@10; trials in parentheses; a value's "
            "best trial also differs in the other settings):\n"
            "- `loss`: singlelh 0.3200 (1), lsepair 0.3100 (2)\n"
            "- `trainer.max_epochs`: 2 0.3200 (2), 1 0.3000 (1)\n"
            "- `module.optimizer.lr`: 1e-5 0.3200 (2), 3e-5 0.3000 (1)\n\n") in md
    assert "Overrides common to every run: `experiment=nfcorpus_recipe_search`." in md
    assert md.endswith("Provenance: 3 runs in sweep `nfcorpus_recipe_search-cpu`; seed 42; wall time 20.0 min in "
                       "total, 10.0 min per run (over 2 of 3 runs); device: CPU x2.\n")
    tex = (tmp_path / "out" / "nfcorpus_recipe_search.tex").read_text()
    assert r"1 & singlelh & 2 & 1e-5 & 0.3200 & 0.6200 & 13.3 min & CPU x2 \\" in tex
    assert "% - `loss`: singlelh 0.3200 (1), lsepair 0.3100 (2)\n" in tex


def test_best_per_value_lists_repeated_settings_best_first_and_leaves_out_continuous_ones():
    from multipos.report.render import best_per_value

    ovs = [{"loss": "a", "lr": "1"}, {"loss": "b", "lr": "2"}, {"loss": "a", "lr": "3"}, {"lr": "4"}]
    assert best_per_value([0.1, 0.3, 0.2, 0.3], ovs, ["loss", "lr"]) == [
        ("loss", [("b", 0.3, 1), ("—", 0.3, 1), ("a", 0.2, 2)])]  # lr: one value per trial, left out
    assert best_per_value([0.1, 0.2], [{"loss": "a"}, {"loss": "b"}], ["loss"]) == []  # nothing repeated
    assert best_per_value([0.1, 0.2, 0.3, 0.4], [{"m": str(i % 3)} for i in range(4)], ["m"], max_values=2) == []
    with pytest.raises(ValueError, match="2 metric values for 1 trials"):
        best_per_value([0.1, 0.2], [{}], ["loss"])


@pytest.mark.parametrize("node", ["scale", "size"])
def test_a_query_side_variant_renders_beside_the_study(tmp_path, node):
    """``scale=cpu_query_side`` runs carry ``scale.suffix: -query_side`` (runs made before the ``size`` group was
    folded into ``scale``: ``size.suffix``): their files are ``<report.name>_query_side.*`` with a labelled title, so
    rendering them never overwrites the two-tower study."""
    root = tmp_path / "table2_homogeneous-cpu-query_side"
    variant = report_yaml().replace("scale", node).replace(f"{node}:\n", f"{node}:\n  suffix: -query_side\n")
    for obj, per_seed in seeded_values().items():
        for seed, v in zip(SEEDS, per_seed):
            make_run(root, f"loss={obj},seed={seed}", obj, {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v / 2)}},
                     seed=seed, extra_config=variant)
    out = tmp_path / "results"
    (out / "table2_homogeneous.md").parent.mkdir()
    (out / "table2_homogeneous.md").write_text("the two-tower study\n")
    md = render_sweep(root, out)
    assert (out / "table2_homogeneous.md").read_text() == "the two-tower study\n"
    assert (out / "table2_homogeneous_query_side.md").read_text() == md
    assert md.startswith(f"Table: {TITLE} (query-side)")
    assert render_sweep(root, out, name="other") == (out / "other.md").read_text()  # --name still wins


@pytest.mark.parametrize("suffix", ["", "-query_side"])
def test_a_paper_scale_study_renders_beside_the_cpu_scale_one(tmp_path, suffix):
    """Runs at paper scale (``scale.name: paper[-query_side]``) render to ``<report.name>_paper[_query_side].*``: the
    CPU-scale files of the same study are left alone."""
    root = tmp_path / f"table2_homogeneous-paper{suffix}"
    paper = report_yaml().replace("scale:\n", f"scale:\n  suffix: '{suffix}'\n  name: paper${{scale.suffix}}\n")
    for obj, per_seed in seeded_values().items():
        per_query = {SET: {"ndcg@10": qmap(per_seed[0]), "mrr@10": qmap(per_seed[0] / 2)}}
        make_run(root, f"loss={obj},seed=1", obj, per_query, seed=1, extra_config=paper)
    out = tmp_path / "results"
    out.mkdir()
    for stem in ("table2_homogeneous", "table2_homogeneous_query_side"):
        (out / f"{stem}.md").write_text("the CPU-scale study\n")
    md = render_sweep(root, out)
    assert (out / f"table2_homogeneous_paper{suffix.replace('-', '_')}.md").read_text() == md
    assert all((out / f"{s}.md").read_text() == "the CPU-scale study\n"
               for s in ("table2_homogeneous", "table2_homogeneous_query_side"))


def test_candidate_set_rows_are_compared_with_the_baseline_of_their_own_candidate_set(tmp_path):
    """experiment=candidate_set: every objective at G=8, M=2 once with sampled groups and once with every corpus passage
    a candidate (``passages.candidates``). JointLH-corpus sits 0.02 above SingleLH-corpus on every query and level
    with SingleLH-group: it must carry the + of its own candidate set, and the group row none."""
    root = tmp_path / "candidate_set-cpu-query_side"
    base = np.random.default_rng(3).uniform(0.2, 0.6, 40)
    wiggle = np.tile([0.01, -0.01], 20)
    values = {("singlelh", "group"): base + 0.02, ("jointlh", "group"): base + 0.02 + wiggle,
              ("singlelh", "corpus"): base, ("jointlh", "corpus"): base + 0.02}
    for (obj, cand), v in values.items():
        for seed in SEEDS:
            extra = (report_yaml("candidate_set", row_key="objective,G,M,candidates")
                     + f"passages:\n  candidates: {cand}\n")
            make_run(root, f"loss={obj},candidates={cand},seed={seed}", obj,
                     {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(v)}}, seed=seed, M=2, extra_config=extra)
    rows = {k: [unstyled(c) for c in v] for k, v in md_rows(render_sweep(root, tmp_path / "out")).items()}
    joint_corpus = next(v for k, v in rows.items() if k.startswith("jointlh") and "corpus" in k)
    joint_group = next(v for k, v in rows.items() if k.startswith("jointlh") and "group" in k)
    assert joint_corpus[0].split(" ± ")[0].endswith("+"), rows
    assert not joint_group[0].split(" ± ")[0].endswith(("+", "-")), rows


def _lsepair_runs(sweep, seeds):
    """One loaded LSEPair run per seed in ``sweep`` (one query, nDCG@10 0.5), for the provenance line."""
    from multipos.report.runs import load_run

    return [load_run(make_run(sweep, f"seed={s}", "lsepair", {SET: {"ndcg@10": {"q1": 0.5}}}, seed=s)) for s in seeds]


def test_the_wall_time_of_resumed_runs_is_called_a_lower_bound(tmp_path):
    """A run killed mid-training (out of memory, say) and resumed records only the time of the attempt that
    finished it, so the provenance line says the total is a lower bound and how many runs were resumed."""
    from multipos.report.render import provenance

    runs = _lsepair_runs(tmp_path / "s", (1, 2))
    fresh = [{"wall_s": 600.0, "device": "CPU"}, {"wall_s": 600.0, "device": "CPU"}]
    assert "wall time 20.0 min in total, 10.0 min per run; device" in provenance(tmp_path / "s", runs, fresh)
    resumed = [{"wall_s": 600.0, "device": "CPU", "resumed": True}, {"wall_s": 600.0, "device": "CPU"}]
    assert ("wall time 20.0 min in total, 10.0 min per run (a lower bound: 1 of them resumed after a stop, whose "
            "time before the stop is not recorded); device") in provenance(tmp_path / "s", runs, resumed)


def test_provenance_counts_rows_in_the_singular_and_plural(tmp_path):
    """A one-row table (the main job's seeds averaged) reads "2 runs (1 row)", not "(1 rows)"."""
    from multipos.report.render import provenance

    runs = _lsepair_runs(tmp_path / "s", (1, 2))
    assert provenance(tmp_path / "s", runs, [{}, {}], rows=1).startswith("Provenance: 2 runs (1 row) in sweep `s`")
    assert provenance(tmp_path / "s", runs[:1], [{}], rows=2).startswith("Provenance: 1 run (2 rows) in sweep `s`")


def test_provenance_names_each_device_with_its_runs(tmp_path):
    """Device descriptions hold commas ("CPU AMD EPYC, 2 cores"), so several are told apart by " / ", each with its
    number of runs; one device is named as it is."""
    from multipos.report.render import provenance

    runs = _lsepair_runs(tmp_path / "s", (1, 2, 3))
    infos = [{"device": "CPU EPYC, 2 cores"}, {"device": "CPU EPYC, 2 cores, 1 torch thread"},
             {"device": "CPU EPYC, 2 cores"}]
    assert provenance(tmp_path / "s", runs, infos).endswith(
        "; devices: CPU EPYC, 2 cores (2 runs) / CPU EPYC, 2 cores, 1 torch thread (1 run).")
    assert provenance(tmp_path / "s", runs, [infos[0]] * 3).endswith("; device: CPU EPYC, 2 cores.")


def test_provenance_names_the_archive_and_counts_copied_cells_and_reference_rows(tmp_path):
    from multipos.report.render import provenance

    sweep = tmp_path / "sweeps" / "cpu-query_side-2026-11-25" / "s"
    runs = _lsepair_runs(sweep, (1, 2, 3))
    infos = [{"copied_from": ["a/s/seed=1"]},
             {"copied_from": ["a/s/seed=9 (references: zero-shot, nfcorpus_test)"]},
             {"copied_from": ["a/s/seed=3", "a/t/seed=3 (references: bm25, nfcorpus_test)"]}]
    line = provenance(sweep, runs, infos)
    assert "in sweep `s` of archive `experiments/sweeps/cpu-query_side-2026-11-25`" in line
    assert " of archive " not in provenance(tmp_path / "multirun" / "s", runs, infos)  # a sweep of its own
    assert "2 of them: their results copied" in line and "2 of them: their reference rows copied" in line
