"""Tests for multipos.report on hand-built run directories (no training, no assets)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from multipos import report
from multipos.report import collect, load_run, main, markers, paired_ttest, render_table, row_label

SET = "nfcorpus_test"
N = 40  # queries
CONFIG = """\
data:
  name: {data}
  regime: heterogeneous
  group_size: {G}
  max_positives: {M}
  positive_selection: first
  tokenizer: ${{model.name_or_path}}
  source:
    teacher: ${{model.name_or_path}}
model:
  name_or_path: all-MiniLM-L6-v2
loss:
  _target_: multipos.losses.ContrastiveLoss
  name: {objective}
seed: {seed}
paths:
  output_dir: ${{hydra:runtime.output_dir}}
"""


def make_run(root: Path, name: str, objective: str, per_query: dict[str, dict[str, dict[str, float]]] | None = None,
             metrics: dict | None = None, refs: dict | None = None, G: int = 8, M: int = 4, seed: int = 42,
             data: str = "nfcorpus_hetero") -> Path:
    """A fake finished run: metrics.json (= per-query means unless given), per_query.<set>.json, .hydra/."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    per_query = per_query or {}
    if metrics is None:
        metrics = {s: {m: float(np.mean(list(v.values()))) for m, v in pq.items()} for s, pq in per_query.items()}
    (d / "metrics.json").write_text(json.dumps(metrics))
    for s, pq in per_query.items():
        (d / f"per_query.{s}.json").write_text(json.dumps(pq))
    if refs is not None:
        (d / "references.json").write_text(json.dumps(refs))
    (d / ".hydra" / "config.yaml").write_text(CONFIG.format(data=data, G=G, M=M, objective=objective, seed=seed))
    (d / ".hydra" / "overrides.yaml").write_text(f"- loss={objective}\n- data.group_size={G}\n")
    return d


def qmap(values) -> dict[str, float]:
    return {f"q{i:03d}": float(v) for i, v in enumerate(values)}


def scenario_values() -> dict[str, np.ndarray]:
    """Per-query nDCG@10 crafted for known significance outcomes (n=40, alpha=0.05)."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, N)

    def noise(scale=0.01):
        e = rng.normal(0, scale, N)
        return e - e.mean()

    alt = np.tile([0.01, -0.01], N // 2)  # zero-mean wiggle: t = 0 against the run it is added to
    rand1lh = base + 0.05 + noise()
    return {
        "singlelh": base,
        "rand1lh": rand1lh,                       # + vs SingleLH
        "jointlh": base + 0.02 + noise(),         # + vs SingleLH, ♦ vs Rand1LH
        "lsepair": rand1lh + alt,                 # + vs SingleLH, same mean as Rand1LH → no ♣/♦
        "summarglh": base + alt,                  # same mean as SingleLH → no +/-, ♦ vs Rand1LH
        "recontriever": base - 0.03 + noise(),    # - vs SingleLH, ♦ vs Rand1LH
    }


EXPECTED_MD = {"singlelh": "♦", "rand1lh": "+", "jointlh": "+♦", "lsepair": "+", "summarglh": "♦",
               "recontriever": "-♦"}
REFS = {"bm25": {SET: {"ndcg@10": 0.9, "mrr@10": 0.1}}, "zero-shot": {SET: {"ndcg@10": 0.3}}}


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A sweep dir with the six scenario runs at different depths, plus an unfinished run (no metrics)."""
    root = tmp_path / "multirun"
    vals = scenario_values()
    for i, (obj, v) in enumerate(vals.items()):
        sub = root / ("day1" if i % 2 else "day2")
        pq = {SET: {"ndcg@10": qmap(v), "mrr@10": qmap(np.clip(v + 0.2, 0, 1))}}
        make_run(sub, f"{i}-loss={obj}", obj, pq, refs=REFS if obj == "singlelh" else None)
    (root / "day1" / "unfinished" / ".hydra").mkdir(parents=True)
    return root


