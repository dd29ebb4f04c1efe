"""Tests for multipos.report.tables: Markdown / LaTeX tables, explicit columns, the plain-text table."""

from __future__ import annotations

import pytest

from multipos import report
from multipos.report import collect, load_run, render_table
from tests.report.fakes import AVG, AVG_VALUES, COLUMNS, EXPECTED_MD, SET, make_run, md_rows, unstyled


def test_markdown_table_bold_underline_markers_and_floor_rows(runs):
    md = render_table(list(runs.values()), [SET], ["ndcg@10", "mrr@10"], title="Table 2")
    assert md.startswith("Table: Table 2\n")
    rows = md_rows(md)
    assert rows["objective"] == ["nfcorpus_test nDCG@10", "nfcorpus_test MRR@10"]
    # floor rows first, unranked and unmarked even when higher than every run (BM25 nDCG 0.9)
    labels = list(rows)[1:]
    assert labels[:4] == ["BM25", "zero-shot", "singlelh", "rand1lh"]
    assert rows["BM25"] == ["0.9000", "0.1000"] and rows["zero-shot"] == ["0.3000", "n/a"]
    vals = {k: runs[k].metrics[SET]["ndcg@10"] for k in runs}
    # rand1lh and lsepair have the same mean → tie for best (both bold); jointlh is second
    assert f"{vals['rand1lh']:.4f}" == f"{vals['lsepair']:.4f}"
    assert rows["rand1lh"][0] == f"**{vals['rand1lh']:.4f}**+"
    assert rows["lsepair"][0] == f"**{vals['lsepair']:.4f}**+"
    assert rows["jointlh"][0] == f"<u>{vals['jointlh']:.4f}</u>+♦"
    assert rows["singlelh"][0] == f"{vals['singlelh']:.4f}♦"  # only compared with Rand1LH
    assert rows["summarglh"][0] == f"{vals['summarglh']:.4f}♦"
    assert rows["recontriever"][0] == f"{vals['recontriever']:.4f}-♦"
    for k in runs:  # marker suffix of every cell is exactly markers()
        assert rows[k][0].endswith(EXPECTED_MD[k]) and not rows[k][0].endswith("+" + EXPECTED_MD[k])
    assert sum("**" in c for row in rows.values() for c in row[:1]) == 2
    assert "+/-: significantly better/worse than singlelh; ♣/♦: significantly better/worse than rand1lh" in md


def test_ties_and_number_formats(tmp_path):
    vals = {"singlelh": 0.5, "rand1lh": 0.5, "jointlh": 0.41231, "lsepair": 0.41234, "summarglh": 0.3}
    runs = [load_run(make_run(tmp_path, k, k, metrics={SET: {"ndcg@10": v}})) for k, v in vals.items()]
    md = render_table(runs, [SET], ["ndcg@10"], significance=False, references=False)
    rows = md_rows(md)
    assert rows["singlelh"] == ["**0.5000**"] and rows["rand1lh"] == ["**0.5000**"]
    # 0.41231 and 0.41234 display the same → tied second best
    assert rows["jointlh"] == ["<u>0.4123</u>"] and rows["lsepair"] == ["<u>0.4123</u>"]
    assert rows["summarglh"] == ["0.3000"]
    assert "significantly" not in md
    pct = md_rows(render_table(runs, [SET], ["ndcg@10"], significance=False, percent=True))
    assert pct["singlelh"] == ["**50.00**"] and pct["lsepair"] == ["<u>41.23</u>"] and pct["summarglh"] == ["30.00"]
    # a single distinct value: all bold, nothing underlined
    same = md_rows(render_table(runs[:2], [SET], ["ndcg@10"], significance=False))
    assert same["singlelh"] == ["**0.5000**"] and same["rand1lh"] == ["**0.5000**"]


def test_latex_table(runs):
    tex = render_table(list(runs.values()), [SET], ["ndcg@10", "mrr@10"], fmt="latex", title="Table 2: main")
    vals = {k: runs[k].metrics[SET]["ndcg@10"] for k in runs}
    lines = tex.splitlines()
    assert lines[0] == r"\begin{table}[t]" and lines[-1] == r"\end{table}"
    assert r"\label{tab:table-2-main}" in tex and r"\caption{Table 2: main. $^{+}$/$^{-}$: significantly" in tex
    assert r"\begin{tabular}{lrr}" in tex
    assert r" & \multicolumn{2}{c}{nfcorpus\_test} \\" in lines
    assert r"objective & nDCG@10 & MRR@10 \\" in lines
    assert r"BM25 & 0.9000 & 0.1000 \\" in lines and r"zero-shot & 0.3000 & -- \\" in lines
    i_floor, i_first = lines.index(r"zero-shot & 0.3000 & -- \\"), next(
        i for i, line in enumerate(lines) if line.startswith("singlelh &"))
    assert lines[i_floor + 1] == r"\midrule" and i_first == i_floor + 2
    row = {line.split(" & ")[0]: line.split(" & ")[1:] for line in lines if " & " in line and not line.startswith(" &")}
    assert row["rand1lh"][0] == rf"\textbf{{{vals['rand1lh']:.4f}}}$^{{+}}$"
    assert row["jointlh"][0] == rf"\underline{{{vals['jointlh']:.4f}}}$^{{+\diamondsuit}}$"
    assert row["recontriever"][0] == rf"{vals['recontriever']:.4f}$^{{-\diamondsuit}}$"
    assert row["singlelh"][0] == rf"{vals['singlelh']:.4f}$^{{\diamondsuit}}$"
    assert r"\bottomrule" in lines


