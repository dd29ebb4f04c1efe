"""Tests for multipos.report.cli: ``python -m multipos.report``."""

from __future__ import annotations

import re

import pytest

from multipos.report import cli, collect, main, render_table
from tests.report.fakes import COLUMNS, SET, md_rows


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
    cells = [c for k, row in md_rows(plain).items() if k != "objective" for c in row]
    assert len(cells) == 12 and all(re.fullmatch(r"(\*\*|<u>)?\d+\.\d\d(\*\*|</u>)?", c) for c in cells), cells


def test_cli_error_names_the_path(tmp_path, capsys):
    bad = tmp_path / "not_a_run"
    bad.mkdir()
    with pytest.raises(SystemExit) as exc:
        main([str(bad), "--table", "t"])
    assert exc.value.code == 2
    assert f"{bad}: no metrics.json found" in capsys.readouterr().err


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
    rows = md_rows(text.split("\n\n\\begin{table}")[0])
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
    monkeypatch.setattr(cli, "plot_ratio_ablation",
                        lambda runs, s, ms, out_png: calls.append((len(runs), s, ms)) or out_png)
    assert main([str(mixed), "--plot-ratio", "r.png", "--columns", "msmarco_dev:mrr@10", "nq_test:acc@20",
                 "msmarco_dev:recall@1000"]) == ""
    assert calls == [(6, "msmarco_dev", ["mrr@10", "recall@1000"])]
    assert "ratio ablation plot (msmarco_dev): r.png" in capsys.readouterr().err
