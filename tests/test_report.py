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