@pytest.fixture
def runs(sweep):
    return {r.objective: r for r in collect([sweep])}


# ---------------------------------------------------------------------------------------------- t-test


def test_paired_ttest_matches_scipy_and_hand_computation():
    a = {"q1": 0.1, "q2": 0.4, "q3": 0.35, "q4": 0.8}
    b = {"q1": 0.2, "q2": 0.3, "q3": 0.30, "q4": 0.5}
    t, p = paired_ttest(a, b)
    d = np.array([-0.1, 0.1, 0.05, 0.3])
    t_hand = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    ref = stats.ttest_rel([0.1, 0.4, 0.35, 0.8], [0.2, 0.3, 0.30, 0.5])
    assert t == pytest.approx(t_hand, rel=1e-12)
    assert t == pytest.approx(float(ref.statistic), rel=1e-12)
    assert p == pytest.approx(float(ref.pvalue), rel=1e-12)
    assert 0.2 < p < 0.4  # not significant: a sanity check of the two-sided p
    # order of qids in the dicts does not matter (pairs are matched by qid)
    t2, p2 = paired_ttest(dict(reversed(list(a.items()))), b)
    assert (t2, p2) == pytest.approx((t, p))
    assert paired_ttest(b, a)[0] == pytest.approx(-t)


def test_paired_ttest_identical_inputs_give_p_one():
    a = qmap(np.linspace(0, 1, 10))
    t, p = paired_ttest(a, dict(a))
    assert (t, p) == (0.0, 1.0)
    assert not math.isnan(p)


def test_paired_ttest_rejects_different_query_sets_with_counts():
    a = qmap([0.1, 0.2, 0.3, 0.4])
    b = {k: v for k, v in a.items() if k != "q003"} | {"qX": 0.5, "qY": 0.6}
    with pytest.raises(ValueError, match=r"4 vs 5 queries, 3 in common, 1 only in the first.*2 only in the second"):
        paired_ttest(a, b)
    with pytest.raises(ValueError, match="at least 2 queries"):
        paired_ttest({"q": 0.1}, {"q": 0.2})


# ---------------------------------------------------------------------------------------------- loading


def test_load_run_reads_config_without_resolving_interpolations(tmp_path):
    d = make_run(tmp_path, "run", "lsepair_maxp", {SET: {"ndcg@10": qmap([0.5, 0.7])}}, G=16, M=2, seed=7)
    run = load_run(d)
    assert run.objective == "lsepair_maxp"
    assert run.config["data.group_size"] == 16 and run.config["data.max_positives"] == 2
    assert run.config["seed"] == 7 and run.config["data.positive_selection"] == "first"
    assert run.metrics[SET]["ndcg@10"] == pytest.approx(0.6)
    assert run.per_query[SET]["ndcg@10"]["q001"] == 0.7
    assert run.overrides == ["loss=lsepair_maxp", "data.group_size=16"]
    assert run.get("data.tokenizer") == "${model.name_or_path}"  # raw, unresolved
    assert row_label(run, "G,M") == "G=16,M=2"
    assert row_label(run, "objective,data.max_positives,seed") == "lsepair_maxp,M=2,seed=7"
    with pytest.raises(ValueError, match="no config key 'data.nope'"):
        row_label(run, "data.nope")


def test_collect_finds_runs_in_sweep_dir(sweep, tmp_path):
    runs = collect([sweep])
    assert sorted(r.objective for r in runs) == sorted(EXPECTED_MD)
    assert [r.path for r in runs] == sorted(r.path for r in runs)  # deterministic order
    # the same runs reached twice (sweep + one of its run dirs) are loaded once
    one = next(r.path for r in runs if r.objective == "jointlh")
    again = collect([one, sweep])
    assert len(again) == 6 and again[0].path == one
    assert collect([one])[0].objective == "jointlh"