def test_latex_escapes_labels(tmp_path):
    run = load_run(make_run(tmp_path, "r", "lsepair_minp_maxn", metrics={"trec_dl19": {"recall@100": 0.25}}))
    tex = render_table([run], ["trec_dl19"], ["recall@100"], fmt="latex", significance=False)
    assert r"lsepair\_minp\_maxn & \textbf{0.2500} \\" in tex
    assert r"\multicolumn{1}{c}{trec\_dl19}" in tex and "R@100" in tex
    with pytest.raises(ValueError, match="unknown format 'html'"):
        render_table([run], ["trec_dl19"], ["recall@100"], fmt="html")
    with pytest.raises(ValueError, match=r"r/metrics\.json: no 'ndcg@10' for eval set 'trec_dl19'"):
        render_table([run], ["trec_dl19"], ["ndcg@10"], significance=False)


def test_metric_labels():
    assert report.metric_label("acc@20") == "Acc@20" and report.metric_label("acc@100") == "Acc@100"
    assert report.metric_label("acc@7") == "Acc@7"  # any k
    assert [report.metric_label(m) for m in ("ndcg@10", "mrr@10", "recall@100", "recall@1000")] == [
        "nDCG@10", "MRR@10", "R@100", "R@1000"]
    assert report.metric_label("map@100") == "map@100"


def test_columns_markdown_per_set_metrics(mixed):
    runs = collect([mixed])
    md = render_table(runs, columns=COLUMNS, title="Table 3")
    rows = md_rows(md)
    assert rows["objective"] == ["nq_test Acc@20", "nq_test Acc@100", "msmarco_dev MRR@10", "msmarco_dev R@1000",
                                 "hybrid_annotation.gold nDCG@10", "beir_average nDCG@10"]
    assert rows["BM25"] == ["0.6000", "0.7500", "0.1800", "0.8600", "n/a", "n/a"]
    assert rows["zero-shot"] == ["0.5000", "n/a", "n/a", "n/a", "n/a", "0.4100"]
    by_obj = {r.objective: r for r in runs}
    for obj, cells in rows.items():
        if obj not in by_obj:
            continue
        for (s, m), cell in zip(COLUMNS[:-1], cells[:-1]):  # per-query columns: the scenario's markers
            assert unstyled(cell) == f"{by_obj[obj].value(s, m):.4f}{EXPECTED_MD[obj]}", (obj, s, m, cell)
        assert unstyled(cells[-1]) == f"{AVG_VALUES[obj]:.4f}"  # the average column: the value, no marker
    # best / second best per column: rand1lh = lsepair (same mean) best, jointlh second on per-query columns ...
    for j in range(5):
        assert rows["rand1lh"][j].startswith("**") and rows["lsepair"][j].startswith("**")
        assert rows["jointlh"][j].startswith("<u>")
        assert sum(c[j].startswith("**") for c in rows.values()) == 2
    # ... but jointlh = lsepair best and singlelh second on the average
    assert rows["jointlh"][-1] == "**0.4700**" and rows["lsepair"][-1] == "**0.4700**"
    assert rows["singlelh"][-1] == "<u>0.4500</u>" and rows["rand1lh"][-1] == "0.4000"
    assert "+/-: significantly better/worse than singlelh; ♣/♦: significantly better/worse than rand1lh" in md


