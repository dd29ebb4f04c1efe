"""multipos.report.noise_audit: how many of the label-noise study's false positives are likely relevant."""

from __future__ import annotations

from multipos.report.noise_audit import agreeing_top, audit_rows, format_audit


def test_agreeing_top_keeps_passages_both_rankers_put_in_their_top_k():
    bm25 = {"q": {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.5}}
    dense = {"q": {"c": 0.9, "a": 0.8, "d": 0.7, "b": 0.1}, "other": {"a": 1.0}}
    assert agreeing_top(bm25, dense, 2) == {"q": {"a"}}
    assert agreeing_top(bm25, dense, 3) == {"q": {"a", "c"}}


def test_the_audit_redraws_the_study_false_positives_and_counts_each_signal(tiny_beir, tiny_bert, monkeypatch,
                                                                             tmp_path):
    monkeypatch.setenv("MULTIPOS_CACHE", str(tmp_path / "cache"))
    rows, about = audit_rows([f"data.source.path={tiny_beir}", f"data.source.negative_model={tiny_bert}",
                              "data.source.negative_depth=20"], kinds=("bm25",), rates=(0.5,), k=5)
    assert [(r["kind"], r["rate"], r["exclude"]) for r in rows] == [("bm25", 0.5, "query"),
                                                                    ("bm25", 0.5, "every_split")]
    for r in rows:
        assert 0 < r["injected"] and r["likely_relevant"] <= r["injected"]
        assert r["replaced"] == r["injected"] and r["replaced_likely_relevant"] <= r["replaced"]
    assert rows[1]["judged_elsewhere"] == 0  # the study's draw never takes a passage judged in any split
    page = format_audit(rows, about, "python -m multipos.report.noise_audit")
    assert "| bm25 | 0.5 | every_split |" in page and "Written by `python -m multipos.report.noise_audit`" in page
