"""multipos.annotate.agreement: Cohen's kappa, precision and recall of a judge against human grades, for the LLM's
grades of an annotation run and for a dense model thresholded on another split."""

from __future__ import annotations

import json

import pytest

from multipos.annotate.agreement import best_threshold, binary_agreement, main
from multipos.formats.trec import read_qrels


def test_agreement_of_two_binary_labelings():
    # po = 0.75; pe = 0.5 * 0.25 + 0.5 * 0.75 = 0.5; kappa = (0.75 - 0.5) / (1 - 0.5)
    a = binary_agreement([True, True, False, False], [True, False, False, False])
    assert a["kappa"] == pytest.approx(0.5) and a["precision"] == 1.0 and a["recall"] == 0.5
    assert binary_agreement([True, False], [False, False])["precision"] is None
    with pytest.raises(ValueError, match="equal, non-zero"):
        binary_agreement([True], [])


def test_the_threshold_with_the_best_kappa_separates_the_scores():
    assert best_threshold([0.9, 0.8, 0.3, 0.2], [True, True, False, False]) == 0.8


def test_a_report_from_an_annotation_folder(tiny_beir, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    dev = read_qrels(tiny_beir / "qrels" / "dev.tsv")
    q = sorted(dev)[0]
    relevant = sorted(dev[q])[:2]
    other = next(p for p in (json.loads(line)["_id"] for line in (tiny_beir / "corpus.jsonl").open())
                 if p not in dev[q])
    run = tmp_path / "run"
    (run / "qrels").mkdir(parents=True)
    (run / "pools.json").write_text(json.dumps({q: [*relevant, other]}))
    # the judge: the first relevant passage graded 3, the second malformed (no grade), the unjudged one graded 0
    grades = f"query-id\tcorpus-id\tscore\n{q}\t{relevant[0]}\t3\n{q}\t{other}\t0\n"
    (run / "qrels" / "relevance.tsv").write_text(grades)
    (run / "summary.json").write_text(json.dumps({"stages": {"relevance": {"seconds": 3.0, "calls": 4}}}))
    report = main([str(run), "--data", str(tiny_beir), "--dense", str(tiny_bert), "--calibration-queries", "3",
                   "--out", str(tmp_path / "report.json")])
    assert report["pairs"] == 3 and report["llm"]["pairs"] == 2 and report["llm"]["malformed"] == 1
    assert report["llm"]["precision"] == 1.0 and report["llm"]["recall"] == 1.0
    assert report["llm"]["s_per_1000"] == 1000.0
    assert report["dense"]["pairs"] == 3 and report["dense"]["model"] == str(tiny_bert)
    assert json.loads((tmp_path / "report.json").read_text()) == report