def test_errors_name_the_path(tmp_path, sweep):
    empty = tmp_path / "empty_run"
    (empty / ".hydra").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"empty_run/metrics\.json: not found"):
        load_run(empty)
    with pytest.raises(FileNotFoundError, match="empty_run: no metrics.json found"):
        collect([empty])
    with pytest.raises(FileNotFoundError, match="does_not_exist: no such run"):
        collect([tmp_path / "does_not_exist"])
    d = make_run(tmp_path, "no_pq", "singlelh", metrics={SET: {"ndcg@10": 0.5}, "trec_dl19": {"ndcg@10": 0.6}})
    with pytest.raises(FileNotFoundError, match=r"no_pq/per_query\.trec_dl19\.json: per-query file missing"):
        load_run(d, sets=["trec_dl19"], metrics=["ndcg@10"])
    lenient = load_run(d, sets=["trec_dl19"], metrics=["ndcg@10"], require_per_query=False)
    assert lenient.value("trec_dl19", "ndcg@10") == 0.6
    with pytest.raises(ValueError, match=r"no_pq/metrics\.json: no eval set 'trec_dl20'"):
        load_run(d, sets=["trec_dl20"], require_per_query=False)
    (d / "metrics.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"no_pq/metrics\.json: invalid JSON"):
        load_run(d)


# ---------------------------------------------------------------------------------------------- markers


def test_markers_follow_paper_convention(runs):
    s, r = runs["singlelh"], runs["rand1lh"]
    got = {obj: markers(run, s, r, SET, "ndcg@10") for obj, run in runs.items()}
    assert got == EXPECTED_MD
    # sanity of the crafted data: the "not significant" comparisons really are far from alpha
    _, p = paired_ttest(runs["lsepair"].query_values(SET, "ndcg@10"), r.query_values(SET, "ndcg@10"))
    assert p > 0.5
    _, p = paired_ttest(runs["jointlh"].query_values(SET, "ndcg@10"), s.query_values(SET, "ndcg@10"))
    assert p < 1e-6
    # LaTeX: one superscript per cell
    assert markers(runs["jointlh"], s, r, SET, "ndcg@10", fmt="latex") == r"$^{+\diamondsuit}$"
    assert markers(runs["recontriever"], s, r, SET, "ndcg@10", fmt="latex") == r"$^{-\diamondsuit}$"
    assert markers(runs["summarglh"], s, r, SET, "ndcg@10", fmt="latex") == r"$^{\diamondsuit}$"
    assert markers(s, s, r, SET, "ndcg@10", fmt="latex") == r"$^{\diamondsuit}$"
    # a run compared with itself / with a missing baseline gets nothing
    assert markers(s, s, None, SET, "ndcg@10") == ""
    assert markers(r, s, r, SET, "ndcg@10") == "+"
    assert markers(runs["jointlh"], None, None, SET, "ndcg@10") == ""
    # alpha below the p-value → not significant → no marker
    _, p_sum = paired_ttest(runs["summarglh"].query_values(SET, "ndcg@10"), r.query_values(SET, "ndcg@10"))
    assert markers(runs["summarglh"], s, r, SET, "ndcg@10", alpha=p_sum / 2) == ""


def test_markers_refuse_mismatched_queries(tmp_path):
    a = load_run(make_run(tmp_path, "a", "jointlh", {SET: {"ndcg@10": qmap([0.1, 0.2, 0.3])}}))
    b = load_run(make_run(tmp_path, "b", "singlelh", {SET: {"ndcg@10": qmap([0.1, 0.2])}}))
    with pytest.raises(ValueError, match=r"nfcorpus_test/ndcg@10: .*a vs .*b: .*3 vs 2 queries"):
        markers(a, b, None, SET, "ndcg@10")


def test_baseline_resolution_prefers_matching_config_and_rejects_ambiguity(tmp_path):
    pq = lambda v: {SET: {"ndcg@10": qmap(v)}}  # noqa: E731
    lo, hi = np.linspace(0.1, 0.5, 20), np.linspace(0.1, 0.5, 20) + np.linspace(0.05, 0.06, 20)
    s8 = load_run(make_run(tmp_path, "s8", "singlelh", pq(lo), G=8))
    s16 = load_run(make_run(tmp_path, "s16", "singlelh", pq(hi + 0.1), G=16))
    run8 = load_run(make_run(tmp_path, "j8", "jointlh", pq(hi), G=8))
    pool = [s8, s16, run8]
    assert report.resolve_baseline(run8, pool, "singlelh") is s8
    assert report.resolve_baseline(s16, pool, "singlelh") is s16  # itself → no marker
    assert report.resolve_baseline(run8, pool, "rand1lh") is None
    table = render_table(pool, [SET], ["ndcg@10"], row_key="objective,G", baselines=("singlelh", None))
    assert "| jointlh,G=8 | <u>0.3550</u>+ |" in table  # + against s8, not a - against s16
    s8b = load_run(make_run(tmp_path, "s8b", "singlelh", pq(lo), G=8))
    with pytest.raises(ValueError, match="ambiguous singlelh baseline"):
        report.resolve_baseline(run8, [s8, s8b, run8], "singlelh")


# ---------------------------------------------------------------------------------------------- tables


def _rows(md: str) -> dict[str, list[str]]:
    out = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("|:"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0]] = cells[1:]
    return out