def test_columns_latex_groups_consecutive_sets(mixed):
    runs = collect([mixed])
    tex = render_table(runs, columns=COLUMNS, fmt="latex", title="Table 3")
    lines = tex.splitlines()
    assert r"\begin{tabular}{lrrrrrr}" in lines
    head = lines.index(r"\toprule")
    assert lines[head + 1] == (r" & \multicolumn{2}{c}{nq\_test} & \multicolumn{2}{c}{msmarco\_dev} & "
                               r"\multicolumn{1}{c}{hybrid\_annotation.gold} & \multicolumn{1}{c}{beir\_average} \\")
    assert lines[head + 2] == r"\cmidrule(lr){2-3}\cmidrule(lr){4-5}\cmidrule(lr){6-6}\cmidrule(lr){7-7}"
    assert lines[head + 3] == r"objective & Acc@20 & Acc@100 & MRR@10 & R@1000 & nDCG@10 & nDCG@10 \\"
    assert r"BM25 & 0.6000 & 0.7500 & 0.1800 & 0.8600 & -- & -- \\" in lines
    assert r"zero-shot & 0.5000 & -- & -- & -- & -- & 0.4100 \\" in lines
    row = {line.split(" & ")[0]: line.removesuffix(r" \\").split(" & ")[1:] for line in lines
           if " & " in line and not line.startswith((" &", "objective"))}
    assert set(row) == {"BM25", "zero-shot"} | set(EXPECTED_MD) and all(len(c) == 6 for c in row.values())
    j = next(r for r in runs if r.objective == "jointlh")
    assert row["jointlh"][0] == rf"\underline{{{j.value('nq_test', 'acc@20'):.4f}}}$^{{+\diamondsuit}}$"
    assert row["jointlh"][3] == rf"\underline{{{j.value('msmarco_dev', 'recall@1000'):.4f}}}$^{{+\diamondsuit}}$"
    assert row["jointlh"][5] == r"\textbf{0.4700}" and row["singlelh"][5] == r"\underline{0.4500}"
    assert row["recontriever"][5] == "0.2000"
    assert all("$^" not in cells[5] for cells in row.values())  # no markers on the average column
    assert all("$^" in row[obj][j] for obj in EXPECTED_MD for j in range(5))  # every run differs from a baseline
    # the same set twice but not consecutively → two groups
    split = render_table(runs, columns=[("nq_test", "acc@20"), (AVG, "ndcg@10"), ("nq_test", "acc@100")], fmt="latex",
                         references=False).splitlines()
    assert (r" & \multicolumn{1}{c}{nq\_test} & \multicolumn{1}{c}{beir\_average} & \multicolumn{1}{c}{nq\_test} \\"
            in split)
    assert r"\cmidrule(lr){2-2}\cmidrule(lr){3-3}\cmidrule(lr){4-4}" in split
    # the grid form still works and equals the same columns given explicitly
    cols = [("nq_test", "acc@20"), ("nq_test", "acc@100")]
    assert render_table(runs, ["nq_test"], ["acc@20", "acc@100"], fmt="latex") == render_table(
        runs, columns=cols, fmt="latex")


def test_columns_errors(mixed):
    runs = collect([mixed])
    with pytest.raises(ValueError, match="either columns or sets/metrics, not both"):
        render_table(runs, ["nq_test"], None, columns=COLUMNS)
    with pytest.raises(ValueError, match="need at least one column"):
        render_table(runs, columns=[])
    with pytest.raises(ValueError, match="need at least one eval set and one metric"):
        render_table(runs)
    with pytest.raises(ValueError, match="duplicate columns: nq_test:acc@20"):
        render_table(runs, columns=[("nq_test", "acc@20"), (AVG, "ndcg@10"), ("nq_test", "acc@20")])
    for bad in ["nq_test:acc@20", ("nq_test", ""), ("nq_test", "acc@20", "x")]:
        with pytest.raises(ValueError, match="must be a \\(set, metric\\) pair"):
            render_table(runs, columns=[bad])
    with pytest.raises(ValueError, match=r"run-singlelh/metrics\.json: no 'recall@100' for eval set 'beir_average'"):
        render_table(runs, columns=[(AVG, "recall@100")], significance=False)
    assert report.parse_column("hybrid_annotation.gold:ndcg@10") == ("hybrid_annotation.gold", "ndcg@10")
    for bad, why in [("nq_test", "no ':'"), ("nq_test:acc:20", "more than one ':'"), (":acc@20", "empty eval set"),
                     ("nq_test:", "empty metric")]:
        with pytest.raises(ValueError, match=why):
            report.parse_column(bad)
    # a set that some run has per-query values for: a run without them is still an error (not a silent "no marker")
    (mixed / "run-jointlh" / "per_query.msmarco_dev.json").unlink()
    runs = collect([mixed], require_per_query=False)
    with pytest.raises(FileNotFoundError, match=r"run-jointlh/per_query\.msmarco_dev\.json: per-query file missing"):
        render_table(runs, columns=COLUMNS)
    assert "msmarco_dev" not in render_table(runs, columns=[("nq_test", "acc@20"), (AVG, "ndcg@10")])


# ---------------------------------------------------------------------------------------------- grid


def test_render_grid():
    md = report.render_grid(["#", "lr", "dev nDCG@10"], [["1", "3e-5", "0.3100"], ["2", "a|b", "0.3000"]],
                            title="Trials", align="rlr")
    assert md.splitlines() == ["Table: Trials", "", "| # | lr | dev nDCG@10 |", "|---:|:---|---:|",
                               "| 1 | 3e-5 | 0.3100 |", r"| 2 | a\|b | 0.3000 |"]
    tex = report.render_grid(["#", "loss"], [["1", "lsepair_maxp"]], "latex", title="T")
    assert r"\begin{tabular}{lr}" in tex and r"\caption{T.}" in tex and r"1 & lsepair\_maxp \\" in tex
    with pytest.raises(ValueError, match="need 2 cells"):
        report.render_grid(["a", "b"], [["1"]])