def test_markdown_table_bold_underline_markers_and_floor_rows(runs):
    md = render_table(list(runs.values()), [SET], ["ndcg@10", "mrr@10"], title="Table 2")
    assert md.startswith("Table: Table 2\n")
    rows = _rows(md)
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
    rows = _rows(md)
    assert rows["singlelh"] == ["**0.5000**"] and rows["rand1lh"] == ["**0.5000**"]
    # 0.41231 and 0.41234 display the same → tied second best
    assert rows["jointlh"] == ["<u>0.4123</u>"] and rows["lsepair"] == ["<u>0.4123</u>"]
    assert rows["summarglh"] == ["0.3000"]
    assert "significantly" not in md
    pct = _rows(render_table(runs, [SET], ["ndcg@10"], significance=False, percent=True))
    assert pct["singlelh"] == ["**50.00**"] and pct["lsepair"] == ["<u>41.23</u>"] and pct["summarglh"] == ["30.00"]
    # a single distinct value: all bold, nothing underlined
    same = _rows(render_table(runs[:2], [SET], ["ndcg@10"], significance=False))
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
        i for i, l in enumerate(lines) if l.startswith("singlelh &"))
    assert lines[i_floor + 1] == r"\midrule" and i_first == i_floor + 2
    row = {l.split(" & ")[0]: l.split(" & ")[1:] for l in lines if " & " in l and not l.startswith(" &")}
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


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_prints_and_writes_tables(sweep, tmp_path, capsys):
    out = tmp_path / "tables" / "main.md"
    text = main([str(sweep), "--table", "Table 2", "--sets", SET, "--metrics", "ndcg@10", "--format", "both",
                 "--out", str(out)])
    printed = capsys.readouterr().out
    assert printed.strip() == text.strip() and out.read_text().strip() == text.strip()
    md, tex = text.split("\n\n\\begin{table}")
    assert md.startswith("Table: Table 2") and "| jointlh | <u>" in md and "+♦ |" in md
    assert r"\caption{Table 2." in tex and r"$^{+\diamondsuit}$" in tex
    # defaults: sets shared by every run, markdown, ndcg@10 + mrr@10
    default = main([str(sweep), "--table", "t"])
    assert "| objective | nfcorpus_test nDCG@10 | nfcorpus_test MRR@10 |" in default
    assert r"\begin{table}" not in default
    # no significance: no markers at all
    plain = main([str(sweep), "--table", "t", "--no-significance", "--no-references", "--percent"])
    assert not any(s in plain for s in "♣♦") and "BM25" not in plain
    cells = [c for k, row in _rows(plain).items() if k != "objective" for c in row]
    assert len(cells) == 12 and all(re.fullmatch(r"(\*\*|<u>)?\d+\.\d\d(\*\*|</u>)?", c) for c in cells), cells


def test_cli_error_names_the_path(tmp_path, capsys):
    bad = tmp_path / "not_a_run"
    bad.mkdir()
    with pytest.raises(SystemExit) as exc:
        main([str(bad), "--table", "t"])
    assert exc.value.code == 2
    assert f"{bad}: no metrics.json found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- explicit columns

AVG = "beir_average"  # an average over sets: in metrics.json, no per_query.<set>.json
QRELS_VIEW = "hybrid_annotation.gold"
COLUMNS = [("nq_test", "acc@20"), ("nq_test", "acc@100"), ("msmarco_dev", "mrr@10"), ("msmarco_dev", "recall@1000"),
           (QRELS_VIEW, "ndcg@10"), (AVG, "ndcg@10")]
# best / second best of the average column differ from the per-query columns (rand1lh = lsepair best, jointlh second)
AVG_VALUES = {"singlelh": 0.45, "rand1lh": 0.40, "jointlh": 0.47, "lsepair": 0.47, "summarglh": 0.30,
              "recontriever": 0.20}
MIXED_REFS = {"bm25": {"nq_test": {"acc@20": 0.6, "acc@100": 0.75}, "msmarco_dev": {"mrr@10": 0.18, "recall@1000": 0.86}},
              "zero-shot": {"nq_test": {"acc@20": 0.5}, AVG: {"ndcg@10": 0.41}}}


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Six runs with different metrics per set (NQ Acc@k, MS MARCO MRR@10 / R@1000, a qrels view) and a BEIR average.

    Every per-query column is a constant shift of the scenario values, so its markers are :data:`EXPECTED_MD`."""
    root = tmp_path / "mixed"
    for obj, v in scenario_values().items():
        pq = {"nq_test": {"acc@20": qmap(v), "acc@100": qmap(v + 0.3)},
              "msmarco_dev": {"mrr@10": qmap(v - 0.1), "recall@1000": qmap(v + 0.35)},
              QRELS_VIEW: {"ndcg@10": qmap(v)}}
        metrics = {s: {m: float(np.mean(list(q.values()))) for m, q in d.items()} for s, d in pq.items()}
        metrics[AVG] = {"ndcg@10": AVG_VALUES[obj]}
        make_run(root, f"run-{obj}", obj, pq, metrics=metrics, refs=MIXED_REFS if obj == "singlelh" else None)
    return root


def _unstyled(cell: str) -> str:
    return re.sub(r"\*\*|</?u>|\\textbf\{|\\underline\{|\}(?=\$|$)", "", cell)


def test_metric_labels():
    assert report.metric_label("acc@20") == "Acc@20" and report.metric_label("acc@100") == "Acc@100"
    assert report.metric_label("acc@7") == "Acc@7"  # any k
    assert [report.metric_label(m) for m in ("ndcg@10", "mrr@10", "recall@100", "recall@1000")] == [
        "nDCG@10", "MRR@10", "R@100", "R@1000"]
    assert report.metric_label("map@100") == "map@100"


def test_columns_markdown_per_set_metrics(mixed):
    runs = collect([mixed])
    md = render_table(runs, columns=COLUMNS, title="Table 3")
    rows = _rows(md)
    assert rows["objective"] == ["nq_test Acc@20", "nq_test Acc@100", "msmarco_dev MRR@10", "msmarco_dev R@1000",
                                 "hybrid_annotation.gold nDCG@10", "beir_average nDCG@10"]
    assert rows["BM25"] == ["0.6000", "0.7500", "0.1800", "0.8600", "n/a", "n/a"]
    assert rows["zero-shot"] == ["0.5000", "n/a", "n/a", "n/a", "n/a", "0.4100"]
    by_obj = {r.objective: r for r in runs}
    for obj, cells in rows.items():
        if obj not in by_obj:
            continue
        for (s, m), cell in zip(COLUMNS[:-1], cells[:-1]):  # per-query columns: the scenario's markers
            assert _unstyled(cell) == f"{by_obj[obj].value(s, m):.4f}{EXPECTED_MD[obj]}", (obj, s, m, cell)
        assert _unstyled(cells[-1]) == f"{AVG_VALUES[obj]:.4f}"  # the average column: the value, no marker
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
    row = {l.split(" & ")[0]: l.removesuffix(r" \\").split(" & ")[1:] for l in lines
           if " & " in l and not l.startswith((" &", "objective"))}
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


def test_cli_columns(mixed, tmp_path, capsys):
    out = tmp_path / "t3.tex"
    argv = [str(mixed), "--table", "Table 3", "--format", "both", "--out", str(out), "--columns",
            *(f"{s}:{m}" for s, m in COLUMNS)]
    text = main(argv)
    captured = capsys.readouterr()
    assert captured.out.strip() == text.strip() == out.read_text().strip()
    assert text == "\n\n".join(render_table(collect([mixed]), columns=COLUMNS, fmt=f, title="Table 3")
                               for f in ("markdown", "latex"))
    assert "note: no run has per-query values for 'beir_average'" in captured.err
    assert "nq_test" not in captured.err  # only the average gets the note
    rows = _rows(text.split("\n\n\\begin{table}")[0])
    assert rows["jointlh"][0].endswith("+♦") and rows["jointlh"][-1] == "**0.4700**"
    assert r"\cmidrule(lr){2-3}\cmidrule(lr){4-5}\cmidrule(lr){6-6}\cmidrule(lr){7-7}" in text


@pytest.mark.parametrize("extra, message", [
    (["--columns", "nq_test:acc@20", "--sets", "nq_test"], "argument --columns: not allowed with --sets"),
    (["--columns", "nq_test:acc@20", "--metrics", "acc@20"], "argument --columns: not allowed with --metrics"),
    (["--sets", "nq_test", "--metrics", "acc@20", "--columns", "nq_test:acc@20"],
     "argument --columns: not allowed with --sets / --metrics"),
    (["--columns", "nq_test:acc@20", "nq_test"], "argument --columns: column 'nq_test' has no ':'"),
    (["--columns", "nq_test:"], "argument --columns: column 'nq_test:' has an empty metric"),
    (["--columns", ":acc@20"], "argument --columns: column ':acc@20' has an empty eval set"),
    (["--columns", "nq_test:acc:20"], "argument --columns: column 'nq_test:acc:20' has more than one ':'"),
])
def test_cli_columns_usage_errors(mixed, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        main([str(mixed), "--table", "t", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m multipos.report") and message in err


def test_cli_columns_missing_values(mixed, capsys):
    (mixed / "run-rand1lh" / "per_query.nq_test.json").unlink()
    with pytest.raises(SystemExit) as exc:  # a normal set: a missing per-query file is an error, before any table
        main([str(mixed), "--table", "t", "--columns", "nq_test:acc@20", "beir_average:ndcg@10"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "run-rand1lh/per_query.nq_test.json: per-query file missing" in captured.err and captured.out == ""
    # ... not needed without significance markers
    assert "| rand1lh |" in main([str(mixed), "--table", "t", "--no-significance", "--columns", "nq_test:acc@20"])
    with pytest.raises(SystemExit) as exc:
        main([str(mixed), "--table", "t", "--columns", "beir_average:acc@20"])
    assert exc.value.code == 2
    assert "metrics.json: no 'acc@20' for eval set 'beir_average'" in capsys.readouterr().err


def test_cli_columns_plot_ratio_uses_first_columns_set(mixed, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(report, "plot_ratio_ablation", lambda runs, s, ms, out_png: calls.append((len(runs), s, ms)) or out_png)
    assert main([str(mixed), "--plot-ratio", "r.png", "--columns", "msmarco_dev:mrr@10", "nq_test:acc@20",
                 "msmarco_dev:recall@1000"]) == ""
    assert calls == [(6, "msmarco_dev", ["mrr@10", "recall@1000"])]
    assert "ratio ablation plot (msmarco_dev): r.png" in capsys.readouterr().err
